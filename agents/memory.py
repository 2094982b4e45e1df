"""Keep large tensor buffers in the heap instead of fresh ``mmap`` pages (glibc).

Every frame allocates several buffers of the size of its tensors (protobuf copies,
numpy arrays). Above glibc's mmap threshold (128 KiB to start with) each one is a fresh
mapping whose pages fault in and are zeroed on first touch, and are unmapped again on
free: for a 600 KB image that was about half of a gRPC round trip here. Raising the
threshold and the trim threshold lets freed buffers be reused. The agent calls this at
start; the host client too. A no-op where libc has no ``mallopt``.

The price: memory freed in bulk (a stopped pipeline's sessions, weights below the mmap
threshold) stays in the heap. ``give_back_free_memory`` returns it to the system; the agent
calls it once a stopped pipeline's workers have let their sessions go, so an agent whose
pipeline restarts again and again (a peer that comes and goes) does not grow with each restart.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
AGENT_ARENAS = 2  # malloc arenas of the agent's process (glibc's default: 8 per core)
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024

_done = False


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def keep_large_buffers() -> bool:
    """Set the thresholds once per process; True if libc accepted them."""
    global _done
    if _done:
        return True
    try:
        mallopt = _libc().mallopt  # type: ignore[union-attr]
    except AttributeError:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    _done = ok
    return ok


def give_back_free_memory() -> bool:
    """Return the heap's free pages to the system (glibc ``malloc_trim``); True if any were returned.
    A no-op (False) where libc has no ``malloc_trim``."""
    try:
        trim = _libc().malloc_trim  # type: ignore[union-attr]
    except AttributeError:
        return False
    trim.argtypes = [ctypes.c_size_t]
    return bool(trim(0))


def bound_arenas(arenas: int = AGENT_ARENAS) -> bool:
    """At most ``arenas`` malloc arenas in this process (glibc ``M_ARENA_MAX``); True if libc accepted.

    Every pipeline start gives each partition (or unit of partitions) a new worker thread, and glibc gives new threads
    arenas of their own: memory freed in them (a stopped pipeline's) stays fragmented there, and
    an agent whose pipeline restarts again and again grew by several MiB per restart for good
    (bert_tiny, 20 StartPipelines in one agent: 140 -> ~200 MiB; with two arenas 110-122 MiB).
    The agent calls this at start, before its threads allocate; not the host client's process."""
    try:
        mallopt = _libc().mallopt  # type: ignore[union-attr]
    except AttributeError:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_ARENA_MAX, arenas))
