"""A partition runs on the execution provider its manifest names, or the pipeline refuses to start:
the executor never lets onnxruntime fall back to the CPU, and the agent answers FAILED_PRECONDITION
naming the unit and the provider before any session is made."""

from __future__ import annotations

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.bundle import MANIFEST, parse_manifest
from agents.client import AgentError
from agents.executor import Pipeline, PipelineError
from parapipe.local_agent import LocalAgent
from profiler.runtime import ProviderUnavailable
from tests.support.tiny import TABLE_ROWS, expected, frame, with_provider, write_tiny_bundle

MISSING = next(
    p for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider") if p not in ort.get_available_providers()
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.sampled_from(ort.get_available_providers()) | st.sampled_from(ort.get_all_providers()),
        min_size=2,
        max_size=2,
    )
)
def test_every_partition_runs_on_its_provider_or_the_pipeline_refuses(tmp_path_factory, providers) -> None:
    folder = write_tiny_bundle(tmp_path_factory.mktemp("b"), stages=2)
    for stage, provider in enumerate(providers):
        with_provider(folder, stage, provider)
    pipeline = Pipeline(parse_manifest((folder / MANIFEST).read_text()), folder)
    try:
        try:
            pipeline.start()
        except (PipelineError, ProviderUnavailable) as exc:
            assert any(p not in ort.get_available_providers() for p in providers)
            assert "needs" in str(exc) and any(p in str(exc) for p in providers)
            return
        assert all(p in ort.get_available_providers() for p in providers)
        assert np.array_equal(pipeline.infer(frame(1), timeout=30)["t1"], expected(1, 2))
        for w in pipeline.workers.values():  # each session has its partition's provider first
            assert w.session.get_providers()[0] == w.spec.provider
    finally:
        pipeline.stop()


@pytest.mark.agent
def test_the_agent_refuses_a_bundle_whose_unit_needs_a_provider_it_lacks(tmp_path) -> None:
    folder = with_provider(write_tiny_bundle(tmp_path / "b", stages=2), 1, MISSING)
    good = write_tiny_bundle(tmp_path / "good", stages=2)
    with LocalAgent() as agent:
        client = agent.client
        sha = client.load_bundle(folder).bundle_sha256
        with pytest.raises(AgentError) as info:
            client.start(sha)
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
        message = str(info.value)
        assert f"unit unit1 needs {MISSING}" in message and "CPUExecutionProvider" in message
        assert not client.status().ready  # nothing started
        assert MISSING not in client.status().providers
        client.start(client.load_bundle(good).bundle_sha256)  # and the agent serves on
        assert np.array_equal(client.infer(frame(TABLE_ROWS - 1))["t1"], expected(TABLE_ROWS - 1, 2))


@pytest.mark.agent
def test_provider_options_naming_paths_are_refused(tmp_path) -> None:
    """A bundle or a profile request may not point an EP's cache or config at a path of its choosing."""
    from agents.proto import parapipe_agent_pb2 as pb
    from tests.support.tiny import stage_model

    escaped = tmp_path / "escaped"
    folder = with_provider(write_tiny_bundle(tmp_path / "b", stages=2), 1, "CPUExecutionProvider",
                           {"cache_dir": str(escaped)})  # fmt: skip
    with LocalAgent() as agent:
        client = agent.client
        with pytest.raises(AgentError) as info:
            client.start(client.load_bundle(folder).bundle_sha256)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and "'cache_dir' names a path" in str(info.value)
        request = pb.ProfileRequest(model=stage_model(1), threads=1, repeats=3, warmup=1,
                                    provider_options={"trt_engine_cache_path": str(escaped)})  # fmt: skip
        with pytest.raises(AgentError) as info:
            client.profile_ops(request)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and "trt_engine_cache_path" in str(info.value)
        assert not escaped.exists()


@pytest.mark.parametrize("name", ["../../../escaped", "..", "a/b", "", "x" * 200])
def test_names_that_would_become_paths_are_refused(tmp_path, name: str) -> None:
    """A partition or unit name reaches the board's filesystem (a throttled unit's cgroup is named after it):
    the manifest refuses any that is not a plain name, and the throttle refuses it again."""
    import json

    from agents.bundle import BundleError
    from profiler.pinning import PinningError, throttle_current_thread

    folder = write_tiny_bundle(tmp_path / "b", stages=2)
    for key in ("name", "pu"):
        data = json.loads((folder / MANIFEST).read_text())
        data["partitions"][1][key] = name
        with pytest.raises(BundleError, match="is not a plain name"):
            parse_manifest(json.dumps(data))
    if "/" in name or name in ("", ".."):  # the names that leave parapipe's cgroup folder
        with pytest.raises(PinningError, match="one plain folder name"):
            throttle_current_thread(name, 50.0)
