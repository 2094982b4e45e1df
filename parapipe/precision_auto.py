"""``plan --precision auto``: choose each block's precision within an accuracy budget, and prove it on held-back frames.

1. The user's frames (``--calibration FILE.npz|DIR``) are split: the last quarter (at least one frame)
   is held back, the rest calibrates.
2. Every tensor's range is measured on the calibration frames (MinMax); the plan embeds them.
3. Each candidate block (one holding a Conv, MatMul or Gemm) gets its sensitivity: the end-to-end loss
   by ``--metric`` of the model with that block alone in int8, on the calibration frames.
4. Its int8 time on each unit: the cost model's fp32 figure times the measured int8/fp32 ratio of the
   block's variants in the cost table (``profiler.variants``), timed here first where missing when the
   device is this machine; a PU that computes int8 only is priced by the cost model as before.
   Where the device has PUs that compute fp16 and fp32 (GPUs), each candidate block also gets its fp16
   sensitivity (the model with that block alone in fp16: real fp16 rounding, run in onnxruntime here) and
   its fp16 time there: the fp32 figure times the measured fp16/fp32 ratio of its variants where the cost
   table has them, else times the roofline's ratio from the PU's ``fp16_peak_ratio`` (labelled with that
   figure's source: spec-sheet or estimate).
5. The ILP chooses placement and precision with the summed sensitivities within the budget
   (``Int8Choice``): fp16 on the PUs that offer it (and int8 there too where the PU computes it and the cost
   table has the block's int8 time there), int8 on the others.
6. Every plan offered is compiled and run end to end (its chained partitions, as the agents run them) on
   the held-back frames; while its loss exceeds the budget, its most sensitive int8 or fp16 block goes back
   to fp32 (``models.precision.repair``). The loss measured is recorded in the plan.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device_profiles.schema import DeviceProfile
from models.errors import ParapipeError
from models.graph import OpGraph
from models.onnx_io import LoadedModel
from models.precision import (
    FP16_METHOD,
    INT8_METHOD,
    METRICS,
    REFUSED_LOSS,
    Frame,
    MixEvaluator,
    PrecisionError,
    RefusedMix,
    assemble,
    assemble_fp16,
    check_precision,
    int8_nodes,
    measure_accuracy,
    quantizable_groups,
    repair,
    sensitivity,
    tensor_ranges,
    write_ranges,
)
from parapipe.preprocess import Preprocess, PreprocessError, image_files, image_frames, parse_preprocess
from planner.costmodel import CostModel
from planner.plan import Plan, PlanPrecision
from planner.problem import Int8Choice
from planner.search import SearchOptions
from profiler.costtable import CostTable, entry_key
from profiler.session import Timer

PRECISION_CHOICES = ("fp32", "auto")
Progress = Callable[[str], None]


class PrecisionPlanError(ParapipeError):
    """The precision options or the calibration data are not usable as given."""


@dataclass(frozen=True)
class PrecisionRequest:
    """``--precision auto`` with its calibration data, metric and budget (0.01 = 1%)."""

    calibration: Path
    budget: float
    metric: str
    preprocess: Preprocess | None = None  # how images in a --calibration folder become the image input


def request_from_flags(
    precision: str,
    calibration: Path | None,
    max_accuracy_loss: str | None,
    metric: str | None,
    preprocess: str | None = None,
) -> PrecisionRequest | None:
    """The CLI's flags checked: None for fp32 plans; clear errors for every combination that cannot work."""
    if precision not in PRECISION_CHOICES:
        raise PrecisionPlanError(f"--precision must be fp32 or auto, not {precision!r}")
    if precision == "fp32":
        given = [f for f, v in (("--calibration", calibration), ("--max-accuracy-loss", max_accuracy_loss)) if v]
        given += ["--metric"] if metric else []
        given += ["--preprocess"] if preprocess else []
        if given:
            verb = "apply" if len(given) > 1 else "applies"
            raise PrecisionPlanError(f"{', '.join(given)} only {verb} with --precision auto; add --precision auto")
        return None
    if calibration is None:
        raise PrecisionPlanError(
            "--precision auto needs --calibration FILE.npz|DIR: sample inputs of the model (an .npz with one array "
            "per input, frames stacked on the first axis, or a folder of such files)"
        )
    if not calibration.exists():
        raise PrecisionPlanError(f"--calibration {calibration}: no such file or folder")
    spec = parse_preprocess(preprocess) if preprocess else None
    return PrecisionRequest(calibration, parse_budget(max_accuracy_loss or "1%"), metric or "relerr", spec)


