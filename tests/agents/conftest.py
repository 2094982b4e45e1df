"""Fixtures for agent tests: a two-core profile without throttling, and plans that exercise the executor."""

from __future__ import annotations

import os

import pytest

from device_profiles.loader import parse_profile


def _q(v: float) -> dict:
    return {"value": v, "source": "estimate", "cite": "test profile"}


@pytest.fixture(scope="session")
def two_cores():
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    peaks = {c: _q(50.0) for c in ("conv", "depthwise", "matmul", "elementwise", "pooling", "other")}
    pu = {
        "kind": "cpu",
        "peak_gflops": peaks,
        "memory_bandwidth_gbps": _q(10.0),
        "memory_bytes": _q(8e9),
        "launch_overhead_us": _q(5.0),
        "active_power_w": _q(5.0),
        "idle_power_w": _q(1.0),
    }
    data = {
        "schema_version": 1,
        "name": "two-cores",
        "pus": [dict(pu, name="c0", cores=[cores[0]]), dict(pu, name="c1", cores=[cores[1]])],
        "links": [{"a": "c0", "b": "c1", "bandwidth_gbps": _q(10.0), "latency_us": _q(2.0)}],
    }
    return parse_profile(data)
