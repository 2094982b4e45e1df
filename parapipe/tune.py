"""The closed loop: profile -> plan -> run each plan -> feed the measurements back -> re-plan.

Each run on the board reports every partition's busy time per frame, with frames run one at
a time and back to back; those become measured ``partition`` entries in the cost table (keyed
like the profiler's), so the next round's cost model predicts those partitions from what the
board did. The time fed back is the one-at-a-time figure, and what units running at once cost
each other goes into the shared memory's bandwidth, fitted to the measured throughputs (and what
a tensor between hosts costs each end's CPU into the network link's figures, fitted to the plans
measured across it; and what a CFS-throttled PU's quota costs back to back into its sustained factor,
fitted to the measured throughputs, its partitions' times being the work they did at full speed); where the profile names no shared memory (and the PU is not
throttled), a partition keeps its back-to-back time (a unit runs its partitions in turn, so that time
is its own).

A recalibration is kept only if the new table predicts every plan measured so far (each
re-evaluated under both tables) better than the table before it, by at least a twentieth of
its error (``KEEP_GAIN``); otherwise this model's and board's entries go back to what they
were. So the table's error on what was measured never grows from round to round, a noisy run
cannot make the model worse, and a fit that gains next to nothing on the plans it was fitted
to (in-sample: noise alone gains that much) does not get to reprice the plan shapes nobody
measured (on inception_v3, a table kept for 8.2 -> 8.0% planned a latency plan predicted at
78.7 ms that measured 183.8). From two measured plans on, it must also predict them no worse
out of sample (each without its own measurements: as new plans are priced), unless the plans the
next round runs under it are all measured ones (``recalibrate``).

The first plan of round 1 is measured more than once: the spread of those runs is the
measurement noise, reported with every round, and pooled with every plan measured again: the
throughput end of round 1's front (its last plan, measured twice at once: pipelined plans drift most,
and a noise taken on the latency end alone under-states theirs), in a later round (each later round
measures those two plans once more where it did not plan them), or at once when its measurement is
more than 2x the target (or the noise) off the plan's earlier runs or, for a new plan, off its prediction,
and a third time when those two runs are that far apart (the round's figure is then their median:
``confirmed``), so it takes
in what drifts between rounds and the bursts of other work on a shared machine. While it is above a third of the target,
the frames per measurement double (up to a cap): the first plan's runs at once, the noise pooled so
far after each round (``grown_frames``). Where the target is still below what the
noise resolves (1.5x the noise), tune says so and stops once the error is within that
instead of chasing the target. From round 2 on, a new plan predicted within the noise of a plan measured
before gives way to that plan (``settled``): the gain is below what a measurement resolves. Rounds stop
when predicted and measured latency and throughput agree within the target (RMSPE), within the noise, or
the rounds run out; energy enters the error only where a sensor measured it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from device_profiles.loader import load_profile
from device_profiles.schema import DeviceProfile, NetworkLink
from device_profiles.selection import select_units
from models.coarsen import coarsen
from models.graph import OpGraph, build_graph
from models.onnx_io import LoadedModel
from parapipe.intake import open_model
from parapipe.precision_auto import Auto, PrecisionRequest, measure, precision_plans
from parapipe.profiling import profile_on_board
from parapipe.reach import LOCAL_BOARDS, board_device, board_units
from parapipe.records import Figures, PartitionMeasurement
from parapipe.run import RunResult, check_board_units, run_plan
from planner.costmodel import CostModel
from planner.plan import Plan, Predicted
from planner.search import SearchOptions, best_plan, pareto_set
from planner.segments import Segment, UnitKey, lower, segment_precision
from planner.unitname import UnitName
from profiler.calibration import MIN_FIT_MS, RUN_PREFIX, NetworkFit, is_run_entry
from profiler.costtable import EVERY_UNIT, CalibrationRecord, Conditions, CostEntry, CostTable, entry_key
from profiler.pinning import full_speed_ms

NOISE_FRACTION = 1 / 3  # a measurement's noise is "well below" the target at a third of it or less
NOISE_MARGIN = 1.5  # errors within 1.5x the measured noise cannot be told from noise
KEEP_GAIN = 0.05  # a recalibration is kept only if it lowers the measured plans' RMSPE by at least this share
MAX_FRAMES_FACTOR = 8  # --frames grows up to 8x when the noise is large
MIN_PARTITIONS = 3  # a PU's run overhead is fitted on this many short partitions measured there at least


@dataclass(frozen=True)
class Noise:
    """The spread of repeated measurements of a plan: the relative std (%) of one measurement.

    First the first plan measured ``noise_runs`` times; then, pooled with it, the throughput end of round 1's
    front measured twice, and every plan a later round measures again (a round after a reverted recalibration
    plans the same plans, and a round that does not plan those two measures them once more), so the noise
    includes the pipelined plans' spread and what drifts between rounds on a shared machine."""

    plan: str
    runs: int
    # frames per measurement: the first plan's runs measured at, grown later while the pooled noise is large
    frames: int
    latency_pct: float
    throughput_pct: float
    grown: bool = False  # --frames was raised because the noise was large
    capped: bool = False  # frames reached the cap with the noise still above a third of the target
    plans: int = 1  # plans measured more than once that the figures pool

    @property
    def pct(self) -> float:
        return max(self.latency_pct, self.throughput_pct)

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "pct": self.pct}


@dataclass(frozen=True)
class Recalibration:
    """Whether this round's recalibration was kept: the new and previous tables on every plan measured so far."""

    kept: bool
    rmspe_before: float  # the previous table's RMSPE (latency, throughput and measured energy together)
    rmspe_after: float  # the recalibrated table's
    measured_plans: int
    memory_gbps: tuple[tuple[str, float], ...] = ()  # shared memories' bandwidths learnt (kept) from the throughputs
    # network links learnt (kept) from plans measured across them: (link, GB/s, µs per message, µs per MB)
    network: tuple[tuple[str, float, float, float], ...] = ()
    # CFS-throttled PUs' sustained factors learnt (kept) from the throughputs: (PU, factor)
    sustained: tuple[tuple[str, float], ...] = ()
    # each PU's run overhead learnt (kept) from its measured partitions: (PU, ms per partition run)
    run_overhead: tuple[tuple[str, float], ...] = ()
    # the same RMSPEs with each plan predicted without its own partitions' measurements (``table_errors``)
    out_of_sample_before: float | None = None
    out_of_sample_after: float | None = None
    # kept although it predicts the plans worse out of sample: the plans the next round runs under it are all
    # measured ones, predicted in sample (``recalibrate``'s ``replan``)
    measured_plans_only: bool = False
    # what a frame alone spends in a pipeline of several partitions outside their runs, learnt (kept) from the
    # latencies (``fit_frame_overhead``; None: nothing learnt)
    frame_ms: float | None = None

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Round:
    """One round: its plans as predicted (by the table they were planned with) vs measured."""

    index: int
    plans: int
    rmspe_latency: float
    rmspe_throughput: float
    rmspe_energy: float | None  # None: energy was modelled, not measured
    rows: tuple[dict, ...] = ()
    handoff_ms: float | None = None  # the handoff delay learnt from this round's runs (None: none to learn)
    power_scale: tuple[float, float] | None = None  # (busy, idle) power scales learnt from measured energy
    frames: int = 0  # frames per measurement
    noise: Noise | None = None
    target_pct: float = 0.0  # the target asked for
    effective_target_pct: float = 0.0  # max(target, 1.5x noise): what the loop stops at
    noise_limited: bool = False  # the target is below what the measurement noise can resolve
    calibration: Recalibration | None = None  # None: not recalibrated after this round (the loop stopped)
    stop: str | None = None  # why the loop stopped after this round: target | noise | rounds
    note: str = ""

    @property
    def rmspe(self) -> float:
        """The larger of latency's, throughput's and (where a sensor measured it) energy's RMSPE."""
        return max(self.rmspe_latency, self.rmspe_throughput, self.rmspe_energy or 0.0)

    def to_json(self) -> dict[str, object]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["rows"] = list(self.rows)
        data["noise"] = self.noise.to_json() if self.noise else None
        data["calibration"] = self.calibration.to_json() if self.calibration else None
        return data


def rmspe(pairs: list[tuple[float, float]]) -> float:
    """Root mean square percentage error of (predicted, measured) pairs."""
    if not pairs:
        return float("nan")
    return math.sqrt(sum(((p - m) / m) ** 2 for p, m in pairs) / len(pairs)) * 100


