"""The pipeline executor: one pinned worker thread and onnxruntime session per partition.

Board side: numpy, onnxruntime and the stdlib only (plus ``profiler.pinning``).
Each partition's worker pins itself to the partition's cores (affinity is per thread
on Linux), joins its throttle group if its PU is throttled, and only then creates its
session, so onnxruntime's intra-op threads inherit both. Tensors move between workers
as numpy arrays through per-worker inboxes (no serialisation); a frame enters while
fewer than ``max_inflight`` frames are in flight, replicated stages take frames
round-robin, and results are handed back per frame (callers wait on them in order).
Partitions of one unit (the same cores) take turns (``profiler.modulo``): one thread runs them
one at a time, the one with the smallest frame + lag among those whose turn it is in the
frame's order.
Every frame pays these handoffs (``bench/bench_agent.py --overhead`` measures them), so
they use C-level locks only: a worker sleeps on a lock its producers release, and a
caller of ``infer`` on a latch its frame's last worker releases. A pipeline of one partition
(one host) makes no handoff at all for a frame of ``infer`` (``Infer`` and ``ModelInfer`` calls,
the benchmark's frames one at a time) that finds the partition idle: the caller's thread runs it,
pinned to the partition's cores for the run (``infer_inline``). Likewise a submitted frame (a
stream's feed thread, a unary call to a pipeline of several partitions) that finds the partition
reading the model's inputs idle and waiting for it runs that partition in the submitting thread
(``_run_entry``) and hands only its outputs on.

In a plan over several hosts, each host's agent runs only its own partitions; tensors
read on another host go there through ``links`` (agent-to-agent gRPC streams, see
``agents.peers``), and results come back to the entry host, which alone takes frames.
"""

from __future__ import annotations

import graphlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from agents.bundle import Manifest, PartitionSpec, TensorSpec, check_tensor
from agents.isolated import IsolatedSession, IsolatedUnit
from profiler.modulo import lags, pick
from profiler.pinning import pin_current_thread, release_current_thread, throttle_current_thread
from profiler.runtime import cache_options, open_session, own_threads

_RECENT_FAILURES = 4096  # failed frame ids remembered so a failure is handled once per host
log = logging.getLogger("parapipe.agent")


class PipelineError(RuntimeError):
    """The pipeline cannot start or a frame failed; the message names the partition."""


class PeerAway(PipelineError):
    """A peer of a plan over several hosts is away (its link broke): the frame was refused or lost with
    it, not failed by a partition; the pipeline starts again by itself once the peer is back."""


class InputError(ValueError):
    """A frame's tensors do not match the model's inputs (name, dtype, shape or size)."""


class DeadlineExceeded(TimeoutError):
    """A frame did not get a slot or a result before the caller's deadline; it was given up."""


class Links(Protocol):
    """Sends tensors and frame failures to the agents of other hosts of the plan."""

    def send(self, host: str, frame: int, name: str, value: np.ndarray) -> None: ...

    def send_error(self, host: str, frame: int, message: str) -> None: ...

    def send_entered(self, host: str, frame: int) -> None: ...

    def close(self) -> None: ...


@dataclass
class WorkerStats:
    busy_s: float = 0.0
    wait_s: float = 0.0
    frames: int = 0
    # CPU time of the thread that ran the session, over the ``cpu_frames`` runs it was read for (runs on the
    # partition's own worker): a one-thread session's work, whatever its core waited for (a CFS quota)
    cpu_s: float = 0.0
    cpu_frames: int = 0


class Overlap:
    """How the partitions' runs overlapped in time, frame against frame. A frame's *spell* is a stretch of
    time during which at least one partition of this host runs it; a spell *overlapped* if another frame ran
    at some moment of it. A pipeline of several units fed back to back overlaps nearly every spell (a stage
    runs the next frame while the one after it runs this one), however the cores are shared; frames sent one
    at a time overlap none. Also timed: while any frame ran, how long two or more different frames ran, and
    the frames running integrated over time. And the frames in flight (entered, not finished: on the entry
    host) when each run started: one a time reads 1.0, frames fed back to back up to ``max_inflight``, which
    the machine's load does not change.

    A run's start and end cost its thread one list append each (atomic, and in order, under the GIL; no
    lock); the events are folded into the figures when these are read, and every ``FOLD_EVERY`` events so
    the log stays bounded. A pipeline keeps one only while a benchmark asks (``Pipeline.track_overlap``):
    frames served otherwise pay nothing for it."""

    FOLD_EVERY = 8192

    __slots__ = (
        "_busy_s",
        "_fold_lock",
        "_frame_s",
        "_in_flight_sum",
        "_log",
        "_overlap_s",
        "_overlapped_spells",
        "_running",
        "_runs",
        "_since",
        "_spells",
    )

    def __init__(self) -> None:
        self._log: list[tuple[int, float, int | None]] = []  # (frame, time, frames in flight at a start | None: an end)
        self._fold_lock = threading.Lock()
        self._running: dict[int, list] = {}  # frame -> [partitions running it now, whether its spell overlapped]
        self._since = 0.0
        self._busy_s = 0.0  # time with at least one frame running
        self._overlap_s = 0.0  # time with two or more different frames running
        self._frame_s = 0.0  # frames running, integrated over time
        self._spells = 0  # spells ended
        self._overlapped_spells = 0  # of them, those during which another frame ran
        self._runs = 0  # runs started
        self._in_flight_sum = 0  # frames in flight at their starts, summed

    def start(self, frame: int, now: float, in_flight: int = 0) -> None:
        """A partition starts running ``frame`` at ``now``, with ``in_flight`` frames in the pipeline."""
        log = self._log
        log.append((frame, now, in_flight))
        if len(log) >= self.FOLD_EVERY:
            self._fold()

    def end(self, frame: int, now: float) -> None:
        """A partition's run of ``frame`` (started with ``start``) ended at ``now``."""
        self._log.append((frame, now, None))

    def _fold(self) -> None:
        """Take the events logged so far, in their order, into the figures."""
        with self._fold_lock:
            log = self._log
            n = len(log)
            events = log[:n]
            del log[:n]  # appended meanwhile: kept, after these
            running = self._running
            for frame, now, in_flight in events:
                count = len(running)
                if count:
                    dt = now - self._since
                    self._busy_s += dt
                    self._frame_s += count * dt
                    if count > 1:
                        self._overlap_s += dt
                self._since = now
                spell = running.get(frame)
                if in_flight is not None:  # a start
                    self._runs += 1
                    self._in_flight_sum += in_flight
                    if spell is None:
                        spell = running[frame] = [0, False]
                    spell[0] += 1
                    if len(running) > 1:  # this spell and every other one running now overlap
                        for other in running.values():
                            other[1] = True
                elif spell is not None:
                    spell[0] -= 1
                    if spell[0] <= 0:
                        del running[frame]
                        self._spells += 1
                        self._overlapped_spells += spell[1]

    def _folded(self, name: str) -> float:
        self._fold()
        return getattr(self, name)

    @property
    def busy_s(self) -> float:
        """Time with at least one frame running."""
        return self._folded("_busy_s")

    @property
    def overlap_s(self) -> float:
        """Time with two or more different frames running."""
        return self._folded("_overlap_s")

    @property
    def frame_s(self) -> float:
        """Frames running, integrated over time."""
        return self._folded("_frame_s")

    @property
    def spells(self) -> int:
        """Spells ended."""
        return int(self._folded("_spells"))

    @property
    def overlapped_spells(self) -> int:
        """Spells ended during which another frame ran."""
        return int(self._folded("_overlapped_spells"))

    @property
    def runs(self) -> int:
        """Runs started."""
        return int(self._folded("_runs"))

    @property
    def spells_overlapped(self) -> float:
        """The share of the frames' spells during which another frame ran (0: one frame at a time)."""
        spells = self.spells
        return self._overlapped_spells / spells if spells else 0.0

    @property
    def mean_in_flight(self) -> float:
        """Frames in flight when a run started, on average (1.0: one at a time; 0 on a host other than the entry)."""
        runs = self.runs
        return self._in_flight_sum / runs if runs else 0.0

    @property
    def fraction(self) -> float:
        """The share of the busy time during which two or more different frames ran."""
        busy = self.busy_s
        return self._overlap_s / busy if busy > 0 else 0.0

    @property
    def mean_frames(self) -> float:
        """Frames running at once, on average over the busy time (1.0: one at a time)."""
        busy = self.busy_s
        return self._frame_s / busy if busy > 0 else 0.0


