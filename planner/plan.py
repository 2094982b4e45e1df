"""``Plan``: where every block runs, stage by stage; the one type for solved, baseline and hand-written plans.

Serialised as versioned JSON. A plan names its blocks (block -> ONNX node names), so
it can be cut out of the model without re-coarsening; each stage holds one or more
replica groups (frame f goes to group f mod R), each group a set of PU assignments.
A plan runs every block in fp32 unless it names blocks in ``int8`` or ``fp16``; such a plan
carries what building and checking them takes (``PlanPrecision``: the calibration ranges, the
accuracy metric and budget, the accuracy measured when it was planned), so it stays one
self-contained file. All-fp32 plans are written as version 1 (as before precisions existed);
plans with int8 blocks as version 2 and plans with fp16 blocks as version 3, which an older
parapipe refuses rather than run those blocks in fp32.
``validate`` checks a plan against the model graph and the device profile and names
the field that is wrong.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from device_profiles.schema import DeviceProfile, ProcessingUnit
from models.errors import ModelError, ParapipeError
from models.files import atomic_write
from models.graph import OpGraph
from models.inputs import InputSpec
from models.schema import first_problem, load_record, record_schema
from planner.unitname import UnitName

INT8_PLAN_VERSION = 2  # plans with int8 blocks (and none in fp16): what parapipes that know int8 only read
PLAN_VERSION = 3  # the newest version this parapipe writes (for plans with fp16 blocks)
FP32_PLAN_VERSION = 1  # all-fp32 plans keep version 1, so older parapipes still read them
# Frames whose outputs a unit holds at once: the one it is producing and the one waiting in the bounded
# queue in front of its consumer (the executor's queues hold one frame). A bound, not a measurement.
ACTIVATION_FRAMES = 2


class PlanError(ParapipeError):
    """A plan is malformed, does not fit its model or board, or no plan meets the request."""


@dataclass(frozen=True)
class Assignment:
    """Blocks one processing unit runs for a stage, with ``cores`` threads.

    On a CPU cluster several assignments may share the PU on disjoint cores
    (``core_ids``; empty means "the next free cores of the PU, in plan order").
    A unit whose blocks wait on another unit of the same stage and then continue
    runs them as several partitions (segments), see ``planner.segments``.
    """

    pu: UnitName  # one PU, or the CPU clusters one session spans (a plain str given is parsed)
    cores: int
    blocks: tuple[str, ...]  # in the order the unit runs them (data-flow order where that contradicts it)
    core_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "pu", UnitName(self.pu))


@dataclass(frozen=True)
class Stage:
    groups: tuple[tuple[Assignment, ...], ...]  # replica groups; len == 1 without replication

    @property
    def replicas(self) -> int:
        return len(self.groups)

    def pus(self) -> list[str]:
        return [a.pu for g in self.groups for a in g]


@dataclass(frozen=True)
class Predicted:
    latency_ms: float
    throughput_fps: float
    energy_mj: float
    energy_source: str = "modelled"
    method: str = "analytic"  # analytic | simulated


@dataclass(frozen=True)
class Provenance:
    """How a plan was found. ``method``: "ilp" (the solver's incumbent), "heuristic:<name>" (a heuristic
    given to the solver as a start predicted better), "+replicated" appended when replication then improved
    it, "baseline:<name>", "hand". ``status``, ``gap``, ``bound`` and ``solver_value`` are the solver's own:
    its objective value for its own incumbent, in the unit of the predicted figure (``latency_ms``,
    ``throughput_fps`` or ``energy_mj``), None when it found none. A latency's value and bound include the
    frame overhead of a pipeline of several partitions (``CostModel.frame_overhead_ms``), which the ILP, the
    same for all such plans, leaves out of its model; ``gap`` is the solver's, on its model."""

    method: str = "hand"
    solver: str = ""
    status: str = ""
    objective: str = ""
    gap: float | None = None
    bound: float | None = None
    seconds: float = 0.0
    solver_value: float | None = None