def shared_burst_work(alone_ms: Sequence[float], quota_percent: float) -> list[float]:
    """The work at full speed of partitions run one after another on a CFS-throttled unit in one frame, from their
    times alone: together they ran the frame's first burst (one period's quota) at full speed and the rest at
    the quota's share (``profiler.pinning.full_speed_ms`` of the time so far, less what the ones before did)."""
    work, elapsed, done = [], 0.0, 0.0
    for t in alone_ms:
        elapsed += t
        upto = full_speed_ms(elapsed, quota_percent)
        work.append(upto - done)
        done = upto
    return work


def throttled_work(segments: dict[str, Segment], result: RunResult, profile: DeviceProfile) -> dict[str, float]:
    """The work at full speed each partition on a CFS-throttled PU did a frame.

    On one core, what the agent read of it: the CPU time of the session's thread per frame run one at a time
    (the profiler records the same of its runs; what the thread waited for the quota is off the CPU). Else (an
    agent that does not read it, or several threads) from the times alone of its unit's partitions together
    (``shared_burst_work``, in the order the unit runs them), as the cost model prices a frame there
    (``Problem.stalled``). Taken one by one, each partition after the first would be read as starting with a
    full quota and its wait for the quota as work (bert_tiny on local-biglittle: a plan predicted at 114 fps ran
    at 206); together, the quota a period refills while the frame runs on other units is not seen, and small
    partitions between big-core ones are read as doing half their work (bert_small on local-biglittle: 0.06-0.10
    ms where they run at full speed in 0.16-0.25). A unit with a partition not timed alone is left out."""
    cpu = {p.name: p.alone_cpu_per_frame_ms for p in result.partitions}
    alone = {p.name: p.alone_per_frame_ms for p in result.partitions}
    units: dict[UnitKey, list[Segment]] = {}
    for seg in segments.values():
        if not seg.pu.spans and profile.pu(seg.pu).throttle is not None:
            units.setdefault(seg.unit_key, []).append(seg)
    work: dict[str, float] = {}
    for segs in units.values():
        ordered = sorted(segs, key=lambda seg: seg.index)
        times = [alone.get(seg.name) for seg in ordered]
        throttle = profile.pu(ordered[0].pu).throttle
        if throttle is None or any(t is None for t in times):
            continue
        read = [cpu.get(seg.name) for seg in ordered]
        if all(seg.cores == 1 for seg in ordered) and all(c is not None for c in read):
            work.update((seg.name, min(c, t)) for seg, c, t in zip(ordered, read, times, strict=True) if c and t)
            continue
        shares = shared_burst_work([t for t in times if t is not None], throttle.quota_percent)
        work.update(zip((seg.name for seg in ordered), shares, strict=True))
    return work


def feed_back(
    table: CostTable, plan: Plan, result: RunResult, graph: OpGraph, profile: DeviceProfile, ort_version: str
) -> int:
    """Measured busy time per frame of each partition -> measured partition entries; returns how many."""
    segments = {s.name: s for s in lower(plan, graph, profile)}
    at_full_speed = throttled_work(segments, result, profile)
    added = 0
    for p in result.partitions:
        seg = segments.get(p.name)
        if seg is None:
            continue
        if seg.pu.spans:
            added += _feed_back_spanning(table, plan, seg, p, graph, profile, ort_version)
            continue
        per_frame = fed_time(seg, p, profile, at_full_speed)
        if per_frame is None:
            continue
        pu = profile.pu(seg.pu)
        throttle = pu.throttle.quota_percent if pu.throttle else None
        table.add(
            _measured_entry(
                plan, seg, per_frame, p.frames, graph, profile, pu.execution_provider, throttle, ort_version
            )
        )
        added += 1
    return added


def fed_time(
    seg: Segment, p: PartitionMeasurement, profile: DeviceProfile, at_full_speed: dict[str, float]
) -> float | None:
    """The time per frame of one PU's measured partition that ``feed_back`` records (None: nothing to record).

    Its time with frames run one at a time: what a frame's latency adds up. What running beside the others
    costs it back to back (memory, caches, on a VM the host's cores) is the shared memory's term, which tune
    fits from the measured throughputs; on a CFS-throttled PU, what waiting for its quota costs back to back is
    its sustained factor (``fit_sustained``). Where the profile names no shared memory (and the PU is not
    throttled), the back-to-back time is what throughput needs: a unit runs its partitions in turn
    (``profiler.modulo``), so each one's back-to-back time is its own, not shared with the unit's others."""
    pu = profile.pu(seg.pu)
    if pu.throttle is None and profile.shared_memory(seg.pu) is None and p.busy_per_frame_ms is not None:
        return p.busy_per_frame_ms
    if pu.throttle is not None:
        # the work it did at full speed, as the profiler records it (``throttled_work``: its CPU time, or from
        # its time alone); back to back it waited for the quota as well, so without either nothing is fed back
        return at_full_speed.get(p.name)
    return p.alone_per_frame_ms if p.alone_per_frame_ms is not None else p.busy_per_frame_ms


def fit_run_overhead(
    table: CostTable,
    runs: list[tuple[Plan, RunResult]],
    graph: OpGraph,
    profile: DeviceProfile,
    ort_version: str,
) -> dict[str, float] | None:
    """Learn per PU what one partition run costs in a pipeline beyond what the profiler timed of it run after run.

    The profiler times a block or a partition over and over, its code and weights warm; in a pipeline each
    partition runs once a frame after the others, its inputs from another thread (local-biglittle, bert_small:
    the big core's 23 partitions of one plan took 0.04-0.36 ms more each than their profiled times, median 0.13,
    on small and large alike). So from ``runs``' partitions shorter than ``MIN_FIT_MS`` as the table predicts
    them, where that time is mostly this cost (``MIN_PARTITIONS`` at least on a PU), and not predicted by their
    own measurement in a pipeline, the median of measured minus predicted moves the PU's ``run-overhead``
    value (never below 0). Called before this round's partitions are fed back. None where nothing was learnt."""
    calibrated = CostModel.from_table(profile, graph, table)
    residuals: dict[str, list[float]] = {}
    for plan, res in runs:
        segments = {s.name: s for s in lower(plan, graph, profile)}
        at_full_speed = throttled_work(segments, res, profile)
        for p in res.partitions:
            seg = segments.get(p.name)
            if seg is None or seg.pu.spans or segment_precision(plan, seg, profile) != "fp32":
                continue
            entry = calibrated.calibration.fused.get(((str(seg.pu), seg.cores), frozenset(seg.members)))
            if entry is not None and is_run_entry(entry):
                continue  # predicted by its own measurement in a pipeline: the overhead is in both
            measured = fed_time(seg, p, profile, at_full_speed)
            predicted = calibrated.group_ms(seg.members, seg.pu, seg.cores).ms
            if measured is None or predicted - calibrated.run_overhead_ms(seg.pu) >= MIN_FIT_MS:
                continue
            residuals.setdefault(str(seg.pu), []).append(measured - predicted)
    learnt: dict[str, float] = {}
    for pu_name, found in sorted(residuals.items()):
        if len(found) < MIN_PARTITIONS:
            continue
        value = round(max(0.0, calibrated.run_overhead_ms(pu_name) + statistics.median(found)), 4)
        if value == calibrated.run_overhead_ms(pu_name):
            continue
        cond = sustained_conditions(profile, pu_name, ort_version)
        table.learn(CalibrationRecord.learnt(graph.model_sha256, "run-overhead", value, cond, len(found), pu_name))
        learnt[pu_name] = value
    return learnt or None


def _measured_entry(
    plan: Plan,
    seg: Segment,
    per_frame: float,
    frames: int,
    graph: OpGraph,
    profile: DeviceProfile,
    provider: str,
    throttle: float | None,
    ort_version: str,
) -> CostEntry:
    """A measured ``partition`` entry of ``seg``'s time per frame, keyed like the profiler's."""
    cond = Conditions(
        profile.name,
        seg.pu,
        seg.cores,
        seg.cores,
        provider,
        ort_version,
        "all",
        throttle,
        segment_precision(plan, seg, profile),  # an int8 / fp16 partition's time is never an fp32 one
    )
    members = set(seg.members)
    return CostEntry(
        key=entry_key(graph.model_sha256, "partition", seg.members, cond),
        kind="partition",
        model_sha256=graph.model_sha256,
        name=f"{RUN_PREFIX}{seg.name}",
        members=seg.members,
        conditions=cond,
        median_ms=per_frame,
        mean_ms=per_frame,
        p10_ms=per_frame,
        p90_ms=per_frame,
        repeats=frames,
        energy_mj=None,
        energy_source="none",
        flops=sum(n.flops for n in graph.nodes if n.name in members),
        measured_at=time.time(),
    )


