"""Every session parapipe opens for a unit runs on the unit's execution provider or is refused: never a silent
fallback to the CPU (``profiler.runtime``), here with the providers this onnxruntime has and those it lacks."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from profiler.measure import PuConfig, time_model
from profiler.runtime import (
    CPU_PROVIDER,
    ProviderUnavailable,
    declined_nodes,
    missing_providers,
    open_session,
)


def _relu_model() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


MODEL = _relu_model()
NAMES = st.one_of(
    st.sampled_from(ort.get_all_providers()),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", min_size=1, max_size=30),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAMES)
def test_a_session_runs_on_the_provider_asked_for_or_is_refused(provider: str) -> None:
    try:
        session = open_session(MODEL, ort.SessionOptions(), provider, "unit0")
    except ProviderUnavailable as exc:
        assert exc.provider == provider and exc.unit == "unit0"
        assert "unit unit0" in str(exc) and provider in str(exc) and "--exclude-pus unit0" in str(exc)
        assert provider not in ort.get_available_providers() or "the session got" in str(exc)
        return
    assert session.get_providers()[0] == provider


def test_cuda_asked_for_here_is_refused_not_run_on_the_cpu() -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    # what onnxruntime itself does: a warning and a CPU session
    with pytest.warns(UserWarning):
        silent = ort.InferenceSession(MODEL, providers=["CUDAExecutionProvider"])
    assert silent.get_providers() == [CPU_PROVIDER]
    with pytest.raises(ProviderUnavailable) as info:
        open_session(MODEL, ort.SessionOptions(), "CUDAExecutionProvider", "gpu")
    message = str(info.value)
    assert "unit gpu needs CUDAExecutionProvider" in message and CPU_PROVIDER in message
    assert "onnxruntime-gpu" in message and "\n" not in message


def test_the_profiler_refuses_a_provider_it_does_not_have() -> None:
    feeds = {"x": np.ones((1, 4), np.float32)}
    assert time_model(MODEL, feeds, PuConfig("cpu", (0,), 1), warmup=1, repeats=2).median_ms > 0
    with pytest.raises(ProviderUnavailable, match="unit gpu needs TensorrtExecutionProvider"):
        time_model(MODEL, feeds, PuConfig("gpu", (0,), 1, "TensorrtExecutionProvider"), warmup=1, repeats=2)


def test_nodes_a_provider_declines_are_read_from_onnxruntimes_profile() -> None:
    """The Azure EP (in every CPU build) takes no node: the session's first provider is Azure, yet the
    Relu runs on the CPU, and onnxruntime's profiling output says so node by node."""
    if "AzureExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no Azure EP")
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "p")
        session = open_session(MODEL, options, "AzureExecutionProvider", "azure")
        session.run(None, {"x": np.ones((1, 4), np.float32)})
        events = json.loads(Path(session.end_profiling()).read_text())
    assert declined_nodes(events, "AzureExecutionProvider") == ["relu"]
    assert declined_nodes(events, CPU_PROVIDER) == []


def test_missing_providers_names_each_unit_in_order() -> None:
    needed = {"big": CPU_PROVIDER, "gpu": "CUDAExecutionProvider", "npu": "VSINPUExecutionProvider"}
    missing = missing_providers(needed, [CPU_PROVIDER, "AzureExecutionProvider"])
    assert [(m.unit, m.provider) for m in missing] == [
        ("gpu", "CUDAExecutionProvider"),
        ("npu", "VSINPUExecutionProvider"),
    ]
