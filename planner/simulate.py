"""Predict a plan's latency, throughput and energy: analytically and by discrete-event simulation.

Both use the same lowering (``planner.segments``) and costs. A segment starts for a
frame when all its inputs have arrived and its unit (a PU, or a set of cores of a
CPU cluster) is free; a unit runs a frame's segments in its order (``Segment.index``,
the solver's), and of the frames whose next segment there is ready it picks the one
with the smallest frame + lag (``agents.modulo``, as the executor does). Data
between units on different PUs crosses the profile's link: each tensor reaches its consumer
its transfer time after its producer ends, without queueing behind the frame's other transfers
(the executor hands a tensor to every consumer at once), and a link, like a shared memory,
moves one frame's bytes per frame (frames enter no faster than that), and between hosts the sending and receiving segments also
spend the link's CPU time (gRPC) on each tensor; units on one CPU cluster hand tensors over in memory. PUs that
share a memory (the profile's ``memories``) share its bandwidth as a budget per frame:
frames enter and leave no faster than the memory moves one frame's bytes. Frames
are admitted while fewer than ``max_inflight`` are in flight (the executor's bounded
queues; 1 for plans that are not pipelined), replicated stages take frames
round-robin, and frames leave in order.

Energy is modelled from the profile's power figures: every PU draws idle power for
the whole run and its busy power while it computes; network transfers add their
energy per byte. Every figure is labelled ``modelled``.
"""

from __future__ import annotations

import bisect
import heapq
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from agents.modulo import lags
from models.graph import OpGraph
from planner.costmodel import CostModel
from planner.plan import Plan, Predicted
from planner.segments import Segment, block_edges, lower, max_inflight
from profiler.measure import AT_RATE_LOAD


@dataclass(frozen=True)
class SimResult:
    frames: int  # frames simulated back to back: at least two windows (see simulate)
    latency_p50_ms: float
    latency_p99_ms: float
    throughput_fps: float
    energy_mj: float
    busy_ms: Mapping[str, float]  # per segment name, whole run
    makespan_ms: float

    def predicted(self) -> Predicted:
        return Predicted(self.latency_p50_ms, self.throughput_fps, self.energy_mj, "modelled", "simulated")