@dataclass(frozen=True)
class PlanPrecision:
    """What the int8 blocks of a plan need to be built and checked, embedded in the plan.

    ``ranges``: each tensor's (lowest, highest) value over the calibration frames (MinMax), from which
    the compiler quantises the int8 nodes of each partition (static QDQ, per-channel weights);
    ``metric`` and ``budget``: the accuracy loss against fp32 the plan promises to stay within
    (``models.precision.METRICS``; 0.01 = 1%); ``measured``: the losses measured end to end on
    held-back frames when it was planned (metric -> loss, over ``held_out_frames`` frames)."""

    ranges: Mapping[str, tuple[float, float]]
    metric: str = "relerr"
    budget: float = 0.01
    calibration_frames: int = 0
    measured: tuple[tuple[str, float], ...] = ()
    held_out_frames: int = 0
    method: str = ""
    # block -> "PUxCORES" -> its int8 time there (ms), where the PU computes fp32 too: what predictions price
    # the block at (the cost model prices blocks in fp32)
    int8_ms: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # the same for fp16 blocks, with where each time comes from (block -> "PUxCORES" -> source: measured, or
    # the profile's fp16 peak's source: spec-sheet / estimate)
    fp16_ms: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    fp16_source: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ranges"] = {t: [lo, hi] for t, (lo, hi) in self.ranges.items()}
        data["measured"] = dict(self.measured)
        data["int8_ms"] = {b: dict(t) for b, t in self.int8_ms.items()}
        data["fp16_ms"] = {b: dict(t) for b, t in self.fp16_ms.items()}
        data["fp16_source"] = {b: dict(t) for b, t in self.fp16_source.items()}
        if not self.fp16_ms and not self.fp16_source:  # an int8 plan's file as it was
            del data["fp16_ms"], data["fp16_source"]
        return data


@dataclass(frozen=True)
class Plan:
    model_sha256: str
    model_name: str
    device: str
    device_sha256: str
    granularity: str
    blocks: Mapping[str, tuple[str, ...]]
    stages: tuple[Stage, ...]
    provenance: Provenance
    predicted: Predicted | None = None
    simulated: Predicted | None = None
    name: str = ""
    pipelined: bool = True  # False: one frame at a time (the para-only and list-scheduling baselines)
    model_path: str = ""  # where the model was when planned (a hint; the hash is what binds)
    version: int = field(default=FP32_PLAN_VERSION, compare=False)  # as read; written from the content (to_json)
    notes: tuple[str, ...] = field(default=())
    inputs: tuple[InputSpec, ...] = ()  # the input shapes/dtypes (and how frames are made) it was planned for
    int8: tuple[str, ...] = ()  # blocks that run in int8 (static QDQ); every other block runs in fp32
    precision: PlanPrecision | None = None  # what the int8/fp16 blocks need; None for an all-fp32 plan
    fp16: tuple[str, ...] = ()  # blocks that run in fp16 (on PUs that compute fp16: GPUs)

    def precision_of(self, block: str) -> str:
        return "int8" if block in self.int8 else "fp16" if block in self.fp16 else "fp32"

    @property
    def reduced(self) -> tuple[str, ...]:
        """The blocks that do not run in fp32 (int8 and fp16), in block order."""
        return tuple(b for b in self.blocks if b in self.int8 or b in self.fp16)

    def reduced_ms(self, block: str, config: str) -> float | None:
        """The time the plan records for a block in its int8 or fp16 precision on ``PUxCORES``; None for fp32."""
        if self.precision is None:
            return None
        table = self.precision.int8_ms if block in self.int8 else self.precision.fp16_ms if block in self.fp16 else {}
        return table.get(block, {}).get(config)

    def accuracy_loss(self) -> float:
        """The loss against fp32 by the plan's metric, as measured end to end when it was planned: 0 for an all-fp32
        plan; the budget it promises where it was not measured."""
        if not self.int8 and not self.fp16:
            return 0.0
        if self.precision is None:
            return 1.0
        return dict(self.precision.measured).get(self.precision.metric, self.precision.budget)

    def precision_mix(self) -> str:
        """``fp32``, or e.g. ``int8 12/40 blocks (310 of 860 nodes)``, ``fp16 5/40 blocks (...)``, or both joined
        by ``+``."""
        if not self.int8 and not self.fp16:
            return "fp32"
        total = sum(len(m) for m in self.blocks.values())
        parts = []
        for name, chosen in (("int8", self.int8), ("fp16", self.fp16)):
            if chosen:
                nodes = sum(len(self.blocks[b]) for b in chosen if b in self.blocks)
                parts.append(f"{name} {len(chosen)}/{len(self.blocks)} blocks ({nodes} of {total} nodes)")
        return " + ".join(parts)

    def replica_period(self) -> int:
        """Frames after which replica groups repeat: frame f runs on group f mod R of each stage."""
        return math.lcm(*(st.replicas for st in self.stages)) if self.stages else 1

    def assignments(self) -> list[tuple[int, int, Assignment]]:
        """(stage index, replica group, assignment) for every assignment."""
        return [(s, g, a) for s, stage in enumerate(self.stages) for g, group in enumerate(stage.groups) for a in group]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["blocks"] = {k: list(v) for k, v in self.blocks.items()}
        data["inputs"] = [s.to_json() for s in self.inputs]
        data["int8"] = list(self.int8)
        data["fp16"] = list(self.fp16)
        data["precision"] = self.precision.to_json() if self.precision else None
        data["version"] = PLAN_VERSION if self.fp16 else INT8_PLAN_VERSION if self.int8 else FP32_PLAN_VERSION
        if not self.fp16:
            del data["fp16"]
        if not self.int8 and not self.fp16 and self.precision is None:  # an fp32 plan's file as it always was
            del data["int8"], data["precision"]
        return data

    def save(self, path: Path) -> Path:
        return atomic_write(path, json.dumps(self.to_json(), indent=2) + "\n")