def sweep_budgets(budget: float) -> tuple[float, ...]:
    """The accuracy budgets a Pareto sweep plans within, up to the user's: none, half of it, all of it."""
    return tuple(sorted({0.0, budget / 2, budget}))


def parse_budget(text: str) -> float:
    """``1%`` or ``0.01`` -> 0.01."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise PrecisionPlanError(f"--max-accuracy-loss {text!r}: give a loss such as 1% or 0.01") from None
    if not (0.0 <= value < 1.0) or value != value:
        raise PrecisionPlanError(f"--max-accuracy-loss {text!r}: give a loss from 0 up to below 100%, e.g. 1%")
    return value


def load_frames(path: Path, loaded: LoadedModel, preprocess: Preprocess | None = None) -> list[dict[str, np.ndarray]]:
    """Frames for the model's inputs from an .npz (one array per input: one frame, or frames stacked on a
    new first axis, or along a batch axis of 1) or from every .npz of a folder, in name order; a folder of
    images (and no .npz) feeds the model's image input through ``preprocess`` (``parapipe.preprocess``)."""
    files = sorted(path.glob("*.npz")) if path.is_dir() else [path]
    if not files and path.is_dir() and image_files(path):
        try:
            return image_frames(path, preprocess, loaded.inputs)
        except PreprocessError as exc:
            raise PrecisionPlanError(f"--calibration {exc}") from None
    if not files:
        raise PrecisionPlanError(f"--calibration {path}: the folder holds no .npz file and no image")
    frames: list[dict[str, np.ndarray]] = []
    for f in files:
        try:
            with np.load(f, allow_pickle=False) as npz:
                arrays = {k: np.asarray(npz[k]) for k in npz.files}
        except (OSError, ValueError) as exc:
            raise PrecisionPlanError(
                f"--calibration {f}: not a readable .npz ({exc}); write it with numpy.savez(path, NAME=frames, ...)"
            ) from None
        frames += _split(arrays, loaded, f)
    return frames


def _split(arrays: Mapping[str, np.ndarray], loaded: LoadedModel, origin: Path) -> list[dict[str, np.ndarray]]:
    per_input: dict[str, list[np.ndarray]] = {}
    for spec in loaded.inputs:
        if spec.name not in arrays:
            raise PrecisionPlanError(
                f"--calibration {origin}: no array named {spec.name!r} (it has {', '.join(arrays) or 'none'}); "
                f"give one array per model input: {', '.join(s.name for s in loaded.inputs)}"
            )
        a, shape = arrays[spec.name], tuple(spec.shape)
        if np.dtype(spec.dtype).kind != a.dtype.kind:
            raise PrecisionPlanError(
                f"--calibration {origin}: {spec.name!r} is {a.dtype}, the model reads {spec.dtype}"
            )
        a = a.astype(spec.dtype, copy=False)
        if a.shape == shape:
            per_input[spec.name] = [a]
        elif a.shape[1:] == shape:
            per_input[spec.name] = list(a)
        elif shape and shape[0] == 1 and a.ndim == len(shape) and a.shape[1:] == shape[1:]:
            per_input[spec.name] = [a[i : i + 1] for i in range(a.shape[0])]
        else:
            raise PrecisionPlanError(
                f"--calibration {origin}: {spec.name!r} has shape {list(a.shape)}; give {list(shape)} for one frame "
                f"or [N, {', '.join(map(str, shape))}] for N frames"
            )
    counts = {len(v) for v in per_input.values()}
    if len(counts) > 1:
        raise PrecisionPlanError(
            f"--calibration {origin}: the inputs hold different numbers of frames {sorted(counts)}"
        )
    n = counts.pop() if counts else 0
    return [{k: np.ascontiguousarray(v[i]) for k, v in per_input.items()} for i in range(n)]