class PlanModel:
    """A plan lowered to segments with their costs and the bytes flowing between them."""

    def __init__(self, plan: Plan, graph: OpGraph, cost: CostModel) -> None:
        self.plan, self.graph, self.cost = plan, graph, cost
        self.segments = lower(plan, graph, cost.profile)
        self.ms = {s.key: cost.group_ms(s.members, s.pu, s.cores).ms for s in self.segments}
        self.sources = {cost.group_ms(s.members, s.pu, s.cores).source for s in self.segments}
        # the time a segment's bytes occupy the memory its PU shares with others (per frame; none: no entry)
        self.traffic: dict[tuple, tuple[str, float]] = {}
        for s in self.segments:
            memory = cost.shared_memory_of(s.pu)
            if memory is not None:
                self.traffic[s.key] = (memory, cost.traffic_ms(s.members, s.pu))
        seg_of_block: dict[tuple[int, int, str], Segment] = {}
        for s in self.segments:
            for b in s.blocks:
                seg_of_block[(s.stage, s.group, b)] = s
        self.seg_of_block = seg_of_block
        self.stage_of_block = {b: s.stage for s in self.segments for b in s.blocks}
        self.flows = {k: sum(v.values()) for k, v in block_edges(plan, graph).items()}
        self.period = plan.replica_period()
        # between hosts, a tensor costs the sending and the receiving segment CPU time (gRPC), per block edge as
        # in the ILP; the same for every frame that runs a segment, whichever replica it sends to
        handoff: dict[tuple, float] = {}
        for f in range(self.period):
            per_frame: dict[tuple, float] = {}
            for (src, dst), (_, x, y, parts) in self.frame_flows(f).items():
                for nb in parts:
                    send, receive = cost.handoff_cpu_ms(nb, x, y)
                    per_frame[src] = per_frame.get(src, 0.0) + send
                    per_frame[dst] = per_frame.get(dst, 0.0) + receive
            handoff.update(per_frame)
        for key, ms in handoff.items():
            self.ms[key] += ms

    def frame_segments(self, frame: int) -> list[Segment]:
        chosen = {s: frame % st.replicas for s, st in enumerate(self.plan.stages)}
        return [s for s in self.segments if s.group == chosen[s.stage]]

    def frame_flows(self, frame: int) -> dict[tuple[tuple, tuple], tuple[int, str, str, tuple[int, ...]]]:
        """(source segment key, target segment key) -> (bytes, source PU, target PU, bytes of each block edge)
        for one frame. Each block edge (producer block -> consumer block) is one transfer, as in the ILP."""
        chosen = {s: frame % st.replicas for s, st in enumerate(self.plan.stages)}
        out: dict[tuple[tuple, tuple], tuple[int, str, str, tuple[int, ...]]] = {}
        for (a, b), nbytes in self.flows.items():
            sa = self.seg_of_block[(self.stage_of_block[a], chosen[self.stage_of_block[a]], a)]
            sb = self.seg_of_block[(self.stage_of_block[b], chosen[self.stage_of_block[b]], b)]
            if sa.key == sb.key:
                continue
            prev = out.get((sa.key, sb.key), (0, sa.pu, sb.pu, ()))
            out[(sa.key, sb.key)] = (prev[0] + nbytes, sa.pu, sb.pu, (*prev[3], nbytes))
        return out

    def transfer_ms(self, nbytes: int, src: str, dst: str) -> float:
        return self.cost.transfer_ms(nbytes, src, dst)

    def flow_ms(self, parts: tuple[int, ...], src: str, dst: str) -> float:
        """Link time of a flow: its block edges one after another."""
        return sum(self.cost.transfer_ms(n, src, dst) for n in parts)

    def idle_w(self) -> float:
        return sum(p.idle_power_w.value for p in self.cost.profile.pus) * self.cost.calibration.power_idle_scale

    def busy_extra_w(self, seg: Segment) -> float:
        return self._busy_extra_w(seg) * self.cost.calibration.power_active_scale

    def _busy_extra_w(self, seg: Segment) -> float:
        if seg.pu.spans:  # one session spanning clusters: all their cores busy
            parts = [self.cost.profile.pu(p) for p in seg.pu.parts]
            return sum(p.active_power_w.value - p.idle_power_w.value for p in parts)
        pu = self.cost.profile.pu(seg.pu)
        n = max(1, len(pu.cores)) if pu.kind == "cpu" else 1
        per_core_idle = pu.idle_power_w.value / n if pu.kind == "cpu" else pu.idle_power_w.value
        if pu.kind == "cpu":
            return (pu.active_power_w.value / n - per_core_idle) * seg.cores
        return pu.active_power_w.value - per_core_idle

    def frame_traffic_ms(self, frame: int) -> float:
        """The longest time one frame's bytes occupy a shared memory or a link: frames enter no faster than
        that."""
        per: dict[tuple[str, ...], float] = {}
        for s in self.frame_segments(frame):
            if s.key in self.traffic:
                memory, ms = self.traffic[s.key]
                per[("memory", memory)] = per.get(("memory", memory), 0.0) + ms
        for _, (_, x, y, parts) in self.frame_flows(frame).items():
            per[("link", x, y)] = per.get(("link", x, y), 0.0) + self.flow_ms(parts, x, y)
        return max(per.values(), default=0.0)

    def max_inflight(self) -> int:
        return max_inflight(self.plan, self.segments)

    def lags(self) -> dict[tuple, int]:
        """Each segment's lag (``agents.modulo``), over the partition graphs of every replica phase."""
        place = {s.key: (s.unit_key, s.index) for s in self.segments}
        return lags(place, (e for f in range(self.period) for e in self.frame_flows(f)))


def analytic(model: PlanModel) -> Predicted:
    """Latency: one frame through an empty pipeline. Throughput: the busiest unit or link per frame."""
    one = simulate(model, frames=1)
    load: dict[tuple, float] = {}
    extra_mj = 0.0
    for f in range(model.period):
        for s in model.frame_segments(f):
            load[s.unit_key] = load.get(s.unit_key, 0.0) + model.ms[s.key]
            extra_mj += model.ms[s.key] * model.busy_extra_w(s)
            if s.key in model.traffic:
                memory, ms = model.traffic[s.key]
                load[("memory", memory)] = load.get(("memory", memory), 0.0) + ms
        for (_, _), (nbytes, x, y, parts) in model.frame_flows(f).items():
            t = model.flow_ms(parts, x, y)
            if t:
                load[("link", x, y)] = load.get(("link", x, y), 0.0) + t
            extra_mj += model.cost.transfer_mj(nbytes, x, y)
    period_ms = max(load.values()) / model.period
    if not model.plan.pipelined:
        period_ms = max(period_ms, one.latency_p50_ms)
    energy = extra_mj / model.period + period_ms * model.idle_w()
    return Predicted(one.latency_p50_ms, 1000.0 / period_ms, energy, "modelled", "analytic")