def _feed_back_spanning(
    table: CostTable,
    plan: Plan,
    seg: Segment,
    p: PartitionMeasurement,
    graph: OpGraph,
    profile: DeviceProfile,
    ort_version: str,
) -> int:
    """A session spanning clusters (``a+b``): its time as measured, under that unit, which the cost model looks up
    before its estimate (``CostModel._spanning_ms``) and takes as is alone and back to back (its throttled parts'
    share is in it). Its time with frames run one at a time where a part shares a memory (what running beside
    the others costs back to back is that memory's term), else back to back, as for one PU. Returns 1 if fed."""
    parts = [profile.pu(part) for part in seg.pu.parts]
    shared = any(profile.shared_memory(part.name) is not None for part in parts)
    per_frame = p.busy_per_frame_ms if not shared else p.alone_per_frame_ms
    per_frame = per_frame if per_frame is not None else p.busy_per_frame_ms
    if per_frame is None:
        return 0
    provider = parts[0].execution_provider
    table.add(_measured_entry(plan, seg, per_frame, p.frames, graph, profile, provider, None, ort_version))
    return 1


def _board_wide(profile: DeviceProfile, ort_version: str) -> Conditions:
    """The conditions of a value learnt for the whole board (every PU, every core count)."""
    return Conditions(profile.name, EVERY_UNIT, 0, 0, "", ort_version, "all", None)


HANDOFF_GRID_MS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


def fit_handoff(
    table: CostTable,
    runs: list[tuple[Plan, RunResult]],
    graph: OpGraph,
    profile: DeviceProfile,
    ort_version: str,
) -> float | None:
    """Learn the delay of a handoff between two units of a host from the measured latencies (one frame alone).

    With the partitions' measured times in the table, what is left between predicted and
    measured latency is mostly the cost of waking another unit's thread, on another PU or on
    other cores of the same one (on a throttled core: of waiting for its quota). The value on ``HANDOFF_GRID_MS``
    with the least RMSPE over ``runs`` becomes the cost table's ``handoff`` calibration value. ``recalibrate``
    passes every plan measured so far: the value is board-wide, and fitted to one round's plans alone it can
    price the handoffs of plans measured before far off what they measured (local-biglittle, bert_small: a
    round-2 plan 1 ms slow set it to 1.0 ms and round 1's latency plan, measured at 17.4 ms, to 41.1). None
    when no plan hands tensors between units.
    """
    from planner.build import evaluate

    calibrated = CostModel.from_table(profile, graph, table)
    best: tuple[float, float] | None = None
    varies = False
    for h in HANDOFF_GRID_MS:
        cost = calibrated.recalibrated(calibrated.calibration.with_handoff(h))
        pairs = [
            (evaluate(plan, graph, cost, frames=0).predicted.latency_ms, res.measured.latency_ms)  # type: ignore[union-attr]
            for plan, res in runs
        ]
        err = rmspe(pairs)
        if best is not None and abs(err - best[1]) > 1e-9:
            varies = True
        if best is None or err < best[1] - 1e-9:
            best = (h, err)
    if best is None or not varies:
        return None
    table.learn(
        CalibrationRecord.learnt(graph.model_sha256, "handoff", best[0], _board_wide(profile, ort_version), len(runs))
    )
    return best[0]


FRAME_GRID_MS = tuple(round(0.05 * i, 2) for i in range(41))  # 0 to 2 ms


def fit_frame_overhead(
    table: CostTable,
    runs: list[tuple[Plan, RunResult]],
    graph: OpGraph,
    profile: DeviceProfile,
    ort_version: str,
) -> float | None:
    """Learn what a frame alone spends in a pipeline of several partitions outside their runs (entering the
    pipeline, waking its first worker, its result back to the caller) from the measured latencies.

    The handoff delay (``fit_handoff``, fitted first) prices the handoffs between units; this is what is left
    of a plan of several partitions on one unit as much as of one over several (multiview_bev on
    local-biglittle: seven partitions on big, 10.97 ms of runs measured and 11.00 predicted, a frame alone
    11.72-11.79 ms). It adds the same to every such plan's latency and nothing to a plan the executor runs in the
    caller's thread (``CostModel.frame_overhead_ms``), so each plan is evaluated once: the value on
    ``FRAME_GRID_MS`` with the least latency RMSPE over ``runs`` (every plan measured so far: it is board-wide)
    becomes the cost table's ``frame-overhead`` value. None when no plan pays it."""
    from planner.build import evaluate, frame_overhead_ms

    calibrated = CostModel.from_table(profile, graph, table)
    without = calibrated.recalibrated(calibrated.calibration.with_frame_overhead(0.0))
    per_ms = calibrated.recalibrated(calibrated.calibration.with_frame_overhead(1.0))
    rows = [
        (
            evaluate(plan, graph, without, frames=0).predicted.latency_ms,
            frame_overhead_ms(plan, graph, per_ms),  # 1 where the plan pays it, else 0
            res.measured.latency_ms,  # type: ignore[union-attr]
        )
        for plan, res in runs
    ]
    if not any(pays for _, pays, _ in rows):
        return None
    best = min(FRAME_GRID_MS, key=lambda f: (round(rmspe([(ms + f * pays, m) for ms, pays, m in rows]), 9), f))
    table.learn(
        CalibrationRecord.learnt(
            graph.model_sha256, "frame-overhead", best, _board_wide(profile, ort_version), len(runs)
        )
    )
    return best


# Errors (RMSPE) this close are equal: the measured plans do not tell the candidates apart
TIE = 1e-9
FINER = (-4, -3, -2, -1, 1, 2, 3, 4)  # steps of 2.5% around a grid's best, to refine it


def least_change(scored: Sequence[tuple[float, float]], base: float) -> tuple[float, float]:
    """Of (value, error) candidates, one with the least error; among those that tie with it, the one nearest
    ``base`` (by ratio). The measured plans may not tell a range of values apart (none of them is bound by
    the term there: it predicts them all alike): the calibration then moves only as far as they say, not to
    the end of the range, which plans of another shape (bound by the term) would be priced by."""
    low = min(e for _, e in scored)

    def distance(fe: tuple[float, float]) -> float:
        return abs(math.log(fe[0] / base)) if fe[0] > 0 and base > 0 else math.inf

    return min((fe for fe in scored if fe[1] <= low + TIE), key=distance)


# Factors tried on a shared memory's bandwidth (what running the model's units at once lets through): from
# four times the contention measured to none at all.
MEMORY_GRID = (0.25, 0.35, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)


def fit_memory(
    table: CostTable,
    runs: list[tuple[Plan, RunResult]],
    graph: OpGraph,
    profile: DeviceProfile,
    ort_version: str,
) -> dict[str, float] | None:
    """Learn each shared memory's bandwidth from the measured throughputs of ``runs``.

    Units that run at once slow each other; the cost model's term for it is the memory they share
    (the period is at least a frame's bytes over its bandwidth). The bandwidth (the calibrated one
    times a factor on ``MEMORY_GRID``, or one at which a frame's bytes take a run's measured period,
    refined around the best; the cost model never takes it so low that it would slow the
    whole model on one core of the memory alone) that predicts the measured throughputs best becomes the cost table's
    ``memory-bandwidth`` value for that memory. None when no candidate changes a prediction
    (the term binds no plan measured).
    """
    from profiler.session import memory_conditions

    if not profile.memories or not runs:
        return None
    learnt: dict[str, float] = {}
    for memory in profile.memories:
        calibrated = CostModel.from_table(profile, graph, table)
        base = calibrated.memory_gbps(memory.name)

        def error(gbps: float) -> float:
            cost = calibrated.recalibrated(calibrated.calibration.with_memory(memory.name, gbps))  # noqa: B023
            return _throughput_rmspe(cost, runs, graph)

        # the grid around the bandwidth calibrated so far, and each run's own: the bandwidth at which a frame's
        # bytes take that run's measured period
        frame_bytes = calibrated.moved_bytes([n.name for n in graph.nodes])
        candidates = sorted(
            {base * f for f in MEMORY_GRID} | {frame_bytes * r.measured.throughput_fps / 1e9 for _, r in runs}
        )
        scored = [(gbps, error(gbps)) for gbps in candidates]
        varies = max(e for _, e in scored) - min(e for _, e in scored) > TIE
        if not varies:
            continue  # no measured plan's throughput depends on it
        best = least_change(scored, base)
        if best[0] != base:  # then finer, around the best
            best = least_change([best, *((g, error(g)) for g in (best[0] * (1 + s * 0.025) for s in FINER))], base)
        gbps = calibrated.recalibrated(calibrated.calibration.with_memory(memory.name, best[0])).memory_gbps(
            memory.name
        )  # what the cost model makes of it: never below the whole model on one core alone
        table.learn(
            CalibrationRecord.learnt(
                graph.model_sha256,
                "memory-bandwidth",
                gbps,
                memory_conditions(profile, ort_version),
                len(runs),
                memory.name,
            )
        )
        learnt[memory.name] = gbps
    return learnt or None