_CALLBACKS = (
    threading.Lock()
)  # guards every FrameFuture's callback list for a few bytecodes (never held while one runs)


class FrameFuture:
    """One frame's outcome: its outputs, or why it failed. The part of ``concurrent.futures.Future`` the agent
    uses (``result``, ``exception``, ``done``, ``add_done_callback``; frames are never cancelled) at a fraction
    of its cost per frame: no Condition, no RLock. Waiters sleep on a C-level lock held until the frame is done
    (a latch, made by the first waiter: released once by the finishing thread, acquired and released again by
    each waiter; a frame whose outcome goes only to callbacks, the Benchmark's, makes none); callbacks
    run in the finishing thread, in order, and one that raises is logged, as ``Future`` does. The first
    outcome set is kept (a frame is finished once). ``frame`` is the frame's id."""

    __slots__ = ("_callbacks", "_done", "_exception", "_latch", "_result", "collected", "frame", "started")

    def __init__(self, frame: int, started: float = 0.0) -> None:
        self.frame = frame
        self.started = started  # when it entered the pipeline (``time.perf_counter``)
        self.collected: dict[str, np.ndarray] = {}  # its results as they arrive (the outputs once all are in)
        self._result: dict[str, np.ndarray] | None = None
        self._exception: BaseException | None = None
        self._done = False
        self._callbacks: list[Callable[[FrameFuture], object]] | None = []
        self._latch: threading.Lock | None = None  # made held by the first waiter, released when done

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` s (None: for ever) for the frame to be done; whether it is."""
        if self._done:
            return True
        with _CALLBACKS:
            if self._done:
                return True
            latch = self._latch
            if latch is None:  # the first waiter: the finishing thread releases it (it reads it under this lock)
                latch = self._latch = threading.Lock()
                latch.acquire()
        if latch.acquire(True, -1 if timeout is None else max(0.0, timeout)):
            latch.release()  # a latch: it stays open for every other waiter
            return True
        return self._done

    def result(self, timeout: float | None = None) -> dict[str, np.ndarray]:
        """The frame's outputs; raises its failure, or ``concurrent.futures.TimeoutError`` past ``timeout``."""
        if not self.wait(timeout):
            raise FutureTimeout()
        if self._exception is not None:
            raise self._exception
        return self._result  # type: ignore[return-value]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Why the frame failed (None: it did not); ``concurrent.futures.TimeoutError`` past ``timeout``."""
        if not self.wait(timeout):
            raise FutureTimeout()
        return self._exception

    def add_done_callback(self, fn: Callable[[FrameFuture], object]) -> None:
        """Call ``fn(self)`` once the frame is done: now, in this thread, if it is already."""
        with _CALLBACKS:
            callbacks = self._callbacks
            if callbacks is not None:
                callbacks.append(fn)
                return
        self._call(fn)

    def set_result(self, outputs: dict[str, np.ndarray]) -> None:
        self._finish(outputs, None)

    def set_exception(self, error: BaseException) -> None:
        self._finish(None, error)

    def _finish(self, outputs: dict[str, np.ndarray] | None, error: BaseException | None) -> None:
        with _CALLBACKS:
            callbacks = self._callbacks
            if callbacks is None:
                return  # finished already: the first outcome stands
            self._callbacks = None
            self._result, self._exception = outputs, error
            self._done = True
            latch = self._latch
        if latch is not None:
            latch.release()
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("a done-callback of frame %d raised", self.frame)

    def _call(self, fn: Callable[[FrameFuture], object]) -> None:
        try:
            fn(self)
        except Exception:
            log.exception("a done-callback of frame %d raised", self.frame)


class _Worker:
    def __init__(self, spec: PartitionSpec, path: Path, shared_cores: bool, pipeline: Pipeline) -> None:
        self.spec, self.path, self.pipeline = spec, path, pipeline
        self.shared_cores = shared_cores
        self.inbox: dict[int, dict[str, np.ndarray]] = {}
        self.arrived: dict[int, float] = {}
        self.skipped: set[int] = set()  # frames that failed elsewhere: not to be waited for
        self.next = spec.group  # the next frame this worker takes; older deliveries are late and dropped
        # ``lock`` guards the inbox; ``_wake`` is a binary semaphore (a lock held while there is nothing
        # new): whoever changes what the worker waits for releases it, the worker acquires it to sleep.
        # Two C-level lock operations per handoff, where a Condition costs a new lock and Python code.
        self.lock = threading.Lock()
        self._wake = threading.Lock()
        self._wake.acquire()
        self.ready = threading.Event()
        # one session.run at a time: this worker's, or a caller's running a frame inline (``Pipeline.infer``)
        self.run_lock = threading.Lock()
        self.session = None
        self.output_names = list(spec.outputs)
        self.cores = set(spec.core_ids)
        self.error: BaseException | None = None
        self.stats = WorkerStats()
        self.load_s = 0.0  # how long its session took to load, EP compilation included
        self.cache_hit = False  # the EP's compiled model came from the cache folder
        self._inputs = len(spec.inputs)
        self.lag = 0  # ``profiler.modulo``: how many frames behind the entry this partition works
        self.thread = threading.Thread(target=self._run, name=f"pp-{spec.name}", daemon=True)

    def queue_depth(self) -> int:
        """Frames with inputs waiting here (what the metrics report)."""
        with self.lock:
            return len(self.inbox)

    def wake(self) -> None:
        """Make the worker look at its inbox and the pipeline's state again."""
        wake = self._wake
        if not wake.locked():
            return  # woken already and not asleep since (a busy worker: most frames), no exception raised
        try:
            wake.release()
        except RuntimeError:
            pass  # another thread woke it just now

    def deliver(self, frame: int, name: str, value: np.ndarray) -> None:
        with self.lock:
            if frame < self.next or frame in self.skipped:
                return  # the frame failed or was given up: nothing waits for this tensor any more
            box = self.inbox.setdefault(frame, {})
            box[name] = value
            if len(box) < self._inputs:
                return
            self.arrived[frame] = time.perf_counter()
        self.wake()

    def skip(self, frame: int) -> None:
        """Frame ``frame`` failed (here, on another partition or host) or was given up: do not wait for it."""
        if frame % self.pipeline.replicas[self.spec.stage] != self.spec.group:
            return  # another replica's frame
        with self.lock:
            if frame < self.next:
                return  # taken already
            self.skipped.add(frame)
            self.inbox.pop(frame, None)
            self.arrived.pop(frame, None)
        self.wake()

    def _due(self, frame: int) -> bool:
        """Whether frame ``frame`` can run here (called holding ``lock``): its inputs arrived, or, for a
        partition without inputs (a constant subgraph), the frame entered the pipeline. Without that
        gate such a partition would run ahead of the frames for ever, filling its consumers' inboxes."""
        if self._inputs:
            return frame in self.arrived
        return frame < self.pipeline.admitted

    def load(self):
        """Make this partition's session (on its unit's provider, checked), timing it (``load_s``)."""
        started = time.perf_counter()
        self.session = self._session()
        self.load_s = time.perf_counter() - started
        return self.session

    def _provider_options(self) -> dict[str, str]:
        """The unit's EP options, and where its EP keeps compiled models (``Pipeline.cache_dir``): a restart
        of the same bundle finds them there (``cache_hit``)."""
        spec = self.spec
        options = dict(spec.provider_options)
        cache = self.pipeline.cache_dir
        extra = cache_options(spec.provider, str(cache / spec.name)) if cache is not None else {}
        if extra:
            folder = cache / spec.name  # type: ignore[operator]
            self.cache_hit = folder.is_dir() and any(folder.iterdir())
            folder.mkdir(parents=True, exist_ok=True)
        return {**extra, **options}

    def _session(self):
        import onnxruntime as ort

        spec = self.spec
        provider_options = self._provider_options()
        options = ort.SessionOptions()
        options.intra_op_num_threads = spec.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        throttled = set(spec.throttled_cores)
        free = [c for c in spec.core_ids if c not in throttled]
        spanning = bool(throttled) and bool(free)
        # Spinning threads steal cores from other sessions sharing them, and burn a throttled quota.
        spin = not (self.shared_cores or throttled)
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        if spanning:
            # One session over fast and throttled cores: this thread runs on the fast ones, the
            # pool threads are placed on the rest (1-based processor ids) and inherit the throttle.
            pin_current_thread(free[:1])
            others = [c for c in spec.core_ids if c != free[0]][: spec.threads - 1]
            if others:
                options.add_session_config_entry(
                    "session.intra_op_thread_affinities", ";".join(str(c + 1) for c in others)
                )
            throttle_current_thread(f"{spec.name}", spec.throttle_percent or 100.0)
            try:
                return open_session(str(self.path), options, spec.provider, spec.pu, provider_options)
            finally:
                release_current_thread()
        pin_current_thread(spec.core_ids)
        if throttled or own_threads(spec.provider):
            # in a process of its own: a throttle stops a thread wherever it is, the GIL held or not
            # (``agents.isolated``), and an EP with a thread pool of its own (OpenVINO's) keeps to the cores
            # of a process where it ignores a thread's; this thread stays here, pinned, and waits for it
            return self.pipeline.isolated_unit(spec).session(
                self.path, spec.provider, spec.threads, spec.pu, provider_options
            )
        return open_session(str(self.path), options, spec.provider, spec.pu, provider_options)

    def _run(self) -> None:
        try:
            session = self.load()
            output_names = self.output_names
        except BaseException as exc:
            self.error = exc
            self.pipeline.release_isolated(self.spec)
            self.ready.set()
            return
        self.ready.set()
        try:
            self._loop(session, output_names)
        finally:
            # The session (the partition's weights and onnxruntime's arena) goes with the run: the
            # pipeline and its workers refer to each other, so without this a stopped pipeline's
            # memory waits for the cyclic garbage collector and every restart adds to the peak.
            with self.run_lock:
                self.session = None
            self.pipeline.release_isolated(self.spec)

    def _loop(self, session, output_names: list[str]) -> None:
        run_lock = self.run_lock
        pipeline = self.pipeline
        period = pipeline.replicas[self.spec.stage]
        frame = self.spec.group
        lock, wake = self.lock, self._wake
        arrived, skipped = self.arrived, self.skipped
        inputs = self._inputs
        # only a partition another thread may run too (``infer_inline``, ``_run_entry``) takes turns on its run_lock
        shared = self is pipeline._solo or self is pipeline._entry
        while True:
            lock.acquire()
            while True:
                if self.next > frame:  # a submitting thread ran this frame itself (``Pipeline._run_entry``)
                    frame = self.next
                # ``_due`` inline: the frame's inputs arrived, or (no inputs) it entered the pipeline
                if (frame in arrived if inputs else frame < pipeline.admitted) or frame in skipped or pipeline.stopping:
                    break
                lock.release()
                wake.acquire(True, 0.5)
                lock.acquire()
            try:
                if pipeline.stopping:
                    return
                taken = self.take(frame)
            finally:
                lock.release()
            if taken is None:
                frame += period
                continue
            if shared:
                self.execute(session, output_names, frame, taken[0], taken[1], run_lock)
            else:
                self.hand_on(output_names, frame, self.compute(session, output_names, frame, taken[0], taken[1]))
            frame += period

    def take(self, frame: int) -> tuple[dict[str, np.ndarray], float] | None:
        """Frame ``frame``'s inputs, taken from the inbox (None: the frame was given up, passed on here).
        The caller holds ``lock`` and saw the frame due or skipped."""
        self.next = frame + self.pipeline.replicas[self.spec.stage]
        if frame in self.skipped:
            self.skipped.discard(frame)
            self.inbox.pop(frame, None)
            return None
        return self.inbox.pop(frame, {}), self.arrived.pop(frame, time.perf_counter())

    def execute(
        self, session, output_names: list[str], frame: int, feeds: dict, arrived: float, lock: threading.Lock
    ) -> None:
        """Run frame ``frame`` (holding ``lock`` for the run) and hand its outputs on (or fail the frame,
        naming this partition)."""
        with lock:
            outcome = self.compute(session, output_names, frame, feeds, arrived)
        self.hand_on(output_names, frame, outcome)

    def compute(
        self, session, output_names: list[str], frame: int, feeds: dict, arrived: float | None
    ) -> list | BaseException:
        """One session.run of frame ``frame`` (the caller holds ``run_lock``): the outputs, or the error it
        raised. ``arrived``: when the inputs were there (None: run by the thread that brought them, no wait)."""
        pipeline = self.pipeline
        overlap = pipeline.overlap  # None unless a benchmark tracks it
        start = time.perf_counter()
        if overlap is not None:
            overlap.start(frame, start, len(pipeline._frames) + pipeline._inline)  # a racy read is fine for a statistic
        cpu = time.thread_time()
        try:
            results = session.run(output_names, feeds)
        except BaseException as exc:
            if overlap is not None:
                overlap.end(frame, time.perf_counter())
            return exc
        end = time.perf_counter()
        # a throttled unit's run is the child process's CPU time (``agents.isolated``), not this thread's
        self.stats.cpu_s += session.last_cpu_s if isinstance(session, IsolatedSession) else time.thread_time() - cpu
        self.stats.cpu_frames += 1
        if overlap is not None:
            overlap.end(frame, end)
        self.stats.busy_s += end - start
        if arrived is not None:
            self.stats.wait_s += start - arrived
        self.stats.frames += 1
        return results

    def hand_on(self, output_names: list[str], frame: int, outcome: list | BaseException) -> None:
        """Route a run's outputs to their consumers, or fail the frame naming this partition."""
        if isinstance(outcome, BaseException):
            self.pipeline.fail(frame, PipelineError(f"partition {self.spec.name} failed on frame {frame}: {outcome}"))
            return
        fan_out = self.pipeline._fan_out
        for name, value in zip(output_names, outcome, strict=True):
            fan_out(frame, name, value)


class _UnitRunner:
    """One thread for a unit that holds several partitions (``profiler.modulo``): it creates their sessions
    (pinned to the unit's cores) and runs them one after the other, no handoff between them. Each turn
    goes, among the partitions whose turn it is in their next frame (a frame's partitions in the unit's
    order) and whose inputs are there, to the smallest frame + lag; a frame given up is passed on in turn.
    The partitions keep their inboxes, stats and lags; deliveries to any of them wake this thread."""

    def __init__(self, workers: list[_Worker], pipeline: Pipeline) -> None:
        self.workers = workers  # in the unit's order: the position of each
        self.pipeline = pipeline
        self._wake = threading.Lock()
        self._wake.acquire()
        for w in workers:
            w._wake = self._wake  # deliver, skip and stop wake this thread
        self.thread = threading.Thread(target=self._run, name=f"pp-unit-{workers[0].spec.name}", daemon=True)
        for w in workers:
            w.thread = self.thread

    def _run(self) -> None:
        for i, w in enumerate(self.workers):
            try:
                w.load()
            except BaseException as exc:
                w.error = exc
                for later in self.workers[i + 1 :]:
                    later.error = PipelineError(f"not loaded: {w.spec.name} on the same cores failed first")
                self.pipeline.release_isolated(w.spec)
                for x in self.workers:
                    x.ready.set()
                return
        for w in self.workers:
            w.ready.set()
        try:
            self._loop()
        finally:
            for w in self.workers:  # the sessions go with the run (see ``_Worker._run``)
                with w.run_lock:
                    w.session = None
            self.pipeline.release_isolated(self.workers[0].spec)

    def _loop(self) -> None:
        pipeline, workers = self.pipeline, self.workers
        period = pipeline.replicas[workers[0].spec.stage]
        size = len(workers)
        names = [list(w.spec.outputs) for w in workers]
        frames = [w.spec.group for w in workers]  # each partition's next frame
        cursor: dict[int, int] = {}  # frame -> the position whose turn it is (absent: 0)
        while not pipeline.stopping:
            due = []
            for pos, w in enumerate(workers):  # in order: a frame passed on at pos is pos + 1's turn next
                frame = frames[pos]
                if cursor.get(frame, 0) != pos:
                    continue
                # membership reads need no lock (one bytecode under the GIL); taking the frame does
                if frame in w.skipped:
                    with w.lock:
                        w.take(frame)
                    frames[pos] += period
                    self._advance(cursor, frame, pos, size)
                elif w._due(frame):
                    due.append((frame, w.lag, pos))
            turn = pick(due)
            if turn is None:
                self._wake.acquire(True, 0.5)  # until a delivery, a frame given up or stop
                continue
            frame, _, pos = turn
            w = workers[pos]
            with w.lock:
                taken = w.take(frame)
            if taken is not None:
                w.execute(w.session, names[pos], frame, taken[0], taken[1], w.run_lock)
            frames[pos] += period
            self._advance(cursor, frame, pos, size)

    @staticmethod
    def _advance(cursor: dict[int, int], frame: int, pos: int, size: int) -> None:
        if pos + 1 >= size:
            cursor.pop(frame, None)
        else:
            cursor[frame] = pos + 1


def _finite(timeout: float | None) -> float | None:
    """``timeout``, or None (no bound) where it is beyond what a lock can wait: for a gRPC call without
    a deadline ``time_remaining()`` is beyond ``threading.TIMEOUT_MAX``, and ``Condition.wait`` raises."""
    return None if timeout is None or timeout >= threading.TIMEOUT_MAX else timeout


class Pipeline:
    """Runs a bundle's partitions as a pipeline of pinned workers."""

    def __init__(
        self,
        manifest: Manifest,
        folder: Path,
        max_inflight: int = 0,
        links: Links | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        """``cache_dir``: where EPs that compile (OpenVINO, TensorRT) keep their compiled partitions, one folder
        each (None: they compile at every start)."""
        self.manifest, self.folder = manifest, Path(folder)
        self.cache_dir = cache_dir
        self.links = links
        self.replicas = manifest.replicas
        self.max_inflight = max_inflight or manifest.max_inflight or 1
        # how far ahead of a partition's next frame a peer's tensor may be: the entry host admits at most
        # max_inflight frames at once, so a peer never sends further (twice that and 8 more, for hosts started
        # with another max_inflight); beyond it a tensor would be held for a frame that cannot come
        self.ahead = 2 * self.max_inflight * max(manifest.replicas, default=1) + 8
        self.stopping = False
        self.draining = False  # the agent shuts down: frames in flight finish, new ones are refused
        self.frames_done = 0
        self.frames_failed = 0
        self.broken: str | None = None  # why the pipeline cannot finish frames any more (a peer link broke)
        self.on_done: Callable[[float], None] | None = None  # told each completed frame's latency (s): metrics
        self.overlap: Overlap | None = None  # how the partitions' runs overlap, while tracked (``track_overlap``)
        self.epoch = uuid.uuid4().hex  # this run of the pipeline: peers start their parts again when it changes
        self._peer_epochs: dict[str, str] = {}  # the run of each other host's part that sends to this one
        self.period = manifest.replica_period()
        self._frames: dict[int, FrameFuture] = {}  # the frames in flight that entered here
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)  # a frame left: a slot is free (or the pipeline stops)
        self._space_waiters = 0  # threads waiting on ``_space`` (under ``_lock``): a frame that ends wakes none if 0
        self._recent_failures: dict[int, None] = {}  # frames whose failure was handled here (bounded, in order)
        self._next_id = 0
        self.admitted = 0  # frames below this id have entered the pipeline (on this host)
        self._admit_lock = threading.Lock()  # frames may enter from several peer streams at once
        self._isolated: dict[tuple[int, int, int], IsolatedUnit] = {}  # throttled units' processes, by unit
        self._isolated_lock = threading.Lock()
        local = manifest.local_partitions()
        cores_use: dict[int, int] = {}
        for p in local:
            for c in p.core_ids:
                cores_use[c] = cores_use.get(c, 0) + 1
        self.workers = {
            p.name: _Worker(p, self.folder / p.file, any(cores_use[c] > 1 for c in p.core_ids), self) for p in local
        }
        self._runners = self._unit_runners()
        self._sourceless = [w for w in self.workers.values() if not w.spec.inputs]  # run once a frame enters
        # routing per phase (frame mod period): tensor -> local consumers, and -> other hosts reading it
        self._consumers: list[dict[str, list[_Worker]]] = []
        self._remote: list[dict[str, list[str]]] = []
        self._outputs = {t.name for t in manifest.outputs}
        self.entry = manifest.is_entry
        for phase in range(self.period):
            table: dict[str, list[_Worker]] = {}
            remote: dict[str, list[str]] = {}
            for p in manifest.active(phase):
                for t in p.inputs:
                    if manifest.is_local(p):
                        table.setdefault(t, []).append(self.workers[p.name])
                    elif p.host not in remote.setdefault(t, []):
                        remote[t].append(p.host)
            if not self.entry:  # results go back to the entry host
                for t in self._outputs:
                    if manifest.entry not in remote.setdefault(t, []):
                        remote[t].append(manifest.entry)
            self._consumers.append(table)
            self._remote.append({t: hs for t, hs in remote.items() if hs})
        # Hosts with partitions that take no inputs run a frame once it entered (``Pipeline.admitted``); another
        # host may send them no tensor of a frame, or only tensors that need those partitions' outputs first,
        # so the entry host announces every frame to them (per phase) as it enters.
        self._announce: list[tuple[str, ...]] = [
            tuple(
                sorted({p.host for p in manifest.active(phase) if not p.inputs and p.host != manifest.host})
                if self.entry and manifest.host
                else ()
            )
            for phase in range(self.period)
        ]
        self.peer_hosts = sorted(
            {h for table in self._remote for hs in table.values() for h in hs}
            | {h for hs in self._announce for h in hs}
        )
        self.accepts = {t for table in self._consumers for t in table} | (self._outputs if self.entry else set())
        # per phase, each tensor's whole route in one lookup (``_fan_out``, once per tensor of every frame):
        # the partitions here that read it, the hosts it goes to, and whether it is a result to collect here
        self._routes: list[dict[str, tuple[tuple[_Worker, ...], tuple[str, ...], bool]]] = [
            {
                t: (tuple(table.get(t, ())), tuple(remote.get(t, ())), t in self._outputs and self.entry)
                for t in set(table) | set(remote) | self._outputs
            }
            for table, remote in zip(self._consumers, self._remote, strict=True)
        ]
        self.inputs: dict[str, TensorSpec] = {t.name: t for t in manifest.inputs}
        self._input_names = set(self.inputs)
        self._input_checks = [(t.name, np.dtype(t.dtype), tuple(t.shape)) for t in manifest.inputs]
        # A pipeline of one partition on this host alone runs a caller's frame in the caller's thread when
        # that partition is idle (``infer``): no handoff to its worker and back, and nothing to overlap.
        self._solo = self._inline_worker()
        self._inline = 0  # frames running inline now (in flight, like those in ``_frames``)
        # The partition a submitting thread may run itself when it is idle (``_run_entry``): the one local
        # partition reading the model's inputs, reading nothing else, alone on its unit and not replicated.
        self._entry = self._entry_worker()

    def _unit_runners(self) -> list[_UnitRunner]:
        """Each partition's lag (``profiler.modulo``, as the planner's simulator has it); a unit holding several
        partitions here gets one thread that runs them in turn."""
        manifest = self.manifest
        place = {p.name: ((p.stage, p.group, p.unit), p.segment) for p in manifest.partitions}
        edges = []
        for phase in range(self.period):
            active = manifest.active(phase)
            producer = {t: p.name for p in active for t in p.outputs}
            edges += [(producer[t], p.name) for p in active for t in p.inputs if t in producer]
        try:
            lag = lags(place, edges)
        except graphlib.CycleError as exc:
            raise PipelineError(
                f"the bundle's partitions wait for each other in a cycle ({', '.join(exc.args[1])}); "
                "compile the plan again with parapipe"
            ) from None
        by_unit: dict[tuple[int, int, int], list[_Worker]] = {}
        for w in self.workers.values():
            w.lag = lag[w.spec.name]
            by_unit.setdefault((w.spec.stage, w.spec.group, w.spec.unit), []).append(w)
        out = []
        for unit, ws in by_unit.items():
            size = sum(1 for p in manifest.partitions if (p.stage, p.group, p.unit) == unit)
            if size > 1 and size == len(ws):  # a unit is on one host (the compiler's bundles)
                # positions in the unit's order, whatever numbers a hand-made manifest gives
                out.append(_UnitRunner(sorted(ws, key=lambda w: (w.spec.segment, w.spec.name)), self))
        return out

    def _inline_worker(self) -> _Worker | None:
        if self.manifest.hosts or len(self.workers) != 1 or len(self.manifest.partitions) != 1:
            return None
        w = next(iter(self.workers.values()))
        spec = w.spec
        if spec.throttled_cores or set(spec.inputs) != self._input_names or not self._outputs <= set(spec.outputs):
            return None  # a throttle is per thread group (a cgroup), not for a caller's thread to join per frame
        return w

    def _entry_worker(self) -> _Worker | None:
        readers = [w for w in self.workers.values() if set(w.spec.inputs) & self._input_names]
        if len(readers) != 1:
            return None
        w = readers[0]
        spec = w.spec
        if (
            any(w in r.workers for r in self._runners)  # a unit's runner orders its partitions' turns itself
            or spec.throttled_cores  # a throttle is per thread group (a cgroup), not for a caller to join per frame
            or self.replicas[spec.stage] != 1  # replicas take frames in turn: the submitter would serialise them
            or not set(spec.inputs) <= self._input_names
        ):
            return None
        return w

    # ------------------------------------------------------------------ life cycle

    def isolated_unit(self, spec: PartitionSpec) -> IsolatedUnit:
        """The child process that runs the sessions of ``spec``'s (throttled) unit, started on first use."""
        key = (spec.stage, spec.group, spec.unit)
        with self._isolated_lock:
            unit = self._isolated.get(key)
            if unit is None:
                unit = self._isolated[key] = IsolatedUnit(spec.core_ids, spec.pu, spec.throttle_percent or 100.0)
            return unit

    def release_isolated(self, spec: PartitionSpec) -> None:
        """Stop the child process of ``spec``'s unit, if it has one (its thread ended or failed to load)."""
        with self._isolated_lock:
            unit = self._isolated.pop((spec.stage, spec.group, spec.unit), None)
        if unit is not None:
            unit.close()

    def start(self, timeout: float = 120.0) -> None:
        for thread in dict.fromkeys(w.thread for w in self.workers.values()):  # a unit's runner once
            thread.start()
        deadline = time.monotonic() + timeout
        for w in self.workers.values():
            if not w.ready.wait(max(0.0, deadline - time.monotonic())):
                self.stop()
                raise PipelineError(f"partition {w.spec.name} did not load within {timeout:.0f}s")
            if w.error is not None:
                self.stop()
                raise PipelineError(f"partition {w.spec.name} ({w.spec.file}) failed to load: {w.error}")

    def stop(self) -> None:
        """Stop the workers and wake every waiter: frames in flight and callers waiting for a slot fail."""
        self.stopping = True
        for w in self.workers.values():
            w.wake()
        with self._lock:
            frames = list(self._frames.values())
            self._frames.clear()
            self.frames_failed += len(frames)
            self._freed()
        for f in frames:
            f.set_exception(PipelineError("the pipeline was stopped"))
        if self.links is not None:
            self.links.close()

    def wait_released(self, timeout: float) -> bool:
        """After ``stop``: wait up to ``timeout`` s for the workers to end (each lets its session go as
        it ends); True if all did."""
        deadline = time.monotonic() + timeout
        for w in self.workers.values():
            if w.thread.is_alive():
                w.thread.join(max(0.0, deadline - time.monotonic()))
        return not any(w.thread.is_alive() for w in self.workers.values())

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._frames) + self._inline

    # ------------------------------------------------------------------ frames

    def check_inputs(self, tensors: Mapping[str, np.ndarray]) -> None:
        if tensors.keys() == self._input_names:
            for name, dtype, shape in self._input_checks:
                value = tensors[name]
                if value.dtype != dtype or value.shape != shape:
                    break
            else:
                return  # the common case, checked in a few comparisons; the messages come from below
        missing = set(self.inputs) - set(tensors)
        extra = set(tensors) - set(self.inputs)
        if missing or extra:
            raise InputError(
                f"the model takes inputs {sorted(self.inputs)}; got {sorted(tensors)}"
                + (f" (missing {sorted(missing)})" if missing else "")
                + (f" (unknown {sorted(extra)})" if extra else "")
            )
        for name, spec in self.inputs.items():
            value = tensors[name]
            if str(value.dtype) != spec.dtype:
                raise InputError(f"input {name!r} must be {spec.dtype}, got {value.dtype}")
            if tuple(value.shape) != spec.shape:
                raise InputError(f"input {name!r} must have shape {list(spec.shape)}, got {list(value.shape)}")

    def drain(self, timeout: float) -> int:
        """Refuse new frames and wait up to ``timeout`` s for those in flight; returns how many are left."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self.draining = True
            self._freed()
            while (self._frames or self._inline) and not self.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wait_space(left)
            return len(self._frames) + self._inline

    def _wait_space(self, timeout: float | None) -> None:
        """Wait (holding ``_lock``) until a slot frees or the pipeline's state changes, at most ``timeout`` s."""
        self._space_waiters += 1
        try:
            self._space.wait(timeout)
        finally:
            self._space_waiters -= 1

    def _freed(self) -> None:
        """A slot freed or the pipeline's state changed (the caller holds ``_lock``): wake whoever waits on
        ``_space``; a frame that ends while none does (frames back to back below ``max_inflight``) pays nothing."""
        if self._space_waiters:
            self._space.notify_all()

    def _refuse_new(self) -> None:
        if self.draining:
            raise PipelineError("the agent is shutting down; send frames to it again once it is back")
        if self.broken:  # also once stopped: a broken pipeline is stopped while its replacement loads
            raise PeerAway(f"{self.broken}; the pipeline starts again by itself once the peer is back")
        if self.stopping:
            raise PipelineError("the pipeline was stopped")

    def submit(self, tensors: Mapping[str, np.ndarray], timeout: float | None = None, run: bool = True) -> FrameFuture:
        """Queue one frame; the future gives its outputs (``future.frame`` is its id).

        Waits while ``max_inflight`` frames are in flight: at most ``timeout`` seconds
        (``DeadlineExceeded`` then), and never past ``stop()``. With ``run``, a frame alone in the
        pipeline whose entry partition (the one reading the model's inputs) is idle and waiting for it
        runs there in the calling thread (``_run_entry``) instead of being handed to that worker; pass
        ``run=False`` from a thread that must not block for a run (a worker's done-callback, a pacer).
        """
        if self.draining or self.broken or self.stopping:
            self._refuse_new()
        if not self.entry:
            raise PipelineError(
                f"this agent runs host {self.manifest.host!r}'s part of a plan over {', '.join(self.manifest.hosts)}; "
                f"send frames to the agent of the entry host {self.manifest.entry!r}"
            )
        self.check_inputs(tensors)
        with self._lock:
            if len(self._frames) + self._inline >= self.max_inflight:
                self._wait_for_slot(_finite(timeout))
            self._refuse_new()
            frame_id = self._next_id
            frame = self._frames[frame_id] = FrameFuture(frame_id, time.perf_counter())
            self._next_id = self.admitted = frame_id + 1  # ids grow under this lock: ``admitted`` never goes back
            alone = len(self._frames) == 1 and not self._inline
        for w in self._sourceless:
            w.wake()
        if self.links is not None:
            for host in self._announce[frame_id % self.period]:
                self.links.send_entered(host, frame_id)
        # Only a frame alone in the pipeline: with frames in flight the submitting thread would hold back the
        # next frame (a stream's feed reads it while the worker runs this one), and the worker has it queued.
        entry = self._entry if run and alone else None
        if entry is not None and self._take_entry(entry, frame_id):
            for name, value in tensors.items():
                self._fan_out(frame_id, name, value, skip=entry)
            self._run_entry(entry, frame_id, tensors)
            return frame
        for name, value in tensors.items():
            self._fan_out(frame_id, name, value)
        return frame

    def _wait_for_slot(self, timeout: float | None) -> None:
        """Wait (holding ``_lock``) while ``max_inflight`` frames are in flight: at most ``timeout`` s
        (``DeadlineExceeded`` then), and never past ``stop()``, a broken link or a drain."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._frames) + self._inline >= self.max_inflight and not (
            self.stopping or self.broken or self.draining
        ):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise DeadlineExceeded(f"no frame slot within the deadline ({self.max_inflight} frames in flight)")
            self._wait_space(left)

    def _take_entry(self, w: _Worker, frame: int) -> bool:
        """Take frame ``frame`` from ``w`` for the submitting thread to run, if ``w`` is idle (not running a
        frame) and waiting for exactly this frame; holds ``w.run_lock`` when True (``_run_entry`` lets go)."""
        if w.session is None or not w.run_lock.acquire(False):
            return False
        with w.lock:
            taken = w.next == frame and frame not in w.skipped and w.session is not None and not self.stopping
            if taken:
                w.next = frame + 1  # the worker goes on to the next frame (its stage has one replica)
                later = bool(w.inbox)  # a later frame arrived while the worker waited for this one
        if not taken:
            w.run_lock.release()
        elif later:
            w.wake()  # it sleeps waiting for the frame taken here: look again
        return taken

    def _run_entry(self, w: _Worker, frame: int, tensors: Mapping[str, np.ndarray]) -> None:
        """Run frame ``frame``'s entry partition ``w`` in this thread (holding ``w.run_lock``, taken by
        ``_take_entry``), pinned to ``w``'s cores for the run as its worker is, and hand the outputs on: one
        thread handoff less per frame, the feeding thread's."""
        try:
            cores = w.cores
            before = os.sched_getaffinity(0) if cores else cores
            if before != cores:
                os.sched_setaffinity(0, cores)
            try:
                outcome = w.compute(w.session, w.output_names, frame, {n: tensors[n] for n in w.spec.inputs}, None)
            finally:
                if before != cores:
                    os.sched_setaffinity(0, before)
        finally:
            w.run_lock.release()
        w.hand_on(w.output_names, frame, outcome)

    def result(self, future: FrameFuture, timeout: float | None = None) -> dict[str, np.ndarray]:
        """Wait for a submitted frame; past ``timeout`` the frame is given up (its slot freed) and
        ``DeadlineExceeded`` raised."""
        try:
            return future.result(_finite(timeout))
        except FutureTimeout:
            self.fail(future.frame, DeadlineExceeded("the frame's deadline passed"))
            if future.done() and future.exception() is None:
                return future.result()  # finished just now
            raise DeadlineExceeded(f"frame {future.frame} did not finish within the deadline") from None

    @staticmethod
    def wait(future: FrameFuture, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a submitted frame to finish (outputs or failure); whether it did.
        The frame is not given up (``result`` does that)."""
        return future.wait(max(0.0, timeout))

    def infer(self, tensors: Mapping[str, np.ndarray], timeout: float | None = None) -> dict[str, np.ndarray]:
        """One frame's outputs: run in this thread where the pipeline is one idle partition
        (``infer_inline``), else submitted and waited for."""
        timeout = _finite(timeout)
        outputs = self.infer_inline(tensors, timeout)
        if outputs is not None:
            return outputs
        deadline = None if timeout is None else time.monotonic() + timeout
        future = self.submit(tensors, timeout)
        return self.result(future, None if deadline is None else max(0.0, deadline - time.monotonic()))

    def infer_inline(
        self, tensors: Mapping[str, np.ndarray], timeout: float | None = None
    ) -> dict[str, np.ndarray] | None:
        """Run one frame in the calling thread, pinned to the partition's cores for the run, if the
        pipeline is one partition on this host and that partition is idle with no frame waiting for
        it; None if not (submit the frame then). What a frame pays otherwise, two thread handoffs,
        is most of the executor's cost on a small model. The frame counts as in flight while it
        runs; a run, once started, is not cut short by the deadline (it is one session.run of this
        partition)."""
        w = self._solo
        if w is None or w.session is None or not w.run_lock.acquire(False):
            return None
        try:
            if w.session is None:  # the pipeline stopped meanwhile and its worker let the session go
                return None
            with self._lock:
                if self._frames or self._inline >= self.max_inflight:
                    return None  # frames wait for the worker: this one queues behind them, not ahead
                self._refuse_new()
                self._inline += 1
            try:
                self.check_inputs(tensors)
                if timeout is not None and timeout <= 0:
                    raise DeadlineExceeded("the frame's deadline passed before it could start")
                started = time.perf_counter()
                results = self._run_pinned(w, tensors)
                end = time.perf_counter()
            except BaseException as exc:
                with self._lock:
                    self._inline -= 1
                    if not isinstance(exc, InputError):
                        self.frames_failed += 1
                    self._freed()
                if isinstance(exc, (InputError, DeadlineExceeded, PipelineError)):
                    raise
                raise PipelineError(f"partition {w.spec.name} failed on a frame: {exc}") from None
            w.stats.busy_s += end - started
            w.stats.frames += 1
        finally:
            w.run_lock.release()
        with self._lock:
            self._inline -= 1
            self.frames_done += 1
            self._freed()
        if self.on_done is not None:
            self.on_done(end - started)
        return {n: v for n, v in zip(w.output_names, results, strict=True) if n in self._outputs}

    @staticmethod
    def _run_pinned(w: _Worker, tensors: Mapping[str, np.ndarray]) -> list:
        """``w``'s session.run in this thread, on ``w``'s cores (affinity is per thread), as its worker runs it."""
        cores = w.cores
        before = os.sched_getaffinity(0) if cores else cores
        if before != cores:
            os.sched_setaffinity(0, cores)
        try:
            return w.session.run(w.output_names, tensors)  # type: ignore[union-attr]
        finally:
            if before != cores:
                os.sched_setaffinity(0, before)

    def enter(self, frame: int) -> None:
        """Frame ``frame`` entered the pipeline (told by the entry host, or its first tensor arrived here):
        partitions without inputs may now run it, and every frame before it."""
        if frame < self.admitted:
            return
        with self._admit_lock:
            if frame < self.admitted:
                return
            self.admitted = frame + 1  # set before the wake: a worker that just looked sleeps no further
        for w in self._sourceless:
            w.wake()

    def _fan_out(self, frame: int, name: str, value: np.ndarray, skip: _Worker | None = None) -> None:
        route = self._routes[frame % self.period].get(name)
        if route is None:
            return  # read by no one in this phase
        workers, hosts, collect = route
        for w in workers:
            if w is not skip:
                w.deliver(frame, name, value)
        if hosts and self.links is not None:
            for host in hosts:
                self.links.send(host, frame, name, value)
        if collect:  # a result (also an input passed straight through)
            self._collect(frame, name, value)

    def receive(self, frame: int, name: str, value: np.ndarray) -> None:
        """A tensor from another host's agent: hand it to the partitions here that read it."""
        if name not in self.accepts:
            raise InputError(f"no partition on host {self.manifest.host!r} reads tensor {name!r}")
        consumers = self._consumers[frame % self.period].get(name, [])
        for w in consumers:
            if frame >= w.next + self.ahead:
                raise InputError(
                    f"frame {frame} is {frame - w.next} frames ahead of partition {w.spec.name} (next: frame "
                    f"{w.next}); a peer sends at most {self.ahead} ahead"
                )
        self.enter(frame)  # on a host other than the entry, a frame has entered once a tensor of it arrives
        for w in consumers:
            w.deliver(frame, name, value)
        if name in self._outputs and self.entry:
            self._collect(frame, name, value)

    def same_peer_run(self, host: str, epoch: str) -> bool:
        """Whether ``host``'s part that sends to this one is the run this pipeline has heard from (the
        first run heard from counts); False means that host started its part again since."""
        with self._lock:
            return self._peer_epochs.setdefault(host, epoch) == epoch

    def receive_error(self, frame: int, message: str) -> None:
        """Another host's partition failed on a frame: skip it here, pass it on, fail it on the entry host."""
        self.fail(frame, PipelineError(message))

    def _collect(self, frame_id: int, name: str, value: np.ndarray) -> None:
        with self._lock:
            frame = self._frames.get(frame_id)
            if frame is None:
                return
            collected = frame.collected
            collected[name] = value
            if len(collected) < len(self._outputs):
                return
            del self._frames[frame_id]
            self.frames_done += 1
            if self._space_waiters:
                self._space.notify_all()  # a slot freed
        if self.on_done is not None:
            self.on_done(time.perf_counter() - frame.started)
        frame.set_result(collected)

    def break_down(self, message: str) -> None:
        """A peer link broke: fail every frame in flight (their tensors will not come back) and refuse new ones."""
        self.broken = message
        if not self.entry:
            return
        with self._lock:
            frames = list(self._frames.values())
            self._frames.clear()
            self.frames_failed += len(frames)
            self._freed()
        for f in frames:
            f.set_exception(PeerAway(message))

    def fail(self, frame_id: int, error: BaseException, forward: bool = True) -> None:
        """Frame ``frame_id`` failed: no partition here waits for it any more, the other hosts of the
        plan are told (once), and on the entry host its caller gets ``error`` and its slot is freed."""
        with self._lock:
            if frame_id in self._recent_failures:
                return  # handled already (a failure reaches a host over several links)
            self._recent_failures[frame_id] = None
            if len(self._recent_failures) > _RECENT_FAILURES:
                del self._recent_failures[next(iter(self._recent_failures))]
            frame = self._frames.pop(frame_id, None) if self.entry else None
            if frame is not None:
                self.frames_failed += 1
                self._freed()
        for w in self.workers.values():
            w.skip(frame_id)
        if forward and self.links is not None and not self.stopping:
            for host in self.peer_hosts:
                self.links.send_error(host, frame_id, str(error))
        if frame is not None:
            frame.set_exception(error)

    def stats(self) -> dict[str, WorkerStats]:
        return {name: w.stats for name, w in self.workers.items()}

    def reset_stats(self) -> None:
        for w in self.workers.values():
            w.stats = WorkerStats()
        if self.overlap is not None:
            self.overlap = Overlap()

    def track_overlap(self) -> Overlap:
        """Record how the partitions' runs overlap from now on, into the ``Overlap`` returned, until
        ``untrack_overlap`` is given it (or another one is tracked)."""
        overlap = self.overlap = Overlap()
        return overlap

    def untrack_overlap(self, overlap: Overlap) -> None:
        """Stop recording into ``overlap`` (if it is still the one tracked)."""
        if self.overlap is overlap:
            self.overlap = None


def generate_inputs(specs: tuple[TensorSpec, ...], seed: int = 0) -> dict[str, np.ndarray]:
    """Frames made on the board by each input's spec: fixed values where given (a sample rate), integer
    ids in [low, high), random 0/1 booleans, normal floats (the host's ``models.inputs.generate`` alike)."""
    for t in specs:  # before anything is allocated: a declared [65536, 65536] input would be 16 GiB
        check_tensor(t.name, t.shape, t.dtype, "a generated input")
    rng = np.random.default_rng(seed)
    out = {}
    for t in specs:
        if t.values:
            out[t.name] = np.array(t.values, dtype=np.float64).astype(t.dtype).reshape(t.shape)
        elif t.dtype.startswith(("int", "uint")):
            lo = t.low or 0
            out[t.name] = rng.integers(lo, max(t.high or 2, lo + 1), size=t.shape).astype(t.dtype)
        elif t.dtype == "bool":
            out[t.name] = rng.integers(0, 2, size=t.shape).astype(bool)
        else:
            out[t.name] = rng.standard_normal(t.shape).astype(t.dtype)
    return out