class _File(BaseModel):
    """A part of a plan file. Fields this parapipe does not know are ignored (a newer one may have written them)."""

    model_config = ConfigDict(strict=True, frozen=True)


class _AssignmentFile(_File):
    pu: UnitName
    cores: int = Field(ge=1)
    blocks: list[str]
    core_ids: list[int] = []

    @field_validator("pu", mode="plain")
    @classmethod
    def _unit(cls, value: object) -> UnitName:
        if not isinstance(value, str):
            raise ValueError(f"expected a PU name, got {value!r}")
        return UnitName(value)


class _PrecisionFile(_File):
    ranges: dict[str, Annotated[list[float], Field(min_length=2, max_length=2)]]
    metric: str = "relerr"
    budget: float = Field(default=0.01, ge=0.0, allow_inf_nan=False)
    calibration_frames: int = Field(default=0, ge=0)
    measured: dict[str, float] = {}
    held_out_frames: int = Field(default=0, ge=0)
    method: str = ""
    int8_ms: dict[str, dict[str, Annotated[float, Field(ge=0.0, allow_inf_nan=False)]]] = {}
    fp16_ms: dict[str, dict[str, Annotated[float, Field(ge=0.0, allow_inf_nan=False)]]] = {}
    fp16_source: dict[str, dict[str, str]] = {}

    @field_validator("ranges", mode="after")
    @classmethod
    def _ranges(cls, value: dict[str, list[float]]) -> dict[str, list[float]]:
        for t, (lo, hi) in value.items():
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
                raise ValueError(f"tensor {t!r}: [{lo}, {hi}] is not a range (finite lowest <= highest)")
        return value

    @field_validator("metric", mode="after")
    @classmethod
    def _metric(cls, value: str) -> str:
        from models.precision import METRICS

        if value not in METRICS:
            raise ValueError(f"unknown metric {value!r}; one of {', '.join(METRICS)}")
        return value


class _StageFile(_File):
    groups: list[Annotated[list[_AssignmentFile], Field(min_length=1)]] = Field(min_length=1)


_ProvenanceFile = record_schema(Provenance, extra="ignore")
_PredictedFile = record_schema(Predicted, extra="ignore")


class _PlanFile(_File):
    version: int
    model_sha256: str
    model_name: str = ""
    device: str
    device_sha256: str = ""
    granularity: str = "custom"
    blocks: dict[str, Annotated[list[str], Field(min_length=1)]]
    stages: list[_StageFile] = Field(min_length=1)
    provenance: _ProvenanceFile = _ProvenanceFile()  # type: ignore[valid-type]
    predicted: _PredictedFile | None = None  # type: ignore[valid-type]
    simulated: _PredictedFile | None = None  # type: ignore[valid-type]
    name: str = ""
    pipelined: bool = True
    model_path: str = ""
    notes: list[str] = []
    inputs: list[dict[str, Any]] = []
    int8: list[str] = []
    fp16: list[str] = []
    precision: _PrecisionFile | None = None


