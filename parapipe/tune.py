"""The closed loop: profile -> plan -> run each plan -> feed the measurements back -> re-plan.

Each run on the board reports every partition's busy time per frame (frames back to
back; for units split into several segments, which overlap on their cores, frames run one
at a time); those become measured ``partition`` entries in the cost table (keyed like the profiler's), so the
next round's cost model predicts those partitions from what the board did. Rounds stop
when predicted and measured latency and throughput agree within the target (RMSPE) or
the rounds run out; energy enters the error only where a sensor measured it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from device_profiles.loader import load_profile
from device_profiles.schema import DeviceProfile
from models.coarsen import coarsen
from models.graph import OpGraph, build_graph
from models.onnx_io import LoadedModel
from parapipe.intake import open_model
from parapipe.profiling import profile_on_board
from parapipe.reach import board_device
from parapipe.run import RunResult, run_plan
from planner.costmodel import CostModel
from planner.plan import Plan
from planner.search import best_plan, pareto_set
from planner.segments import lower
from profiler.costtable import Conditions, CostEntry, CostTable, entry_key


@dataclass
class Round:
    index: int
    plans: int
    rmspe_latency: float
    rmspe_throughput: float
    rmspe_energy: float | None  # None: energy was modelled, not measured
    rows: list[dict] = field(default_factory=list)
    handoff_ms: float | None = None  # the handoff delay learnt from this round's runs (None: none to learn)
    power_scale: tuple[float, float] | None = None  # (busy, idle) power scales learnt from measured energy


def rmspe(pairs: list[tuple[float, float]]) -> float:
    """Root mean square percentage error of (predicted, measured) pairs."""
    if not pairs:
        return float("nan")
    return math.sqrt(sum(((p - m) / m) ** 2 for p, m in pairs) / len(pairs)) * 100


def feed_back(
    table: CostTable, plan: Plan, result: RunResult, graph: OpGraph, profile: DeviceProfile, ort_version: str
) -> int:
    """Measured busy time per frame of each partition -> measured partition entries; returns how many."""
    segments = {s.name: s for s in lower(plan, graph, profile)}
    flops = {n.name: n.flops for n in graph.nodes}
    added = 0
    per_unit: dict[tuple[int, int, int], int] = {}
    for seg in segments.values():
        per_unit[seg.unit_key] = per_unit.get(seg.unit_key, 0) + 1
    for p in result.partitions:
        seg = segments.get(p.name)
        if seg is None or "+" in seg.pu:
            continue
        # Back to back, a partition's time includes what running beside the others costs it
        # (memory, caches, the executor's own threads): what the pipeline's throughput depends
        # on. But segments of one unit share its cores and overlap, and then each one's wall
        # time counts the others; for those the frames run one at a time are the honest measure.
        if per_unit[seg.unit_key] == 1 and p.busy_per_frame_ms is not None:
            per_frame = p.busy_per_frame_ms
        else:
            per_frame = p.alone_per_frame_ms or p.busy_per_frame_ms
        if per_frame is None:
            continue
        pu = profile.pu(seg.pu)
        cond = Conditions(
            profile.name,
            seg.pu,
            seg.cores,
            seg.cores,
            pu.execution_provider,
            ort_version,
            "all",
            pu.throttle.quota_percent if pu.throttle else None,
        )
        table.add(
            CostEntry(
                key=entry_key(graph.model_sha256, "partition", seg.members, cond),
                kind="partition",
                model_sha256=graph.model_sha256,
                name=f"run:{seg.name}",
                members=seg.members,
                conditions=cond,
                median_ms=per_frame,
                mean_ms=per_frame,
                p10_ms=per_frame,
                p90_ms=per_frame,
                repeats=p.frames,
                energy_mj=None,
                energy_source="none",
                flops=sum(flops[m] for m in seg.members),
            )
        )
        added += 1
    return added


HANDOFF_GRID_MS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


def fit_handoff(
    table: CostTable,
    runs: list[tuple[Plan, RunResult]],
    graph: OpGraph,
    profile: DeviceProfile,
    ort_version: str,
) -> float | None:
    """Learn the delay of a handoff between PUs from the measured latencies (one frame alone).

    With the partitions' measured times in the table, what is left between predicted and
    measured latency is mostly the cost of waking a worker on another PU (on a throttled
    core: of waiting for its quota). The value on ``HANDOFF_GRID_MS`` with the least RMSPE
    over this round's plans becomes a ``handoff`` entry of the cost table. None when no plan
    hands tensors between PUs.
    """
    from planner.build import evaluate

    cost = CostModel(profile, graph, table)
    best: tuple[float, float] | None = None
    varies = False
    for h in HANDOFF_GRID_MS:
        cost.handoff_ms = h
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
    cond = Conditions(profile.name, "*", 0, 0, "", ort_version, "all", None)
    table.add(
        CostEntry(
            key=entry_key(graph.model_sha256, "handoff", (), cond),
            kind="handoff",
            model_sha256=graph.model_sha256,
            name="handoff",
            members=(),
            conditions=cond,
            median_ms=best[0],
            mean_ms=best[0],
            p10_ms=best[0],
            p90_ms=best[0],
            repeats=len(runs),
            energy_source="none",
            measured_at=time.time(),
        )
    )
    return best[0]


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
    cost = CostModel(profile, graph, table)
    rows = []
    for plan, _ in measured:
        cost.power_active_scale, cost.power_idle_scale = 1.0, 0.0
        busy = evaluate(plan, graph, cost, frames=0).predicted.energy_mj  # type: ignore[union-attr]
        cost.power_active_scale, cost.power_idle_scale = 0.0, 1.0
        idle = evaluate(plan, graph, cost, frames=0).predicted.energy_mj  # type: ignore[union-attr]
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
    cond = Conditions(profile.name, "*", 0, 0, "", ort_version, "all", None)
    for name, value in (("active-scale", float(a)), ("idle-scale", float(b))):
        table.add(
            CostEntry(
                key=entry_key(graph.model_sha256, "power", (name,), cond),
                kind="power",
                model_sha256=graph.model_sha256,
                name=name,
                members=(),
                conditions=cond,
                median_ms=0.0,
                mean_ms=0.0,
                p10_ms=0.0,
                p90_ms=0.0,
                repeats=len(measured),
                energy_source="measured",
                measured_at=time.time(),
                value=value,
            )
        )
    return (float(a), float(b))


def tune(
    model: Path,
    board: str,
    costs: Path,
    objective: str = "pareto",
    rounds: int = 3,
    target_error: float = 5.0,
    time_limit: float = 2.0,
    frames: int = 30,
    progress: Callable[[str], None] | None = None,
    input_shape: list[str] | None = None,
    input_data: Path | None = None,
) -> tuple[list[Round], list[tuple[Plan, RunResult]]]:
    import onnxruntime as ort

    say = progress or (lambda _msg: None)
    loaded: LoadedModel = open_model(model, input_shape, input_data)
    graph = build_graph(loaded.proto, loaded.sha256, model.stem)
    profile = load_profile(board_device(board))
    table = CostTable.load(costs)
    if not table.select(model_sha256=loaded.sha256, board=profile.name):
        say(f"profiling on {board}")
        profile_on_board(loaded, graph, board, table, costs)
    blocks = coarsen(graph, "coarse")
    history: list[Round] = []
    last: list[tuple[Plan, RunResult]] = []
    for r in range(rounds):
        cost = CostModel(profile, graph, table)
        say(f"round {r + 1}: planning")
        if objective == "pareto":
            plans = pareto_set(blocks, graph, cost, time_limit=time_limit)
        else:
            plans = [best_plan(blocks, graph, cost, objective, time_limit)]
        last = []
        for i, plan in enumerate(plans):
            say(f"round {r + 1}: running plan {i + 1}/{len(plans)} on {board}")
            plan = dataclasses.replace(plan, model_path=str(model.resolve()), inputs=loaded.inputs)
            last.append((plan, run_plan(plan, board, None, frames, input_data=input_data)))
        known = [(res.predicted, res.measured) for _, res in last if res.predicted is not None]
        lat = [(p.latency_ms, m.latency_ms) for p, m in known]
        thr = [(p.throughput_fps, m.throughput_fps) for p, m in known]
        energy = [
            (res.predicted.energy_mj, res.measured.energy_mj)
            for _, res in last
            if res.energy_source == "measured" and res.predicted is not None
        ]
        history.append(
            Round(
                r + 1,
                len(last),
                rmspe(lat),
                rmspe(thr),
                rmspe(energy) if energy else None,
                [
                    {
                        "plan": p.name,
                        "predicted": res.predicted.to_json() if res.predicted else {},
                        "measured": res.measured.to_json(),
                        "errors_pct": res.errors_pct,
                    }
                    for p, res in last
                ],
            )
        )
        if history[-1].rmspe_latency <= target_error and history[-1].rmspe_throughput <= target_error:
            break
        for plan, res in last:
            feed_back(table, plan, res, graph, profile, ort.__version__)
        history[-1].handoff_ms = fit_handoff(table, last, graph, profile, ort.__version__)
        history[-1].power_scale = fit_power(table, last, graph, profile, ort.__version__)
        table.save(costs)
    return history, last