# Tried for a CFS-throttled PU's sustained factor (its back-to-back time over its time alone): from its CFS share,
# 100 / quota, to well beyond it (a partition that starts out of quota waits a whole period first).
SUSTAINED_GRID = (1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)


def fit_sustained(
    table: CostTable,
    runs: list[tuple[Plan, RunResult]],
    graph: OpGraph,
    profile: DeviceProfile,
    ort_version: str,
) -> dict[str, float] | None:
    """Learn each CFS-throttled PU's sustained factor from the measured throughputs of ``runs``.

    Alone a partition on a throttled core runs at full speed on the quota its period refilled; back to back the
    quota runs out, and the cost model counts its unit's load at the factor (``CostModel.sustained_factor``).
    The factor on ``SUSTAINED_GRID`` (refined around the best) that predicts the measured throughputs best
    becomes the cost table's ``sustained-factor`` value for that PU. None when no PU is throttled or no
    candidate changes a prediction (no plan measured runs there, or its load binds none).

    Never below the CFS share: back to back the quota lets the unit run quota / period of each period, so its
    full-speed work takes at least 100 / quota times as long. A plan measured faster than that says its work
    there is less than the table has, and a factor under the share would reprice every plan by how much it puts
    on the unit instead (local-biglittle's squeezenet1_1 fitted 2.38 < 2.5 and its next plans, heavier on
    LITTLE, were measured 35-57% slower than predicted)."""
    throttled = [p for p in profile.pus if p.throttle is not None]
    if not throttled or not runs:
        return None
    learnt: dict[str, float] = {}
    for pu in throttled:
        calibrated = CostModel.from_table(profile, graph, table)

        def error(factor: float) -> float:
            cost = calibrated.recalibrated(calibrated.calibration.with_sustained(pu.name, factor))  # noqa: B023
            return _throughput_rmspe(cost, runs, graph)

        base = calibrated.sustained_factor(pu.name)
        share = 100.0 / pu.throttle.quota_percent if pu.throttle else 1.0
        scored = [(f, error(f)) for f in sorted({share, *(f for f in (*SUSTAINED_GRID, base) if f >= share)})]
        if max(e for _, e in scored) - min(e for _, e in scored) <= TIE and base >= share:
            continue  # no measured plan's throughput depends on it
        best = least_change(scored, base)
        if best[0] != base:  # then finer, around the best
            finer = [f for f in (best[0] * (1 + s * 0.025) for s in FINER) if f >= share]
            best = least_change([best, *((f, error(f)) for f in finer)], base)
        if best[0] == base:
            continue
        cond = sustained_conditions(profile, pu.name, ort_version)
        table.learn(CalibrationRecord.learnt(graph.model_sha256, "sustained-factor", best[0], cond, len(runs), pu.name))
        learnt[pu.name] = best[0]
    return learnt or None


def sustained_conditions(profile: DeviceProfile, pu_name: str, ort_version: str) -> Conditions:
    """The conditions a PU's ``sustained-factor`` record is learnt and looked up under."""
    pu = profile.pu(pu_name)
    return Conditions(
        profile.name,
        pu.name,
        len(pu.cores),
        len(pu.cores),
        pu.execution_provider,
        ort_version,
        "all",
        pu.throttle.quota_percent if pu.throttle else None,
    )


# Tried for a network link: factors on its bandwidth, and the CPU time per tensor each end spends (gRPC and
# protobuf copies) per message (µs) and per MB (µs/MB), from none to what a slow board's Python gRPC costs.
NETWORK_GBPS_GRID = (0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0)
NETWORK_MESSAGE_GRID_US = (0.0, 25.0, 50.0, 100.0, 200.0, 400.0, 800.0, 1600.0)
NETWORK_MB_GRID_US = (0.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2000.0, 4000.0)


def crosses(plan: Plan, link: NetworkLink, profile: DeviceProfile) -> bool:
    """Whether ``plan`` has units on both hosts of ``link``."""
    hosts = {profile.pu(part).host for _, _, a in plan.assignments() for part in UnitName(a.pu).parts}
    return {link.a, link.b} <= hosts


def fit_network(
    table: CostTable,
    runs: list[tuple[Plan, RunResult]],
    graph: OpGraph,
    profile: DeviceProfile,
    ort_version: str,
) -> dict[str, NetworkFit] | None:
    """Learn each network link's bandwidth and CPU time per tensor from the plans measured across it.

    A tensor between hosts occupies the link (its bytes over the bandwidth: latency, and a period
    no shorter than a frame's bytes) and costs the sending and the receiving unit CPU time (gRPC,
    protobuf copies: both units' busy time, so latency and the period). The three values that predict
    the measured latencies and throughputs of the runs across the link best (RMSPE of both together),
    searched over their grids (bandwidth and CPU per MB together, then CPU per message; twice round),
    become the cost table's ``network-bandwidth``, ``network-cpu-message`` and ``network-cpu-mb``
    values for that link (named ``a-b``). None when no run crosses a link, or nothing predicts them
    better than the values the table has.
    """
    from planner.build import evaluate

    learnt: dict[str, NetworkFit] = {}
    for link in profile.network:
        across = [(plan, res) for plan, res in runs if crosses(plan, link, profile)]
        if not across:
            continue
        calibrated = CostModel.from_table(profile, graph, table)

        def error(fit: NetworkFit) -> float:
            cost = calibrated.recalibrated(calibrated.calibration.with_network(link.name, fit))  # noqa: B023
            pairs = []
            for plan, res in across:  # noqa: B023
                predicted = evaluate(plan, graph, cost, frames=0).predicted
                assert predicted is not None
                pairs += [
                    (predicted.latency_ms, res.measured.latency_ms),
                    (predicted.throughput_fps, res.measured.throughput_fps),
                ]
            return rmspe(pairs)

        base = NetworkFit(calibrated.link_gbps(link), *calibrated.network_cpu_us(link))
        best, best_err = base, error(base)
        for _ in range(2):  # bandwidth and CPU per MB together (both scale with the bytes), then per message
            for gbps, per_mb in [(base.gbps * f, mb) for f in NETWORK_GBPS_GRID for mb in NETWORK_MB_GRID_US]:
                candidate = dataclasses.replace(best, gbps=gbps, cpu_us_per_mb=per_mb)
                err = error(candidate)
                if err < best_err - 1e-9:
                    best, best_err = candidate, err
            for per_message in NETWORK_MESSAGE_GRID_US:
                candidate = dataclasses.replace(best, cpu_us_per_message=per_message)
                err = error(candidate)
                if err < best_err - 1e-9:
                    best, best_err = candidate, err
        if best == base:
            continue
        cond = _board_wide(profile, ort_version)
        for kind, value in (
            ("network-bandwidth", best.gbps),
            ("network-cpu-message", best.cpu_us_per_message),
            ("network-cpu-mb", best.cpu_us_per_mb),
        ):
            table.learn(CalibrationRecord.learnt(graph.model_sha256, kind, value, cond, len(across), link.name))
        learnt[link.name] = best
    return learnt or None


def _throughput_rmspe(cost: CostModel, runs: list[tuple[Plan, RunResult]], graph: OpGraph) -> float:
    """RMSPE of the throughputs ``runs`` measured as ``cost`` predicts them."""
    from planner.build import evaluate

    return rmspe(
        [
            (evaluate(plan, graph, cost, frames=0).predicted.throughput_fps, res.measured.throughput_fps)  # type: ignore[union-attr]
            for plan, res in runs
        ]
    )