def plan_from_json(data: Any, origin: str = "plan") -> Plan:
    """Parse and shape-check a plan (hand-written or solved); errors name the field."""
    if not isinstance(data, Mapping):
        raise PlanError(f"{origin}: a plan is a JSON object")
    version = data.get("version")
    if version is not None and version not in (FP32_PLAN_VERSION, INT8_PLAN_VERSION, PLAN_VERSION):
        raise PlanError(
            f"version: {version!r} is not supported; this parapipe reads plan versions {FP32_PLAN_VERSION} to "
            f"{PLAN_VERSION}"
        )
    try:
        checked = _PlanFile.model_validate(data)
    except ValidationError as exc:
        raise PlanError(f"{first_problem(exc)}; fix that field, or plan again with `parapipe plan`") from None
    stages = tuple(_stage(stage, s, checked.blocks) for s, stage in enumerate(checked.stages))
    return Plan(
        model_sha256=checked.model_sha256,
        model_name=checked.model_name,
        device=checked.device,
        device_sha256=checked.device_sha256,
        granularity=checked.granularity,
        blocks={name: tuple(members) for name, members in checked.blocks.items()},
        stages=stages,
        provenance=load_record(Provenance, checked.provenance),
        predicted=load_record(Predicted, checked.predicted) if checked.predicted else None,
        simulated=load_record(Predicted, checked.simulated) if checked.simulated else None,
        name=checked.name,
        pipelined=checked.pipelined,
        model_path=checked.model_path,
        version=checked.version,
        notes=tuple(checked.notes),
        inputs=_inputs(checked.inputs),
        int8=_int8(checked.int8, checked.blocks),
        precision=_precision(checked.precision, checked.int8, checked.fp16),
        fp16=_int8(checked.fp16, checked.blocks, "fp16"),
    )


def _int8(names: list[str], blocks: Mapping[str, list[str]], field: str = "int8") -> tuple[str, ...]:
    for i, b in enumerate(names):
        if b not in blocks:
            raise PlanError(f"{field}[{i}]: unknown block {b!r} (not in the plan's blocks)")
    return tuple(dict.fromkeys(names))


def _precision(raw: _PrecisionFile | None, int8: Sequence[str], fp16: Sequence[str] = ()) -> PlanPrecision | None:
    both = set(int8) & set(fp16)
    if both:
        raise PlanError(f"fp16: block {sorted(both)[0]!r} is in int8 too; a block runs in one precision")
    if raw is None:
        if int8 or fp16:
            which = "int8" if int8 else "fp16"
            raise PlanError(
                f"precision: the plan runs {len(int8) or len(fp16)} block(s) in {which} but carries no calibration "
                "ranges, metric or budget; plan again with --precision auto --calibration FILE"
            )
        return None
    if int8 and not raw.ranges:
        raise PlanError("precision.ranges: empty, but the plan runs blocks in int8; plan again with --calibration")
    return PlanPrecision(
        ranges={t: (float(lo), float(hi)) for t, (lo, hi) in raw.ranges.items()},
        metric=raw.metric,
        budget=raw.budget,
        calibration_frames=raw.calibration_frames,
        measured=tuple(raw.measured.items()),
        held_out_frames=raw.held_out_frames,
        method=raw.method,
        int8_ms={b: dict(t) for b, t in raw.int8_ms.items()},
        fp16_ms={b: dict(t) for b, t in raw.fp16_ms.items()},
        fp16_source={b: dict(t) for b, t in raw.fp16_source.items()},
    )


def _stage(stage: _StageFile, s: int, blocks: Mapping[str, list[str]]) -> Stage:
    """A checked stage, its assignments' blocks looked up in the plan's blocks."""
    for g, group in enumerate(stage.groups):
        for i, a in enumerate(group):
            unknown = [b for b in a.blocks if b not in blocks]
            if unknown:
                raise PlanError(
                    f"stages[{s}].groups[{g}][{i}].blocks: unknown block {unknown[0]!r} (not in the plan's blocks)"
                )
    return Stage(
        tuple(
            tuple(Assignment(a.pu, a.cores, tuple(a.blocks), tuple(a.core_ids)) for a in group)
            for group in stage.groups
        )
    )


