"""Plain onnxruntime, as a user runs it without parapipe: the configurations every plan is compared with.

``all cores``: one session whose intra-op threads use every core; ``per core``: one single-thread session per
core, each run back to back by a thread pinned to its core (CPU affinity is per thread, and a one-thread session
runs on the calling thread), all in this process. Frames per second over a fixed time, after a warm-up.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from profiler.runtime import CPU_PROVIDER, open_session

CONFIGS = ("all cores", "per core")


@dataclass(frozen=True)
class PlainRun:
    config: str
    fps: float
    latency_ms: float  # one frame alone (the all-cores session), or a frame on one core


def _session(model: Path, threads: int):  # -> onnxruntime.InferenceSession
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return open_session(str(model), options, CPU_PROVIDER, "plain")


def _loop(session, feeds: Mapping[str, np.ndarray], core: int | None, until: float, counts: list[int], k: int) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})  # this thread only
    n = 0
    while time.perf_counter() < until:
        session.run(None, dict(feeds))
        n += 1
    counts[k] = n


def plain_run(model: Path, feeds: Mapping[str, np.ndarray], config: str, seconds: float = 1.5) -> PlainRun:
    """Frames per second of plain onnxruntime in ``config`` (``CONFIGS``) on this process's cores."""
    cores: Sequence[int] = sorted(os.sched_getaffinity(0))
    if config == "all cores":
        sessions, pins = [_session(model, len(cores))], [None]
    elif config == "per core":
        sessions, pins = [_session(model, 1) for _ in cores], list(cores)
    else:
        raise ValueError(f"config must be one of {', '.join(CONFIGS)}, not {config!r}")
    for s in sessions:  # warm-up: first runs allocate
        for _ in range(3):
            s.run(None, dict(feeds))
    alone = []
    for _ in range(5):
        t = time.perf_counter()
        sessions[0].run(None, dict(feeds))
        alone.append((time.perf_counter() - t) * 1e3)
    counts = [0] * len(sessions)
    start = time.perf_counter()
    until = start + seconds
    threads = [
        threading.Thread(target=_loop, args=(s, feeds, pin, until, counts, k), name=f"pp-plain-{k}")
        for k, (s, pin) in enumerate(zip(sessions, pins, strict=True))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return PlainRun(config, sum(counts) / (time.perf_counter() - start), sorted(alone)[len(alone) // 2])
