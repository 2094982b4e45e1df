"""Throttling a thread of a real-time process: the thread runs under CFS inside its group, real-time again after.

The test process itself never runs at real-time priority: a child python started under ``chrt -f 1``
throttles a thread through the product's ``run_pinned`` and reports what it saw, as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from device_profiles.local import throttling_available
from profiler.pinning import cfs_settings, full_speed_ms

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, os, threading
from pathlib import Path
from profiler.pinning import PinningError, run_pinned

def inside():
    tid = threading.get_native_id()
    return {
        "cgroup": Path(f"/proc/self/task/{tid}/cgroup").read_text(),
        "policy": os.sched_getscheduler(0),
        "priority": os.sched_getparam(0).sched_priority,
    }

seen = {"process_policy": os.sched_getscheduler(0)}
try:
    seen["inside"] = run_pinned(inside, sorted(os.sched_getaffinity(0))[:1], throttle_percent=50, name="test-rt")
    seen["after"] = run_pinned(
        lambda: [os.sched_getscheduler(0), os.sched_getparam(0).sched_priority, Path(
            f"/proc/self/task/{threading.get_native_id()}/cgroup").read_text()],
        sorted(os.sched_getaffinity(0))[:1],
    )
    # the same thread throttled and released: back under its real-time policy, in the root group
    def throttled_then_released():
        from profiler.pinning import release_current_thread, throttle_current_thread
        throttle_current_thread("test-rt", 50)
        during = os.sched_getscheduler(0)
        release_current_thread()
        tid = threading.get_native_id()
        return [during, os.sched_getscheduler(0), os.sched_getparam(0).sched_priority,
                Path(f"/proc/self/task/{tid}/cgroup").read_text()]
    seen["released"] = run_pinned(throttled_then_released, sorted(os.sched_getaffinity(0))[:1])
except PinningError as exc:
    seen["error"] = str(exc)
print(json.dumps(seen))
"""


def _cpu_line(cgroup_file: str) -> str:
    """The cgroup-v1 cpu controller's line of /proc/.../cgroup: the group's path."""
    for line in cgroup_file.splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    raise AssertionError(f"no cpu controller line in {cgroup_file!r}")


def _realtime_child() -> dict:
    why = throttling_available()
    if why:
        pytest.skip(why)
    chrt = shutil.which("chrt")
    if chrt is None:
        pytest.skip("chrt (util-linux) is not installed")
    probe = subprocess.run([chrt, "-f", "1", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot start a SCHED_FIFO process here: {probe.stderr.strip()}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [chrt, "-f", "1", sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_realtime_thread_is_throttled_under_cfs_and_gets_its_policy_back() -> None:
    seen = _realtime_child()
    assert seen["process_policy"] == os.SCHED_FIFO, "the child must run real-time for this test to mean anything"
    assert "error" not in seen, seen.get("error")
    inside = seen["inside"]
    assert _cpu_line(inside["cgroup"]).endswith("/parapipe/test-rt"), inside["cgroup"]
    assert inside["policy"] == os.SCHED_OTHER, "a CFS quota limits CFS threads only"
    assert inside["priority"] == 0
    # a thread created later, not throttled, runs real-time as its creator does
    policy, priority, cgroup = seen["after"]
    assert (policy, priority) == (os.SCHED_FIFO, 1)
    assert "parapipe" not in _cpu_line(cgroup)
    during, policy, priority, cgroup = seen["released"]
    assert during == os.SCHED_OTHER
    assert (policy, priority) == (os.SCHED_FIFO, 1), "release gives the thread back its real-time policy"
    assert _cpu_line(cgroup) == "/", cgroup


@given(st.floats(0.0, 500.0), st.sampled_from([10.0, 25.0, 40.0, 70.0, 100.0]))
def test_the_work_recorded_for_a_run_alone_on_a_throttled_core_gives_back_its_time_alone(work, quota) -> None:
    """A run alone does one period's quota at full speed and the rest at the quota's share (what the planner's
    model takes for a frame's work there: ``Problem.stalled``): the work recorded for its time is that work."""
    burst = cfs_settings(quota)[1] / 1000.0
    alone = work if work <= burst else burst + (work - burst) * 100.0 / quota
    assert full_speed_ms(alone, quota) == pytest.approx(work, rel=1e-9, abs=1e-9)
    assert full_speed_ms(alone, quota) <= alone + 1e-9  # never more than the time it took