def _inputs(raw: list[dict[str, Any]]) -> tuple[InputSpec, ...]:
    try:
        return tuple(InputSpec.from_json(r, f"inputs[{i}]: ") for i, r in enumerate(raw))
    except ModelError as exc:
        raise PlanError(str(exc)) from None


def load_plan(path: Path) -> Plan:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise PlanError(f"no such plan file: {path}") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path}: not a readable JSON plan: {exc}") from None
    try:
        return plan_from_json(data, str(path))
    except PlanError as exc:
        raise PlanError(f"{path}: {exc}") from None


def _is_file_of(device: str, profile: DeviceProfile) -> bool:
    """A plan of a user's profile names its TOML file (``plan --device FILE``): the file ``profile`` came from."""
    return bool(profile.origin) and Path(device).is_file() and Path(device).resolve() == Path(profile.origin).resolve()


def validate(plan: Plan, graph: OpGraph, profile: DeviceProfile) -> None:
    """The plan fits this model and board: hashes, PUs, cores, every node once per replica, stage order."""
    if plan.model_sha256 != graph.model_sha256:
        raise PlanError(
            f"model_sha256: the plan is for model {plan.model_sha256[:12]}…, this file is {graph.model_sha256[:12]}…; "
            "re-plan for this model"
        )
    if plan.device != profile.name and not _is_file_of(plan.device, profile):
        raise PlanError(f"device: the plan is for {plan.device!r}, not {profile.name!r}")
    _check_blocks(plan, graph)
    stage_of_block = _check_placement(plan, graph, profile)
    unplaced = set(plan.blocks) - set(stage_of_block)
    if unplaced:
        raise PlanError(f"stages: block(s) {sorted(unplaced)[:3]} are placed on no PU")
    _check_memory(plan, graph, profile)
    _check_stage_order(plan, graph, stage_of_block)
    _check_precisions(plan, profile)
    _check_ranges(plan, graph)


def _check_blocks(plan: Plan, graph: OpGraph) -> None:
    """Every node of the model is in exactly one block."""
    known = {n.name for n in graph.nodes}
    owner: dict[str, str] = {}
    for name, members in plan.blocks.items():
        for m in members:
            if m not in known:
                raise PlanError(f"blocks.{name}: node {m!r} is not in the model")
            if m in owner:
                raise PlanError(f"blocks.{name}: node {m!r} is also in block {owner[m]!r}")
            owner[m] = name
    missing = known - set(owner)
    if missing:
        raise PlanError(f"blocks: {len(missing)} node(s) are in no block, e.g. {sorted(missing)[:3]}")


def _check_placement(plan: Plan, graph: OpGraph, profile: DeviceProfile) -> dict[str, int]:
    """Every assignment's PU and cores exist and are its own; every replica group holds the same blocks, each
    once and in one stage only. Returns the stage of each placed block."""
    stage_of_block: dict[str, int] = {}
    cores = core_ids(plan, profile)
    taken: dict[tuple[str, int], str] = {}  # (PU, core; -1: the whole accelerator) -> the assignment using it
    for s, stage in enumerate(plan.stages):
        first: set[str] = set()
        for g, group in enumerate(stage.groups):
            seen: set[str] = set()
            for i, a in enumerate(group):
                where = f"stages[{s}].groups[{g}][{i}]"
                if a.pu.spans:  # one session spanning several CPU clusters
                    _check_spanning(a, where, profile, taken)
                else:
                    _check_pu(a, where, profile, cores[(s, g, i)], taken)
                    _check_supported(a, where, plan, graph, profile.pu(a.pu))
                for b in a.blocks:
                    if b in seen:
                        raise PlanError(f"{where}.blocks: block {b!r} appears twice in one replica group")
                    if b in stage_of_block and stage_of_block[b] != s:
                        raise PlanError(f"{where}.blocks: block {b!r} is also in stage {stage_of_block[b]}")
                    seen.add(b)
                    stage_of_block[b] = s
            if g == 0:
                first = seen
            elif seen != first:
                raise PlanError(f"stages[{s}].groups[{g}]: a replica must hold the same blocks as group 0")
    return stage_of_block


