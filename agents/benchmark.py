"""Benchmark a running pipeline with frames generated on the board.

Three runs, each with its own purpose: frames back to back (steady-state throughput, per-partition
busy time and queue waits, energy), as many one frame at a time (latency alone: their mean, the
figure the cost model's sum of mean partition times predicts -- a median sits below it by the tail
of slow runs, 5-11% on this 2-core VM's single-partition plans; more frames make it less noisy too), and frames arriving at ``AT_RATE_LOAD`` (90%) of the measured throughput (latency p50/p99 at rate) -- the
same quantities the planner's analytic model and simulator predict.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from dataclasses import dataclass
from functools import partial

import numpy as np

from agents.executor import DeadlineExceeded, Pipeline, generate_inputs
from profiler.energy import EnergyMeter, PowerModel
from profiler.measure import AT_RATE_LOAD

PROBE_FRAMES = 3  # one at a time before the back-to-back run: its window (``steady_inflight``)
WINDOW_MARGIN = 2  # frames in flight back to back: this many times what keeps every unit busy


@dataclass(frozen=True)
class PartitionResult:
    name: str
    pu: str
    busy_ms: float
    queue_wait_ms: float
    frames: int
    alone_busy_ms: float = 0.0  # over the frames run one at a time: no other frame competes
    alone_frames: int = 0
    # the CPU time of the thread running the session, back to back and one at a time, over the runs it was read for
    cpu_ms: float = 0.0
    cpu_frames: int = 0
    alone_cpu_ms: float = 0.0
    alone_cpu_frames: int = 0
    provider: str = ""  # the execution provider its session runs on (its first, checked when it was made)
    load_s: float = 0.0  # seconds its session took to load, EP compilation included (a deploy cost)
    compile_cache_hit: bool = False  # the EP's compiled model came from the agent's cache


@dataclass(frozen=True)
class BenchmarkResult:
    frames: int  # the throughput is measured over these; the partitions also ran the last window's, which drained
    latency_p50_ms: float
    latency_p99_ms: float
    latency_alone_ms: float
    throughput_fps: float
    energy_mj: float
    energy_source: str
    energy_sensor: str
    partitions: tuple[PartitionResult, ...]
    wall_s: float
    # frames back to back, how the partitions' runs overlapped (``executor.Overlap``): the share of the busy time
    # two or more different frames ran at once, the mean frames running while any ran (1.0: one at a time), and
    # the share of the frames' runs during which another frame ran (0: one at a time); and the frames in flight
    # when a partition started a run, on average (1.0: one at a time)
    overlap: float = 0.0
    frames_at_once: float = 0.0
    runs_overlapped: float = 0.0
    in_flight: float = 0.0


def back_to_back(
    pipeline: Pipeline, inputs: dict[str, np.ndarray], frames: int, inflight: int | None = None
) -> dict[int, float]:
    """Run ``frames`` frames back to back, ``inflight`` at once (at most and by default the pipeline's
    ``max_inflight``); each frame's finish time, by index.

    This thread fills the slots; then each frame that finishes sends the next one from the thread that
    finished it (its last worker), as a plain session run in a loop feeds itself, so ``inflight`` frames
    stay in flight with no feeding thread that needs a core each time a slot frees (at real-time priority it
    gets none until a worker runs dry: the workers then wait for it). A frame that finds no slot there (a
    call to the agent took it meanwhile) is left to this thread, which waits for a slot. The first failure
    ends the run: the frames in flight finish, then it is raised."""
    finished: dict[int, float] = {}
    lock = threading.Lock()
    wake = threading.Event()
    left_over: list[int] = []  # frames a done-callback could not send: this thread sends them
    failure: list[BaseException] = []
    claimed = [0]
    submitted = [0]

    def claim() -> int | None:
        with lock:
            if claimed[0] >= frames or failure:
                return None
            claimed[0] += 1
            submitted[0] += 1  # counted before it may finish; taken back if it is not sent
            return claimed[0] - 1

    def send(i: int, here: bool) -> None:
        """Submit frame ``i``, counted in ``submitted`` already."""
        try:
            future = pipeline.submit(inputs, None if here else 0.0, run=False)
        except DeadlineExceeded:  # no slot free (from a done-callback, which must not wait)
            with lock:
                submitted[0] -= 1
                left_over.append(i)
            wake.set()
            return
        except BaseException as exc:
            with lock:
                submitted[0] -= 1
            failure.append(exc)
            wake.set()
            return
        future.add_done_callback(partial(done, i))

    def done(i: int, future) -> None:
        finished[i] = time.perf_counter()
        error = future.exception()
        if error is not None:
            failure.append(error)
        if len(finished) == frames or failure:
            wake.set()
            if failure:
                return
        nxt = claim()
        if nxt is not None:
            send(nxt, here=False)

    window = min(inflight or pipeline.max_inflight, pipeline.max_inflight)
    for _ in range(min(frames, window)):
        nxt = claim()
        if nxt is not None:
            send(nxt, here=True)
    while len(finished) < frames:
        with lock:
            if failure and len(finished) >= submitted[0]:
                break  # every frame sent has finished or failed
        wake.wait(0.5)
        wake.clear()
        with lock:
            todo, left_over[:] = left_over[:], []
        for i in todo:
            if not failure:
                with lock:
                    submitted[0] += 1
                send(i, here=True)
    if failure:
        raise failure[0]
    return finished


def steady_inflight(pipeline: Pipeline, latency_s: float, busy_s: dict[str, float], frames: int) -> int:
    """Frames in flight for a steady back-to-back run: ``WINDOW_MARGIN`` times the simulator's saturating
    window (``planner.simulate._saturating_window``: one frame in each unit and one waiting in front of it,
    for every frame the busiest unit finishes during one frame's latency, and one more) plus the largest lag
    of a unit's partition (``profiler.modulo``: a unit runs its later partitions that many frames behind), at
    most the pipeline's ``max_inflight``. ``latency_s`` is one frame's latency alone, ``busy_s`` each local
    partition's busy time over those ``frames``. A plan of many partitions admits hundreds of frames
    (``planner.segments.max_inflight``); a run of fewer frames than that never refills, and is a burst
    that fills and drains, not the steady state the plan predicts."""
    load: dict[object, float] = {}
    for name, busy in busy_s.items():
        thread = pipeline.workers[name].thread  # a unit's partitions share its runner
        load[thread] = load.get(thread, 0.0) + busy / max(frames, 1)
    period = max(load.values(), default=0.0)
    if period <= 0.0 or not math.isfinite(latency_s):
        return pipeline.max_inflight
    parts = pipeline.manifest.partitions
    units = len({(p.host, p.stage, p.group, p.unit) for p in parts})  # every host's: the frame crosses them all
    lag = max((w.lag for w in pipeline.workers.values()), default=0)
    window = 2 * units * max(1, math.ceil(latency_s / period)) + 1 + lag
    return max(1, min(pipeline.max_inflight, math.ceil(WINDOW_MARGIN * window)))


def steady_rate(finished: list[float], measured: int, started: float) -> float:
    """Frames per second from the finish times of a back-to-back run whose first ``measured`` finishes each
    sent the next frame in (the run's window refilled): over those finishes, after the fill (the first tenth,
    at least one window's worth where there is room). The frames that finish after them drain the pipeline
    and are not counted: with nothing new behind them they leave faster than any steady rate."""
    done = sorted(finished)[:measured]
    if measured < 3:
        return measured / (done[-1] - started)
    warm = min(max(1, measured // 10, len(finished) - measured), measured // 2)
    return (measured - 1 - warm) / (done[-1] - done[warm])


def run_benchmark(
    pipeline: Pipeline,
    frames: int = 50,
    warmup: int = 5,
    seed: int = 0,
    power: PowerModel | None = None,
    cores: int = 1,
) -> BenchmarkResult:
    started = time.perf_counter()
    inputs = generate_inputs(pipeline.manifest.inputs, seed)
    for _ in range(warmup):
        pipeline.infer(inputs)
    pipeline.reset_stats()
    probe = []
    for _ in range(PROBE_FRAMES):
        a = time.perf_counter()
        pipeline.infer(inputs)
        probe.append(time.perf_counter() - a)
    busy = {name: s.busy_s for name, s in pipeline.stats().items()}
    inflight = steady_inflight(pipeline, statistics.median(probe), busy, PROBE_FRAMES)

    # 1. back to back: throughput, busy time, energy. ``frames`` finishes with the window refilled (each sends
    # the next frame in), then the window's last frames drain: ``frames`` + the window are run.
    fed = frames + inflight if frames > 1 else frames
    pipeline.reset_stats()
    overlap = pipeline.track_overlap()
    meter = EnergyMeter(power or PowerModel(0.0, 0.0), cores)
    try:
        with meter:
            t0 = time.perf_counter()
            finished = back_to_back(pipeline, inputs, fed, inflight)
            t1 = time.perf_counter()
    finally:
        pipeline.untrack_overlap(overlap)
    throughput = steady_rate(list(finished.values()), frames, t0) if frames > 1 else 1 / (t1 - t0)
    stats = dict(pipeline.stats())
    reading = meter.reading

    # 2. one frame at a time
    pipeline.reset_stats()
    alone = []
    for _ in range(max(3, frames)):
        a = time.perf_counter()
        pipeline.infer(inputs)
        alone.append((time.perf_counter() - a) * 1e3)
    alone_stats = pipeline.stats()
    partitions = tuple(
        PartitionResult(
            name,
            pipeline.workers[name].spec.pu,
            s.busy_s * 1e3,
            s.wait_s * 1e3,
            s.frames,
            alone_stats[name].busy_s * 1e3,
            alone_stats[name].frames,
            s.cpu_s * 1e3,
            s.cpu_frames,
            alone_stats[name].cpu_s * 1e3,
            alone_stats[name].cpu_frames,
            pipeline.workers[name].spec.provider,
            pipeline.workers[name].load_s,
            pipeline.workers[name].cache_hit,
        )
        for name, s in stats.items()
    )

    # 3. frames arriving at AT_RATE_LOAD of the measured throughput
    interval = 1.0 / (AT_RATE_LOAD * throughput)
    latencies = []
    pending = []
    base = time.perf_counter()
    for i in range(frames):
        target = base + i * interval
        now = time.perf_counter()
        if target > now:
            time.sleep(target - now)
        sent = time.perf_counter()
        fut = pipeline.submit(inputs, run=False)  # frames arrive on time whatever runs: never run by this thread
        pending.append((sent, fut))
        fut.add_done_callback(lambda _f, s=sent: latencies.append((time.perf_counter() - s) * 1e3))
    for _, fut in pending:
        fut.result()
    while len(latencies) < frames:  # callbacks may run a moment after result() returns
        time.sleep(0.001)
    latencies.sort()
    return BenchmarkResult(
        frames=frames,
        latency_p50_ms=statistics.median(latencies),
        latency_p99_ms=latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        latency_alone_ms=statistics.fmean(alone),  # the mean, as the partitions' busy times are: see the docstring
        throughput_fps=throughput,
        energy_mj=(reading.joules * 1e3 / fed) if reading else 0.0,
        energy_source=reading.source if reading else "modelled",
        energy_sensor=reading.sensor if reading else "",
        partitions=partitions,
        wall_s=time.perf_counter() - started,
        overlap=overlap.fraction,
        frames_at_once=overlap.mean_frames,
        runs_overlapped=overlap.spells_overlapped,
        in_flight=overlap.mean_in_flight,
    )
