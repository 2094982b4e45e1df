"""``plan --precision auto``: its flags and calibration data fail clearly, and a plan over its budget on
held-back frames is repaired (its most sensitive int8 blocks back to fp32) before it is offered.

A tiny CNN keeps this fast: a precision choice that claims every block costs nothing in accuracy puts them
all in int8; the end-to-end check on held-back frames then measures the real loss and puts blocks back
until the budget holds, and the plan records that loss.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler import compile_plan, run_chained
from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import LoadedModel, load_onnx
from models.precision import check_precision, tensor_ranges
from parapipe.precision_auto import (
    Auto,
    PrecisionPlanError,
    PrecisionRequest,
    check_and_repair,
    load_frames,
    parse_budget,
    request_from_flags,
)
from planner.costmodel import CostModel
from planner.problem import build_problem
from planner.search import SearchOptions, best_plan
from tests.models.test_precision import SHAPE, _tiny_cnn
from tests.support.cli import run_cli


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_onnx(_tiny_cnn(tmp_path_factory.mktemp("auto") / "tiny.onnx"))


def test_flags_that_cannot_work_say_what_to_do(tmp_path: Path) -> None:
    assert request_from_flags("fp32", None, None, None) is None
    with pytest.raises(PrecisionPlanError, match="--precision auto needs --calibration"):
        request_from_flags("auto", None, "1%", "top1")
    with pytest.raises(PrecisionPlanError, match="only applies with --precision auto"):
        request_from_flags("fp32", tmp_path, None, None)
    with pytest.raises(PrecisionPlanError, match="--precision must be fp32 or auto"):
        request_from_flags("int4", None, None, None)
    with pytest.raises(PrecisionPlanError, match="no such file"):
        request_from_flags("auto", tmp_path / "none.npz", None, None)
    got = request_from_flags("auto", tmp_path, None, None)
    assert got == PrecisionRequest(tmp_path, 0.01, "relerr")
    assert parse_budget("2.5%") == pytest.approx(0.025) and parse_budget("0.01") == 0.01
    for bad in ("abc", "-1%", "100%", "nan"):
        with pytest.raises(PrecisionPlanError, match="--max-accuracy-loss"):
            parse_budget(bad)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.sampled_from(["stacked", "batch", "single"]))
def test_calibration_frames_are_read_in_every_layout(tiny: LoadedModel, n: int, layout: str) -> None:
    import tempfile

    rng = np.random.default_rng(n)
    frames = [rng.random(SHAPE, dtype=np.float32) for _ in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        if layout == "stacked":  # [N, 1, 3, 16, 16]
            np.savez(Path(tmp) / "f.npz", x=np.stack(frames))
        elif layout == "batch":  # [N, 3, 16, 16] along the batch axis of 1
            np.savez(Path(tmp) / "f.npz", x=np.concatenate(frames))
        else:  # one frame per file, a folder
            for i, f in enumerate(frames):
                np.savez(Path(tmp) / f"{i:03d}.npz", x=f)
        got = load_frames(Path(tmp) if layout == "single" else Path(tmp) / "f.npz", tiny)
    assert len(got) == n
    for a, b in zip(got, frames, strict=True):
        assert a["x"].shape == SHAPE and np.array_equal(a["x"], b)


def test_bad_calibration_data_is_one_clear_error(tiny: LoadedModel, tmp_path: Path) -> None:
    np.savez(tmp_path / "named.npz", images=np.zeros(SHAPE, np.float32))
    with pytest.raises(PrecisionPlanError, match=r"no array named 'x' \(it has images\)"):
        load_frames(tmp_path / "named.npz", tiny)
    np.savez(tmp_path / "shape.npz", x=np.zeros((2, 3, 8, 8), np.float32))
    with pytest.raises(PrecisionPlanError, match=r"'x' has shape \[2, 3, 8, 8\]; give \[1, 3, 16, 16\]"):
        load_frames(tmp_path / "shape.npz", tiny)
    np.savez(tmp_path / "ints.npz", x=np.zeros(SHAPE, np.int64))
    with pytest.raises(PrecisionPlanError, match="'x' is int64, the model reads float32"):
        load_frames(tmp_path / "ints.npz", tiny)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PrecisionPlanError, match=r"holds no \.npz"):
        load_frames(tmp_path / "empty", tiny)
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(PrecisionPlanError, match=r"not a readable \.npz"):
        load_frames(tmp_path / "junk.npz", tiny)


@pytest.mark.parametrize("command", [("plan", "--device", "local"), ("tune", "--board", "local")])
def test_the_cli_refuses_auto_without_calibration_with_exit_2(
    tiny: LoadedModel, tmp_path: Path, command: tuple[str, ...]
) -> None:
    done = run_cli(command[0], str(tiny.path), *command[1:], "--precision", "auto", home=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "--precision auto needs --calibration" in done.stderr and "Traceback" not in done.stderr
    done = run_cli(command[0], str(tiny.path), *command[1:], "--metric", "top1", home=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "--metric only applies with --precision auto" in done.stderr and "Traceback" not in done.stderr


def test_a_plan_over_budget_on_held_back_frames_is_repaired_before_it_is_offered(tiny: LoadedModel) -> None:
    graph = build_graph(tiny.proto, tiny.sha256, "tiny")
    blocks = coarsen(graph, "fine")
    cost = CostModel(load_profile("local"), graph)
    rng = np.random.default_rng(3)
    frames = [{"x": rng.random(SHAPE, dtype=np.float32)} for _ in range(8)]
    calibration, held = frames[:6], frames[6:]
    budget = 0.002  # relerr: below what all blocks in int8 lose
    # a precision choice that claims every block loses nothing: the ILP puts them all in int8
    names = [b.name for b in blocks.nodes]
    ms = {(b.name, "cpu", k): cost.block_ms(b.members, "cpu", k) / 3 for b in blocks.nodes for k in (1, 2)}
    auto = Auto(
        tiny,
        graph,
        PrecisionRequest(Path("unused"), budget, "relerr"),
        calibration,
        held,
        tensor_ranges(tiny, calibration),
        dict.fromkeys(names, 0.0),
        {n: float(i) for i, n in enumerate(names)},  # ties broken: the later block goes back first
        ms,
        [],
    )
    problem = build_problem(blocks, graph, cost, 2, int8=auto.choice())
    plan = best_plan(blocks, graph, cost, "latency", SearchOptions(5, 2), problem=problem)
    assert set(plan.int8) == set(names), "nothing stops the solver from putting every block in int8"

    fixed, reverted = check_and_repair(plan, auto, cost, graph, lambda _msg: None)
    assert reverted and set(fixed.int8) == set(plan.int8) - set(reverted)
    assert fixed.precision is not None or not fixed.int8
    # what it recorded is what its partitions do on the held-back frames, within the budget
    compiled = compile_plan(fixed, tiny, graph, cost.profile, verify=False)
    import onnxruntime as ort

    full = ort.InferenceSession(tiny.ort_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = [{"logits": full.run(["logits"], f)[0]} for f in held]
    got = [run_chained(compiled.manifest, compiled.files, f) for f in held]
    check = check_precision(reference, got, "relerr", budget)
    assert check.ok, check.describe()
    if fixed.precision is not None:
        assert dict(fixed.precision.measured)["relerr"] == pytest.approx(check.loss, rel=1e-6)
        assert fixed.precision.held_out_frames == len(held)
        assert set(fixed.precision.int8_ms) == set(fixed.int8)


def _photographs(folder: Path, names: tuple[str, ...]) -> Path:
    from PIL import Image

    from tests.support.images import image

    folder.mkdir()
    for name in names:
        Image.fromarray((image(name) * 255).round().astype(np.uint8)).save(folder / f"{name}.jpg")
    return folder


def test_a_folder_of_photographs_calibrates_through_a_preprocessing_spec(tiny: LoadedModel, tmp_path: Path) -> None:
    from parapipe.preprocess import parse_preprocess

    photos = _photographs(tmp_path / "photos", ("astronaut", "coffee", "chelsea", "rocket"))
    spec = parse_preprocess("mean = [0.485, 0.456, 0.406]; std = [0.229, 0.224, 0.225]; resize = 'crop'")
    frames = load_frames(photos, tiny, spec)
    assert len(frames) == 4 and all(f["x"].shape == SHAPE and f["x"].dtype == np.float32 for f in frames)
    assert len({f["x"].tobytes() for f in frames}) == 4
    with pytest.raises(PrecisionPlanError, match="--preprocess"):
        load_frames(photos, tiny)
    done = run_cli("plan", str(tiny.path), "--device", "local", "--precision", "auto", "--calibration", str(photos),
                   home=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "--preprocess" in done.stderr and "Traceback" not in done.stderr, done.stderr
    done = run_cli("plan", str(tiny.path), "--device", "local", "--preprocess", "scale = 1.0", home=tmp_path)
    assert done.returncode == 2 and "only applies with --precision auto" in done.stderr, done.stderr
    done = run_cli("plan", str(tiny.path), "--device", "local", "--precision", "auto", "--calibration", str(photos),
                   "--preprocess", "mean = [0.5]; std = [0.25]", "--objective", "latency", "--time-limit", "2",
                   "-o", str(tmp_path / "plans"), "--json", home=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    precision = json.loads(done.stdout)["precision"]
    assert precision["calibration_frames"] + precision["held_out_frames"] == 4


class _Timings:
    """A timer that gives the whole model's time per core count: fp32, or the mix of every candidate in int8."""

    def __init__(self, fp32: bytes, ms: dict[tuple[str, int], float]) -> None:
        self.fp32, self.ms, self.calls = fp32, ms, 0

    @property
    def ort_version(self) -> str:
        return "test"

    def op_profile(self, model, feeds, cfg, warmup, repeats):  # type: ignore[no-untyped-def]
        raise AssertionError("not used")

    def time(self, model, feeds, cfg, warmup, repeats, pu):  # type: ignore[no-untyped-def]
        from profiler.measure import Timing

        self.calls += 1
        return Timing.of([self.ms[("fp32" if model == self.fp32 else "int8", cfg.threads)]])