def _check_pu(
    a: Assignment, where: str, profile: DeviceProfile, ids: tuple[int, ...], taken: dict[tuple[str, int], str]
) -> None:
    """The assignment's PU is the profile's; a CPU's cores are that PU's and nobody else's, an accelerator runs
    one assignment with cores = 1."""
    pu_names = {p.name for p in profile.pus}
    if a.pu not in pu_names:
        raise PlanError(f"{where}.pu: unknown PU {a.pu!r}; {profile.name} has {', '.join(sorted(pu_names))}")
    pu = profile.pu(a.pu)
    hardware = profile.hardware(a.pu)  # PUs that are runtimes on the same hardware take turns for its cores
    if pu.kind != "cpu":
        if a.cores != 1:
            raise PlanError(f"{where}.cores: {a.pu!r} is a {pu.kind}; it takes cores = 1")
        if (hardware, -1) in taken:
            raise PlanError(
                f"{where}.pu: {a.pu!r} is also used by {taken[(hardware, -1)]}; a {pu.kind} runs one assignment"
            )
        taken[(hardware, -1)] = where
        return
    if len(ids) != a.cores:
        raise PlanError(
            f"{where}.cores: {a.pu!r} has {len(pu.cores)} core(s) and the plan leaves {len(ids)} free "
            f"for this assignment, which asks for {a.cores}"
        )
    for c in ids:
        if c not in pu.cores:
            raise PlanError(f"{where}.core_ids: core {c} is not in PU {a.pu!r} (cores {list(pu.cores)})")
        if (hardware, c) in taken:
            raise PlanError(f"{where}.core_ids: core {c} of {a.pu!r} is also used by {taken[(hardware, c)]}")
        taken[(hardware, c)] = where


def _check_supported(a: Assignment, where: str, plan: Plan, graph: OpGraph, pu: ProcessingUnit) -> None:
    """The PU supports every operator type of the assignment's blocks."""
    for b in a.blocks:
        for m in plan.blocks[b]:
            for t in graph.index[m].op_types:
                if not pu.supports(t):
                    raise PlanError(f"{where}: PU {a.pu!r} does not support {t} (node {m!r}, block {b!r})")


def _check_precisions(plan: Plan, profile: DeviceProfile) -> None:
    """Every block runs on a PU that computes its precision (an NPU: int8 blocks only)."""
    for s, g, a in plan.assignments():
        for part in a.pu.parts:
            pu = profile.pu(part)
            for b in a.blocks:
                precision = plan.precision_of(b)
                if not pu.computes(precision):
                    where = f"stages[{s}].groups[{g}][{plan.stages[s].groups[g].index(a)}]"
                    raise PlanError(
                        f"{where}: block {b!r} runs in {precision}, which PU {part!r} does not compute (it computes "
                        f"{', '.join(pu.precision_set.values)}); plan again"
                    )


def _check_ranges(plan: Plan, graph: OpGraph) -> None:
    """Every tensor an int8 Conv/MatMul/Gemm reads from another node or the caller has a calibration range."""
    if not plan.int8 or plan.precision is None:
        return
    from models.precision import QUANTIZABLE

    ranges = plan.precision.ranges
    for b in plan.int8:
        for m in plan.blocks[b]:
            node = graph.index[m]
            if node.op_type not in QUANTIZABLE:
                continue
            for t in node.inputs:
                info = graph.tensors.get(t)
                if info is not None and info.dtype.startswith(("float", "bfloat")) and t not in ranges:
                    raise PlanError(
                        f"precision.ranges: no calibration range for tensor {t!r} (read by int8 node {m!r} of block "
                        f"{b!r}); plan again with --calibration"
                    )


def _check_memory(plan: Plan, graph: OpGraph, profile: DeviceProfile) -> None:
    pu_names = {p.name for p in profile.pus}
    for pu, used in sorted(memory_use(plan, graph).items()):
        if pu in pu_names and used > profile.pu(pu).memory_bytes.value:
            raise PlanError(
                f"stages: PU {pu!r} would hold {used / 2**20:.1f} MiB of weights and activations "
                f"({ACTIVATION_FRAMES} frames of its blocks' outputs) but has {profile.pu(pu).memory_bytes.value / 2**20:.1f} MiB"
            )