def fit_power(
    table: CostTable,
    runs: list[tuple[Plan, RunResult]],
    graph: OpGraph,
    profile: DeviceProfile,
    ort_version: str,
) -> tuple[float, float] | None:
    """Rescale the profile's busy and idle power so predicted energy meets what a sensor measured.

    Predicted energy per frame is busy-power energy plus idle-power energy; the measured
    energy of this round's plans gives scales ``a``, ``b`` >= 0 with measured ~ a*busy + b*idle
    (least squares; one plan: one common scale). None when no run measured energy.
    """
    import numpy as np

    from planner.build import evaluate

    measured = [(plan, res.measured.energy_mj) for plan, res in runs if res.energy_source == "measured"]
    if not measured:
        return None
    calibrated = CostModel.from_table(profile, graph, table)
    busy_only = calibrated.recalibrated(calibrated.calibration.with_power(1.0, 0.0))
    idle_only = calibrated.recalibrated(calibrated.calibration.with_power(0.0, 1.0))
    rows = []
    for plan, _ in measured:
        busy = evaluate(plan, graph, busy_only, frames=0).predicted.energy_mj  # type: ignore[union-attr]
        idle = evaluate(plan, graph, idle_only, frames=0).predicted.energy_mj  # type: ignore[union-attr]
        rows.append((busy, idle))
    a_mat = np.array(rows)
    y = np.array([m for _, m in measured])
    if len(rows) >= 2 and np.linalg.matrix_rank(a_mat) == 2:
        (a, b), *_ = np.linalg.lstsq(a_mat, y, rcond=None)
        if a < 0 or b < 0:  # keep the one that explains the data on its own
            only_idle = float(y @ a_mat[:, 1] / (a_mat[:, 1] @ a_mat[:, 1]))
            only_busy = float(y @ a_mat[:, 0] / (a_mat[:, 0] @ a_mat[:, 0]))
            a, b = (0.0, only_idle) if a < 0 else (only_busy, 0.0)
    else:
        a = b = float(np.median(y / a_mat.sum(axis=1)))
    cond = _board_wide(profile, ort_version)
    table.learn(CalibrationRecord.learnt(graph.model_sha256, "power-active-scale", float(a), cond, len(measured)))
    table.learn(CalibrationRecord.learnt(graph.model_sha256, "power-idle-scale", float(b), cond, len(measured)))
    return (float(a), float(b))


def spread_pct(values: list[float]) -> float:
    """Relative standard deviation (%) of one measurement, from repeated measurements (sample std)."""
    if len(values) < 2:
        return float("nan")
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / mean * 100 if mean else float("nan")


def pooled_spread_pct(groups: list[list[float]]) -> float:
    """Relative standard deviation (%) of one measurement, pooled over groups of repeated measurements of one
    thing each (groups of one say nothing); NaN without any repeat."""
    squares, freedom = 0.0, 0
    for values in groups:
        if len(values) < 2:
            continue
        mean = sum(values) / len(values)
        if not mean:
            continue
        squares += sum(((v - mean) / mean) ** 2 for v in values)
        freedom += len(values) - 1
    return math.sqrt(squares / freedom) * 100 if freedom else float("nan")


OUTLIER_FACTOR = 2.0  # a run this many times the target (or the noise) off what it is checked against is repeated


def far_apart(measured: Figures, reference: Figures | Predicted, tolerance_pct: float) -> bool:
    """Whether ``measured`` is more than ``OUTLIER_FACTOR`` times ``tolerance_pct`` off ``reference`` in latency
    or throughput (relative to ``measured``): the test for measuring a plan again (``confirmed``)."""
    errors = [
        abs(reference.latency_ms - measured.latency_ms) / measured.latency_ms,
        abs(reference.throughput_fps - measured.throughput_fps) / measured.throughput_fps,
    ]
    return max(errors) * 100 > OUTLIER_FACTOR * tolerance_pct


def confirmed(
    first: RunResult,
    earlier: Sequence[RunResult],
    again: Callable[[str], RunResult],
    tolerance_pct: float,
    twice: bool = False,
) -> list[RunResult]:
    """A round's runs of one plan, ``first`` first: measured again when ``first`` is far (``far_apart``) from the
    plan's earlier runs (their median, ``merge_runs``) or, for a plan not measured before, from its prediction
    (or when ``twice``: for the noise), and a third time when those two runs are far apart from each other; the
    round's measurement of the plan is then their median. ``again(why)`` runs the plan once more.

    On this VM a neighbour's burst took a run's cores for the whole second: squeezenet1_1's latency plan on
    ``local`` measured 263.8 fps in round 2 and 186.2 in round 3, predicted 264; the one run stood for the
    round and its RMSPE went 25.7 -> 29.5%, the loop's error. A plan checked against its own runs is not
    repeated for being far off its prediction when its runs agree: that is the model's error, not noise."""
    runs = [first]
    reference: Figures | Predicted | None = merge_runs(list(earlier)).measured if earlier else first.predicted
    if twice:
        runs.append(again("for the noise"))
    elif reference is not None and far_apart(first.measured, reference, tolerance_pct):
        runs.append(again("it is far from its earlier runs" if earlier else "it is far from its prediction"))
    if len(runs) == 2 and far_apart(runs[1].measured, runs[0].measured, tolerance_pct):
        runs.append(again("its two runs are far apart: the median of three"))
    return runs


def plan_key(plan: Plan) -> str:
    """What makes two plans the same plan when run: their stages (units, cores, blocks) and blocks' precisions."""
    return repr((plan.stages, plan.int8, plan.fp16))


def shortfall(candidate: Predicted, planned: Predicted) -> float:
    """How much worse ``candidate`` is predicted than ``planned`` on its worst figure: latency, throughput and
    energy, each relative to ``planned`` (0 or less: as good on all three)."""
    tiny = 1e-9
    return max(
        candidate.latency_ms / max(planned.latency_ms, tiny) - 1.0,
        1.0 - candidate.throughput_fps / max(planned.throughput_fps, tiny),
        candidate.energy_mj / max(planned.energy_mj, tiny) - 1.0,
    )


def settled(
    plans: Sequence[Plan], measured: Sequence[Plan], graph: OpGraph, cost: CostModel, noise_pct: float
) -> list[tuple[Plan, Plan | None]]:
    """This round's front, each plan kept or, in its place, a plan measured in an earlier round that the current
    model predicts within the noise of it on latency, throughput and energy (``shortfall``; the closest such):
    (the plan to run, the planned plan it stands in for, or None). A gain smaller than what one measurement
    resolves is no evidence for a plan nobody has run, and the plan that ran is predicted from its own runs.
    Without this, a round after a kept recalibration ran the planner's new plans, the ones the model now
    favours; the model was most optimistic about exactly those, and the round came out worse than the one before
    it (mobilenet_v2 on local-biglittle: a new throughput plan predicted at 339.8 fps measured 256.4, where
    round 1's, predicted within the 10.7% noise of it, had measured 301). A plan standing in for two is run
    once. Returned figures are re-evaluated under ``cost``, simulation included."""
    from planner.build import evaluate

    tol = noise_pct / 100.0
    known: dict[str, Plan] = {}
    for q in measured:
        known.setdefault(plan_key(q), q)
    now: dict[str, Predicted] = {}  # the measured plans' analytic figures under this round's model, as needed
    out: list[tuple[Plan, Plan | None]] = []
    taken: set[str] = set()
    for p in plans:
        key = plan_key(p)
        best: tuple[float, str] | None = None
        if key not in known and p.predicted is not None and tol > 0.0:
            for k, q in known.items():
                if k not in now:
                    figures = evaluate(q, graph, cost, frames=0).predicted
                    assert figures is not None
                    now[k] = figures
                gap = shortfall(now[k], p.predicted)
                if gap <= tol and (best is None or gap < best[0]):
                    best = (gap, k)
        if best is None:
            if key not in taken:
                out.append((p, None))
                taken.add(key)
        elif best[1] not in taken:
            out.append((evaluate(known[best[1]], graph, cost), p))
            taken.add(best[1])
    return out


def pooled_noise(noise: Noise, repeats: dict[str, list[tuple[float, float]]]) -> Noise:
    """``noise`` with its figures pooled over every plan measured more than once at its frames."""
    groups = [v for v in repeats.values() if len(v) >= 2]
    if not groups:
        return noise
    return dataclasses.replace(
        noise,
        runs=sum(len(v) for v in groups),
        latency_pct=pooled_spread_pct([[lat for lat, _ in v] for v in groups]),
        throughput_pct=pooled_spread_pct([[thr for _, thr in v] for v in groups]),
        plans=len(groups),
    )