def simulate(model: PlanModel, frames: int = 200, max_inflight: int | None = None) -> SimResult:
    """Throughput and energy with frames offered back to back; latency with frames arriving at that rate.

    Offered back to back, frames queue in front of the slowest unit and their latency
    grows with the queue; so latency is measured in a second run where frames arrive
    at ``AT_RATE_LOAD`` (90%) of the throughput the first run reached, as the agent's
    benchmark sends them: the latency a user sees near full rate.
    """
    window = max_inflight or model.max_inflight()
    # Steady state: frames that left while the window was still refilled (after the last frame entered the
    # pipeline drains, and frames that queued while it filled leave in a burst, faster than any steady rate),
    # from the middle of that stretch on. A window as large as the run would leave no such stretch, so the
    # run is at least two windows long.
    requested, frames = frames, max(frames, 2 * window) if frames > 1 else frames
    enter, leave, busy, extra_mj = _run(model, frames, window, None)
    last = frames - 1 - window if frames - 1 - window >= 1 else frames - 1  # left before the last frame entered
    warm = max(1, last // 2)
    span = leave[last] - leave[warm - 1] if frames > 1 else leave[0] - enter[0]
    # frames that leave together (replicas started at once) count whole: every frame that left after the
    # first instant and by the last, so a burst split by the frame indices does not bias the rate
    done = bisect.bisect_right(leave, leave[last]) - bisect.bisect_right(leave, leave[warm - 1]) if frames > 1 else 1
    throughput = 1000.0 * done / span if span > 0 else float("inf")
    makespan = leave[-1] - enter[0]
    if frames > 1 and span > 0:
        p_enter, p_leave, _, _ = _run(model, requested, window, 1000.0 / (AT_RATE_LOAD * throughput))
        latencies = sorted(b - a for a, b in zip(p_enter, p_leave, strict=True))
    else:
        latencies = sorted(b - a for a, b in zip(enter, leave, strict=True))
    return SimResult(
        frames=frames,
        latency_p50_ms=statistics.median(latencies),
        latency_p99_ms=latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        throughput_fps=throughput,
        energy_mj=(extra_mj + makespan * model.idle_w()) / frames,
        busy_ms=busy,
        makespan_ms=makespan,
    )


def _run(
    model: PlanModel, frames: int, window: int, interval_ms: float | None
) -> tuple[list[float], list[float], dict[str, float], float]:
    """One event-driven run: (entry times, in-order leave times, busy ms per segment, busy energy mJ)."""
    run = _Run(model, frames, window, interval_ms)
    run.loop()
    return [run.enter[f] for f in range(frames)], run.leave_times(), run.busy, run.extra_mj


class _Run:
    """The state of one event-driven run: frames admitted into a window, segments queued on their units in the
    unit's order, tensors crossing links; events are (time, sequence, kind, data)."""

    def __init__(self, model: PlanModel, frames: int, window: int, interval_ms: float | None) -> None:
        self.model, self.frames, self.window, self.interval_ms = model, frames, window, interval_ms
        self.events: list[tuple[float, int, str, tuple]] = []
        self.seq = 0
        self.segs = {f: model.frame_segments(f) for f in range(min(frames, model.period))}
        self.flows = {f: model.frame_flows(f) for f in range(min(frames, model.period))}
        self.seg_by_key = {s.key: s for s in model.segments}
        # per phase, each segment's outgoing flows, in ``flows``' order: (dst, its link time, the handoff delay
        # beyond it, its transfer energy), priced once here rather than on every frame's event
        self.out_flows: dict[int, dict[tuple, list[tuple[tuple, float, float, float]]]] = {}
        for f, flows in self.flows.items():
            by_src: dict[tuple, list[tuple[tuple, float, float, float]]] = {}
            for (src, dst), (nbytes, x, y, parts) in flows.items():
                t = model.flow_ms(parts, x, y)
                # latency only: it occupies no link; none to a later partition of the same unit
                same_unit = self.seg_by_key[src].unit_key == self.seg_by_key[dst].unit_key
                delay = 0.0 if same_unit else model.cost.handoff_delay_ms(x, y)
                mj = model.cost.transfer_mj(nbytes, x, y) if t else 0.0
                by_src.setdefault(src, []).append((dst, t, delay, mj))
            self.out_flows[f] = by_src
        self.extra_w = {s.key: model.busy_extra_w(s) for s in model.segments}
        self.name_of = {s.key: s.name for s in model.segments}
        # per phase, how many flows each of its segments waits for
        self.incoming: dict[int, dict[tuple, int]] = {}
        for f, fs in self.segs.items():
            incoming = {s.key: 0 for s in fs}
            for _, dst in self.flows[f]:
                incoming[dst] += 1
            self.incoming[f] = incoming
        # the executor's order on a unit (``agents.modulo``): among the frames whose next segment there is
        # ready, the smallest frame + lag
        self.lag = model.lags()
        self.waiting: dict[tuple[int, tuple], int] = {}
        self.unit_busy_until: dict[tuple, float] = {}
        # a unit's segments that may run now: each frame's next one in the unit's order, if ready (a heap by
        # frame + lag); ready ones further on in the order wait in ``held`` until their turn
        self.runnable: dict[tuple, list[tuple[int, int, int, tuple]]] = {}
        self.held: dict[tuple[tuple, int], dict[int, tuple]] = {}  # (unit, frame) -> index -> segment key
        self.next_index: dict[tuple[tuple, int], int] = {}  # (unit, frame) -> the index of its next segment there
        self.done_count: dict[int, int] = {}
        self.enter: dict[int, float] = {}
        self.finish: dict[int, float] = {}
        self.busy: dict[str, float] = {}
        self.extra_mj = 0.0
        self.admitted = self.inflight = 0
        self.gate = {f: model.frame_traffic_ms(f) for f in self.segs}
        self.next_entry = 0.0  # a shared memory moves one frame's bytes per frame_traffic_ms: the next enters then

    def push(self, t: float, kind: str, data: tuple) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, data))
        self.seq += 1

    def loop(self) -> None:
        self.push(0.0, "admit", ())
        while self.events:
            now, _, kind, data = heapq.heappop(self.events)
            if kind == "admit":
                self.admit(now)
            elif kind == "done":
                self.done(now, *data)
            elif kind == "arrive":
                self.arrive(now, *data)
            # a unit that just became free may have queued work
            for unit, until in list(self.unit_busy_until.items()):
                if until <= now and self.runnable.get(unit):
                    self.dispatch(now, unit)

    def admit(self, now: float) -> None:
        """Frames enter while the window has room, at their due time and no faster than the shared memory."""
        while self.admitted < self.frames and self.inflight < self.window:
            f = self.admitted
            due = max(f * self.interval_ms if self.interval_ms is not None else 0.0, self.next_entry)
            if due > now:
                self.push(due, "admit", ())
                return
            self.admitted += 1
            self.inflight += 1
            self.enter[f] = now
            self.next_entry = now + self.gate[f % self.model.period]
            self.done_count[f] = 0
            fs = self.segs[f % self.model.period]
            incoming = self.incoming[f % self.model.period]
            for s in fs:
                self.waiting[(f, s.key)] = incoming[s.key]
                if incoming[s.key] == 0:
                    self.ready(now, f, s.key)

    def ready(self, now: float, f: int, key: tuple) -> None:
        unit, index = key[:3], key[3]  # a segment's key is its unit's key and its index there
        if index == self.next_index.get((unit, f), 0):
            heapq.heappush(self.runnable.setdefault(unit, []), (f + self.lag[key], f, index, key))
        else:
            self.held.setdefault((unit, f), {})[index] = key
        self.dispatch(now, unit)

    def dispatch(self, now: float, unit: tuple) -> None:
        """Of the frames whose next segment on this unit (in the unit's order) is ready, the one with the
        smallest frame + lag runs it."""
        queue = self.runnable.get(unit)
        if not queue or self.unit_busy_until.get(unit, 0.0) > now:
            return
        _, f, index, key = heapq.heappop(queue)
        self.next_index[(unit, f)] = index + 1
        held = self.held.get((unit, f))
        if held and index + 1 in held:  # the frame's next segment here was ready already: its turn now
            nxt = held.pop(index + 1)
            heapq.heappush(queue, (f + self.lag[nxt], f, index + 1, nxt))
        ms = self.model.ms[key]
        self.unit_busy_until[unit] = now + ms
        name = self.name_of[key]
        self.busy[name] = self.busy.get(name, 0.0) + ms
        self.extra_mj += ms * self.extra_w[key]
        self.push(now + ms, "done", (f, key))

    def done(self, now: float, f: int, key: tuple) -> None:
        """A segment ended: its unit takes the next, its outputs cross their links, the frame may be finished."""
        model = self.model
        self.dispatch(now, key[:3])
        for dst, t, delay, mj in self.out_flows[f % model.period].get(key, ()):
            # every consumer gets the tensor as soon as it has crossed: transfers of one frame do not queue
            # behind each other (the executor hands a tensor to each consumer at once); a link's occupancy
            # per frame spaces the frames instead (``frame_traffic_ms``), as in the ILP
            self.extra_mj += mj
            self.push(now + t + delay, "arrive", (f, dst))
        self.done_count[f] += 1
        if self.done_count[f] == len(self.segs[f % model.period]):
            self.finish[f] = now
            self.inflight -= 1
            self.admit(now)

    def arrive(self, now: float, f: int, dst: tuple) -> None:
        self.waiting[(f, dst)] -= 1
        if self.waiting[(f, dst)] == 0:
            self.ready(now, f, dst)

    def leave_times(self) -> list[float]:
        """Frames leave in order, and no faster than the shared memory moves their bytes."""
        leave, last = [], 0.0
        for f in range(self.frames):
            last = max(last + self.gate[f % self.model.period] if f else 0.0, self.finish[f])
            leave.append(last)
        return leave