@settings(max_examples=25, deadline=None)
@given(
    speedups=st.lists(st.floats(0.5, 6.0), min_size=8, max_size=8),
    mixed=st.tuples(st.floats(0.3, 1.3), st.floats(0.3, 1.3)),
)
def test_int8_times_are_held_to_the_whole_models_measured_int8_saving(tiny: LoadedModel, speedups, mixed) -> None:
    """Whatever the blocks timed alone claim, after calibration the share of the whole model's time the blocks
    faster in int8 alone save on each core count is the share the model with those blocks in int8 saved,
    measured as one session (none where it was no faster), each block's saving scaled alike, within the guards
    (at most MAX_INT8_SCALE times the claim, no block below MIN_INT8_SHARE of its fp32 time); blocks slower in
    int8 alone keep their times; the measurement is taken on every core count where some block claims a
    saving, and what it found is reported per core count."""
    from models.precision import quantizable_groups, write_ranges
    from parapipe.precision_auto import MAX_INT8_SCALE, MIN_INT8_SHARE, calibrate_int8

    graph = build_graph(tiny.proto, tiny.sha256, "tiny")
    blocks = coarsen(graph, "fine")
    cost = CostModel(load_profile("local"), graph)
    groups = quantizable_groups(graph, {b.name: b.members for b in blocks.nodes})
    rng = np.random.default_rng(0)
    frames = [{"x": rng.random(SHAPE, dtype=np.float32)} for _ in range(4)]
    cores = (1, 2)
    ms = {
        (g, "cpu", k): cost.block_ms(members, "cpu", k) / speedups[(i + k) % len(speedups)]
        for i, (g, members) in enumerate(groups.items())
        for k in cores
    }
    fp32 = tiny.ort_proto.SerializeToString()
    timer = _Timings(
        fp32,
        {**{("fp32", k): 10.0 for k in cores}, **{("int8", k): 10.0 * m for k, m in zip(cores, mixed, strict=True)}},
    )
    with tempfile.TemporaryDirectory() as tmp:
        ranges = write_ranges(tensor_ranges(tiny, frames), Path(tmp) / "ranges.json")
        out, checks, notes = calibrate_int8(ms, tiny, groups, cost, ranges, frames[0], timer, rounds=2)
    every = [n.name for n in graph.nodes]
    measured_on = []
    for k, m in zip(cores, mixed, strict=True):
        fp32_ms = {g: cost.block_ms(groups[g], "cpu", k) for g in groups}
        before = {g: fp32_ms[g] - ms[(g, "cpu", k)] for g in groups}
        faster = {g: s for g, s in before.items() if s > 0}
        after = {g: fp32_ms[g] - out[(g, "cpu", k)] for g in groups if (g, "cpu", k) in out}
        assert {g: after[g] for g in groups if g not in faster} == pytest.approx(
            {g: before[g] for g in groups if g not in faster}
        ), "blocks slower in int8 alone keep their times"
        if not faster:
            continue
        measured_on.append(k)
        whole = cost.block_ms(every, "cpu", k)
        wanted = max(0.0, 1.0 - m) / (sum(faster.values()) / whole)
        scale = min(MAX_INT8_SCALE, wanted)
        check = next(c for c in checks if c.label == f"cpux{k}")
        assert set(check.blocks) == set(faster) and check.measured == pytest.approx(1.0 - m)
        assert check.scale == pytest.approx(scale)
        if scale == 0:
            assert not any((g, "cpu", k) in out for g in faster), "no faster: int8 not offered for them there"
            continue
        assert {g: after[g] for g in faster} == pytest.approx(
            {g: min(s * scale, (1 - MIN_INT8_SHARE) * fp32_ms[g]) for g, s in faster.items()}
        )
        assert all(out[(g, "cpu", k)] >= MIN_INT8_SHARE * fp32_ms[g] * (1 - 1e-9) for g in groups)
        if wanted <= MAX_INT8_SCALE and all(s * scale <= (1 - MIN_INT8_SHARE) * fp32_ms[g] for g, s in faster.items()):
            assert sum(after[g] for g in faster) / whole == pytest.approx(max(0.0, 1.0 - m), abs=1e-9)
    assert timer.calls == 2 * 2 * len(measured_on), "fp32 and the mix, in each round, where some block is faster"
    assert len(checks) == len(notes) == len(measured_on)


