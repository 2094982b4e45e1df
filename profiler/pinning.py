"""Run work on chosen cores: per-thread CPU affinity and, for throttled PUs, a CFS quota.

Linux affinity is per thread, and threads inherit both affinity and cgroup from the
thread that creates them; so a worker pins itself (and joins its throttle cgroup)
*before* it creates its onnxruntime session, and the session's intra-op threads
follow. Stdlib only: the board-side agent uses this too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
CFS_PERIOD_US = 2000  # short periods keep throttled latency smooth rather than bursty
MIN_QUOTA_US = 1000


class PinningError(RuntimeError):
    """Pinning or throttling a thread failed; the message says what this host lacks."""


def pin_current_thread(cores: Sequence[int]) -> None:
    if not cores:
        return
    try:
        os.sched_setaffinity(0, set(cores))  # pid 0 = the calling thread
    except OSError as exc:
        allowed = sorted(os.sched_getaffinity(0))
        raise PinningError(f"cannot pin to cores {list(cores)}: {exc}; this process may use {allowed}") from None


def throttle_current_thread(name: str, quota_percent: float) -> Path:
    """Move the calling thread into a cgroup-v1 cpu group limited to quota_percent of one core."""
    group = CGROUP_CPU / "parapipe" / name
    period, quota = cfs_settings(quota_percent)
    try:
        group.mkdir(parents=True, exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "tasks").write_text(str(threading.get_native_id()))
    except OSError as exc:
        raise PinningError(
            f"cannot throttle a thread with {group}: {exc} (needs root and the cgroup v1 cpu controller)"
        ) from None
    return group


def cfs_settings(quota_percent: float) -> tuple[int, int]:
    """(period, quota) in us for a share of one core; the kernel's smallest quota is 1000 us."""
    period = max(CFS_PERIOD_US, round(MIN_QUOTA_US * 100 / quota_percent))
    return period, round(period * quota_percent / 100)


def release_current_thread() -> None:
    """Put the calling thread back into the root cpu cgroup (no-op where there is none)."""
    try:
        (CGROUP_CPU / "tasks").write_text(str(threading.get_native_id()))
    except OSError:
        pass


def run_pinned(fn: Callable[[], T], cores: Sequence[int], throttle_percent: float | None = None, name: str = "pu") -> T:
    """Run ``fn`` in a new thread pinned to ``cores`` (and throttled if asked); return its result."""
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            pin_current_thread(cores)
            if throttle_percent is not None:
                throttle_current_thread(name, throttle_percent)
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread below
            error.append(exc)
        finally:
            if throttle_percent is not None:
                release_current_thread()

    thread = threading.Thread(target=body, name=f"parapipe-{name}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