def _check_stage_order(plan: Plan, graph: OpGraph, stage_of_block: Mapping[str, int]) -> None:
    """No tensor flows from a later stage back to an earlier one."""
    block_of = {m: b for b, ms in plan.blocks.items() for m in ms}
    for e in graph.edges:
        a, b = stage_of_block[block_of[e.src]], stage_of_block[block_of[e.dst]]
        if a > b:
            raise PlanError(
                f"stages: node {e.dst!r} in stage {b} reads {e.tensor!r} from {e.src!r} in later stage {a} "
                "(a cycle between stages); stages must follow the data flow"
            )


def activation_bytes(members: tuple[str, ...] | list[str], graph: OpGraph) -> int:
    """Bytes of a block's output tensors: what its nodes produce that a node outside it, or the caller, reads."""
    inside = set(members)
    leaving = {e.tensor for e in graph.edges if e.src in inside and e.dst not in inside}
    returned = {t.name for t in graph.outputs}
    leaving |= {t for m in inside for t in graph.index[m].outputs if t in returned}
    return sum(graph.tensors[t].nbytes for t in sorted(leaving) if t in graph.tensors)


def memory_use(plan: Plan, graph: OpGraph) -> dict[str, int]:
    """Bytes each PU holds: the weights of every block an assignment on it runs (every replica its own copy)
    and the activations of those blocks, ``ACTIVATION_FRAMES`` frames of their output tensors."""
    weights = {b: sum(graph.index[m].param_bytes for m in ms) for b, ms in plan.blocks.items()}
    acts = {b: activation_bytes(ms, graph) for b, ms in plan.blocks.items()}
    use: dict[str, int] = {}
    for _, _, a in plan.assignments():
        pu = a.pu.first  # a session spanning clusters allocates once, in the first's memory
        use[pu] = use.get(pu, 0) + sum(weights[b] + ACTIVATION_FRAMES * acts[b] for b in a.blocks)
    return use


def core_ids(plan: Plan, profile: DeviceProfile) -> dict[tuple[int, int, int], tuple[int, ...]]:
    """Cores of every CPU assignment: as written, or the next free ones of its PU in plan order."""
    # free cores per piece of hardware (PUs that are runtimes on the same cores draw from one list)
    hardware = {p.name: p.shares or p.name for p in profile.pus if p.kind == "cpu"}
    free: dict[str, list[int]] = {p.name: list(p.cores) for p in profile.pus if p.kind == "cpu" and not p.shares}
    for p in profile.pus:
        if p.kind == "cpu":
            free.setdefault(hardware[p.name], list(p.cores))
    for _, _, a in plan.assignments():
        for c in a.core_ids:
            if a.pu in hardware and c in free[hardware[a.pu]]:
                free[hardware[a.pu]].remove(c)
    out: dict[tuple[int, int, int], tuple[int, ...]] = {}
    for s, stage in enumerate(plan.stages):
        for g, group in enumerate(stage.groups):
            for i, a in enumerate(group):
                if a.core_ids or a.pu not in hardware:
                    out[(s, g, i)] = a.core_ids
                else:
                    mine = free[hardware[a.pu]]
                    out[(s, g, i)] = tuple(mine[: a.cores])
                    del mine[: a.cores]
    return out


def _check_spanning(a: Assignment, where: str, profile: DeviceProfile, taken: dict[tuple[str, int], str]) -> None:
    names = {p.name: p for p in profile.pus}
    parts = a.pu.parts
    for part in parts:
        if part not in names or names[part].kind != "cpu":
            raise PlanError(f"{where}.pu: {part!r} in {a.pu!r} is not a CPU PU of {profile.name}")
    providers = {names[part].execution_provider for part in parts}
    if len(providers) > 1:  # one session runs on one execution provider
        raise PlanError(f"{where}.pu: {a.pu!r} spans units of different runtimes ({', '.join(sorted(providers))})")
    allowed = [c for part in parts for c in names[part].cores]
    ids = a.core_ids or tuple(allowed[: a.cores])
    if len(ids) != a.cores or any(c not in allowed for c in ids):
        raise PlanError(f"{where}.core_ids: {a.pu!r} needs {a.cores} of the cores {allowed}")
    for c in ids:
        owner = profile.hardware(next(part for part in parts if c in names[part].cores))
        if (owner, c) in taken:
            raise PlanError(f"{where}.core_ids: core {c} of {owner!r} is also used by {taken[(owner, c)]}")
        taken[(owner, c)] = where
