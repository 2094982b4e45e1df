"""Sessions of a CFS-throttled unit, run in a process of their own.

A throttle (``profiler.pinning``) stops a thread for the rest of a CFS period once its quota is
spent, wherever it is. In the agent's process every thread shares Python's GIL, so a throttled
worker stopped while it held the GIL (handing a frame on, converting a session's outputs) stopped
every other unit too: on ``local-biglittle`` the big core's unit waited in ``take_gil`` at the end
of its runs, 15-20% of its run time off the CPU whenever the throttled unit ran beside it, and none
with the throttle removed (``bench/bench_throttle_stall.py``: resnet18's throughput plan ran at 57
fps, 76 unthrottled). A LITTLE core on a board is slow, never frozen; so a throttled unit's sessions
run in a child process, pinned and throttled there, with its own GIL. The worker thread stays in
the agent (pinned to the unit's cores, unthrottled) and waits for each run without the GIL.

Tensors cross through files in ``/dev/shm`` (memory), one per tensor name and side, mapped by both
processes: the agent writes a run's inputs there, the child runs the session on views of them and
writes the outputs back; only names, shapes and dtypes go over the socket. The child's CPU time of
each run is reported with its outputs (``last_cpu_s``): the work the throttled core did.

Stdlib, numpy and onnxruntime only, like the rest of the agent.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

SHM_ROOT = Path("/dev/shm")
START_TIMEOUT_S = 120.0  # a child imports onnxruntime and creates its sessions: seconds on a slow board


class IsolatedError(RuntimeError):
    """The child process failed to start, to load a session or to run one; the message says why."""


class _Buffers:
    """Files in one folder, each mapped whole and grown (re-created) when a tensor outgrows it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.maps: dict[str, tuple[int, mmap.mmap]] = {}

    def writable(self, name: str, nbytes: int) -> mmap.mmap:
        """The map of file ``name``, at least ``nbytes`` long (created or grown as needed)."""
        held = self.maps.get(name)
        if held is not None and held[0] >= nbytes:
            return held[1]
        size = max(nbytes, 1, 2 * held[0] if held else 0)
        path = self.folder / name
        with open(path, "w+b") as f:
            f.truncate(size)
            m = mmap.mmap(f.fileno(), size)
        if held is not None:
            held[1].close()
        self.maps[name] = (size, m)
        return m

    def readable(self, name: str, nbytes: int) -> mmap.mmap:
        """The map of file ``name`` another process wrote, remapped when it grew past what is mapped."""
        held = self.maps.get(name)
        if held is not None and held[0] >= nbytes:
            return held[1]
        path = self.folder / name
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            m = mmap.mmap(f.fileno(), size)
        if held is not None:
            held[1].close()
        self.maps[name] = (size, m)
        return m

    def close(self) -> None:
        for _, m in self.maps.values():
            try:
                m.close()
            except BufferError:
                pass  # a view still refers to it: the map goes with the view
        self.maps.clear()


def _put(buffers: _Buffers, name: str, array: np.ndarray) -> tuple[str, str, tuple[int, ...]]:
    """Copy ``array`` into buffer ``name``: (name, dtype, shape) for the other side."""
    array = np.ascontiguousarray(array)
    m = buffers.writable(name, array.nbytes)
    if array.nbytes:
        np.frombuffer(m, dtype=array.dtype, count=array.size)[:] = array.reshape(-1)
    return name, array.dtype.str, tuple(array.shape)


def _view(buffers: _Buffers, name: str, dtype: str, shape: Sequence[int]) -> np.ndarray:
    """A view of buffer ``name`` as an array (no copy)."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    m = buffers.readable(name, count * dt.itemsize)
    return np.frombuffer(m, dtype=dt, count=count).reshape(shape)


def _safe(name: str) -> str:
    """A tensor name as a file name: the name's hex (tensor names may hold any character)."""
    return name.encode().hex()[:200] or "empty"


