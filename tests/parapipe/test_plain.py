"""Plain onnxruntime as the demo and benchmarks measure it beside plans: both configurations run and count frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from parapipe.plain import CONFIGS, plain_run
from tests.device_profiles.test_runtimes import _branchy_model


def test_plain_onnxruntime_runs_in_both_configurations(tmp_path: Path) -> None:
    import onnxruntime as ort

    model = _branchy_model(tmp_path / "m.onnx")
    (x,) = ort.InferenceSession(str(model)).get_inputs()
    feeds = {x.name: np.zeros([d if isinstance(d, int) else 1 for d in x.shape], np.float32)}
    for config in CONFIGS:
        run = plain_run(model, feeds, config, seconds=0.3)
        assert run.config == config and run.fps > 0 and run.latency_ms > 0
    with pytest.raises(ValueError, match="config must be one of"):
        plain_run(model, feeds, "per cluster")