def merge_runs(runs: list[RunResult]) -> RunResult:
    """Repeated runs of one plan as one measurement: each figure their median (two runs: their mean; from three
    on, one run a neighbour's burst slowed does not move it), partition counters summed."""
    if len(runs) == 1:
        return runs[0]

    def median(get: Callable[[Figures], float | None]) -> float | None:
        vals = [get(r.measured) for r in runs]
        return None if any(v is None for v in vals) else float(statistics.median(vals))  # type: ignore[type-var]

    measured = Figures(
        latency_ms=median(lambda f: f.latency_ms) or 0.0,
        throughput_fps=median(lambda f: f.throughput_fps) or 0.0,
        energy_mj=median(lambda f: f.energy_mj) or 0.0,
        latency_p50_at_rate_ms=median(lambda f: f.latency_p50_at_rate_ms),
        latency_p99_at_rate_ms=median(lambda f: f.latency_p99_at_rate_ms),
    )
    parts: dict[tuple[str, str], PartitionMeasurement] = {}
    for r in runs:
        for p in r.partitions:
            k = (p.host, p.name)
            q = parts.get(k)
            parts[k] = (
                p
                if q is None
                else dataclasses.replace(
                    q,
                    busy_ms=q.busy_ms + p.busy_ms,
                    queue_wait_ms=q.queue_wait_ms + p.queue_wait_ms,
                    frames=q.frames + p.frames,
                    alone_busy_ms=q.alone_busy_ms + p.alone_busy_ms,
                    cpu_ms=q.cpu_ms + p.cpu_ms,
                    cpu_frames=q.cpu_frames + p.cpu_frames,
                    alone_cpu_ms=q.alone_cpu_ms + p.alone_cpu_ms,
                    alone_cpu_frames=q.alone_cpu_frames + p.alone_cpu_frames,
                    alone_frames=q.alone_frames + p.alone_frames,
                )
            )
    first = runs[0]
    return dataclasses.replace(
        first,
        measured=measured,
        errors_pct=first.predicted.errors_pct(measured) if first.predicted else {},
        partitions=tuple(parts.values()),
    )


def pooled_runs(
    measured: Sequence[tuple[Plan, RunResult]], runs_of: dict[str, list[RunResult]]
) -> list[tuple[Plan, RunResult]]:
    """Each plan of ``measured`` once (``plan_key``; the first of its names), with every run of it so far merged
    (``merge_runs``): what recalibrating fits and feeds back. A plan the loop measures in several rounds (the
    noise plans; a plan the planner offers again) is then the median of its runs, not its latest run, which on
    a noisy board moves more than the model's errors do (local-biglittle, an AMD EPYC VM: resnet18's latency
    plan at 62.1 fps in one round and 52.9 in the next). A plan without runs in ``runs_of`` keeps its
    measurement."""
    pooled: dict[str, tuple[Plan, RunResult]] = {}
    for plan, result in measured:
        key = plan_key(plan)
        if key not in pooled:
            pooled[key] = (plan, merge_runs(runs_of[key]) if runs_of.get(key) else result)
    return list(pooled.values())


def own_partitions(table: CostTable, plan: Plan, graph: OpGraph, profile: DeviceProfile) -> frozenset[str]:
    """The keys of ``table``'s measured partition entries that are ``plan``'s own partitions (its segments' nodes
    on the same PU and cores): what predicts the plan by looking its measurement up."""
    own = {(frozenset(s.members), str(s.pu), s.cores) for s in lower(plan, graph, profile)}
    return frozenset(
        e.key
        for e in table.select(model_sha256=graph.model_sha256, kind="partition", board=profile.name, precision=None)
        if (frozenset(e.members), e.conditions.pu, e.conditions.cores) in own
    )


def table_errors(
    table: CostTable,
    runs: list[tuple[Plan, RunResult]],
    graph: OpGraph,
    profile: DeviceProfile,
    out_of_sample: bool = False,
) -> tuple[float, float, float]:
    """RMSPE (latency, throughput, all figures together) of ``table``'s predictions of measured plans.

    Every plan is re-evaluated (analytic model) under ``table``; "all together" pools the
    latency, throughput and, where a sensor measured it, energy errors into one RMSPE. ``out_of_sample``: each
    plan under the table without its own partitions' measurements (``own_partitions``, kept out of every fit
    too), as a plan not measured yet is predicted.
    """
    from planner.build import evaluate

    whole = CostModel.from_table(profile, graph, table)
    lat, thr, every = [], [], []
    for plan, res in runs:
        held = own_partitions(table, plan, graph, profile) if out_of_sample else frozenset()
        cost = CostModel.from_table(profile, graph, table, holdout=held) if held else whole
        pred = evaluate(plan, graph, cost, frames=0).predicted
        assert pred is not None
        lat.append((pred.latency_ms, res.measured.latency_ms))
        thr.append((pred.throughput_fps, res.measured.throughput_fps))
        every += [lat[-1], thr[-1]]
        if res.energy_source == "measured" and res.measured.energy_mj:
            every.append((pred.energy_mj, res.measured.energy_mj))
    return rmspe(lat), rmspe(thr), rmspe(every)


@dataclass(frozen=True)
class _Snapshot:
    """A model's and board's entries and calibration values in a table, to put back."""

    entries: dict[str, CostEntry]
    learnt: dict[str, CalibrationRecord]

    @staticmethod
    def of(table: CostTable, model_sha256: str, board: str) -> _Snapshot:
        return _Snapshot(
            {e.key: e for e in table.select(model_sha256=model_sha256, board=board, precision=None)},
            {r.key: r for r in table.learnt(model_sha256=model_sha256, board=board)},
        )

    def restore(self, table: CostTable, model_sha256: str, board: str) -> None:
        """Put back exactly this snapshot as the table's entries and calibration values for this model and board."""
        now = _Snapshot.of(table, model_sha256, board)
        for key in now.entries:
            del table.entries[key]
        for key in now.learnt:
            del table.calibration[key]
        table.entries.update(self.entries)
        table.calibration.update(self.learnt)


def worth_keeping(before: float, after: float) -> bool:
    """Whether a recalibration that takes the measured plans' RMSPE from ``before`` to ``after`` is kept: lower
    by at least ``KEEP_GAIN`` of it."""
    return after < before * (1 - KEEP_GAIN)


def generalises(before: float, after: float) -> bool:
    """Whether a recalibration predicts the measured plans, each without its own measurement, no worse than the
    previous table (within ``KEEP_GAIN`` of its error: what noise alone moves)."""
    return after <= before * (1 + KEEP_GAIN)


def recalibrate(
    table: CostTable,
    runs: list[tuple[Plan, RunResult]],
    measured: list[tuple[Plan, RunResult]],
    graph: OpGraph,
    profile: DeviceProfile,
    ort_version: str,
    replan: Callable[[CostTable], Sequence[Plan]] | None = None,
) -> tuple[Recalibration, float | None, tuple[float, float] | None]:
    """Feed ``runs`` back into ``table``; keep that only if it predicts ``measured`` (all so far) better, by at
    least ``KEEP_GAIN`` of the error, and, from two plans on, predicts them no worse out of sample, each plan
    without its own partitions' measurements (``table_errors``, ``generalises``): a table that looks a measured
    plan's partitions up predicts it almost exactly whatever else it learnt, and the next round's plans are new
    ones (inception_v3 on local-biglittle: a table kept for 14.0% -> 3.3% on the plans it had measured put the
    next round's latency plan at 35.6 ms; it ran in 52.1).

    Unless they are not: ``replan`` gives the plans the next round would run under a table (the recalibrated
    one, here). Where every one of them has been measured, the out-of-sample error prices plans nobody will
    run, the in-sample gain is what the next round sees, and the recalibration is kept
    (``measured_plans_only``). Without this, reverting left the table that had planned those very plans, and
    the loop ran them again, round after round (multiview_bev on local-biglittle: the same two plans in all
    four rounds at 13.8%, each recalibration fitting them 10.9 -> 3.3% in sample and reverted for 10.9 ->
    12.4% out of sample).

    Returns the verdict and the handoff and power scales learnt (None where reverted or nothing learnt).
    The table is changed in memory only; the caller saves it.
    """
    previous = _Snapshot.of(table, graph.model_sha256, profile.name)
    before = table_errors(table, measured, graph, profile)[2]
    unseen_before = table_errors(table, measured, graph, profile, out_of_sample=True)[2]
    run_overhead = fit_run_overhead(table, runs, graph, profile, ort_version)  # before they are fed back
    for plan, res in runs:
        feed_back(table, plan, res, graph, profile, ort_version)
    handoff = fit_handoff(table, measured, graph, profile, ort_version)
    frame = fit_frame_overhead(table, measured, graph, profile, ort_version)
    sustained = fit_sustained(table, measured, graph, profile, ort_version)
    memory = fit_memory(table, measured, graph, profile, ort_version)
    network = fit_network(table, measured, graph, profile, ort_version)
    power = fit_power(table, runs, graph, profile, ort_version)
    after = table_errors(table, measured, graph, profile)[2]
    unseen_after = table_errors(table, measured, graph, profile, out_of_sample=True)[2]
    # leaving one plan out says something only where others remain to learn from
    kept = worth_keeping(before, after) and (len(measured) < 2 or generalises(unseen_before, unseen_after))
    measured_only = False
    if not kept and worth_keeping(before, after) and replan is not None:
        known = {plan_key(p) for p, _ in measured}
        nxt = replan(table)
        measured_only = bool(nxt) and all(plan_key(p) in known for p in nxt)
        kept = measured_only
    if not kept:
        previous.restore(table, graph.model_sha256, profile.name)
        handoff = power = memory = network = sustained = run_overhead = frame = None
    learnt = tuple(sorted((memory or {}).items()))
    links = tuple(sorted((name, f.gbps, f.cpu_us_per_message, f.cpu_us_per_mb) for name, f in (network or {}).items()))
    factors = tuple(sorted((sustained or {}).items()))
    overheads = tuple(sorted((run_overhead or {}).items()))
    verdict = Recalibration(
        kept,
        before,
        after,
        len(measured),
        learnt,
        links,
        factors,
        overheads,
        unseen_before,
        unseen_after,
        measured_only,
        frame,
    )
    return verdict, handoff, power


