"""What an agent holds in memory, on request: off unless the agent is started with ``--debug-memory FILE``.

With the flag the agent traces Python allocations (``tracemalloc``) from its start and, on each
``SIGUSR1``, appends one JSON line to FILE: the process's resident memory, its threads by name,
the live objects of the kinds a restarted pipeline could leave behind (pipelines, workers, peer
links, gRPC channels, onnxruntime sessions, futures) as the garbage collector sees them, the
collector's own counts, and the Python allocations that grew most since the first report.
Nothing of this is reachable without the flag: no signal handler is installed, nothing traced.

Board side: the stdlib only (psutil is not needed: resident memory is read from /proc).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import linecache
import logging
import re
import signal
import threading
import time
import tracemalloc
import types
from collections import Counter
from pathlib import Path

log = logging.getLogger("parapipe.agent")
TRACE_FRAMES = 8  # stack depth tracemalloc keeps per allocation
TOP = 15  # allocation sites reported per snapshot
# the classes (by qualified name) whose live instances each report counts
WATCHED = (
    "agents.executor.Pipeline",
    "agents.executor._Worker",
    "agents.peers.PeerLinks",
    "agents.peers._Link",
    "grpc._channel.Channel",
    "grpc._channel._ChannelCallState",
    "grpc._channel._ChannelConnectivityState",
    "onnxruntime.capi.onnxruntime_inference_collection.InferenceSession",
    "agents.executor.FrameFuture",
)
_DIGITS = re.compile(r"\d+")


def rss_kib() -> int:
    """This process's resident memory (KiB), 0 where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_info() -> dict[str, int]:
    """glibc's heap figures (KiB): ``arena`` held from the system by the arenas, ``in_use`` of it, ``free`` in
    it, ``mmapped`` in blocks of their own; {} where libc has no ``mallinfo2`` (glibc before 2.33, musl)."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {
        "arena": info.arena // 1024,
        "in_use": info.uordblks // 1024,
        "free": info.fordblks // 1024,
        "mmapped": info.hblkhd // 1024,
    }


def rss_by_mapping() -> dict[str, int]:
    """Resident memory (KiB) by kind of mapping (/proc/self/smaps): the main heap, other anonymous memory
    by size (thread stacks are 8 MiB, glibc's other arenas 64 MiB), and files (libraries, models)."""
    groups: Counter[str] = Counter()
    kind = ""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            size = end - start
            path = fields[5] if len(fields) > 5 else ""
            if path.startswith("["):
                kind = path
            elif path:
                kind = "files"
            elif size <= 9 * 1024 * 1024:
                kind = "anonymous <= 9 MiB (thread stacks)"
            elif size <= 64 * 1024 * 1024:
                kind = "anonymous <= 64 MiB (malloc arenas)"
            else:
                kind = "anonymous > 64 MiB"
        elif fields[0] == "Rss:":
            groups[kind] += int(fields[1])
    return dict(groups)


def large_anonymous(min_rss_kib: int = 512) -> list[list[object]]:
    """[address, size KiB, resident KiB, the size of the unreadable mapping right after it (a malloc arena's
    reserve, a thread stack's guard is before it)] of each anonymous mapping with ``min_rss_kib`` resident."""
    maps: list[list[object]] = []
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return maps
    for line in lines:
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            maps.append([fields[0].split("-")[0], (end - start) // 1024, 0, fields[1], len(fields) <= 5])
        elif fields[0] == "Rss:":
            maps[-1][2] = int(fields[1])
    found = []
    for i, (addr, size, rss, _perms, anonymous) in enumerate(maps):
        if anonymous and int(rss) >= min_rss_kib:  # type: ignore[call-overload]
            after = maps[i + 1] if i + 1 < len(maps) else None
            reserve = after[1] if after is not None and after[3] == "---p" and after[4] else 0
            found.append([addr, size, rss, reserve])
    return sorted(found, key=lambda m: -int(m[2]))  # type: ignore[call-overload]


def thread_names() -> dict[str, int]:
    """Live threads by name, numbers folded (``pp-rpc_3`` and ``pp-rpc_12`` count as ``pp-rpc_N``)."""
    return dict(Counter(_DIGITS.sub("N", t.name) for t in threading.enumerate()))


def live_objects(names: tuple[str, ...] = WATCHED, collect: bool = True) -> dict[str, int]:
    """Instances of each class in ``names`` among the objects the garbage collector tracks: after a
    collection (live), or with ``collect=False`` as the process holds them now (garbage in reference
    cycles included, which holds its memory until the collector runs)."""
    if collect:
        gc.collect()
    counts = dict.fromkeys(names, 0)
    for obj in gc.get_objects():
        cls = type(obj)
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in counts:
            counts[name] += 1
    return counts


def _describe(obj: object) -> str:
    if isinstance(obj, types.FrameType):
        return f"frame {obj.f_code.co_name} ({Path(obj.f_code.co_filename).name}:{obj.f_lineno})"
    if isinstance(obj, threading.Thread):
        return f"thread {obj.name}"
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    if isinstance(obj, types.FunctionType):
        return f"function {obj.__qualname__}"
    if isinstance(obj, types.CellType):
        return "cell"
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def holders(name: str, depth: int = 6, limit: int = 4) -> list[list[str]]:
    """For each live instance of class ``name`` (up to ``limit``), one chain of what refers to it, up to
    ``depth`` steps: how a retained pipeline is still reachable."""
    gc.collect()
    chains: list[list[str]] = []
    instances = [o for o in gc.get_objects() if f"{type(o).__module__}.{type(o).__qualname__}" == name]
    ignore = {id(instances), id(chains)}
    for obj in instances[:limit]:
        chain: list[str] = []
        current, seen = obj, {id(obj)}
        ignore.add(id(chain))
        for _ in range(depth):
            refs = [
                r
                for r in gc.get_referrers(current)
                if id(r) not in ignore
                and id(r) not in seen
                and not (isinstance(r, types.FrameType) and r.f_code.co_filename == __file__)
            ]
            if not refs:
                break
            # a frame or a thread says most: prefer them, then anything but the instance's own dicts
            refs.sort(key=lambda r: (not isinstance(r, types.FrameType | threading.Thread), isinstance(r, dict)))
            current = refs[0]
            seen.add(id(current))
            chain.append(_describe(current))
            if isinstance(current, types.FrameType | types.ModuleType | threading.Thread):
                break
        chains.append(chain)
    return chains


class MemoryReports:
    """Appends a report to ``path`` on each SIGUSR1 (from a thread of its own, not the signal handler)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._wanted = threading.Event()
        self._first: tracemalloc.Snapshot | None = None
        self.reports = 0

    def install(self) -> None:
        """Start tracing and listening; call from the main thread (signal handlers are set there)."""
        tracemalloc.start(TRACE_FRAMES)
        signal.signal(signal.SIGUSR1, lambda *_: self._wanted.set())
        threading.Thread(target=self._serve, name="pp-debug-memory", daemon=True).start()
        log.warning("memory reports on: tracing allocations; SIGUSR1 appends a report to %s", self.path)

    def _serve(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            try:
                self.write()
            except Exception:  # a report must never take the agent down
                log.exception("memory report failed")

    def report(self) -> dict:
        snapshot = tracemalloc.take_snapshot().filter_traces(
            (
                tracemalloc.Filter(False, tracemalloc.__file__),
                tracemalloc.Filter(False, __file__),
                tracemalloc.Filter(False, linecache.__file__),
            )
        )
        if self._first is None:
            self._first = snapshot
        grown = snapshot.compare_to(self._first, "traceback")[:TOP]
        current, peak = tracemalloc.get_traced_memory()
        return {
            "time": time.time(),
            "rss_kib": rss_kib(),
            "rss_by_mapping_kib": rss_by_mapping(),
            "malloc_kib": malloc_info(),
            "large_anonymous_kib": large_anonymous(),
            "traced_kib": current // 1024,
            "traced_peak_kib": peak // 1024,
            "threads": thread_names(),
            "uncollected": live_objects(collect=False),  # first: the line below collects
            "objects": live_objects(),
            "holders": {n.rsplit(".", 1)[-1]: holders(n) for n in ("agents.executor.Pipeline", "agents.peers._Link")},
            "gc_counts": list(gc.get_count()),
            "gc_tracked": len(gc.get_objects()),
            "grown_since_first": [
                {"kib": s.size_diff // 1024, "count": s.count_diff, "where": s.traceback.format()[-6:]} for s in grown
            ],
        }

    def write(self) -> None:
        line = json.dumps(self.report())
        with open(self.path, "a") as fh:
            fh.write(line + "\n")
        self.reports += 1