@dataclass
class Auto:
    """What ``--precision auto`` measured for one model on one device: frames, ranges, sensitivities, times."""

    loaded: LoadedModel
    graph: OpGraph
    request: PrecisionRequest
    calibration: list[Frame]
    held_out: list[Frame]
    ranges: dict[str, tuple[float, float]]
    sensitivity: dict[str, float]
    tie_break: dict[str, float]  # relerr sensitivities: rank blocks a discrete metric ties
    ms: dict[tuple[str, str, int], float]
    notes: list[str]
    # fp16 on PUs that compute it (GPUs): each block's loss alone in fp16 (and its relerr, to break ties), its
    # fp16 time per (block, PU, cores) and where that time comes from (measured, or the profile's figure's source)
    fp16_sensitivity: dict[str, float] = dataclasses.field(default_factory=dict)
    fp16_tie_break: dict[str, float] = dataclasses.field(default_factory=dict)
    fp16_ms: dict[tuple[str, str, int], float] = dataclasses.field(default_factory=dict)
    fp16_source: dict[tuple[str, str, int], str] = dataclasses.field(default_factory=dict)
    # what the int8 times were held to on this machine: the mix of blocks faster alone, timed whole (calibrate_int8)
    int8_checks: list[Int8Check] = dataclasses.field(default_factory=list)

    def choice(self, budget: float | None = None) -> Int8Choice:
        """The precision choice for the ILP, within ``budget`` (default: the user's)."""
        budget = self.request.budget if budget is None else budget
        method = f"{INT8_METHOD}, MinMax over {len(self.calibration)} frames"
        sources: dict[str, dict[str, str]] = {}
        for (b, pu, k), src in self.fp16_source.items():
            sources.setdefault(b, {})[f"{pu}x{k}"] = src
        precision = PlanPrecision(
            self.ranges,
            self.request.metric,
            budget,
            len(self.calibration),
            method=method + (f"; fp16: {FP16_METHOD}" if self.fp16_ms else ""),
            fp16_source=sources,
        )
        return Int8Choice(
            self.sensitivity, budget, self.ms, precision, dict(self.fp16_sensitivity) if self.fp16_ms else {},
            self.fp16_ms,
        )  # fmt: skip

    def recosted(self, before: CostModel, after: CostModel, blocks: OpGraph) -> Auto:
        """These measurements under a recalibrated cost model (``parapipe tune``'s next round): each block's int8
        and fp16 time keeps its ratio to the block's fp32 figure, which ``after`` prices anew; accuracy, ranges
        and frames stay as measured (they do not depend on the timing)."""
        members = {b.name: b.members for b in blocks.nodes}

        def moved(times: Mapping[tuple[str, str, int], float]) -> dict[tuple[str, str, int], float]:
            out = {}
            for (b, pu, k), ms in times.items():
                old = before.block_ms(members[b], pu, k)
                out[(b, pu, k)] = ms * after.block_ms(members[b], pu, k) / old if old > 0 else ms
            return out

        return dataclasses.replace(self, ms=moved(self.ms), fp16_ms=moved(self.fp16_ms))

    def loss_alone(self, block: str, precision: str) -> float:
        """The block's sensitivity in ``precision`` (int8 or fp16)."""
        table = self.fp16_sensitivity if precision == "fp16" else self.sensitivity
        return table.get(block, 0.0)