class IsolatedUnit:
    """A child process holding the sessions of one throttled unit; ``session(path)`` gives a handle."""

    def __init__(self, cores: Sequence[int], pu: str, throttle_percent: float) -> None:
        base = SHM_ROOT if SHM_ROOT.is_dir() and os.access(SHM_ROOT, os.W_OK) else None
        self.folder = Path(tempfile.mkdtemp(prefix="parapipe-unit-", dir=base))
        self._buffers = _Buffers(self.folder)
        self._lock = threading.Lock()  # one request at a time over the socket
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PARAPIPE_ISOLATED_PATH"] = os.pathsep.join(p for p in sys.path if p)
        setup = {"cores": list(cores), "pu": pu, "throttle_percent": throttle_percent, "folder": str(self.folder)}
        code = (
            "import os, sys; sys.path[:0] = os.environ['PARAPIPE_ISOLATED_PATH'].split(os.pathsep); "
            "from agents.isolated import serve; serve(int(sys.argv[1]), sys.argv[2])"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(theirs.fileno()), json.dumps(setup)],
            pass_fds=(theirs.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        self._sessions = 0
        self.pu = pu
        try:
            self._call(("ping",), START_TIMEOUT_S)
        except BaseException:
            self.close()  # a child that cannot pin or throttle itself: stopped, its buffers removed
            raise

    def _exchange(self, message: tuple[Any, ...], timeout: float | None = None) -> Any:
        """Send a request and read its answer (the caller holds ``_lock``)."""
        try:
            self.conn.send(message)
            if timeout is not None and not self.conn.poll(timeout):
                raise IsolatedError(f"the throttled unit's process did not answer within {timeout:.0f} s")
            kind, payload = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise IsolatedError(
                f"the throttled unit's process ended (exit code {self.proc.poll()}): {exc or 'connection closed'}"
            ) from None
        if kind == "error":
            raise IsolatedError(payload)
        return payload

    def _call(self, message: tuple[Any, ...], timeout: float | None = None) -> Any:
        with self._lock:
            return self._exchange(message, timeout)

    def session(
        self,
        path: Path,
        provider: str,
        threads: int = 1,
        unit: str = "",
        provider_options: Mapping[str, str] | None = None,
    ) -> IsolatedSession:
        """Load the partition at ``path`` in the child (``threads`` intra-op threads, which inherit the child's
        cores and throttle) on ``provider`` and nothing else; a handle whose ``run`` runs it there."""
        key = self._sessions
        self._sessions += 1
        load = ("load", key, str(path), provider, threads, unit or self.pu, dict(provider_options or {}))
        self._call(load, START_TIMEOUT_S)
        return IsolatedSession(self, key)

    def run(self, key: int, names: list[str], feeds: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], float]:
        with self._lock:  # the buffers are this unit's: one run at a time writes and reads them
            inputs = [(n, *_put(self._buffers, f"i-{_safe(n)}", np.asarray(v))) for n, v in feeds.items()]
            outputs, cpu_s = self._exchange(("run", key, names, inputs))
            return [_view(self._buffers, f, d, s).copy() for f, d, s in outputs], cpu_s

    def close(self) -> None:
        """Stop the child and remove its buffers (idempotent)."""
        try:
            with self._lock:
                self.conn.send(("stop",))
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()
        self._buffers.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class IsolatedSession:
    """One partition's session in an ``IsolatedUnit``: ``run`` as onnxruntime's, and the child's CPU time."""

    def __init__(self, unit: IsolatedUnit, key: int) -> None:
        self.unit, self.key = unit, key
        self.last_cpu_s = 0.0

    def run(self, output_names: list[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        outputs, self.last_cpu_s = self.unit.run(self.key, list(output_names), feeds)
        return outputs


def _session(path: str, provider: str, threads: int, unit: str, provider_options: Mapping[str, str]):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    from profiler.runtime import open_session

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # it would burn the quota
    return open_session(path, options, provider, unit, provider_options)


def serve(fd: int, setup_json: str) -> None:
    """The child: pinned and throttled, it loads sessions and runs them on request until told to stop."""
    from profiler.pinning import pin_current_thread, throttle_current_thread

    conn = Connection(fd)
    setup = json.loads(setup_json)
    buffers = _Buffers(Path(setup["folder"]))
    sessions: dict[int, Any] = {}
    try:
        pin_current_thread(setup["cores"])
        if float(setup["throttle_percent"]) < 100.0:  # a whole core's quota would only add the accounting
            throttle_current_thread(setup["pu"], float(setup["throttle_percent"]))
    except Exception as exc:  # reported on the first request
        failed: str | None = f"cannot pin or throttle the unit's process: {exc}"
    else:
        failed = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the agent went away
        kind = message[0]
        if kind == "stop":
            buffers.close()
            return
        if failed is not None:
            conn.send(("error", failed))
            continue
        try:
            if kind == "ping":
                conn.send(("ok", None))
            elif kind == "load":
                _, key, path, provider, threads, unit, options = message
                sessions[key] = _session(path, provider, threads, unit, options)
                conn.send(("ok", None))
            elif kind == "run":
                _, key, names, inputs = message
                feeds = {n: _view(buffers, f, d, s) for n, f, d, s in inputs}
                cpu = time.thread_time()
                results = sessions[key].run(names, feeds)
                outputs = [_put(buffers, f"o-{_safe(n)}", np.asarray(r)) for n, r in zip(names, results, strict=True)]
                conn.send(("ok", (outputs, time.thread_time() - cpu)))
            else:
                conn.send(("error", f"unknown request {kind!r}"))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def time_isolated(
    model: bytes,
    feeds: Mapping[str, np.ndarray],
    names: list[str],
    cfg: Any,
    warmup: int,
    repeats: int,
    stop: Callable[[], bool] | None = None,
) -> Any:
    """``profiler.measure.time_model`` for a unit whose EP runs threads of its own (OpenVINO): the session in a
    child pinned to the unit's cores (``cfg``: a ``PuConfig``), as the executor runs it, hand-off included."""
    from profiler.measure import Timing, check_stop

    with tempfile.TemporaryDirectory(prefix="parapipe-profile-") as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model)
        unit = IsolatedUnit(cfg.cores, cfg.pu, 100.0)
        try:
            session = unit.session(path, cfg.provider, cfg.threads, cfg.pu, dict(cfg.provider_options))
            for _ in range(warmup):
                check_stop(stop)
                session.run(names, feeds)
            samples = []
            for _ in range(repeats):
                check_stop(stop)
                start = time.perf_counter()
                session.run(names, feeds)
                samples.append((time.perf_counter() - start) * 1e3)
        finally:
            unit.close()
    return Timing.of(samples)
