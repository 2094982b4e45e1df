"""The measure-replan loop: measurements become measured partitions, rounds report RMSPE."""

from __future__ import annotations

import math

import pytest

from parapipe.tune import rmspe, tune
from profiler.costtable import CostTable


def test_rmspe() -> None:
    assert rmspe([(110.0, 100.0), (90.0, 100.0)]) == pytest.approx(10.0)
    assert math.isnan(rmspe([]))


def test_tune_feeds_measurements_back(exported, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    costs = tmp_path / "costs.json"
    history, last = tune(
        exported("squeezenet1_1").path, "local", costs, "throughput", rounds=2, target_error=0.0, time_limit=1, frames=8
    )
    assert len(history) == 2, "a target of 0% is never met, so every round runs"
    for h in history:
        assert h.plans == 1 and h.rmspe_latency >= 0 and h.rmspe_throughput >= 0
        assert h.rmspe_energy is None  # energy is modelled here, so it is not part of the error
    table = CostTable.load(costs)
    fed = [e for e in table if e.name.startswith("run:")]
    assert fed and all(e.kind == "partition" and e.mean_ms > 0 for e in fed)
    # every partition's time comes from frames run one at a time
    assert all(p.alone_frames > 0 for _, r in last for p in r.partitions)
    assert last and last[0][1].measured.throughput_fps > 0


def test_measured_energy_rescales_the_power_model(exported, tmp_path, monkeypatch) -> None:
    """A board with a power sensor (a fake hwmon tree read by the real agent): energy enters the loop."""
    hwmon = tmp_path / "hwmon" / "hwmon0"
    hwmon.mkdir(parents=True)
    (hwmon / "name").write_text("fakepower\n")
    (hwmon / "power1_input").write_text("40000000\n")  # 40 W, far above the profile's estimates
    monkeypatch.setenv("PARAPIPE_HWMON_ROOT", str(tmp_path / "hwmon"))
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    costs = tmp_path / "costs.json"
    history, last = tune(
        exported("squeezenet1_1").path, "local", costs, "throughput", rounds=2, target_error=0.0, time_limit=1, frames=8
    )
    assert all(r.energy_source == "measured" for _, r in last)
    first, second = history
    assert first.rmspe_energy is not None and first.rmspe_energy > 30  # the estimates are far off
    assert first.power_scale is not None and max(first.power_scale) > 1.5
    assert second.rmspe_energy is not None
    table = CostTable.load(costs)
    assert {e.name for e in table if e.kind == "power"} == {"active-scale", "idle-scale"}
    # The planner's model now predicts the energy the sensor measured for the last plan. (Comparing
    # round 2's RMSPE with round 1's would also compare two noisy 8-frame throughput measurements.)
    from device_profiles.loader import load_profile
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from planner.build import evaluate
    from planner.costmodel import CostModel

    loaded = load_onnx(exported("squeezenet1_1").path)
    graph = build_graph(loaded.proto, loaded.sha256)
    cost = CostModel(load_profile("local"), graph, table)
    plan, result = last[0]
    predicted = evaluate(plan, graph, cost, frames=0).predicted.energy_mj
    assert predicted == pytest.approx(result.measured.energy_mj, rel=0.01)