def test_more_blocks_go_to_int8_while_the_measured_mix_holds_the_budget(tiny: LoadedModel) -> None:
    """The ILP bounds the sum of the blocks' losses alone in int8; a mix loses less than that sum here, so after
    the solve more blocks go to int8 as long as the mix, measured on the calibration frames, holds the budget,
    and the plan is priced with their int8 times."""
    from models.precision import MixEvaluator, write_ranges

    graph = build_graph(tiny.proto, tiny.sha256, "tiny")
    blocks = coarsen(graph, "fine")
    cost = CostModel(load_profile("local"), graph)
    rng = np.random.default_rng(5)
    frames = [{"x": rng.random(SHAPE, dtype=np.float32)} for _ in range(8)]
    calibration, held = frames[:6], frames[6:]
    budget = 0.05
    names = [b.name for b in blocks.nodes]
    ms = {(b.name, "cpu", k): cost.block_ms(b.members, "cpu", k) / 3 for b in blocks.nodes for k in (1, 2)}
    ranges = tensor_ranges(tiny, calibration)
    auto = Auto(
        tiny,
        graph,
        PrecisionRequest(Path("unused"), budget, "relerr"),
        calibration,
        held,
        ranges,
        dict.fromkeys(names, budget),  # each block claims the whole budget: the ILP takes one
        {n: float(i) for i, n in enumerate(names)},
        ms,
        [],
    )
    problem = build_problem(blocks, graph, cost, 1, int8=auto.choice())
    plan = best_plan(blocks, graph, cost, "latency", SearchOptions(5, 1), problem=problem)
    assert len(plan.int8) == 1
    with tempfile.TemporaryDirectory() as tmp:
        ev = MixEvaluator(
            tiny,
            {b.name: b.members for b in blocks.nodes},
            calibration,
            "relerr",
            write_ranges(ranges, Path(tmp) / "r.json"),
        )
        assert ev.loss(names) <= budget, "every block in int8 holds this budget on these frames"
    fixed, reverted = check_and_repair(plan, auto, cost, graph, lambda _msg: None)
    assert not reverted and set(fixed.int8) == set(names)
    assert fixed.precision is not None and set(fixed.precision.int8_ms) == set(names)
    assert fixed.predicted is not None and plan.predicted is not None
    assert fixed.predicted.latency_ms < plan.predicted.latency_ms
    assert dict(fixed.precision.measured)["relerr"] <= budget


