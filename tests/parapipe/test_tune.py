"""The measure-replan loop: measurements become measured partitions, a recalibration is kept only
if it predicts what was measured better, the measurement noise is measured and reported, and a
target below the noise is reported rather than chased."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parapipe.records import Figures, PartitionMeasurement
from parapipe.tune import (
    KEEP_GAIN,
    NOISE_MARGIN,
    Noise,
    TuneOptions,
    as_long,
    confirmed,
    far_apart,
    feed_back,
    fit_sustained,
    frames_for,
    generalises,
    least_change,
    merge_runs,
    noise_verdict,
    own_partitions,
    plan_key,
    pooled_noise,
    pooled_spread_pct,
    recalibrate,
    rmspe,
    settled,
    shared_burst_work,
    shortfall,
    spread_pct,
    stop_reason,
    sustained_conditions,
    table_errors,
    throttled_work,
    tune,
    worth_keeping,
)
from profiler.calibration import NetworkFit
from profiler.costtable import CostTable, entry_key
from tests.support.cli import PARAPIPE

pytestmark = pytest.mark.exclusive  # CPU time on throttled or contended cores: run alone (Makefile)

MODEL = "squeezenet1_1"


@settings(max_examples=300, deadline=None)
@given(
    frames=st.integers(1, 10_000),
    seconds=st.floats(0.0, 10.0),
    predicted=st.floats(0.0, 1e5),
    measured=st.lists(st.floats(0.0, 1e5), max_size=3),
)
def test_a_measurement_lasts_at_least_the_floor_at_the_plans_rate(
    frames: int, seconds: float, predicted: float, measured: list[float]
) -> None:
    """Never fewer frames than asked; at the fastest rate known for the plan (predicted or measured) the frames
    last at least ``min_seconds``; no more than that takes (one frame of rounding); 0 s: exactly the frames."""
    from planner.plan import Plan, Predicted, Provenance

    plan = Plan("0" * 64, "m", "local", "0" * 64, "coarse", {}, (), Provenance("hand"), Predicted(1.0, predicted, 0.0))
    n = frames_for(plan, frames, seconds, measured)
    rate = max([predicted, *measured])
    assert n >= frames
    assert n / rate >= seconds - 1e-9 if rate > 0 else n == frames
    assert n == frames or n - 1 < seconds * rate
    assert frames_for(plan, frames, 0.0, measured) == frames
    assert frames_for(dataclasses.replace(plan, predicted=None), frames, seconds) == frames


def test_rmspe() -> None:
    assert rmspe([(110.0, 100.0), (90.0, 100.0)]) == pytest.approx(10.0)
    assert math.isnan(rmspe([]))


def test_spread_is_the_relative_std_of_one_measurement() -> None:
    assert spread_pct([99.0, 101.0]) == pytest.approx(math.sqrt(2) / 100 * 100)
    assert spread_pct([5.0, 5.0, 5.0]) == 0.0
    assert math.isnan(spread_pct([5.0]))


def test_noise_pools_every_plan_measured_again() -> None:
    """One group is the plain relative std; plans measured once add nothing; a plan measured again in a later
    round (after a reverted recalibration, say) widens the noise when it drifted."""
    assert pooled_spread_pct([[99.0, 101.0]]) == pytest.approx(spread_pct([99.0, 101.0]))
    assert pooled_spread_pct([[99.0, 101.0], [50.0]]) == pytest.approx(spread_pct([99.0, 101.0]))
    assert math.isnan(pooled_spread_pct([[1.0], [2.0]]))
    first = Noise("p", 2, 30, latency_pct=spread_pct([10.0, 10.2]), throughput_pct=spread_pct([100.0, 101.0]))
    same = pooled_noise(first, {"a": [(10.0, 100.0), (10.2, 101.0)], "b": [(5.0, 50.0)]})
    assert same.latency_pct == pytest.approx(first.latency_pct) and same.plans == 1 and same.runs == 2
    drifted = pooled_noise(first, {"a": [(10.0, 100.0), (10.2, 101.0)], "b": [(5.0, 50.0), (6.0, 40.0)]})
    assert drifted.plans == 2 and drifted.runs == 4 and drifted.frames == 30
    assert drifted.latency_pct > 3 * first.latency_pct and drifted.throughput_pct > 3 * first.throughput_pct


def test_stop_rule_and_noise_verdict() -> None:
    """Pure decision rules: the target wins where it is reachable; below the noise the loop stops at 1.5x it."""
    quiet = Noise("p", 2, 30, latency_pct=0.5, throughput_pct=1.0)
    assert noise_verdict(quiet, 5.0)[:2] == (5.0, False)
    loud = Noise("p", 2, 240, latency_pct=2.0, throughput_pct=4.0, grown=True, capped=True)
    effective, limited, note = noise_verdict(loud, 5.0)
    assert limited and effective == pytest.approx(NOISE_MARGIN * 4.0)
    assert "below what the measurements resolve" in note and "240 frames, the cap" in note
    assert stop_reason(4.0, 5.0, 6.0, last=False) == "target"
    assert stop_reason(5.5, 5.0, 6.0, last=False) == "noise"
    assert stop_reason(7.0, 5.0, 6.0, last=False) is None
    assert stop_reason(7.0, 5.0, 6.0, last=True) == "rounds"


def _result(template, fps: float, lat: float, busy: float):
    part = PartitionMeasurement(
        "p0", "cpu", busy_ms=busy * 10, queue_wait_ms=0.0, frames=10, alone_busy_ms=busy * 5, alone_frames=5
    )
    return dataclasses.replace(template, measured=Figures(lat, fps, 1.0), partitions=(part,))


def test_far_apart_is_more_than_twice_the_tolerance_off_in_latency_or_throughput() -> None:
    reference = Figures(10.0, 100.0, 1.0)
    near = Figures(11.0, 92.0, 1.0)  # 9.1% and 8.7% off
    assert not far_apart(near, reference, 5.0) and far_apart(near, reference, 4.0)
    slow = Figures(10.0, 40.0, 1.0)  # a burst took the cores
    assert far_apart(slow, reference, 5.0) and not far_apart(slow, reference, 80.0)


def _with(template, predicted: Figures | None, lat: float, fps: float):
    return dataclasses.replace(template, predicted=predicted, measured=Figures(lat, fps, 1.0))


def test_a_run_far_off_is_measured_again_and_a_third_time_when_the_two_disagree(tuned) -> None:
    """A new plan is checked against its prediction, a plan measured before against its earlier runs; a run
    within the tolerance stands alone; two runs far apart get a third, and the round takes their median."""
    (_, template), *_ = tuned["last"]
    predicted = Figures(10.0, 100.0, 1.0)
    queue: list = []
    asked: list[str] = []

    def again(why: str):
        asked.append(why)
        return queue.pop(0)

    near = _with(template, predicted, 10.5, 96.0)
    assert confirmed(near, [], again, 5.0) == [near] and not asked
    # a burst: the repeat lands where the prediction is, the third agrees with it, the median ignores the burst
    burst = _with(template, predicted, 14.0, 70.0)
    queue[:] = [_with(template, predicted, 10.2, 99.0), _with(template, predicted, 10.4, 97.0)]
    runs = confirmed(burst, [], again, 5.0)
    assert len(runs) == 3 and asked == [
        "it is far from its prediction",
        "its two runs are far apart: the median of three",
    ]
    assert merge_runs(runs).measured.throughput_fps == pytest.approx(97.0)
    # the prediction off, the runs agreeing: measured twice, no third
    asked.clear()
    off = _with(template, predicted, 14.0, 70.0)
    queue[:] = [_with(template, predicted, 14.2, 69.0)]
    assert len(confirmed(off, [], again, 5.0)) == 2 and len(asked) == 1
    # a plan measured before is checked against its own runs, not its (off) prediction
    asked.clear()
    assert confirmed(off, [_with(template, predicted, 14.1, 71.0)], again, 5.0) == [off] and not asked
    queue[:] = [_with(template, predicted, 14.0, 70.0), _with(template, predicted, 14.1, 70.5)]
    runs = confirmed(near, [off, _with(template, predicted, 14.1, 71.0)], again, 5.0)
    assert asked == ["it is far from its earlier runs", "its two runs are far apart: the median of three"]
    assert merge_runs(runs).measured.throughput_fps == pytest.approx(70.5)
    # for the noise: twice whatever the first run says; no prediction and no earlier runs: once
    asked.clear()
    queue[:] = [_with(template, predicted, 10.4, 96.5)]
    assert len(confirmed(near, [], again, 5.0, twice=True)) == 2 and asked == ["for the noise"]
    assert confirmed(_with(template, None, 14.0, 70.0), [], again, 5.0) == [_with(template, None, 14.0, 70.0)]


def test_the_noise_keeps_every_pass_that_ran_as_long_as_the_final_one(tuned) -> None:
    """A fast model runs the same frames in every pass (the floor in seconds): all its runs are its
    measurement and its noise, not the final pass alone (which a slow phase of the machine can take whole);
    shorter runs of earlier passes are left out."""
    (_, template), *_ = tuned["last"]
    fps = [265.6, 270.0, 261.6, 254.6, 168.4, 174.3]
    every = [(284, _with(template, None, 1000 / f, f)) for f in fps]
    final = Noise("p", 2, 120, spread_pct([1000 / f for f in fps[-2:]]), spread_pct(fps[-2:]), True, True)
    noise, kept = as_long(final, every, 2)
    assert len(kept) == 6 and noise.runs == 6 and noise.capped and noise.frames == 120
    assert noise.throughput_pct == pytest.approx(spread_pct(fps)) and noise.throughput_pct > 15
    assert merge_runs(kept).measured.throughput_fps == pytest.approx((254.6 + 261.6) / 2)  # not ~171
    slow = [(30, every[0][1]), (30, every[1][1]), (60, every[4][1]), (64, every[5][1])]
    noise, kept = as_long(final, slow, 2)
    assert noise == final and [r.measured.throughput_fps for r in kept] == fps[-2:]


def test_merge_runs_takes_the_median_of_figures_and_sums_counters(tuned) -> None:
    (_, first), *_ = tuned["last"]
    merged = merge_runs([_result(first, 100.0, 10.0, 2.0), _result(first, 110.0, 12.0, 4.0)])
    assert merged.measured.throughput_fps == pytest.approx(105.0)
    assert merged.measured.latency_ms == pytest.approx(11.0)
    (p,) = merged.partitions
    assert p.frames == 20 and p.busy_per_frame_ms == pytest.approx(3.0) and p.alone_per_frame_ms == pytest.approx(3.0)
    three = merge_runs(
        [_result(first, 100.0, 10.0, 2.0), _result(first, 60.0, 17.0, 4.0), _result(first, 104.0, 9.5, 2.0)]
    )
    assert three.measured.throughput_fps == pytest.approx(100.0) and three.measured.latency_ms == pytest.approx(10.0)


@pytest.fixture(scope="module")
def tuned(exported, tmp_path_factory):
    """One profiled cost table and one measured plan, not yet fed back (the target is met at once)."""
    home = tmp_path_factory.mktemp("tune-home")
    old = os.environ.get("PARAPIPE_HOME")
    os.environ["PARAPIPE_HOME"] = str(home)
    try:
        costs = home / "costs.json"
        options = TuneOptions("throughput", rounds=1, target_error=1e6, time_limit=1, frames=8, min_seconds=0.0)
        history, last = tune(exported(MODEL).path, "local", costs, options)
    finally:
        if old is None:
            del os.environ["PARAPIPE_HOME"]
        else:
            os.environ["PARAPIPE_HOME"] = old
    assert history[0].stop == "target" and history[0].calibration is None
    return {"costs": costs, "history": history, "last": last}


def _fresh(tuned, tmp_path: Path) -> Path:
    costs = tmp_path / "costs.json"
    shutil.copy(tuned["costs"], costs)
    return costs


def _context(exported):
    from device_profiles.loader import load_profile
    from models.graph import build_graph
    from models.onnx_io import load_onnx

    loaded = load_onnx(exported(MODEL).path)
    return build_graph(loaded.proto, loaded.sha256, MODEL), load_profile("local")


def test_noise_is_measured_and_reported(tuned) -> None:
    (only,) = tuned["history"]
    noise = only.noise
    assert noise is not None and noise.runs >= 2 and noise.plan == tuned["last"][0][0].name
    assert noise.latency_pct >= 0 and noise.throughput_pct >= 0 and math.isfinite(noise.pct)
    assert 8 <= noise.frames <= 8 * 8 and only.frames == noise.frames
    assert noise.grown == (noise.frames > 8)
    data = json.loads(json.dumps(only.to_json()))  # the record --json prints
    assert data["noise"]["pct"] == pytest.approx(noise.pct) and data["frames"] == noise.frames
    # the plan's measurement is all of the noise runs together
    (_, result), *_ = tuned["last"]
    assert result.partitions and all(p.frames >= noise.runs for p in result.partitions)


def test_a_calibration_that_predicts_the_measured_plans_better_is_kept(tuned, exported, tmp_path) -> None:
    """The board's partition times with figures that agree with them (what the fed-back table predicts:
    a board without outside load) are kept. On this shared machine the real run's figures can disagree
    with its own partition times; then the rule decides either way, and the table shows which."""
    import onnxruntime as ort

    from planner.build import evaluate
    from planner.costmodel import CostModel

    graph, profile = _context(exported)
    costs = _fresh(tuned, tmp_path)
    plan, real = tuned["last"][0]
    scratch = CostTable.load(costs)
    assert feed_back(scratch, plan, real, graph, profile, ort.__version__) > 0  # fed back unconditionally
    agreed = evaluate(plan, graph, CostModel.from_table(profile, graph, scratch), frames=0).predicted
    consistent = dataclasses.replace(
        real,
        measured=dataclasses.replace(real.measured, latency_ms=agreed.latency_ms, throughput_fps=agreed.throughput_fps),
    )
    table = CostTable.load(costs)
    calibration, _, _ = recalibrate(table, [(plan, consistent)], [(plan, consistent)], graph, profile, ort.__version__)
    assert calibration.kept and calibration.rmspe_after < calibration.rmspe_before
    assert calibration.rmspe_after < 1 and calibration.measured_plans == 1
    fed = [e for e in table if e.name.startswith("run:")]
    assert fed and all(e.kind == "partition" and e.mean_ms > 0 for e in fed)
    # every partition's time comes from frames run one at a time too
    assert all(p.alone_frames > 0 for p in real.partitions)
    # the real run: kept exactly when it predicts better by KEEP_GAIN of the error, and the table says which
    table = CostTable.load(costs)
    before = {e.key: e for e in table}
    verdict, _, _ = recalibrate(table, [(plan, real)], [(plan, real)], graph, profile, ort.__version__)
    assert verdict.kept == worth_keeping(verdict.rmspe_before, verdict.rmspe_after)
    assert ({e.key: e for e in table} == before) == (not verdict.kept)


def test_a_calibration_that_predicts_the_measured_plans_worse_is_reverted(tuned, exported, tmp_path) -> None:
    """A corrupted measurement (partitions 10x slower than the board's figures say) fed back through the
    real functions: the table it makes predicts the measured plan worse, so its entries are put back."""
    import onnxruntime as ort

    graph, profile = _context(exported)
    costs = _fresh(tuned, tmp_path)
    table = CostTable.load(costs)
    before = {e.key: e for e in table}
    learnt_before = dict(table.calibration)
    plan, real = tuned["last"][0]
    corrupt = dataclasses.replace(
        real,
        partitions=tuple(
            dataclasses.replace(p, busy_ms=p.busy_ms * 10, alone_busy_ms=p.alone_busy_ms * 10) for p in real.partitions
        ),
    )
    calibration, handoff, power = recalibrate(table, [(plan, corrupt)], [(plan, real)], graph, profile, ort.__version__)
    assert not calibration.kept and calibration.rmspe_after > calibration.rmspe_before
    assert {e.key: e for e in table} == before, "the previous table's entries are back, nothing added"
    assert table.calibration == learnt_before, "and its calibration values"
    assert handoff is None and power is None
    assert table_errors(table, [(plan, real)], graph, profile)[2] == pytest.approx(calibration.rmspe_before)


def test_the_handoff_is_fitted_to_every_plan_measured_so_far_not_this_rounds_alone(tuned, exported, tmp_path) -> None:
    """The handoff delay is board-wide: fitted to this round's plans alone, one plan slower than predicted
    can price every handoff of the plans measured before far off what they measured (local-biglittle,
    bert_small: a round-2 plan 1 ms slow set it to 1.0 ms, and round 1's latency plan, measured at 17.4 ms
    and predicted 17.5, went to 41.1). Two two-stage plans of one handoff each (cut at other blocks): the
    earlier measured as predicted, this round's 1 ms slower; the fit over both moves the handoff less than
    this round's plan alone asks, and is kept because it predicts both better."""
    import onnxruntime as ort

    import parapipe.tune as tune_module
    from models.coarsen import coarsen
    from planner.baselines import flop_pipeline
    from planner.build import evaluate
    from planner.costmodel import CostModel
    from planner.plan import Assignment, Stage

    graph, profile = _context(exported)
    blocks = coarsen(graph, "coarse")
    costs = _fresh(tuned, tmp_path)
    table = CostTable.load(costs)
    earlier = flop_pipeline(blocks, profile, [("cpu", 1), ("cpu", 1)], "earlier")
    order = [b for s in earlier.stages for b in s.groups[0][0].blocks]
    cut = len(earlier.stages[0].groups[0][0].blocks) // 2  # the first stage half as long
    this = dataclasses.replace(
        earlier,
        name="this-round",
        stages=(
            Stage(((Assignment("cpu", 1, tuple(order[:cut])),),)),
            Stage(((Assignment("cpu", 1, tuple(order[cut:])),),)),
        ),
    )
    # profiling measured a partition of the earlier plan; without it each plan is predicted the same in and out of
    # sample, so the verdict turns on the handoff and not on how far off that one measurement leaves the plan held
    # out (a CI run reverted the fit for 10.7 -> 11.4% out of sample while it took the in-sample error 9.0 -> 7.3%)
    for plan in (earlier, this):
        for key in tune_module.own_partitions(table, plan, graph, profile):
            del table.entries[key]
    table.save(costs)
    cost = CostModel.from_table(profile, graph, table)
    (_, template), *_ = tuned["last"]

    def measured(plan, slower_ms: float):
        p = evaluate(plan, graph, cost, frames=0).predicted
        figures = Figures(p.latency_ms + slower_ms, p.throughput_fps, p.energy_mj)
        return dataclasses.replace(template, plan=plan.name, measured=figures, partitions=())

    runs = [(this, measured(this, 1.0))]
    so_far = [(earlier, measured(earlier, 0.0)), *runs]
    alone = tune_module.fit_handoff(CostTable.load(costs), runs, graph, profile, ort.__version__)
    verdict, handoff, _ = recalibrate(table, runs, so_far, graph, profile, ort.__version__)
    assert alone is not None and handoff is not None and verdict.kept, (alone, handoff, verdict)
    assert handoff < alone
    fitted = CostModel.from_table(profile, graph, table)
    assert fitted.calibration.handoff_ms == pytest.approx(handoff)
    earlier_error = abs(
        evaluate(earlier, graph, fitted, frames=0).predicted.latency_ms - so_far[0][1].measured.latency_ms
    )
    assert earlier_error < 0.75, "the earlier plan stays near what it measured"


def test_the_frame_overhead_is_learnt_from_pipelined_plans_and_spares_a_plan_run_inline(
    tuned, exported, tmp_path
) -> None:
    """A plan of several partitions measured 0.6 ms slower alone than its partitions and handoffs predict, one
    of one partition (run in the caller's thread) as predicted: the fit learns 0.6 ms, the recalibrated table
    predicts both (multiview_bev on local-biglittle: seven partitions on one unit, 10.97 ms of runs measured,
    11.00 predicted, a frame alone 11.72-11.79 ms)."""
    import onnxruntime as ort

    import parapipe.tune as tune_module
    from models.coarsen import coarsen
    from planner.baselines import flop_pipeline, single_pu
    from planner.build import evaluate
    from planner.costmodel import CostModel

    graph, profile = _context(exported)
    blocks = coarsen(graph, "coarse")
    costs = _fresh(tuned, tmp_path)
    table = CostTable.load(costs)
    cost = CostModel.from_table(profile, graph, table)
    pipelined = flop_pipeline(blocks, profile, [("cpu", 1), ("cpu", 1)], "pipelined")
    inline = single_pu(blocks, profile, "cpu", 1)
    (_, template), *_ = tuned["last"]

    def measured(plan, slower_ms: float):
        p = evaluate(plan, graph, cost, frames=0).predicted
        figures = Figures(p.latency_ms + slower_ms, p.throughput_fps, p.energy_mj)
        return dataclasses.replace(template, plan=plan.name, measured=figures, partitions=())

    runs = [(pipelined, measured(pipelined, 0.6)), (inline, measured(inline, 0.0))]
    assert tune_module.fit_frame_overhead(table, runs, graph, profile, ort.__version__) == pytest.approx(0.6)
    fitted = CostModel.from_table(profile, graph, table)
    assert fitted.calibration.frame_ms == pytest.approx(0.6)
    for plan, res in runs:
        predicted = evaluate(plan, graph, fitted, frames=0).predicted.latency_ms
        assert predicted == pytest.approx(res.measured.latency_ms, rel=1e-6), plan.name
    # no plan that pays it: nothing to learn
    assert tune_module.fit_frame_overhead(table, runs[1:], graph, profile, ort.__version__) is None


def test_target_below_the_noise_is_reported_not_chased(tuned, tmp_path) -> None:
    """--target-error 0: no measurement resolves it. The frames grow to the cap and no further, every round
    says the target is below the noise (text and --json), and the loop stops once the error is within
    1.5x the noise instead of running on towards 0%."""
    costs = _fresh(tuned, tmp_path)
    model = tuned["last"][0][0].model_path
    env = {**os.environ, "PARAPIPE_HOME": str(tmp_path)}
    args = [PARAPIPE, "tune", model, "--board", "local", "--objective", "throughput", "--rounds", "3"]
    args += ["--target-error", "0", "--time-limit", "1", "--frames", "8", "--max-frames", "16", "--costs", str(costs)]
    args += ["--min-seconds", "0.2"]  # squeezenet1_1 runs ~500 fps: ~100 frames a measurement, not 16
    proc = subprocess.run([*args, "--json"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    noise = data["noise"]
    assert noise["frames"] == 16 and noise["capped"] and noise["grown"], "grown to the cap, not beyond"
    assert data["noise_limited"] is True
    assert data["effective_target_pct"] == pytest.approx(NOISE_MARGIN * noise["pct"])
    rounds = data["rounds"]
    assert all(r["noise_limited"] and "below what the measurements resolve" in r["note"] for r in rounds)
    assert all(r["frames"] == 16 for r in rounds)
    # every measurement lasted at least --min-seconds at the rate its plan was predicted at, the cap aside
    measured = [row for r in rounds for row in r["rows"]]
    assert all(row["frames"] >= max(16, math.ceil(0.2 * row["predicted"]["throughput_fps"])) for row in measured)
    assert any(row["frames"] > 16 for row in measured), "a fast plan gets more frames than --frames"
    for r in rounds[:-1]:  # it went on only while the error was larger than the noise
        assert r["stop"] is None
        assert max(r["rmspe_latency"], r["rmspe_throughput"]) > r["effective_target_pct"]
    final = rounds[-1]
    assert final["stop"] in ("noise", "rounds") and data["stop"] == final["stop"]
    if final["stop"] == "noise":
        assert max(final["rmspe_latency"], final["rmspe_throughput"]) <= final["effective_target_pct"]
        assert final["calibration"] is None, "within the noise: nothing more is fitted"


def test_the_noise_pools_both_ends_of_round_1s_front_and_every_later_round_measures_them_again(
    tuned, exported, tmp_path, monkeypatch
) -> None:
    """What drifts between rounds is noise too, and pipelined plans drift most: round 1 measures its first plan
    twice and the throughput end of its front twice; a round that plans neither measures each once more, and
    those runs join the noise (real runs on ``local``; the planner is made to offer a two-plan front in round 1
    and another plan in round 2, since which plans it offers is not what this checks)."""
    import parapipe.tune as tune_module
    from models.coarsen import coarsen
    from planner.baselines import flop_pipeline, single_pu
    from planner.build import evaluate
    from planner.costmodel import CostModel

    graph, profile = _context(exported)
    blocks = coarsen(graph, "coarse")
    cost = CostModel.from_table(profile, graph, CostTable.load(tuned["costs"]))

    def far_off(plan, rate=1.0):  # predicted 10x off what any run measures: no round stops within the noise
        p = evaluate(plan, graph, cost, frames=0).predicted
        p = dataclasses.replace(p, latency_ms=p.latency_ms * 10, throughput_fps=p.throughput_fps * rate)
        return dataclasses.replace(plan, predicted=p)

    fronts = [
        [
            far_off(single_pu(blocks, profile, "cpu", 1, "one-core")),
            far_off(flop_pipeline(blocks, profile, [("cpu", 1), ("cpu", 1)], "two-cores")),
        ],
        # predicted at 10x the rate any measured plan is, so none stands in for it (``settled``)
        [far_off(single_pu(blocks, profile, "cpu", 2, "two-threads"), rate=10.0)],
    ]
    planned: list[int] = []  # the first front, then the second for every later planning (``recalibrate``'s too)
    monkeypatch.setattr(
        tune_module, "pareto_set", lambda *a, **k: planned.append(1) or list(fronts[min(len(planned), 2) - 1])
    )
    messages: list[str] = []
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    options = TuneOptions(
        "pareto", rounds=2, target_error=0.0, time_limit=1, frames=8, max_frames=8, noise_runs=2, min_seconds=0.0
    )
    history, last = tune(exported(MODEL).path, "local", _fresh(tuned, tmp_path), options, progress=messages.append)
    assert [p.name for p, _ in last] == ["two-threads"]
    first, second = history[0].noise, history[1].noise
    assert first is not None and second is not None and first.plan == second.plan == "one-core"
    # round 1: the first plan twice (the noise runs) and the throughput end twice, at once
    # (and a third time where two runs of a plan came out far apart: ``confirmed``)
    thirds = [sum(m.startswith(f"round {k}:") and "far apart" in m for m in messages) for k in (1, 2)]
    assert first.plans == 2 and first.runs == 4 + thirds[0], first
    assert "round 1: measuring plan 2 again (for the noise)" in messages
    # round 2: both noise plans once more, and its own plan twice (10x off its prediction, measured again)
    assert {
        "round 2: measuring one-core again for the noise (8 frames)",
        "round 2: measuring two-cores again for the noise (8 frames)",
        "round 2: measuring plan 1 again (it is far from its prediction)",
    } <= set(messages), messages
    assert second.plans == 3 and second.runs == first.runs + 2 + 2 + thirds[1], second
    assert second.frames == first.frames == 8


def test_a_new_plan_within_the_noise_of_a_measured_one_gives_way_to_it(tuned, exported) -> None:
    """For any noise: a planned plan that a plan measured before is predicted within the noise of, on latency,
    throughput and energy, gives way to that plan (re-evaluated under this round's model); one predicted better
    than that is run; a plan measured before is run as planned; and no plan is run twice."""
    from hypothesis import HealthCheck

    from models.coarsen import coarsen
    from planner.baselines import single_pu
    from planner.build import evaluate
    from planner.costmodel import CostModel

    graph, profile = _context(exported)
    blocks = coarsen(graph, "coarse")
    # two cores at half one core's measured times: profiled on a busy machine (this module run beside others,
    # ``-n 2``), two cores came out slower than one, and this test is about ``settled``, not the measurements
    measured = CostTable.load(tuned["costs"])
    table = CostTable()
    for e in measured:
        if e.config == ("cpu", 1):
            table.add(e)
            cond = dataclasses.replace(e.conditions, cores=2, threads=2)
            key = entry_key(e.model_sha256, e.kind, e.members, cond)
            halved = {f: getattr(e, f) / 2 for f in ("median_ms", "mean_ms", "p10_ms", "p90_ms")}
            table.add(dataclasses.replace(e, key=key, conditions=cond, **halved))
    cost = CostModel.from_table(profile, graph, table)
    one = evaluate(single_pu(blocks, profile, "cpu", 1, "one core"), graph, cost, frames=0)
    two = evaluate(single_pu(blocks, profile, "cpu", 2, "two cores"), graph, cost, frames=0)
    assert one.predicted is not None and two.predicted is not None
    gap = shortfall(one.predicted, two.predicted)  # one core for two: slower, within a noise that large
    assert gap > 0.05

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.floats(0.0, 3.0 * 100.0 * gap))
    def check(noise_pct: float) -> None:
        out = settled([two, two], [one], graph, cost, noise_pct)  # planned twice: run once
        if gap <= noise_pct / 100.0:
            ((run, stands_for),) = out
            assert plan_key(run) == plan_key(one) and stands_for is two
            assert run.predicted == evaluate(one, graph, cost, frames=0).predicted and run.simulated is not None
        else:
            assert out == [(two, None)]
        assert settled([one], [one, two], graph, cost, noise_pct) == [(one, None)]  # measured: as planned

    check()


def test_a_plan_measured_in_several_rounds_is_fed_back_as_the_median_of_all_its_runs(
    tuned, exported, tmp_path, monkeypatch
) -> None:
    """On a noisy board the same plan drifts between rounds more than the model is off, so a recalibration fits
    each plan once, every run of it so far merged: round 2 offers round 1's plan again (another name), and its
    recalibration gets it once, with the counters of all three runs (two noise runs in round 1, one in round 2)
    and the median of their figures (real runs on ``local``)."""
    import parapipe.tune as tune_module
    from models.coarsen import coarsen
    from planner.baselines import single_pu
    from planner.build import evaluate
    from planner.costmodel import CostModel

    graph, profile = _context(exported)
    blocks = coarsen(graph, "coarse")
    cost = CostModel.from_table(profile, graph, CostTable.load(tuned["costs"]))

    def far_off(plan):  # predicted 10x off: no round stops within the noise
        p = evaluate(plan, graph, cost, frames=0).predicted
        return dataclasses.replace(plan, predicted=dataclasses.replace(p, latency_ms=p.latency_ms * 10))

    fronts = [[far_off(single_pu(blocks, profile, "cpu", 1, name))] for name in ("first", "again")]
    planned: list[int] = []  # the first front, then the second for every later planning (``recalibrate``'s too)
    monkeypatch.setattr(
        tune_module, "pareto_set", lambda *a, **k: planned.append(1) or list(fronts[min(len(planned), 2) - 1])
    )
    ran: list = []
    real_run, real_recalibrate = tune_module.run_plan, tune_module.recalibrate
    monkeypatch.setattr(tune_module, "run_plan", lambda *a, **k: ran.append(real_run(*a, **k)) or ran[-1])
    fitted: list = []

    def spy(table, runs, measured, *rest):
        fitted.append((runs, measured))
        return real_recalibrate(table, runs, measured, *rest)

    monkeypatch.setattr(tune_module, "recalibrate", spy)
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    options = TuneOptions(
        "pareto", rounds=2, target_error=0.0, time_limit=1, frames=8, max_frames=8, noise_runs=2, min_seconds=0.0
    )
    history, last = tune(exported(MODEL).path, "local", _fresh(tuned, tmp_path), options)
    # round 2 runs it once, or again where that run is far from round 1's two (``confirmed``)
    assert [p.name for p, _ in last] == ["again"] and len(ran) >= 3 and len(fitted) == 2
    (one,), (two,) = fitted[0][0], fitted[1][0]
    ((held, merged),) = fitted[1][1]  # the plans measured so far hold it once, merged too
    assert held.name == "first" and merged.measured == two[1].measured
    fed = [r.partitions[0].frames for r in ran]  # each run's 8 frames, and its window's last ones that drained
    assert min(fed) > 8 and all(len(r.partitions) == 1 for r in ran)
    assert [p.frames for p in one[1].partitions] == [fed[0] + fed[1]]  # round 1: its two noise runs
    plan, pooled = two
    assert plan.name == "again"  # this round's plan, its runs pooled
    assert [p.frames for p in pooled.partitions] == [sum(fed)], "all the runs, not round 2's"
    busy = sum(p.busy_ms for r in ran for p in r.partitions if p.name == pooled.partitions[0].name)
    assert pooled.partitions[0].busy_ms == pytest.approx(busy)
    assert pooled.measured.latency_ms == pytest.approx(statistics.median(r.measured.latency_ms for r in ran))
    # what the round reports is still its own runs
    own = statistics.median(r.measured.latency_ms for r in ran[2:])
    assert history[1].rows[0]["measured"]["latency_ms"] == pytest.approx(own)


def test_measured_energy_rescales_the_power_model(exported, tmp_path, monkeypatch) -> None:
    """A board with a power sensor (a fake hwmon tree read by the real agent): energy enters the loop.

    400 W is so far above the profile's estimates that the error cannot be within the timing noise,
    so the one round recalibrates (rather than stopping at the noise floor)."""
    hwmon = tmp_path / "hwmon" / "hwmon0"
    hwmon.mkdir(parents=True)
    (hwmon / "name").write_text("fakepower\n")
    (hwmon / "power1_input").write_text("400000000\n")  # 400 W
    monkeypatch.setenv("PARAPIPE_HWMON_ROOT", str(tmp_path / "hwmon"))
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    costs = tmp_path / "costs.json"
    options = TuneOptions("throughput", rounds=1, target_error=0.0, time_limit=1, frames=8, min_seconds=0.0)
    history, last = tune(exported(MODEL).path, "local", costs, options)
    assert all(r.energy_source == "measured" for _, r in last)
    (first,) = history
    assert first.rmspe_energy is not None and first.rmspe_energy > 50  # the estimates are far off (predicted ~2% of it)
    assert first.stop == "rounds" and first.calibration is not None and first.calibration.kept
    assert first.power_scale is not None and max(first.power_scale) > 1.5
    table = CostTable.load(costs)
    learnt = {r.kind: r for r in table.learnt(board="local")}
    assert {"power-active-scale", "power-idle-scale"} <= set(learnt) and all(
        r.unit == "x" for r in learnt.values() if r.kind.startswith("power")
    )
    assert (learnt["power-active-scale"].value, learnt["power-idle-scale"].value) == pytest.approx(first.power_scale)
    assert all(e.kind in ("op", "block", "partition") for e in table), "no placeholder timing entries"
    # The kept table predicts the energy the sensor measured for the plan it learnt from.
    from planner.build import evaluate
    from planner.costmodel import CostModel

    graph, profile = _context(exported)
    cost = CostModel.from_table(profile, graph, table)
    plan, result = last[0]
    predicted = evaluate(plan, graph, cost, frames=0).predicted.energy_mj
    assert predicted == pytest.approx(result.measured.energy_mj, rel=0.01)


def _without_memory(costs: Path) -> CostTable:
    """The table without the memory bandwidth profiling measured (on a loaded machine it may bind every plan):
    the profile's no-contention estimate holds; and without the whole model measured on both cores, which
    floors a fitted bandwidth (``CostModel.memory_gbps``: one unit alone runs beside nothing) where this
    machine's measurements put it, leaving a pipeline's slowdown a few percent to be put on the memory. So the
    floor is the whole model on one core here (``_alone_ms``; the floor from both cores has its own test in
    ``tests/planner/test_soc_costs.py``)."""
    table = CostTable.load(costs)
    for key in [k for k, r in table.calibration.items() if r.kind == "memory-bandwidth"]:
        del table.calibration[key]
    every = {n for e in table.entries.values() if e.kind == "op" for n in e.members}
    for key in [k for k, e in table.entries.items() if e.conditions.cores > 1 and set(e.members) == every]:
        del table.entries[key]
    return table


def _alone_ms(cost, graph) -> float:
    """The whole model on the fastest single unit of ``local``'s cpu alone: one core, or both where measured (the
    floor of the memory's bandwidth, ``CostModel.memory_gbps``)."""
    every = [n.name for n in graph.nodes]
    times = [cost.group_ms(every, "cpu", k) for k in (1, 2)]
    return min(t.ms for k, t in zip((1, 2), times, strict=True) if k == 1 or t.source == "measured")


def _pipe_measured(tuned, exported, slowdown: float | None):
    """The two-core pipeline of the model, its partitions measured as the profiled table predicts them, its
    latency as predicted and its throughput ``slowdown`` times below the prediction (None: half way down to
    what the whole model does on one unit alone, ``_alone_ms``)."""
    from models.coarsen import coarsen
    from planner.baselines import flop_pipeline
    from planner.build import evaluate
    from planner.costmodel import CostModel
    from planner.segments import lower

    graph, profile = _context(exported)
    cost = CostModel.from_table(profile, graph, _without_memory(tuned["costs"]))
    plan = flop_pipeline(coarsen(graph, "coarse"), profile, [("cpu", 1), ("cpu", 1)], "pipe")
    parts = []
    for s in lower(plan, graph, profile):
        ms = cost.group_ms(s.members, s.pu, s.cores).ms
        parts.append(PartitionMeasurement(s.name, s.pu, ms * 20, 0.0, 20, ms * 5, 5))
    predicted = evaluate(plan, graph, cost, frames=0).predicted
    if slowdown is None:
        headroom = predicted.throughput_fps * _alone_ms(cost, graph) / 1000
        assert headroom > 1.05, "the pipeline is faster than the model on one unit alone"
        slowdown = 1 + (headroom - 1) / 2
    _, real = tuned["last"][0]
    measured = Figures(predicted.latency_ms, predicted.throughput_fps / slowdown, 1.0)
    return graph, profile, plan, dataclasses.replace(real, measured=measured, partitions=tuple(parts))


def test_tune_learns_the_shared_memory_from_throughputs_slower_than_predicted(tuned, exported, tmp_path) -> None:
    """A pipeline over both cores whose partitions take what the table says but whose throughput is below what
    they allow, half way to one core's (units running at once slowing each other): the recalibration learns the
    shared memory's bandwidth that predicts that throughput, and keeps it because it predicts the measured plan
    better."""
    import onnxruntime as ort

    from planner.build import evaluate
    from planner.costmodel import CostModel

    graph, profile, plan, slowed = _pipe_measured(tuned, exported, None)
    table = _without_memory(_fresh(tuned, tmp_path))
    verdict, _, _ = recalibrate(table, [(plan, slowed)], [(plan, slowed)], graph, profile, ort.__version__)
    assert verdict.kept and verdict.rmspe_after < verdict.rmspe_before
    ((memory, gbps),) = verdict.memory_gbps
    assert memory == "dram"
    cost = CostModel.from_table(profile, graph, table)
    assert cost.memory_gbps("dram") == pytest.approx(gbps)
    predicted = evaluate(plan, graph, cost, frames=0).predicted.throughput_fps
    assert predicted == pytest.approx(slowed.measured.throughput_fps, rel=0.03)


def test_the_memory_never_slows_the_whole_model_on_one_unit_alone(tuned, exported, tmp_path) -> None:
    """A pipeline measured 10x slower than its partitions allow (say, another process took the cores) is not
    blamed on the memory beyond what the model's own time on one unit alone allows (one core, or both cores
    where that was measured): the bandwidth stops there, and a plan of one unit is predicted as fast as its
    own time."""
    import onnxruntime as ort

    from models.coarsen import coarsen
    from planner.baselines import single_pu
    from planner.build import evaluate
    from planner.costmodel import CostModel

    graph, profile, plan, slowed = _pipe_measured(tuned, exported, 10.0)
    table = _without_memory(_fresh(tuned, tmp_path))
    verdict, _, _ = recalibrate(table, [(plan, slowed)], [(plan, slowed)], graph, profile, ort.__version__)
    cost = CostModel.from_table(profile, graph, table)
    every = [n.name for n in graph.nodes]
    alone_ms = _alone_ms(cost, graph)
    assert verdict.kept and verdict.memory_gbps, "the memory explains part of it"
    assert cost.traffic_ms(every, "cpu") == pytest.approx(alone_ms, rel=1e-6), "and no more"
    # however low a bandwidth the table holds, the cost model stops there
    floor = cost.recalibrated(cost.calibration.with_memory("dram", 1e-3))
    assert floor.traffic_ms(every, "cpu") == pytest.approx(alone_ms, rel=1e-6)
    for cores in (1, 2):  # a plan of one unit, on one core or both: as fast as its own time, the memory aside
        alone = evaluate(single_pu(coarsen(graph, "coarse"), profile, "cpu", cores, "one"), graph, cost, frames=0)
        own_ms = cost.group_ms(every, "cpu", cores).ms
        assert alone.predicted.throughput_fps == pytest.approx(1000 / max(own_ms, alone_ms), rel=0.02)


def test_partitions_feed_back_their_one_at_a_time_time_where_a_shared_memory_holds_the_contention(
    tuned, exported
) -> None:
    """On ``local`` (its cores share a memory) a partition's fed-back time is its time with frames one at a time;
    the back-to-back excess is left to the memory's bandwidth. Without a shared memory, every partition keeps its
    back-to-back time (what throughput needs): a unit of several partitions runs them in turn, so each one's
    back-to-back time is its own."""
    import onnxruntime as ort

    from device_profiles.schema import Throttle
    from models.coarsen import coarsen
    from planner.baselines import flop_pipeline
    from planner.plan import Assignment, Stage
    from planner.segments import lower

    graph, profile = _context(exported)
    _, real = tuned["last"][0]
    blocks = coarsen(graph, "coarse")
    pipe = flop_pipeline(blocks, profile, [("cpu", 1), ("cpu", 1)], "pipe")  # units of one partition
    names = [b.name for b in blocks.nodes]
    third = len(names) // 3
    interleaved = Stage(  # core 0 runs the head and the tail around core 1's middle: several partitions
        (
            (
                Assignment("cpu", 1, (*names[:third], *names[2 * third :]), (0,)),
                Assignment("cpu", 1, tuple(names[third : 2 * third]), (1,)),
            ),
        )
    )
    plans = [pipe, dataclasses.replace(pipe, stages=(interleaved,), name="interleaved")]
    for plan in plans:
        segments = lower(plan, graph, profile)
        measured = dataclasses.replace(
            real,
            partitions=tuple(
                PartitionMeasurement(
                    s.name, s.pu, busy_ms=40.0, queue_wait_ms=0.0, frames=20, alone_busy_ms=5.0, alone_frames=5
                )
                for s in segments
            ),
        )  # 2 ms a frame back to back, 1 ms one at a time
        # on a CFS-throttled PU the back-to-back excess is its sustained factor's (``fit_sustained``), with or
        # without a shared memory: its partitions too keep their one-at-a-time time, read back as the work a
        # frame's partitions there did sharing its first burst (1 ms each alone: 1 ms, then 0.4 ms of work)
        throttled = tuple(dataclasses.replace(p, throttle=Throttle(40.0)) for p in profile.pus)
        shared: dict[str, float] = {}
        for k in {s.unit_key for s in segments}:
            unit = sorted((s for s in segments if s.unit_key == k), key=lambda s: s.index)
            shared.update(zip((s.name for s in unit), shared_burst_work([1.0] * len(unit), 40.0), strict=True))
        for board, expect in (
            (profile, dict.fromkeys(shared, 1.0)),
            (dataclasses.replace(profile, memories=()), dict.fromkeys(shared, 2.0)),
            (dataclasses.replace(profile, memories=(), pus=throttled), shared),
        ):
            table = CostTable()
            assert feed_back(table, plan, measured, graph, board, ort.__version__) == len(segments)
            fed = {frozenset(e.members): e.mean_ms for e in table}  # replicas of one unit share an entry
            for s in segments:
                assert fed[frozenset(s.members)] == pytest.approx(expect[s.name]), (plan.name, s.name, board.pus)
    assert shared == pytest.approx({n: 1.0 if n.endswith("_p0") else 0.4 for n in shared})
    units = [s.unit_key for s in lower(plans[1], graph, profile)]
    assert any(units.count(k) > 1 for k in units), "the interleaved plan has a unit of several partitions"


def _big_cut_model(path: Path) -> Path:
    """Three convolutions on a 512x512 image: the tensor between the second and the third is 16 MiB, so a plan
    that cuts there spends much of a frame moving it between hosts."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), f"w{i}")
        for i, shape in enumerate([(16, 3, 3, 3), (16, 16, 3, 3), (4, 16, 3, 3)])
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"], name="relu0"),
        helper.make_node("Conv", ["b", "w1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["d"], name="relu1"),
        helper.make_node("Conv", ["d", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "big-cut",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 512, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 512, 512])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.agent
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_tune_learns_a_network_link_from_a_plan_run_across_it(tmp_path, monkeypatch) -> None:
    """A plan over the edge and cloud agents of ``local-edge-cloud`` (real agent processes streaming a 16 MiB
    tensor to each other over gRPC) is measured; the recalibration learns the link's bandwidth and the CPU time
    each end spends per tensor, keeps them because they predict the run better, and the cost table keeps them."""
    import onnxruntime as ort

    from device_profiles.loader import load_profile
    from device_profiles.schema import Quantity
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from parapipe.run import run_plan
    from planner.baselines import flop_pipeline
    from planner.build import evaluate
    from planner.costmodel import CostModel

    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    model = _big_cut_model(tmp_path / "big-cut.onnx")
    loaded = load_onnx(model)
    graph = build_graph(loaded.proto, loaded.sha256, "big-cut")
    # The profile the recalibration starts from believes the link is 20x faster than loopback gRPC is, with no
    # CPU cost per tensor: its prediction of the run is then clearly off, and a fitted link must do better.
    # (With the shipped estimate the prediction can already be within the run's own noise, and a fit to one
    # 40-frame run may then predict it no better, which is the verdict working, not the fit failing.)
    shipped = load_profile("local-edge-cloud")
    wrong_link = dataclasses.replace(
        shipped.network[0],
        bandwidth_gbps=Quantity(16.0, "estimate", "deliberately wrong for this test"),
        latency_us=Quantity(0.0, "estimate", "deliberately wrong for this test"),
    )
    profile = dataclasses.replace(shipped, network=(wrong_link,))
    plan = flop_pipeline(coarsen(graph, "fine"), profile, [("edge", 1), ("cloud", 1)], name="edge-then-cloud")
    plan = dataclasses.replace(plan, model_path=str(model), inputs=loaded.inputs)
    hosts = {profile.pu(a.pu).host for _, _, a in plan.assignments()}
    assert hosts == {"edge", "cloud"}, "the plan must cross the link"
    result = run_plan(plan, "local-edge-cloud", None, 40)

    table = CostTable()
    verdict, _, _ = recalibrate(table, [(plan, result)], [(plan, result)], graph, profile, ort.__version__)
    assert verdict.kept, verdict
    ((link, gbps, per_message, per_mb),) = verdict.network
    assert link == "edge-cloud" and gbps > 0 and per_message >= 0 and per_mb >= 0

    def error(cost: CostModel) -> float:
        predicted = evaluate(plan, graph, cost, frames=0).predicted
        return rmspe(
            [
                (predicted.latency_ms, result.measured.latency_ms),
                (predicted.throughput_fps, result.measured.throughput_fps),
            ]
        )

    fitted = CostModel.from_table(profile, graph, table)
    assert fitted.calibration.network[link].gbps == pytest.approx(gbps)
    profile_link = profile.network[0]
    as_profiled = fitted.recalibrated(
        fitted.calibration.with_network(link, NetworkFit(profile_link.bandwidth_gbps.value, 0.0, 0.0))
    )
    assert error(fitted) < error(as_profiled)
    # saved and loaded, the table still has it
    table.save(tmp_path / "costs.json")
    again = CostModel.from_table(profile, graph, CostTable.load(tmp_path / "costs.json"))
    assert again.calibration.network[link] == fitted.calibration.network[link]


def _conv_chain_model(path: Path, side: int = 128) -> Path:
    """Four 3x3 convolutions of 16 channels on a ``side`` x ``side`` map: a few ms a frame on one core at 128."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    weights = [
        numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), f"w{i}")
        for i in range(4)
    ]
    nodes, prev = [], "x"
    for i in range(4):
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    graph = helper.make_graph(
        nodes,
        "conv-chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, side, side])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 16, side, side])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.agent
def test_tune_learns_a_throttled_pus_sustained_factor_from_a_plan_run_on_it(tmp_path, monkeypatch) -> None:
    """A pipeline over ``local-biglittle``'s big core and its CFS-throttled LITTLE core (a real agent process) is
    measured. Recalibrated from a profile that believes the LITTLE core's quota costs nothing back to back (a
    sustained factor of 1), the fit learns that its partitions take longer back to back than alone (the quota
    runs out), keeps it because it predicts the run better, and the cost table keeps it."""
    import onnxruntime as ort

    from device_profiles.loader import load_profile
    from device_profiles.schema import ProfileError, Throttle
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from parapipe.run import run_plan
    from planner.baselines import flop_pipeline
    from planner.build import evaluate
    from planner.costmodel import CostModel
    from planner.segments import lower
    from planner.simulate import PlanModel
    from profiler.costtable import CalibrationRecord

    try:
        real = load_profile("local-biglittle")
    except ProfileError as exc:
        pytest.skip(str(exc))
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    model = _conv_chain_model(tmp_path / "chain.onnx")
    loaded = load_onnx(model)
    graph = build_graph(loaded.proto, loaded.sha256, "chain")
    plan = flop_pipeline(coarsen(graph, "fine"), real, [("big", 1), ("little", 1)], name="big-then-little")
    plan = dataclasses.replace(plan, model_path=str(model), inputs=loaded.inputs)
    result = run_plan(plan, "local-biglittle", None, 60)
    # the agent reads the CPU time of the LITTLE session's thread: its work, what it waited for the quota left out
    little = next(p for p in result.partitions if p.pu == "little")
    assert little.alone_cpu_frames == little.alone_frames > 0 and little.cpu_frames == little.frames
    assert 0 < little.alone_cpu_per_frame_ms <= little.alone_per_frame_ms * 1.02
    assert little.cpu_ms < little.busy_ms, "back to back the quota runs out: it waits"
    segments = {s.name: s for s in lower(plan, graph, real)}
    assert throttled_work(segments, result, real)[little.name] == pytest.approx(little.alone_cpu_per_frame_ms)

    unaware = dataclasses.replace(
        real, pus=tuple(dataclasses.replace(p, throttle=Throttle(100.0)) if p.throttle else p for p in real.pus)
    )
    assert CostModel(unaware, graph).sustained_factor("little") == 1.0
    table = CostTable()
    verdict, _, _ = recalibrate(table, [(plan, result)], [(plan, result)], graph, unaware, ort.__version__)
    assert verdict.kept, verdict
    ((pu, factor),) = verdict.sustained
    assert pu == "little" and factor > 1.2, verdict
    fitted = CostModel.from_table(unaware, graph, table)
    assert fitted.sustained_factor("little") == pytest.approx(factor)
    assert fitted.sustained_factor("big") == 1.0

    def error(cost: CostModel) -> float:
        predicted = evaluate(plan, graph, cost, frames=0).predicted.throughput_fps
        return abs(predicted / result.measured.throughput_fps - 1)

    # The memory fit runs after this one and may then explain the run as well with either factor (CI saw both
    # at 0.0 error when the run was memory bound): the factor must beat 1.0 where it was fitted, before it
    # (no memory bandwidth learnt yet), and never be worse after it.
    assert error(fitted) <= error(fitted.recalibrated(fitted.calibration.with_sustained("little", 1.0)))
    before_memory = fitted.recalibrated(dataclasses.replace(fitted.calibration, memory_gbps={}))
    assert error(before_memory) < error(
        before_memory.recalibrated(before_memory.calibration.with_sustained("little", 1.0))
    )
    table.save(tmp_path / "costs.json")
    again = CostModel.from_table(unaware, graph, CostTable.load(tmp_path / "costs.json"))
    assert again.sustained_factor("little") == pytest.approx(factor)

    # With the real quota (40%: a share of 2.5), a run measured faster than the share allows is explained by
    # less work on the unit than the table has, never by a factor under the share: the fit that predicts this
    # run best would be about 2.5 / 1.8, and it stays at the share.
    share = 100.0 / real.pu("little").throttle.quota_percent
    at_share = CostModel(real, graph)
    bound = 1000.0 / max(
        at_share.group_ms(s.members, s.pu, s.cores).ms * at_share.sustained_factor(s.pu)
        for s in PlanModel(plan, graph, at_share).segments
    )
    fast = dataclasses.replace(result, measured=dataclasses.replace(result.measured, throughput_fps=1.8 * bound))
    cheap = CostTable()
    fitted_fast = fit_sustained(cheap, [(plan, fast)], graph, real, ort.__version__)
    assert fitted_fast is None or fitted_fast["little"] >= share
    assert CostModel.from_table(real, graph, cheap).sustained_factor("little") >= share
    under = CostTable()
    old = CostModel.from_table(real, graph, under)
    under.learn(
        CalibrationRecord.learnt(
            graph.model_sha256,
            "sustained-factor",
            1.5,
            sustained_conditions(real, "little", ort.__version__),
            1,
            "little",
        )
    )
    assert CostModel.from_table(real, graph, under).sustained_factor("little") == 1.5 != old.sustained_factor("little")
    # a factor learnt under the share before (an older table) is moved back up to it
    assert fit_sustained(under, [(plan, fast)], graph, real, ort.__version__) == {"little": share}


@pytest.mark.agent
def test_a_session_spanning_a_throttled_core_is_priced_by_its_parts_rates_and_fed_back_as_measured(
    tmp_path, monkeypatch
) -> None:
    """One session over big and the throttled LITTLE core (what ``ort-all-cores`` is on local-biglittle): the cost
    model prices it at its parts' rates summed, LITTLE's at its share, the same alone and back to back; a real
    run of it is fed back under that unit and then looked up, never fitted. Before, it was priced at LITTLE's
    pace (2.5x its time back to back) and never fed back, so every round mispredicted the same plan (squeezenet1_1's
    latency plan: 213 fps predicted, 265-374 measured in eight runs)."""
    import onnxruntime as ort

    from device_profiles.loader import load_profile
    from device_profiles.schema import ProfileError
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from parapipe.run import run_plan
    from planner.baselines import single_pu
    from planner.build import evaluate
    from planner.costmodel import CostModel
    from planner.segments import lower

    try:
        real = load_profile("local-biglittle")
    except ProfileError as exc:
        pytest.skip(str(exc))
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    model = _conv_chain_model(tmp_path / "chain.onnx")
    loaded = load_onnx(model)
    graph = build_graph(loaded.proto, loaded.sha256, "chain")
    blocks = coarsen(graph, "fine")
    plan = single_pu(blocks, real, "big+little", 2, "spanning")
    plan = dataclasses.replace(plan, model_path=str(model), inputs=loaded.inputs)
    (seg,) = lower(plan, graph, real)

    cost = CostModel(real, graph)
    big, little = (cost.group_ms(seg.members, pu, 1).ms for pu in ("big", "little"))
    share = 100.0 / real.pu("little").throttle.quota_percent
    assert cost.group_ms(seg.members, "big+little", 2).ms == pytest.approx(1 / (1 / big + 1 / (little * share)))
    assert cost.sustained_factor("big+little") == cost.alone_factor("big+little") == 1.0
    assert cost.burst_ms("big+little") is None and cost.burst_ms("little") is not None

    result = run_plan(plan, "local-biglittle", None, 40)
    (measured,) = result.partitions
    table = CostTable()
    assert feed_back(table, plan, result, graph, real, ort.__version__) == 1
    (entry,) = list(table)
    assert (
        entry.conditions.pu == "big+little"
        and entry.conditions.cores == 2
        and entry.conditions.throttle_percent is None
    )
    # local-biglittle's cores share a memory: the time fed back is the one with frames run one at a time
    assert real.shared_memory("big") is not None
    assert entry.mean_ms == pytest.approx(measured.alone_per_frame_ms)
    fed = CostModel.from_table(real, graph, table)
    looked_up = fed.group_ms(seg.members, "big+little", 2)
    assert looked_up.source == "measured" and looked_up.ms == pytest.approx(measured.alone_per_frame_ms)
    assert ("big+little", 2) not in fed.fits, "a spanning session is looked up, never fitted"
    predicted = evaluate(plan, graph, fed, frames=0).predicted
    assert predicted.latency_ms >= looked_up.ms and predicted.throughput_fps == pytest.approx(
        1000.0 / looked_up.ms, rel=0.2
    )


@settings(max_examples=200, deadline=None)
@given(
    errors=st.lists(st.sampled_from([0.05, 0.1, 0.2, 0.4]), min_size=2, max_size=14),
    base_at=st.integers(0, 13),
)
def test_a_fit_moves_only_as_far_as_the_measured_plans_tell_values_apart(errors: list[float], base_at: int) -> None:
    """Of a grid of candidate values, a fit takes one of the least error, and among the values the measured plans
    predict alike (a plateau: the term binds none of them there) the one nearest the value it had: never the far
    end of the plateau, which plans of another shape would then be priced by (a throttled core's sustained
    factor moved from 2.5 to 1.4 by plans none of which the core bound)."""
    values = [1.0 + 0.25 * i for i in range(len(errors))]
    base = values[min(base_at, len(values) - 1)]
    value, error = least_change(list(zip(values, errors, strict=True)), base)
    assert error == min(errors)
    tied = [v for v, e in zip(values, errors, strict=True) if e == error]
    assert abs(math.log(value / base)) == min(abs(math.log(v / base)) for v in tied)
    if error == errors[values.index(base)]:
        assert value == base, "where the value it had predicts as well, it stays"


@given(st.floats(0.0, 500.0), st.floats(0.0, 500.0))
def test_a_recalibration_is_kept_only_for_a_gain_noise_alone_would_not_give(before: float, after: float) -> None:
    """Kept only if it lowers the error by at least KEEP_GAIN of it: a fit scored on the plans it was fitted to
    gains a little on noise alone, and a kept table reprices every plan shape nobody measured."""
    kept = worth_keeping(before, after)
    assert kept == (after < before * (1 - KEEP_GAIN))
    if kept:
        assert after < before and before - after >= KEEP_GAIN * before
    if after >= before * 0.96:  # e.g. 8.2% -> 8.0%: inception_v3's kept table that then mispredicted by 2.3x
        assert not kept


def test_a_plans_own_measurement_is_left_out_of_its_out_of_sample_prediction(tuned, exported, tmp_path) -> None:
    """Out of sample, a measured plan is predicted as before its partitions were fed back (they are its own, by
    nodes, PU and cores, and kept out of every fit); in sample, it is predicted by them."""
    import onnxruntime as ort

    from planner.build import evaluate
    from planner.costmodel import CostModel

    graph, profile = _context(exported)
    plan, real = tuned["last"][0]
    table = CostTable.load(_fresh(tuned, tmp_path))
    unseen = table_errors(table, [(plan, real)], graph, profile, out_of_sample=True)
    slower = dataclasses.replace(
        real,
        partitions=tuple(
            dataclasses.replace(p, busy_ms=p.busy_ms * 3, alone_busy_ms=p.alone_busy_ms * 3) for p in real.partitions
        ),
    )
    assert feed_back(table, plan, slower, graph, profile, ort.__version__) > 0
    assert own_partitions(table, plan, graph, profile), "the fed-back partitions are the plan's own"
    agreed = evaluate(plan, graph, CostModel.from_table(profile, graph, table), frames=0).predicted
    assert agreed is not None
    consistent = dataclasses.replace(real, measured=Figures(agreed.latency_ms, agreed.throughput_fps, 1.0))
    assert table_errors(table, [(plan, consistent)], graph, profile)[2] < 1e-6
    assert table_errors(table, [(plan, real)], graph, profile, out_of_sample=True) == pytest.approx(unseen)
    assert table_errors(table, [(plan, consistent)], graph, profile, out_of_sample=True)[2] > 50


def _fit_better_in_sample_worse_out_of_sample(monkeypatch) -> None:
    """Every recalibration scores 20 -> 10% in sample and 20 -> 30% out of sample (``table_errors`` is called
    before and after, in and out of sample): the real tables' errors would decide either way."""
    import itertools

    import parapipe.tune as tune_module

    in_sample, unseen = itertools.cycle([20.0, 10.0]), itertools.cycle([20.0, 30.0])

    def table_errors(table, measured, graph, profile, out_of_sample=False):
        return (0.0, 0.0, next(unseen if out_of_sample else in_sample))

    monkeypatch.setattr(tune_module, "table_errors", table_errors)


@pytest.mark.parametrize("plans", [1, 2])
def test_a_recalibration_must_not_predict_the_plans_each_without_its_own_measurement_worse(
    tuned, exported, tmp_path, monkeypatch, plans: int
) -> None:
    """A recalibration that predicts the measured plans better in sample (by its lookups of their own partitions)
    but worse out of sample, each plan without its own measurement as the next round's new plans are priced, is
    reverted from two measured plans on (``generalises``); with one plan nothing is left to learn it from and the
    in-sample rule alone decides. The errors are set here (the real tables' would decide either way); the feed
    back, the fits and the restore are the real ones."""
    import onnxruntime as ort

    graph, profile = _context(exported)
    plan, real = tuned["last"][0]
    runs = [(plan, real)] * plans
    _fit_better_in_sample_worse_out_of_sample(monkeypatch)
    table = CostTable.load(_fresh(tuned, tmp_path))
    before = {e.key: e for e in table}
    verdict, _, _ = recalibrate(table, runs[:1], runs, graph, profile, ort.__version__)
    assert (verdict.rmspe_before, verdict.rmspe_after) == (20.0, 10.0)
    assert (verdict.out_of_sample_before, verdict.out_of_sample_after) == (20.0, 30.0)
    assert worth_keeping(20.0, 10.0) and not generalises(20.0, 30.0)
    assert verdict.kept == (plans == 1)
    assert ({e.key: e for e in table} == before) == (plans == 2)


@pytest.mark.parametrize("next_measured", [True, False])
def test_a_recalibration_worse_out_of_sample_is_kept_where_the_next_round_runs_only_measured_plans(
    tuned, exported, tmp_path, monkeypatch, next_measured: bool
) -> None:
    """The out-of-sample rule guards the next round's new plans. Where the recalibrated table plans only plans
    measured before, those are predicted in sample and the in-sample gain is what the next round sees: the
    recalibration is kept (reverting it left the table that planned the same plans, and the loop ran them
    again round after round: multiview_bev on local-biglittle, 13.8% in all four rounds). ``replan`` is asked
    under the recalibrated table; a plan nobody measured among its plans reverts it as before."""
    import onnxruntime as ort

    graph, profile = _context(exported)
    plan, real = tuned["last"][0]
    runs = [(plan, real)] * 2
    _fit_better_in_sample_worse_out_of_sample(monkeypatch)
    table = CostTable.load(_fresh(tuned, tmp_path))
    before = {e.key: e for e in table}
    unmeasured = dataclasses.replace(plan, stages=plan.stages[:1] * 2)
    assert plan_key(unmeasured) != plan_key(plan)
    asked: list[bool] = []

    def replan(fitted: CostTable):
        asked.append({e.key: e for e in fitted} != before)  # under the recalibrated table
        return [plan] if next_measured else [plan, unmeasured]

    verdict, _, _ = recalibrate(table, runs[:1], runs, graph, profile, ort.__version__, replan)
    assert asked == [True]
    assert verdict.kept == verdict.measured_plans_only == next_measured
    assert ({e.key: e for e in table} == before) == (not next_measured)


def test_tune_runs_the_plans_it_kept_a_recalibration_for(tuned, exported, tmp_path, monkeypatch) -> None:
    """In the loop: a recalibration that fits two measured plans in sample and predicts them worse out of sample,
    where the planner offers the same two plans under it, is kept every round (it was reverted every round
    before, and the same plans ran under the same table), and the next round runs the plans it was kept for,
    planned once under that table."""
    import parapipe.tune as tune_module
    from models.coarsen import coarsen
    from planner.baselines import single_pu
    from planner.build import evaluate
    from planner.costmodel import CostModel

    graph, profile = _context(exported)
    blocks = coarsen(graph, "coarse")
    cost = CostModel.from_table(profile, graph, CostTable.load(tuned["costs"]))

    def far_off(plan):  # predicted 10x off: no round meets the target or stops within the noise
        p = evaluate(plan, graph, cost, frames=0).predicted
        return dataclasses.replace(plan, predicted=dataclasses.replace(p, latency_ms=p.latency_ms * 10))

    front = [far_off(single_pu(blocks, profile, "cpu", cores, f"cpu{cores}")) for cores in (1, 2)]
    asked: list[int] = []
    monkeypatch.setattr(tune_module, "pareto_set", lambda *a, **k: asked.append(1) or list(front))
    _fit_better_in_sample_worse_out_of_sample(monkeypatch)
    said: list[str] = []
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    options = TuneOptions(
        "pareto", rounds=3, target_error=0.0, time_limit=1, frames=8, max_frames=8, noise_runs=2, min_seconds=0.0
    )
    history, last = tune(exported(MODEL).path, "local", _fresh(tuned, tmp_path), options, said.append)
    assert len(history) == 3 and [p.name for p, _ in last] == ["cpu1", "cpu2"]
    for done in history:
        assert done.calibration is not None and done.calibration.kept and done.calibration.measured_plans_only
        assert (done.calibration.out_of_sample_before, done.calibration.out_of_sample_after) == (20.0, 30.0)
    assert len(asked) == 4, "round 1's planning, then once under each recalibrated table"
    assert "round 1: planning" in said and not any(m in said for m in ("round 2: planning", "round 3: planning"))
    assert "round 2: planning under the recalibrated table" in said
    assert "round 4: planning under the recalibrated table" not in said, "no round 4 runs"
    assert "round 3: planning under the recalibrated table to decide whether to keep it" in said


@settings(max_examples=300, deadline=None)
@given(
    times=st.lists(st.floats(0.01, 6.0), min_size=1, max_size=6),
    quota=st.sampled_from([25.0, 40.0, 70.0]),
)
def test_a_throttled_units_partitions_share_a_frames_first_burst(times: list[float], quota: float) -> None:
    """Read back from a frame's times alone, the partitions' work at full speed is what the cost model turns back
    into those times: the frame's first burst (one period's quota) at full speed, the rest at the CFS share, in
    the unit's order; every partition's work is positive and the first one's is read as the profiler reads a run."""
    from profiler.pinning import cfs_settings, full_speed_ms

    work = shared_burst_work(times, quota)
    burst = cfs_settings(quota)[1] / 1000.0

    def alone_ms(w: float) -> float:  # the cost model's time of a frame's first w ms of work on the unit
        return w if w <= burst else burst + (w - burst) * 100.0 / quota

    assert len(work) == len(times) and all(w > 0 for w in work)
    assert work[0] == pytest.approx(full_speed_ms(times[0], quota))
    for k in range(1, len(times) + 1):
        assert alone_ms(sum(work[:k])) == pytest.approx(sum(times[:k]), rel=1e-9, abs=1e-9)


@pytest.mark.agent
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_tune_learns_the_run_overhead_of_a_partition_in_a_pipeline(tuned, exported, tmp_path, monkeypatch) -> None:
    """A plan of many short partitions (squeezenet1_1's blocks alternately on the two cores of ``local``, one
    stage) runs on a real agent. Before its partitions are fed back, the median of what each short one took
    more than the profiled table predicts becomes the PU's run overhead; with it, that median is gone, and once
    fed back the plan's own partitions are priced as measured, the overhead not added again."""
    import onnxruntime as ort

    from models.coarsen import coarsen
    from models.onnx_io import load_onnx
    from parapipe.run import run_plan
    from parapipe.tune import fed_time, fit_run_overhead
    from planner.baselines import flop_pipeline
    from planner.costmodel import CostModel
    from planner.plan import Assignment, Stage, validate
    from planner.segments import lower

    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    graph, profile = _context(exported)
    blocks = coarsen(graph, "coarse")
    names = [b.name for b in blocks.nodes]
    stage = Stage(((Assignment("cpu", 1, tuple(names[0::2]), (0,)), Assignment("cpu", 1, tuple(names[1::2]), (1,))),))
    plan = dataclasses.replace(flop_pipeline(blocks, profile, [("cpu", 1)]), stages=(stage,), name="alternating")
    validate(plan, graph, profile)
    loaded = load_onnx(exported(MODEL).path)
    plan = dataclasses.replace(plan, model_path=str(exported(MODEL).path), inputs=loaded.inputs)
    result = run_plan(plan, "local", None, 30)
    table = CostTable.load(_fresh(tuned, tmp_path))
    before = CostModel.from_table(profile, graph, table)
    segments = {s.name: s for s in lower(plan, graph, profile)}
    work = throttled_work(segments, result, profile)

    def residuals(cost: CostModel) -> list[float]:
        out = []
        for p in result.partitions:
            seg = segments[p.name]
            predicted = cost.group_ms(seg.members, seg.pu, seg.cores).ms
            if predicted - cost.run_overhead_ms(seg.pu) < 1.0:
                out.append(fed_time(seg, p, profile, work) - predicted)
        return out

    found = residuals(before)
    assert len(found) >= 3, "the plan has short partitions"
    expected = max(0.0, statistics.median(found))
    learnt = fit_run_overhead(table, [(plan, result)], graph, profile, ort.__version__)
    assert (learnt or {}).get("cpu", 0.0) == pytest.approx(expected, abs=1e-4)
    after = CostModel.from_table(profile, graph, table)
    assert after.run_overhead_ms("cpu") == pytest.approx(expected, abs=1e-4)
    if expected > 0:
        assert statistics.median(residuals(after)) == pytest.approx(0.0, abs=1e-3)
    feed_back(table, plan, result, graph, profile, ort.__version__)
    fed = CostModel.from_table(profile, graph, table)
    for p in result.partitions:
        seg = segments[p.name]
        assert fed.group_ms(seg.members, seg.pu, seg.cores).ms == pytest.approx(fed_time(seg, p, profile, work))


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0.0, 60.0),
    st.floats(0.5, 20.0),
    st.integers(1, 200),
    st.integers(1, 400),
)
def test_frames_grow_between_rounds_while_the_pooled_noise_is_above_a_third_of_the_target(
    pct: float, target: float, frames: int, cap: int
) -> None:
    from parapipe.tune import NOISE_FRACTION, grown_frames

    frames = min(frames, cap)  # the loop never runs more than the cap
    noise = Noise("p", 4, frames, pct, pct / 2)
    more = grown_frames(noise, target, frames, cap)
    assert frames <= more <= cap, "never fewer, never past the cap"
    if noise.pct > target * NOISE_FRACTION and frames < cap:
        assert more == min(cap, 2 * frames)
    else:
        assert more == frames
