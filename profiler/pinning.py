"""Run work on chosen cores: per-thread CPU affinity and, for throttled PUs, a CFS quota.

Linux affinity is per thread, and threads inherit both affinity and cgroup from the
thread that creates them; so a worker pins itself (and joins its throttle cgroup)
*before* it creates its onnxruntime session, and the session's intra-op threads
follow. Stdlib only: the board-side agent uses this too.

A CFS quota limits CFS threads only, and a cgroup-v1 cpu group without a real-time budget
(``cpu.rt_runtime_us`` 0, what a new group gets) refuses real-time threads: a thread running
SCHED_FIFO or SCHED_RR (a process started under ``chrt -f``) is put under SCHED_OTHER before it
joins its throttle group, and gets its policy back when it leaves it. Scheduling policy, like
affinity, is per thread on Linux and inherited by the threads it creates, so onnxruntime's
intra-op threads of a throttled session run under CFS too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
SCHED_DEADLINE = 6  # not in ``os``: a thread under it cannot be given back its policy without sched_setattr
CFS_PERIOD_US = 2000  # short periods keep throttled latency smooth rather than bursty
MIN_QUOTA_US = 1000


class PinningError(RuntimeError):
    """Pinning or throttling a thread failed; the message says what this host lacks."""


_left_realtime = threading.local()  # per thread: (policy, priority) it ran under before joining a throttle group


def pin_current_thread(cores: Sequence[int]) -> None:
    if not cores:
        return
    try:
        os.sched_setaffinity(0, set(cores))  # pid 0 = the calling thread
    except OSError as exc:
        allowed = sorted(os.sched_getaffinity(0))
        raise PinningError(f"cannot pin to cores {list(cores)}: {exc}; this process may use {allowed}") from None


def throttle_current_thread(name: str, quota_percent: float) -> Path:
    """Move the calling thread into a cgroup-v1 cpu group limited to quota_percent of one core.

    A real-time thread (SCHED_FIFO, SCHED_RR) is put under SCHED_OTHER first (a quota throttles CFS
    threads only, and the group refuses real-time ones); ``release_current_thread`` gives it back."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:  # one folder under parapipe's, no other
        raise PinningError(f"cannot throttle a thread as {name!r}: a cgroup name is one plain folder name")
    group = CGROUP_CPU / "parapipe" / name
    period, quota = cfs_settings(quota_percent)
    try:
        group.mkdir(parents=True, exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    except OSError as exc:
        raise PinningError(
            f"cannot throttle a thread with {group}: {exc} (needs root and the cgroup v1 cpu controller)"
        ) from None
    left = _leave_realtime()
    try:
        (group / "tasks").write_text(str(threading.get_native_id()))
    except OSError as exc:
        if left:
            _restore_realtime()
        raise PinningError(
            f"cannot throttle a thread with {group}: {exc} (needs root and the cgroup v1 cpu controller)"
        ) from None
    return group


def _leave_realtime() -> bool:
    """Put the calling thread under SCHED_OTHER if it runs real-time; whether it did (its policy is kept)."""
    policy = os.sched_getscheduler(0)
    if policy == SCHED_DEADLINE:
        raise PinningError(
            "cannot throttle a SCHED_DEADLINE thread: a CFS quota limits SCHED_OTHER threads only; "
            "run the process under SCHED_OTHER or SCHED_FIFO (chrt -f) instead"
        )
    if policy not in (os.SCHED_FIFO, os.SCHED_RR):
        return False
    priority = os.sched_getparam(0).sched_priority
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # pid 0 = the calling thread
    except OSError as exc:
        raise PinningError(
            f"cannot throttle a real-time thread (policy {policy}, priority {priority}): putting it under "
            f"SCHED_OTHER failed: {exc}; run the process without real-time priority (no chrt)"
        ) from None
    if getattr(_left_realtime, "saved", None) is None:
        _left_realtime.saved = (policy, priority)
    return True


def _restore_realtime() -> None:
    """Give the calling thread back the real-time policy it left to be throttled (if it did)."""
    saved = getattr(_left_realtime, "saved", None)
    if saved is None:
        return
    _left_realtime.saved = None
    try:
        os.sched_setscheduler(0, saved[0], os.sched_param(saved[1]))
    except OSError:
        pass  # it could not leave its throttle group, or may no longer run real-time: it stays under CFS


def cfs_settings(quota_percent: float) -> tuple[int, int]:
    """(period, quota) in us for a share of one core; the kernel's smallest quota is 1000 us."""
    period = max(CFS_PERIOD_US, round(MIN_QUOTA_US * 100 / quota_percent))
    return period, round(period * quota_percent / 100)


def full_speed_ms(alone_ms: float, quota_percent: float) -> float:
    """The work (ms at the core's full speed) a run that took ``alone_ms`` alone on a core throttled to
    ``quota_percent`` did: it ran at full speed on one period's quota, and at the quota's share after that
    (a run alone longer than the quota waited for it)."""
    quota_ms = cfs_settings(quota_percent)[1] / 1000.0
    if alone_ms <= quota_ms:
        return alone_ms
    return quota_ms + (alone_ms - quota_ms) * quota_percent / 100.0


def release_current_thread() -> None:
    """Put the calling thread back into the root cpu cgroup (no-op where there is none), then back under
    the real-time policy it left to be throttled (the root group takes real-time threads)."""
    try:
        (CGROUP_CPU / "tasks").write_text(str(threading.get_native_id()))
    except OSError:
        pass
    _restore_realtime()


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