def test_the_pareto_sweep_trades_measured_accuracy_for_speed(tiny: LoadedModel) -> None:
    """``plan --objective pareto --precision auto``: plans within budgets of none, half and all of the user's, each
    checked on held-back frames; the front keeps exact plans beside faster ones that lose measured accuracy."""
    from models.precision import MixEvaluator, quantizable_groups, sensitivity, write_ranges
    from parapipe.precision_auto import precision_plans
    from planner.search import dominates

    graph = build_graph(tiny.proto, tiny.sha256, "tiny")
    blocks = coarsen(graph, "fine")
    cost = CostModel(load_profile("local"), graph)
    rng = np.random.default_rng(4)
    frames = [{"x": rng.random(SHAPE, dtype=np.float32)} for _ in range(8)]
    calibration, held = frames[:6], frames[6:]
    ranges = tensor_ranges(tiny, calibration)
    groups = quantizable_groups(graph, {b.name: b.members for b in blocks.nodes})
    with tempfile.TemporaryDirectory() as tmp:
        evaluator = MixEvaluator(tiny, groups, calibration, "relerr", write_ranges(ranges, Path(tmp) / "r.json"))
        sens = sensitivity(evaluator, groups)
        everything = evaluator.loss(list(groups))
    budget = 1.5 * everything  # every candidate in int8 fits; half of it does not
    ms = {(b, "cpu", k): cost.block_ms(groups[b], "cpu", k) / 3 for b in groups for k in (1, 2)}
    request = PrecisionRequest(Path("unused"), budget, "relerr")
    auto = Auto(tiny, graph, request, calibration, held, ranges, sens, sens, ms, [])
    front, reverted = precision_plans(blocks, graph, cost, SearchOptions(1, 2), auto, "pareto", lambda _msg: None)

    assert set(reverted) == {p.name for p in front}
    for p in front:
        assert p.name.startswith("pareto-") and "@loss" in p.name
        assert not any(dominates(q, p) for q in front if q is not p)
        if p.int8:  # checked on the held-back frames, within the budget it was planned in (none, half, all)
            assert p.precision is not None and p.precision.held_out_frames == len(held)
            assert p.precision.budget in (0.0, budget / 2, budget)
            assert 0 < p.accuracy_loss() <= p.precision.budget
        else:
            assert p.accuracy_loss() == 0.0
    exact = [p for p in front if not p.int8]
    lossy = [p for p in front if p.int8]
    assert exact and lossy, "the front offers exact plans and plans that trade accuracy for speed"
    assert min(p.predicted.latency_ms for p in lossy) < min(p.predicted.latency_ms for p in exact)