def stop_reason(round_rmspe: float, target: float, effective_target: float, last: bool) -> str | None:
    """Why the loop stops after a round with this RMSPE (the larger of latency's and throughput's)."""
    if round_rmspe <= target:
        return "target"
    if round_rmspe <= effective_target:
        return "noise"
    return "rounds" if last else None


def noise_verdict(noise: Noise, target: float) -> tuple[float, bool, str]:
    """(the target the loop stops at, whether the noise limits it, what to tell the user)."""
    floor = NOISE_MARGIN * noise.pct
    grown = f"; --frames raised to {noise.frames}" if noise.grown else ""
    grown += f"; pooled over {noise.plans} plans measured {noise.runs} times" if noise.plans > 1 else ""
    if target >= floor:
        capped = ", the cap: above a third of the target" if noise.capped else ""
        return target, False, f"measurement noise {noise.pct:.1f}% at {noise.frames} frames{capped}{grown}"
    return (
        floor,
        True,
        f"target {target:g}% is below what the measurements resolve (noise {noise.pct:.1f}% at "
        f"{noise.frames} frames{', the cap' if noise.capped else ''}{grown}): not chasing it, stopping "
        f"when RMSPE <= {floor:.1f}% ({NOISE_MARGIN:g}x the noise)",
    )


@dataclass(frozen=True)
class TuneOptions:
    """How the loop runs: the CLI's --objective, --rounds, --target-error, --time-limit, --frames, --max-frames,
    --min-seconds, --pus and --exclude-pus."""

    objective: str = "pareto"  # pareto, latency, throughput or energy
    rounds: int = 3
    target_error: float = 5.0  # stop when the RMSPE (%) is at most this
    time_limit: float = 2.0  # seconds per ILP solve
    frames: int = 30  # frames per measured plan (doubled while the noise is large)
    max_frames: int | None = None  # the cap --frames may grow to (default 8x frames)
    noise_runs: int = 2  # how many times the first plan of round 1 is measured to take the noise
    # each measurement runs at least this long at the plan's rate (``frames_for``): shorter ones carry the
    # machine's own burst noise (this VM: a fixed matmul's rate spreads 16% over 0.1 s windows, 3% over 1 s)
    min_seconds: float = 1.0
    pus: str | None = None  # comma-separated units to plan on (default: every unit an onnxruntime drives)
    exclude_pus: str | None = None  # comma-separated units to leave out

    def units(self, profile: DeviceProfile, recorded: tuple[str, ...] = ()) -> DeviceProfile:
        """The profile restricted to the units tune plans on (``device_profiles.selection``): without ``pus``, the
        board's ``recorded`` units if any."""

        def names(text: str | None) -> list[str]:
            return [n.strip() for n in (text or "").split(",") if n.strip()]

        return select_units(profile, names(self.pus) or list(recorded), names(self.exclude_pus))


def frames_for(plan: Plan, frames: int, min_seconds: float, measured_fps: Sequence[float] = ()) -> int:
    """The frames ``plan`` is measured over: ``frames``, or as many as last ``min_seconds`` at its rate (the faster of
    its predicted throughput and any measured before), whichever is more. A fast model's 30 frames last 0.1 s,
    where the machine's bursts alone spread a measurement by 10-16%; over 1 s they spread it by about 3%, so the
    floor is in seconds, not frames (the frames cap bounds how far the noise grows ``frames``, not this)."""
    rate = max([plan.predicted.throughput_fps if plan.predicted else 0.0, *measured_fps])
    if min_seconds <= 0 or not math.isfinite(rate) or rate <= 0:
        return frames
    return max(frames, math.ceil(min_seconds * rate))


