"""How much PUs that run at once slow each other: the same model alone on each PU, then on all at once.

On a board the PUs share DRAM, caches and (on a virtual machine) the host's cores, so two pipeline
stages running at the same time each take longer than they do alone. The cost model's term for it
is a shared memory's bandwidth (``device_profiles.schema.SharedMemory``): every byte a frame moves
crosses the memory once, so the period is at least the frame's bytes over the bandwidth. This
module measures that bandwidth for one model: the whole model runs on every PU of the memory at
once, back to back, and the frames they finish together per second are what the memory lets
through. Each round runs the model alone on each PU and then on all at once; a PU's slowdown is the
median over rounds of its together / alone ratio (both taken within one round, so a neighbour that
comes and goes on a shared machine moves it less; the spread of the ratios says how much), and its
time together is its median time alone times that slowdown.

Only onnxruntime, numpy and the stdlib are used here (like ``profiler.measure``).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from profiler.measure import PuConfig, _session
from profiler.pinning import PinningError, pin_current_thread, release_current_thread, throttle_current_thread


@dataclass(frozen=True)
class Contention:
    """One model's whole-model time (ms per frame) on each PU alone (median over rounds) and with all running
    (that times the median slowdown)."""

    pus: tuple[str, ...]
    alone_ms: tuple[float, ...]
    together_ms: tuple[float, ...]
    rounds: int
    spread_pct: float  # the largest relative spread (max - min over median, %) of a PU's slowdown over rounds
    seconds: float = 0.0  # each run's length (back to back, alone or all at once)

    @property
    def slowdown(self) -> tuple[float, ...]:
        """Together / alone, per PU: 1.0 when running beside the others costs nothing."""
        return tuple(t / a for t, a in zip(self.together_ms, self.alone_ms, strict=True))

    @property
    def frames_per_ms(self) -> float:
        """Frames all PUs finish together per ms; never below the fastest PU alone (one PU alone needs no
        other: a memory that lets fewer frames through than that would slow plans of one unit too)."""
        return max(sum(1 / t for t in self.together_ms), max(1 / a for a in self.alone_ms))

    def bandwidth_gbps(self, frame_bytes: int) -> float:
        """The shared memory's bandwidth this measurement implies for a model moving ``frame_bytes`` per frame."""
        return frame_bytes * self.frames_per_ms / 1e6

    def describe(self, model: str) -> str:
        per = ", ".join(
            f"{p} {t:.2f} vs {a:.2f} ms alone (x{s:.2f})"
            for p, t, a, s in zip(self.pus, self.together_ms, self.alone_ms, self.slowdown, strict=True)
        )
        return f"{model} on {' + '.join(self.pus)} at once: {per}; medians of {self.rounds} rounds of {self.seconds:g} s runs, spread {self.spread_pct:.0f}%"


class _Worker:
    """A thread pinned to one configuration holding one session: given a deadline, it runs frames back to back
    until then, then reports its ms per frame. The session is made (and warmed up) once.

    The worker watches the deadline itself rather than waiting to be told to stop: under real-time priority
    (a process started under ``chrt -f``) a busy worker on every core keeps the caller's thread, of the same
    priority, from running at all, so a stop it would set came only when two workers happened to contend for
    the GIL (minutes with a model of tens of ms a frame)."""

    def __init__(self, model: bytes, feeds: Mapping[str, np.ndarray], cfg: PuConfig, warmup: int) -> None:
        self.cfg = cfg
        self.commands: queue.Queue[float | None] = queue.Queue()  # a deadline (perf_counter), None: end
        self.results: queue.Queue[float | BaseException] = queue.Queue()
        self.thread = threading.Thread(
            target=self._body, args=(model, feeds, warmup), name=f"parapipe-contention-{cfg.label}", daemon=True
        )
        self.thread.start()

    def _body(self, model: bytes, feeds: Mapping[str, np.ndarray], warmup: int) -> None:
        cfg = self.cfg
        try:
            pin_current_thread(cfg.cores)
            if cfg.throttle_percent is not None:
                throttle_current_thread(cfg.label, cfg.throttle_percent)
            session = _session(model, cfg, "all")
            names = [o.name for o in session.get_outputs()]
            for _ in range(warmup):
                session.run(names, dict(feeds))
            self.results.put(0.0)  # ready
            while (deadline := self.commands.get()) is not None:
                frames, start = 0, time.perf_counter()
                while frames == 0 or time.perf_counter() < deadline:
                    session.run(names, dict(feeds))
                    frames += 1
                self.results.put((time.perf_counter() - start) * 1e3 / frames)
        except BaseException as exc:  # reported to the caller
            self.results.put(exc)
        finally:
            if cfg.throttle_percent is not None:
                release_current_thread()

    def result(self) -> float:
        got = self.results.get()
        if isinstance(got, PinningError):
            raise got
        if isinstance(got, BaseException):
            raise PinningError(f"contention run on {self.cfg.label} cores {list(self.cfg.cores)} failed: {got}")
        return got


def _run_at_once(workers: Sequence[_Worker], seconds: float) -> list[float]:
    """Ms per frame of each worker, all running back to back for ``seconds`` at the same time (each until the
    same deadline: see ``_Worker``)."""
    deadline = time.perf_counter() + seconds
    for w in workers:
        w.commands.put(deadline)
    return [w.result() for w in workers]


def measure_contention(
    model: bytes,
    feeds: Mapping[str, np.ndarray],
    cfgs: Sequence[PuConfig],
    seconds: float = 1.0,
    rounds: int = 3,
    warmup: int = 3,
) -> Contention:
    """The model alone on each of ``cfgs`` (one after the other), then on all at once, ``rounds`` times
    interleaved, each run back to back for ``seconds``; medians over the rounds."""
    if len(cfgs) < 2:
        raise ValueError("contention needs at least two PU configurations")
    alone: list[list[float]] = [[] for _ in cfgs]
    ratios: list[list[float]] = [[] for _ in cfgs]
    workers = [_Worker(model, feeds, cfg, warmup) for cfg in cfgs]
    try:
        for w in workers:
            w.result()  # made and warmed up
        for _ in range(rounds):
            this_round = [_run_at_once([w], seconds)[0] for w in workers]
            for i, ms in enumerate(_run_at_once(workers, seconds)):
                alone[i].append(this_round[i])
                ratios[i].append(ms / this_round[i])
    finally:
        for w in workers:
            w.commands.put(None)
        for w in workers:
            w.thread.join()
    medians = [statistics.median(a) for a in alone]
    return Contention(
        tuple(f"{c.pu}[{','.join(map(str, c.cores))}]" for c in cfgs),
        tuple(medians),
        tuple(m * statistics.median(r) for m, r in zip(medians, ratios, strict=True)),
        rounds,
        max((max(r) - min(r)) / statistics.median(r) * 100 for r in ratios),
        seconds,
    )