def measure(
    loaded: LoadedModel,
    graph: OpGraph,
    blocks: OpGraph,
    cost: CostModel,
    table: CostTable,
    costs_path: Path | None,
    request: PrecisionRequest,
    local: bool,
    progress: Progress,
    frames: tuple[list[Frame], list[Frame]] | None = None,
) -> Auto:
    """Steps 1-4: frames, ranges, sensitivities and int8 times of the candidate blocks. ``frames``: the
    calibration and held-back frames as given (else read from ``request.calibration`` and split)."""
    if request.metric not in METRICS:
        raise PrecisionPlanError(f"--metric must be one of {', '.join(METRICS)}, not {request.metric!r}")
    if frames is None:
        given = load_frames(request.calibration, loaded, request.preprocess)
        if len(given) < 2:
            raise PrecisionPlanError(
                f"--calibration {request.calibration}: {len(given)} frame(s); give at least 2 (a quarter is held "
                "back to check each plan), better 16 or more"
            )
        held = max(1, len(given) // 4)
        calibration, held_out = given[:-held], given[-held:]
    else:
        calibration, held_out = list(frames[0]), list(frames[1])
    progress(f"calibration ranges on {len(calibration)} frames")
    ranges = tensor_ranges(loaded, calibration)
    groups = quantizable_groups(graph, {b.name: b.members for b in blocks.nodes})
    if not groups:
        raise PrecisionPlanError(
            "the model has no Conv, MatMul or Gemm for int8 to speed up; plan with --precision fp32"
        )
    with tempfile.TemporaryDirectory(prefix="parapipe-auto-") as tmp:
        cache = write_ranges(ranges, Path(tmp) / "ranges.json")
        evaluator = MixEvaluator(loaded, groups, calibration, request.metric, cache)
        try:
            evaluator.loss([], request.metric)
        except KeyError:
            raise PrecisionPlanError(
                f"--metric {request.metric}: does not apply to this model's outputs ({METRICS[request.metric].description})"
            ) from None
        done = [0]

        def each(int8):  # type: ignore[no-untyped-def]
            done[0] += 1
            progress(f"sensitivity of each block alone in int8: {done[0] - 1}/{len(groups)}")
            return evaluator.loss(int8)

        sens = sensitivity(each, groups)
        rel = sensitivity(lambda s: evaluator.loss(s, "relerr"), groups)  # the same runs, kept
        ms, notes = int8_times(loaded, groups, calibration, cost, table, costs_path, local, progress)
        checks: list[Int8Check] = []
        if local and ms:
            progress("timing the whole model in fp32 and with the blocks faster in int8 in int8, on each core count")
            ms, checks, more = calibrate_int8(ms, loaded, groups, cost, cache, calibration[0])
            notes += more
        # fp16 candidates: the blocks a PU that computes fp16 (a GPU) can run at all
        half_pus = [p for p in cost.profile.pus if p.computes("fp16") and p.computes("fp32")]
        op_types = {n.name: n.op_type for n in graph.nodes}
        runnable = {g: m for g, m in groups.items() if any(all(p.supports(op_types[x]) for x in m) for p in half_pus)}
        half_ms, half_source, more = fp16_times(loaded, runnable, cost, table)
        notes += more
        half_sens: dict[str, float] = {}
        half_rel: dict[str, float] = {}
        if half_ms:
            half_sens, half_rel = fp16_sensitivity(loaded, runnable, calibration, evaluator, request.metric, progress)
    return Auto(
        loaded, graph, request, calibration, held_out, ranges, sens, rel, ms, notes, half_sens, half_rel, half_ms,
        half_source, checks,
    )  # fmt: skip


def fp16_sensitivity(
    loaded: LoadedModel,
    groups: Mapping[str, Sequence[str]],
    calibration: Sequence[Frame],
    evaluator: MixEvaluator,
    metric_name: str,
    progress: Progress,
) -> tuple[dict[str, float], dict[str, float]]:
    """Per candidate block: the end-to-end loss (by ``metric_name``, and by relerr) of the model with that block
    alone in fp16, on the calibration frames. The fp16 model runs in onnxruntime on this CPU: its numerics are
    real fp16 rounding, whatever PU the block is planned for."""
    sens: dict[str, float] = {}
    rel: dict[str, float] = {}
    for i, (g, members) in enumerate(groups.items()):
        progress(f"sensitivity of each block alone in fp16: {i}/{len(groups)}")
        try:
            got = assemble_fp16(loaded, members).run(calibration)
        except Exception:  # onnxruntime has no fp16 kernel for an operator here: never offer it in fp16
            sens[g] = rel[g] = REFUSED_LOSS
            continue
        acc = measure_accuracy(evaluator.reference, got, METRICS)
        sens[g] = acc.loss(metric_name)
        rel[g] = acc.loss("relerr")
    return sens, rel


def fp16_times(
    loaded: LoadedModel, groups: Mapping[str, Sequence[str]], cost: CostModel, table: CostTable
) -> tuple[dict[tuple[str, str, int], float], dict[tuple[str, str, int], str], list[str]]:
    """(block, PU, cores) -> fp16 ms on the PUs that compute fp16 and fp32 (GPUs), with each figure's source: the
    calibrated fp32 figure times the measured fp16/fp32 ratio of the block's variants where the cost table has
    them ("measured"), else times the roofline's fp16/fp32 ratio from the PU's ``fp16_peak_ratio`` (labelled with
    that figure's source). A PU with neither offers no fp16."""
    from profiler.roofline import Roofline

    profile: DeviceProfile = cost.profile
    pus = [p for p in profile.pus if p.computes("fp16") and p.computes("fp32")]
    ms: dict[tuple[str, str, int], float] = {}
    source: dict[tuple[str, str, int], str] = {}
    notes: list[str] = []
    if not pus:
        return ms, source, notes
    by_members = {tuple(m): g for g, m in groups.items()}
    names = {p.name for p in pus}
    for e in table.select(model_sha256=loaded.sha256, kind="block", board=profile.name, precision="fp16"):
        block = by_members.get(tuple(e.members))
        if block is None or e.conditions.pu not in names:
            continue
        twin = table.entries.get(
            entry_key(loaded.sha256, "block", e.members, dataclasses.replace(e.conditions, precision="fp32"))
        )
        if twin is None or twin.median_ms <= 0:
            continue
        pu = profile.pu(e.conditions.pu)
        cores = e.conditions.cores if pu.kind == "cpu" else 1
        ms[(block, pu.name, cores)] = cost.block_ms(groups[block], pu.name, cores) * e.median_ms / twin.median_ms
        source[(block, pu.name, cores)] = "measured"
    roofline = Roofline(profile, cost.graph)
    for pu in pus:
        ratio = pu.fp16_peak_ratio
        if ratio is None:
            if not any(p == pu.name for _, p, _ in ms):
                notes.append(
                    f"PU {pu.name} computes fp16 but the cost table has no fp16 times of this model's blocks on it and "
                    "its profile gives no fp16_peak_ratio: fp16 is not offered there"
                )
            continue
        sizes = range(1, len(pu.cores) + 1) if pu.kind == "cpu" else (1,)
        for k in sizes:
            for g, members in groups.items():
                if (g, pu.name, k) in ms:
                    continue
                ms[(g, pu.name, k)] = cost.block_ms(members, pu.name, k) * roofline.fp16_ratio(members, pu.name, k)
                source[(g, pu.name, k)] = ratio.source
        derived = sum(1 for (_, p, _), src in source.items() if p == pu.name and src != "measured")
        if derived:
            notes.append(
                f"fp16 on {pu.name}: {derived} block time(s) derived from its fp16 peak ({ratio.value:g}x fp32, "
                f"{ratio.source}: {ratio.cite}), not measured"
            )
    return ms, source, notes


def int8_times(
    loaded: LoadedModel,
    groups: Mapping[str, Sequence[str]],
    calibration: Sequence[Frame],
    cost: CostModel,
    table: CostTable,
    costs_path: Path | None,
    local: bool,
    progress: Progress,
) -> tuple[dict[tuple[str, str, int], float], list[str]]:
    """(block, PU, cores) -> int8 ms on PUs that compute fp32 too: the calibrated fp32 figure times the measured
    int8/fp32 ratio of the block's variants, timed here where the table has none and the device is this one."""
    from profiler.session import pu_configs
    from profiler.variants import VariantOptions, time_variants

    profile: DeviceProfile = cost.profile
    # the CPU clusters here can be timed (a board's GPU or NPU is priced from its profile)
    timed = [p.name for p in profile.pus if p.kind == "cpu" and p.execution_provider == "CPUExecutionProvider"]
    configs = [
        c for c in pu_configs(profile, timed) if profile.pu(c.pu).computes("fp32") and profile.pu(c.pu).computes("int8")
    ]
    notes: list[str] = []
    if local and configs:
        options = VariantOptions(("fp32", "int8"), progress=progress)  # entries already in the table are reused
        time_variants(loaded, groups, calibration[:2], profile, configs, options, table)
        if costs_path is not None:
            table.save(costs_path)
    by_members = {tuple(m): g for g, m in groups.items()}
    ms: dict[tuple[str, str, int], float] = {}
    for e in table.select(model_sha256=loaded.sha256, kind="block", board=profile.name, precision="int8"):
        block = by_members.get(tuple(e.members))
        if block is None:
            continue
        twin = table.entries.get(
            entry_key(loaded.sha256, "block", e.members, dataclasses.replace(e.conditions, precision="fp32"))
        )
        pu = profile.pu(e.conditions.pu) if e.conditions.pu in {p.name for p in profile.pus} else None
        if twin is None or pu is None or not pu.computes("fp32") or twin.median_ms <= 0:
            continue
        ratio = e.median_ms / twin.median_ms
        cores = e.conditions.cores if pu.kind == "cpu" else 1  # a GPU is one unit (as fp16_times keys it)
        ms[(block, pu.name, cores)] = cost.block_ms(groups[block], pu.name, cores) * ratio
    if configs and not ms:
        notes.append(
            f"no int8 times of this model's blocks on {profile.name}'s CPUs in the cost table: int8 is offered on "
            "PUs that compute int8 only"
        )
    return ms, notes


# How far the whole model's measurement may move the blocks' own int8 savings: at most this many times what they
# claim, and a block never below this share of its fp32 time (int8 arithmetic is at most 4x fp32's on a CPU's
# vector units, and a block keeps its quantise/dequantise): guards against a measurement taken under a burst
# of load on a shared machine
MAX_INT8_SCALE = 2.0
MIN_INT8_SHARE = 0.2


@dataclass(frozen=True)
class Int8Check:
    """``calibrate_int8`` on one (PU, cores): the model with the blocks that claimed a saving there in int8,
    against fp32, timed as one session each (medians over interleaved rounds), and what it made of the claims."""

    label: str  # the PuConfig's label, e.g. cpux2
    blocks: tuple[str, ...]  # the blocks whose int8 time alone was below their fp32 time
    fp32_ms: float
    int8_ms: float
    measured: float  # share of the whole model's fp32 time the mix saved: the median of the rounds' ratios
    claimed: float  # share the blocks' own int8 times claimed
    scale: float  # what their savings were scaled by


def calibrate_int8(
    ms: Mapping[tuple[str, str, int], float],
    loaded: LoadedModel,
    groups: Mapping[str, Sequence[str]],
    cost: CostModel,
    ranges: Path,
    frame: Frame,
    timer: Timer | None = None,
    rounds: int = 5,
) -> tuple[dict[tuple[str, str, int], float], list[Int8Check], list[str]]:
    """The blocks' int8 times held to the whole model. On each (PU, cores) they are given for, the blocks whose
    int8 time alone (cut out of the model) is below their fp32 time are the ones a plan would put in int8
    there; the model with those blocks in int8 (as plans quantise them) and the model in fp32 are timed as one
    session each, interleaved over ``rounds`` rounds, and the median of the rounds' int8/fp32 ratios is the
    share of the model's time the mix saves, measured. Against the share those blocks' own times claim, it
    scales what each of them saves there (at most MAX_INT8_SCALE, never below MIN_INT8_SHARE of the fp32
    time); where the mix was no faster, int8 is not offered for them there (it would save nothing and cost
    accuracy). A block alone can gain more,
    or less, from int8 than inside the model, where onnxruntime fuses across its boundary and its threads wait
    for each other once per operator; the whole model's run says which. Blocks slower in int8 alone keep their
    times (a plan does not put them in int8 to save time). Where the mix cannot be made the times stay."""
    from profiler.measure import PuConfig
    from profiler.variants import VariantOptions, time_interleaved

    out = dict(ms)
    checks: list[Int8Check] = []
    notes: list[str] = []
    every = [n.name for n in cost.graph.nodes]
    fp32_model = loaded.ort_proto.SerializeToString()
    mixes: dict[tuple[str, ...], bytes] = {}
    for pu, cores in sorted({(p, c) for _, p, c in ms}):
        spec = cost.profile.pu(pu)
        if spec.kind != "cpu" or cores > len(spec.cores):
            continue
        throttle = spec.throttle.quota_percent if spec.throttle else None
        cfg = PuConfig(pu, spec.cores[:cores], cores, spec.execution_provider, throttle)
        # in the blocks' own unit (their calibrated shares, from the same profile): a fused time measured at
        # another moment, under another load, would skew the share they claim
        fp32 = {g: cost.block_ms(groups[g], pu, cores) for g in groups if (g, pu, cores) in out}
        saved = {g: t - out[(g, pu, cores)] for g, t in fp32.items() if t > out[(g, pu, cores)]}
        whole = cost.block_ms(every, pu, cores)
        if not saved or whole <= 0:
            continue
        chosen = tuple(sorted(saved))
        if chosen not in mixes:
            try:
                mixes[chosen] = assemble(loaded, ranges, int8_nodes=int8_nodes(groups, chosen)).model
            except PrecisionError as exc:  # RefusedMix included: onnxruntime cannot run this mix in one session
                notes.append(f"int8 on {cfg.label}: times not checked against the whole model: {exc}")
                continue
        models = {"fp32": fp32_model, "int8": mixes[chosen]}
        times = time_interleaved(models, frame, cost.profile, [cfg], rounds, VariantOptions(repeats=12, timer=timer))
        pairs = [(f, m) for f, m in zip(times[("fp32", cfg.label)], times[("int8", cfg.label)], strict=True) if f > 0]
        if not pairs:
            continue
        measured = 1.0 - statistics.median(m / f for f, m in pairs)
        claimed = sum(saved.values()) / whole
        scale = min(MAX_INT8_SCALE, max(0.0, measured / claimed))
        for g, s in saved.items():
            if scale > 0:
                out[(g, pu, cores)] = max(fp32[g] - scale * s, MIN_INT8_SHARE * fp32[g])
            else:  # int8 saves nothing here: not offered (at fp32's time it would only cost accuracy)
                del out[(g, pu, cores)]
        check = Int8Check(
            cfg.label,
            chosen,
            statistics.median(f for f, _ in pairs),
            statistics.median(m for _, m in pairs),
            measured,
            claimed,
            scale,
        )
        checks.append(check)
        notes.append(
            f"int8 on {cfg.label}: the {len(chosen)} block(s) faster in int8 alone, in int8 together, measured "
            f"{abs(measured):.1%} {'faster' if measured >= 0 else 'slower'} than fp32 in one session (median of "
            f"{len(pairs)} interleaved rounds, "
            f"{check.fp32_ms:.3g} -> {check.int8_ms:.3g} ms); alone they claimed {claimed:.1%}: their int8 "
            f"savings scaled by {scale:.2f}"
        )
    return out, checks, notes


def grow(plan: Plan, auto: Auto, cost: CostModel, graph: OpGraph, progress: Progress) -> Plan:
    """More int8 blocks where the plan runs them, while the loss measured on the calibration frames stays within
    the budget: the ILP bounds the sum of the blocks' losses alone in int8, which over-counts a mix (a detector's
    seventeen blocks summing to 1% lost 0.3% together). Candidates are the blocks whose int8 time is below their
    fp32 time on every unit running them, most time saved per unit of sensitivity first; the longest run of them
    the budget holds is found by bisection (a handful of measurements). The held-back check follows."""
    if not plan.int8 or plan.precision is None:
        return plan
    from planner.build import evaluate

    int8 = set(plan.int8)
    where: dict[str, list[tuple[str, int]]] = {}
    for _, _, a in plan.assignments():
        for b in a.blocks:
            where.setdefault(b, []).append((str(a.pu), a.cores))
    gains: dict[str, float] = {}
    for b in auto.sensitivity:
        if b in int8 or b in plan.fp16 or b not in where:
            continue
        saved = [cost.block_ms(plan.blocks[b], pu, k) - auto.ms.get((b, pu, k), float("inf")) for pu, k in where[b]]
        if all(x > 0 for x in saved):
            gains[b] = min(saved)
    if not gains:
        return plan
    order = sorted(gains, key=lambda b: (-gains[b] / max(auto.sensitivity[b], 1e-9), auto.tie_break.get(b, 0.0)))
    groups = {b: tuple(plan.blocks[b]) for b in auto.sensitivity}
    with tempfile.TemporaryDirectory(prefix="parapipe-grow-") as tmp:
        evaluator = MixEvaluator(
            auto.loaded, groups, auto.calibration, auto.request.metric, write_ranges(auto.ranges, Path(tmp) / "r.json")
        )
        lo, hi = 0, len(order)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            progress(f"trying {len(int8) + mid} int8 blocks on {len(auto.calibration)} calibration frames")
            if evaluator.loss([*int8, *order[:mid]]) <= plan.precision.budget:
                lo = mid
            else:
                hi = mid - 1
    if lo == 0:
        return plan
    added = set(order[:lo])
    assert plan.precision is not None
    times = {b: dict(t) for b, t in plan.precision.int8_ms.items()}
    for b in added:
        times[b] = {f"{pu}x{k}": auto.ms[(b, pu, k)] for pu, k in where[b]}
    grown = dataclasses.replace(
        plan,
        int8=tuple(b for b in plan.blocks if b in int8 | added),
        precision=dataclasses.replace(plan.precision, int8_ms=times),
        notes=(*plan.notes, f"{lo} more block(s) in int8: the mix still within the budget on the calibration frames"),
    )
    return evaluate(grown, graph, cost)


def check_and_repair(
    plan: Plan, auto: Auto, cost: CostModel, graph: OpGraph, progress: Progress
) -> tuple[Plan, tuple[str, ...]]:
    """Step 6: the plan's chained partitions on the held-back frames against fp32; while over budget, its most
    sensitive int8 or fp16 block back to fp32. Returns the plan (re-priced, with the loss it measured) and the
    blocks put back."""
    if not plan.reduced or plan.precision is None:
        return plan, ()
    import onnxruntime as ort

    from compiler import compile_plan, run_chained
    from planner.build import evaluate

    plan = grow(plan, auto, cost, graph, progress)
    budget = plan.precision.budget if plan.precision is not None else auto.request.budget

    full = ort.InferenceSession(auto.loaded.ort_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in full.get_outputs()]
    reference = [dict(zip(names, full.run(None, dict(f)), strict=True)) for f in auto.held_out]
    measured: dict[frozenset[str], tuple[tuple[str, float], ...]] = {}

    def with_int8(reduced: Sequence[str]) -> Plan:
        """The plan with only the ``reduced`` blocks of its int8 and fp16 ones left in their precision."""
        keep = set(reduced)
        kept, half = tuple(b for b in plan.int8 if b in keep), tuple(b for b in plan.fp16 if b in keep)
        assert plan.precision is not None
        precision = dataclasses.replace(
            plan.precision,
            int8_ms={b: t for b, t in plan.precision.int8_ms.items() if b in kept},
            fp16_ms={b: t for b, t in plan.precision.fp16_ms.items() if b in half},
            fp16_source={b: t for b, t in plan.precision.fp16_source.items() if b in half},
        )
        return dataclasses.replace(plan, int8=kept, fp16=half, precision=precision if kept or half else None)

    def loss(int8) -> float:  # type: ignore[no-untyped-def]
        key = frozenset(int8)
        if key not in measured:
            progress(
                f"checking {plan.name} end to end on {len(auto.held_out)} held-back frames ({len(key)} int8/fp16 "
                "blocks)"
            )
            trial = with_int8(tuple(key))
            try:
                compiled = compile_plan(trial, auto.loaded, graph, cost.profile, verify=False)
            except RefusedMix:  # onnxruntime cannot run a partition of this mix: as bad as a mix can be
                measured[key] = ((auto.request.metric, REFUSED_LOSS),)
                return REFUSED_LOSS
            period, sessions = compiled.manifest.replica_period(), {}
            got = [
                run_chained(compiled.manifest, compiled.files, dict(f), k % period, sessions)
                for k, f in enumerate(auto.held_out)
            ]
            measured[key] = check_precision(reference, got, auto.request.metric, budget).accuracy.losses
        return dict(measured[key])[auto.request.metric]

    sens = {b: auto.loss_alone(b, plan.precision_of(b)) for b in plan.reduced}
    ties = {b: (auto.fp16_tie_break if b in plan.fp16 else auto.tie_break).get(b, 0.0) for b in plan.reduced}
    fixed = repair(plan.reduced, sens, loss, budget, tie_break=ties, refill=False)
    repaired = with_int8(fixed.int8)
    if repaired.precision is not None:
        repaired = dataclasses.replace(
            repaired,
            precision=dataclasses.replace(
                repaired.precision, measured=measured[frozenset(fixed.int8)], held_out_frames=len(auto.held_out)
            ),
        )
    if fixed.reverted:
        repaired = evaluate(repaired, graph, cost)
        note = f"{len(fixed.reverted)} int8/fp16 block(s) put back to fp32 to hold the budget on held-back frames"
        repaired = dataclasses.replace(repaired, notes=(*repaired.notes, note))
    return repaired, fixed.reverted


def precision_plans(
    blocks: OpGraph,
    graph: OpGraph,
    cost: CostModel,
    search: SearchOptions,
    auto: Auto,
    objective: str,
    progress: Progress,
) -> tuple[list[Plan], dict[str, tuple[str, ...]]]:
    """The plans ``--precision auto`` offers for ``objective`` (``plan`` and every round of ``tune``), each
    checked end to end on the held-back frames and repaired within the budget; with the blocks each plan put
    back to fp32, by plan name. ``pareto``: the Pareto sweep within a few accuracy budgets up to the user's
    (``sweep_budgets``), the front over latency, throughput, energy and the accuracy loss measured."""
    from planner.problem import build_problem
    from planner.search import best_plan, pareto_front, pareto_set

    reverted: dict[str, tuple[str, ...]] = {}
    if objective != "pareto":
        problem = build_problem(blocks, graph, cost, search.max_stages, int8=auto.choice())
        plan = best_plan(blocks, graph, cost, objective, search, problem=problem)
        return checked_plans([plan], auto, cost, graph, progress, reverted), reverted
    found: list[Plan] = []
    back: dict[str, tuple[str, ...]] = {}
    for budget in sweep_budgets(auto.request.budget):
        progress(f"Pareto sweep within an accuracy loss of {budget:g}")
        problem = build_problem(blocks, graph, cost, search.max_stages, int8=auto.choice(budget))
        plans = pareto_set(blocks, graph, cost, search, problem=problem)
        plans = [dataclasses.replace(p, name=f"{p.name.split('-', 2)[-1]}@loss{budget:g}") for p in plans]
        found += checked_plans(plans, auto, cost, graph, progress, back)
    front = []
    for i, p in enumerate(pareto_front(found)):
        front.append(dataclasses.replace(p, name=f"pareto-{i}-{p.name}"))
        reverted[front[-1].name] = back.get(p.name, ())
    return front, reverted


def checked_plans(
    plans: list[Plan],
    auto: Auto,
    cost: CostModel,
    graph: OpGraph,
    progress: Progress,
    reverted: dict[str, tuple[str, ...]],
) -> list[Plan]:
    """Every plan checked end to end on the held-back frames and repaired before it is offered."""
    out = []
    for p in plans:
        fixed, back = check_and_repair(p, auto, cost, graph, progress)
        out.append(fixed)
        reverted[p.name] = back
    return out