def tune(
    model: Path,
    board: str,
    costs: Path,
    options: TuneOptions = TuneOptions(),
    progress: Callable[[str], None] | None = None,
    input_shape: list[str] | None = None,
    input_data: Path | None = None,
    precision: PrecisionRequest | None = None,
) -> tuple[list[Round], list[tuple[Plan, RunResult]]]:
    """Rounds of plan -> run -> recalibrate; see the module docstring and ``TuneOptions``.

    ``precision``: ``--precision auto`` as ``plan`` takes it; every round then plans within that budget by that
    metric (``precision_plans``: each plan checked and repaired on the held-back frames), the accuracy measured
    once and the int8 / fp16 times following the recalibrated fp32 ones (``Auto.recosted``)."""
    import onnxruntime as ort

    say = progress or (lambda _msg: None)
    objective, rounds, target_error, frames = options.objective, options.rounds, options.target_error, options.frames
    search = SearchOptions(time_limit=options.time_limit)
    loaded: LoadedModel = open_model(model, input_shape, input_data)
    graph = build_graph(loaded.proto, loaded.sha256, model.stem)
    # the units tune plans on: every one an onnxruntime drives, each checked on the board before anything runs
    profile = options.units(load_profile(board_device(board)), board_units(board))
    check_board_units({p.name: p.execution_provider for p in profile.pus}, board)
    table = CostTable.load(costs)
    if not table.select(model_sha256=loaded.sha256, board=profile.name):
        say(f"profiling on {board}")
        profile_on_board(loaded, graph, board, table, costs)
    blocks = coarsen(graph, "coarse")
    cap = max(frames, options.max_frames if options.max_frames is not None else frames * MAX_FRAMES_FACTOR)
    history: list[Round] = []
    last: list[tuple[Plan, RunResult]] = []
    measured: list[tuple[Plan, RunResult]] = []  # every plan measured so far, for the kept-calibration rule
    noise: Noise | None = None
    # plan -> each of its runs at the frames of its round: the noise pools their figures, recalibrating merges them
    runs_of: dict[str, list[RunResult]] = {}
    # the plans whose repeats the noise pools every round: round 1's first plan (measured twice first, for the
    # frames) and the throughput end of its front (measured twice in round 1 too: pipelined plans drift most)
    noise_plans: list[Plan] = []
    auto: tuple[Auto, CostModel] | None = None  # --precision auto: what it measured, under which cost model

    frames_run: dict[str, int] = {}  # plan -> the frames of its latest measurement

    def frames_of(plan: Plan) -> int:  # this round's frames, or more for a fast plan (``frames_for``)
        rates = [m.measured.throughput_fps for m in runs_of.get(plan_key(plan), [])]
        frames_run[plan_key(plan)] = frames_for(plan, frames, options.min_seconds, rates)
        return frames_run[plan_key(plan)]

    def choose(cost: CostModel, r: int) -> list[Plan]:  # round r's plans under ``cost``
        nonlocal auto
        if precision is not None:
            if auto is None:
                local = profile.name in LOCAL_BOARDS
                auto = (measure(loaded, graph, blocks, cost, table, costs, precision, local, say), cost)
            plans, _ = precision_plans(
                blocks, graph, cost, search, auto[0].recosted(auto[1], cost, blocks), objective, say
            )
        elif objective == "pareto":
            plans = pareto_set(blocks, graph, cost, search)
        else:
            plans = [best_plan(blocks, graph, cost, objective, search)]
        if noise is None:
            return plans
        chosen = []  # a later round: a new plan must be predicted better than the noise resolves
        for plan, stands_for in settled(plans, [p for p, _ in measured], graph, cost, noise.pct):
            if stands_for is not None:
                say(
                    f"round {r + 1}: {stands_for.name} is predicted within the noise ({noise.pct:.1f}%) of "
                    f"{plan.name}, measured before: running that again"
                )
            chosen.append(plan)
        return chosen

    replanned: list[Plan] | None = None  # the next round's plans, as ``recalibrate``'s ``replan`` chose them

    def replan(fitted: CostTable) -> list[Plan]:
        nonlocal replanned
        if len(history) + 1 < rounds:
            say(f"round {len(history) + 2}: planning under the recalibrated table")
        else:  # no round runs them: they only decide whether the table the next ``plan`` reads keeps the fit
            say(f"round {len(history) + 1}: planning under the recalibrated table to decide whether to keep it")
        replanned = choose(CostModel.from_table(profile, graph, fitted), len(history) + 1)
        return replanned

    pending: list[Plan] | None = None  # this round's plans, chosen already under the table it plans with
    for r in range(rounds):
        cost = CostModel.from_table(profile, graph, table)
        if pending is None:
            say(f"round {r + 1}: planning")
            plans = choose(cost, r)
        else:
            plans, pending = pending, None
        last = []
        for i, plan in enumerate(plans):
            plan = dataclasses.replace(plan, model_path=str(model.resolve()), inputs=loaded.inputs)
            if noise is None:
                noise, runs = measure_noise(
                    plan, board, frames, cap, target_error, options.noise_runs, input_data, say, options.min_seconds
                )
                frames, noise_plans, result = noise.frames, [plan], merge_runs(runs)
                before = [run.measured.throughput_fps for run in runs[:-1]]
                frames_run[plan_key(plan)] = frames_for(plan, frames, options.min_seconds, before)
                runs_of[plan_key(plan)] = list(runs)
            else:
                n = frames_of(plan)
                say(f"round {r + 1}: running plan {i + 1}/{len(plans)} on {board} ({n} frames)")
                result = run_plan(plan, board, None, n, input_data=input_data)
                seen = runs_of.setdefault(plan_key(plan), [])
                earlier = list(seen)
                throughput_end = r == 0 and i == len(plans) - 1 and plan_key(plan) != plan_key(noise_plans[0])

                def again(why: str, plan: Plan = plan, i: int = i, n: int = n, r: int = r) -> RunResult:
                    say(f"round {r + 1}: measuring plan {i + 1} again ({why})")
                    return run_plan(plan, board, None, n, input_data=input_data)

                ran = confirmed(
                    result, earlier, again, max(target_error, noise.pct), twice=throughput_end and not earlier
                )
                seen.extend(ran)
                result = merge_runs(ran)
                if throughput_end:
                    noise_plans.append(plan)
            last.append((plan, result))
        planned = {plan_key(p) for p, _ in last}
        for again_plan in noise_plans if r > 0 else ():
            if plan_key(again_plan) in planned:
                continue
            # what drifts between rounds is noise too: each noise plan once more, if this round did not measure it
            n = frames_of(again_plan)
            say(f"round {r + 1}: measuring {again_plan.name} again for the noise ({n} frames)")
            again = run_plan(again_plan, board, None, n, input_data=input_data)
            runs_of[plan_key(again_plan)].append(again)
        measured += last
        assert noise is not None
        noise = pooled_noise(
            noise, {k: [(m.measured.latency_ms, m.measured.throughput_fps) for m in v] for k, v in runs_of.items()}
        )
        effective, limited, note = noise_verdict(noise, target_error)
        known = [(res.predicted, res.measured) for _, res in last if res.predicted is not None]
        lat = [(p.latency_ms, m.latency_ms) for p, m in known]
        thr = [(p.throughput_fps, m.throughput_fps) for p, m in known]
        energy = [
            (res.predicted.energy_mj, res.measured.energy_mj)
            for _, res in last
            if res.energy_source == "measured" and res.predicted is not None
        ]
        this = Round(
            r + 1,
            len(last),
            rmspe(lat),
            rmspe(thr),
            rmspe(energy) if energy else None,
            tuple(
                {
                    "plan": p.name,
                    "precision": p.precision_mix(),
                    "predicted": res.predicted.to_json() if res.predicted else {},
                    "measured": res.measured.to_json(),
                    "errors_pct": res.errors_pct,
                    "frames": frames_run.get(plan_key(p), frames),
                }
                for p, res in last
            ),
            frames=frames,
            noise=noise,
            target_pct=target_error,
            effective_target_pct=effective,
            noise_limited=limited,
            note=note,
        )
        stop = stop_reason(this.rmspe, target_error, effective, last=r == rounds - 1)
        if stop in ("target", "noise"):
            history.append(dataclasses.replace(this, stop=stop))
            break
        say(f"round {r + 1}: recalibrating")
        replanned = None
        calibration, handoff, power = recalibrate(
            table, pooled_runs(last, runs_of), pooled_runs(measured, runs_of), graph, profile, ort.__version__, replan
        )
        table.save(costs)
        if calibration.measured_plans_only:
            pending = replanned  # planned under this very table: the next round runs them
        history.append(
            dataclasses.replace(this, calibration=calibration, handoff_ms=handoff, power_scale=power, stop=stop)
        )
        more = grown_frames(noise, target_error, frames, cap)
        if more != frames:
            say(f"round {r + 1}: the noise pooled so far is {noise.pct:.1f}%: {more} frames a measurement from now on")
            frames = more
            noise = dataclasses.replace(noise, frames=frames, grown=True, capped=frames >= cap)
    return history, last


def grown_frames(noise: Noise, target: float, frames: int, cap: int) -> int:
    """The frames a measurement runs from the next round on: doubled (up to ``cap``) while the noise pooled so far
    is above a third of the target. The first plan's runs grow them in round 1 (``measure_noise``); the plans
    measured again later (the throughput end of the front, pipelined, drifts most) can show a noise that the
    first plan's runs did not (resnet50 on ``local``: 1.9% at 30 frames in round 1, one plan at 44.2, 31.4 and
    42.9 fps in three rounds). The repeats at fewer frames stay in the pool: it overstates the noise, never less."""
    if noise.pct <= target * NOISE_FRACTION or frames >= cap:
        return frames
    return min(cap, frames * 2)


def measure_noise(
    plan: Plan,
    board: str,
    frames: int,
    cap: int,
    target: float,
    runs: int,
    input_data: Path | None,
    say: Callable[[str], None],
    min_seconds: float = 0.0,
) -> tuple[Noise, list[RunResult]]:
    """Measure ``plan`` ``runs`` times; while the spread is above a third of the target, double the frames
    (up to ``cap``) and measure again. Each run lasts at least ``min_seconds`` at the plan's rate
    (``frames_for``). Returns the noise and the runs as long as the final pass's: those of earlier passes too
    where the floor in seconds made them as long (a fast model runs the same frames whatever ``frames`` says),
    the noise then their spread. Keeping only the final pass threw measurements away and let one slow phase
    of the machine stand for the plan: squeezenet1_1's latency plan on ``local`` ran 265.6, 270.0, 261.6 and
    254.6 fps, then 168.4 and 174.3, all at 284 frames; the last two were its measurement, its recalibration
    priced it at 170.5 fps and it measured 262 in the next round."""
    grown = False
    every: list[tuple[int, RunResult]] = []  # (frames run, run) over every pass
    while True:
        results: list[RunResult] = []
        for k in range(max(2, runs)):
            n = frames_for(plan, frames, min_seconds, [r.measured.throughput_fps for r in results])
            say(f"measuring the noise: {plan.name}, run {k + 1} ({n} frames)")
            results.append(run_plan(plan, board, None, n, input_data=input_data))
            every.append((n, results[-1]))
        noise = Noise(
            plan.name,
            len(results),
            frames,
            spread_pct([r.measured.latency_ms for r in results]),
            spread_pct([r.measured.throughput_fps for r in results]),
            grown,
        )
        if noise.pct <= target * NOISE_FRACTION:
            return as_long(noise, every, len(results))
        if frames >= cap:
            return as_long(dataclasses.replace(noise, capped=True), every, len(results))
        frames = min(cap, frames * 2)
        grown = True


def as_long(noise: Noise, every: list[tuple[int, RunResult]], last: int) -> tuple[Noise, list[RunResult]]:
    """The runs of ``every`` (frames run, run) at least as long as the shortest of the final pass (its ``last``
    runs), with ``noise``'s spread taken over them."""
    shortest = min(n for n, _ in every[-last:])
    kept = [r for n, r in every if n >= shortest]
    if len(kept) == last:
        return noise, kept
    return dataclasses.replace(
        noise,
        runs=len(kept),
        latency_pct=spread_pct([r.measured.latency_ms for r in kept]),
        throughput_pct=spread_pct([r.measured.throughput_fps for r in kept]),
    ), kept
