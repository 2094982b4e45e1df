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
    assert all(p["alone_frames"] > 0 for _, r in last for p in r.partitions)
    assert last and last[0][1].measured["throughput_fps"] > 0
