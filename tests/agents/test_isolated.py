"""A throttled unit's sessions run in a process of their own, throttled there: no thread of the agent ever
joins a throttle group (a throttled thread stopped while it held the GIL stopped every unit), the frames'
outputs are the plain sessions', the unit's CPU time is the child's, and the child and its buffers go with
the pipeline."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from agents.bundle import MANIFEST, parse_manifest
from agents.executor import Pipeline, PipelineError
from agents.isolated import IsolatedError, IsolatedUnit
from device_profiles.local import throttling_available
from profiler.pinning import CGROUP_CPU
from tests.support.tiny import CONV_SHAPE, write_conv_bundle

QUOTA = 40.0


@pytest.fixture
def throttling() -> None:
    why = throttling_available()
    if why:
        pytest.skip(why)


def _throttle_second_stage(folder: Path) -> Path:
    """The two-stage bundle with its second stage on a throttled core, as local-biglittle's LITTLE."""
    manifest = parse_manifest((folder / MANIFEST).read_text())
    parts = tuple(
        dataclasses.replace(p, throttle_percent=QUOTA, throttled_cores=p.core_ids, pu="little") if p.stage == 1 else p
        for p in manifest.partitions
    )
    (folder / MANIFEST).write_text(dataclasses.replace(manifest, partitions=parts).text())
    return folder


def _plain(folder: Path, x: np.ndarray) -> np.ndarray:
    """The bundle's two stages run one after the other in plain sessions here."""
    mid = ort.InferenceSession(str(folder / "s0.onnx")).run(None, {"x": x})[0]
    return ort.InferenceSession(str(folder / "s1.onnx")).run(None, {"mid": mid})[0]


def _tids_in(group: Path) -> set[int]:
    return {int(t) for t in (group / "tasks").read_text().split()} if (group / "tasks").exists() else set()


@pytest.mark.exclusive  # a throttled core: other tests on it would starve the run
def test_a_throttled_unit_runs_in_its_own_process_and_no_agent_thread_is_throttled(
    throttling, two_cores, tmp_path
) -> None:
    folder = _throttle_second_stage(write_conv_bundle(tmp_path / "b", "two-stages", layers=4))
    pipeline = Pipeline(parse_manifest((folder / MANIFEST).read_text()), folder)
    pipeline.start()
    try:
        ((unit),) = pipeline._isolated.values()
        child = unit.proc.pid
        assert child != os.getpid() and unit.proc.poll() is None
        group = CGROUP_CPU / "parapipe" / "little"
        ours = {t.native_id for t in threading.enumerate()}
        throttled = _tids_in(group)
        assert throttled & {int(t) for t in os.listdir(f"/proc/{child}/task")}, "the child runs throttled"
        assert not throttled & ours, "an agent thread joined the throttle group"
        second = next(p for p in pipeline.manifest.partitions if p.stage == 1)
        assert os.sched_getaffinity(child) == set(second.core_ids)
        rng = np.random.default_rng(0)
        for _ in range(5):
            x = rng.standard_normal(CONV_SHAPE).astype(np.float32)
            (y,) = pipeline.infer({"x": x}, timeout=60).values()
            np.testing.assert_allclose(y, _plain(folder, x), rtol=1e-5, atol=1e-5)
        stats = pipeline.workers["s1"].stats
        assert stats.cpu_frames == 5 and stats.cpu_s > 0.0, "the throttled run's CPU time is the child's"
        buffers = unit.folder
        assert any(buffers.iterdir())
    finally:
        pipeline.stop()
        assert pipeline.wait_released(30)
    assert unit.proc.poll() is not None, "the child goes with the pipeline"
    assert not buffers.exists(), "and its buffers"
    assert pipeline._isolated == {}


@pytest.mark.exclusive
def test_a_partition_the_child_cannot_load_fails_the_start_naming_it(throttling, two_cores, tmp_path) -> None:
    folder = _throttle_second_stage(write_conv_bundle(tmp_path / "b", "two-stages", layers=4))
    (folder / "s1.onnx").write_bytes(b"not an onnx model")
    pipeline = Pipeline(parse_manifest((folder / MANIFEST).read_text()), folder)
    with pytest.raises(PipelineError, match=r"partition s1 \(s1.onnx\) failed to load: .*INVALID_PROTOBUF|s1.onnx"):
        pipeline.start(timeout=60)
    assert pipeline.wait_released(30)
    assert pipeline._isolated == {}


def test_a_child_that_dies_fails_the_run_with_its_exit_code(tmp_path) -> None:
    """A run whose child process was killed is an error that says so (the frame fails, the agent lives)."""
    folder = write_conv_bundle(tmp_path / "b", "two-stages", layers=2)
    core = sorted(os.sched_getaffinity(0))[0]
    unit = IsolatedUnit([core], "little", 100.0)
    try:
        session = unit.session(folder / "s0.onnx", "CPUExecutionProvider")
        x = np.ones(CONV_SHAPE, dtype=np.float32)
        (y,) = session.run(["mid"], {"x": x})
        assert y.shape == CONV_SHAPE and session.last_cpu_s > 0.0
        unit.proc.kill()
        unit.proc.wait()
        with pytest.raises(IsolatedError, match="process ended"):
            session.run(["mid"], {"x": x})
    finally:
        unit.close()