def test_int8_times_measured_on_a_gpu_offer_int8_beside_fp16_there(tiny: LoadedModel) -> None:
    """A cost table with a block's fp32 and int8 variants timed on khadas-vim3's Mali (which computes fp32, fp16
    and int8): its int8 time there is the calibrated fp32 figure times the measured ratio, keyed as the GPU unit,
    and the problem offers that block on the GPU in int8 beside fp16 (``second_cost``)."""
    from models.precision import quantizable_groups
    from parapipe.precision_auto import fp16_times, int8_times
    from planner.problem import Int8Choice
    from profiler.costtable import Conditions, CostEntry, CostTable, entry_key

    graph = build_graph(tiny.proto, tiny.sha256, "tiny")
    blocks = coarsen(graph, "fine")
    cost = CostModel(load_profile("khadas-vim3"), graph)
    groups = quantizable_groups(graph, {b.name: b.members for b in blocks.nodes})
    block = next(iter(groups))
    table = CostTable()
    for precision, ms in (("fp32", 4.0), ("int8", 1.0)):
        cond = Conditions("khadas-vim3", "mali", 0, 0, "ArmNNExecutionProvider", "1", "all", None, precision)
        key = entry_key(tiny.sha256, "block", groups[block], cond)
        table.add(CostEntry(key, "block", tiny.sha256, block, tuple(groups[block]), cond, ms, ms, ms, ms, 5))
    ms, _ = int8_times(tiny, groups, [], cost, table, None, False, lambda _msg: None)
    assert ms == {(block, "mali", 1): pytest.approx(cost.block_ms(groups[block], "mali", 1) / 4)}
    half, _, _ = fp16_times(tiny, groups, cost, table)
    assert (block, "mali", 1) in half, "fp16 there from the Mali's fp16 peak"
    names = {b.name: i for i, b in enumerate(blocks.nodes)}
    choice = Int8Choice(dict.fromkeys(groups, 0.0), 0.01, ms, None, dict.fromkeys(groups, 0.0), half)
    problem = build_problem(blocks, graph, cost, int8=choice)
    mali = next(u for u, x in enumerate(problem.units) if x.pu == "mali")
    assert problem.second_cost == {(names[block], mali): pytest.approx(ms[(block, "mali", 1)])}
    assert problem.reduced(mali) == "fp16" and problem.reduced(mali, 2) == "int8"
