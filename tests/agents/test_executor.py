"""The executor reproduces the full model (max abs diff <= 1e-5) on every zoo model with plans that have
parallel branches, several stages and replication; frames come back in order."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from agents.executor import InputError, Pipeline, generate_inputs
from compiler import compile_plan, write_bundle
from models.zoo import CORE as ZOO
from tests.support.plans import executor_plans, model_and_graph


@pytest.mark.parametrize("name", list(ZOO))
def test_pipeline_outputs_equal_full_model(name: str, exported, two_cores, tmp_path) -> None:
    loaded, graph = model_and_graph(exported, name)
    full = ort.InferenceSession(loaded.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    out_names = [o.name for o in full.get_outputs()]
    for label, plan in executor_plans(loaded, graph, two_cores).items():
        compiled = compile_plan(plan, loaded, graph, two_cores)
        assert compiled.max_abs_diff <= 1e-5
        folder = write_bundle(compiled, tmp_path / label)
        pipeline = Pipeline(compiled.manifest, folder)
        pipeline.start()
        try:
            frames = [generate_inputs(compiled.manifest.inputs, seed=s) for s in range(5)]
            futures = [pipeline.submit(f) for f in frames]  # several in flight, replicas alternate
            for f, fut in zip(frames, futures, strict=True):
                got = fut.result(timeout=120)
                for out_name, ref in zip(out_names, full.run(None, f), strict=True):
                    assert np.max(np.abs(got[out_name].astype(np.float64) - ref)) <= 1e-5, (name, label)
        finally:
            pipeline.stop()
        if label == "branches" and name != "mobilenet_v2":
            assert len({p.pu for p in compiled.manifest.partitions}) == 2
        if label == "replicated":
            assert compiled.manifest.replicas == (2,)


def test_workers_are_pinned_to_their_cores(exported, two_cores, tmp_path) -> None:
    loaded, graph = model_and_graph(exported, "squeezenet1_1")
    compiled = compile_plan(executor_plans(loaded, graph, two_cores)["two-stages"], loaded, graph, two_cores)
    folder = write_bundle(compiled, tmp_path / "b")
    pipeline = Pipeline(compiled.manifest, folder)
    pipeline.start()
    try:
        import os

        for w in pipeline.workers.values():
            affinity = os.sched_getaffinity(w.thread.native_id)
            assert affinity == set(w.spec.core_ids)
    finally:
        pipeline.stop()


def test_bad_frames_are_refused(exported, two_cores, tmp_path) -> None:
    loaded, graph = model_and_graph(exported, "squeezenet1_1")
    compiled = compile_plan(executor_plans(loaded, graph, two_cores)["two-stages"], loaded, graph, two_cores)
    pipeline = Pipeline(compiled.manifest, write_bundle(compiled, tmp_path / "b"))
    pipeline.start()
    try:
        good = generate_inputs(compiled.manifest.inputs)
        name = next(iter(good))
        with pytest.raises(InputError, match="shape"):
            pipeline.infer({name: good[name][..., :10]})
        with pytest.raises(InputError, match="float32"):
            pipeline.infer({name: good[name].astype(np.float64)})
        with pytest.raises(InputError, match="missing"):
            pipeline.infer({})
        assert pipeline.infer(good, timeout=60)  # still serving
    finally:
        pipeline.stop()


def _const_bundle(folder) -> tuple:
    """Partition ``const`` has no inputs (Cast of a weight, as exporters leave them); ``add`` adds it to x."""
    import os

    from onnx import TensorProto, helper, numpy_helper

    from agents.bundle import MANIFEST, Manifest, TensorSpec
    from tests.support.tiny import cpu_partition

    weight = numpy_helper.from_array(np.arange(8, dtype=np.float16).reshape(1, 8), "w16")
    const = helper.make_graph(
        [helper.make_node("Cast", ["w16"], ["w"], to=TensorProto.FLOAT)],
        "const", [], [helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 8])], [weight],
    )  # fmt: skip
    add = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "add",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 8]) for n in ("x", "w")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    files = {
        name: helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
        for name, g in (("const", const), ("add", add))
    }
    core = sorted(os.sched_getaffinity(0))[0]
    parts = (
        cpu_partition("const", "const.onnx", files["const"], core, inputs=(), outputs=("w",), unit=0),
        cpu_partition("add", "add.onnx", files["add"], core, inputs=("x", "w"), outputs=("y",), unit=1),
    )
    manifest = Manifest(
        model_sha256="0" * 64, plan_name="const", device="test", pipelined=True, max_inflight=2, replicas=(1,),
        inputs=(TensorSpec("x", "float32", (1, 8)),), outputs=(TensorSpec("y", "float32", (1, 8)),),
        partitions=parts, power=(1.0, 0.5, 1),
    )  # fmt: skip
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / f"{name}.onnx").write_bytes(data)
    (folder / MANIFEST).write_text(manifest.text())
    return manifest, folder


def test_a_partition_without_inputs_runs_once_per_frame(tmp_path) -> None:
    """A constant subgraph (no inputs) runs for the frames that entered, no further: running ahead it
    filled its consumers' inboxes with a tensor per future frame (an agent grew to 23 GB on MiniLM)."""
    import time

    manifest, folder = _const_bundle(tmp_path / "b")
    pipeline = Pipeline(manifest, folder)
    pipeline.start()
    try:
        time.sleep(0.3)  # a worker that runs ahead does so while no frame is sent
        for i in range(5):
            x = np.full((1, 8), i, dtype=np.float32)
            got = pipeline.infer({"x": x}, timeout=30)
            assert np.array_equal(got["y"], x + np.arange(8, dtype=np.float32))
        stats = pipeline.stats()
        assert stats["const"].frames == 5 and stats["add"].frames == 5
        assert pipeline.workers["add"].queue_depth() == 0
    finally:
        pipeline.stop()


def test_a_one_partition_pipeline_runs_idle_frames_in_the_callers_thread(tmp_path) -> None:
    """``infer`` on a pipeline of one partition runs the frame in the calling thread (no handoff to the
    worker: its queue wait stays 0), pinned to the partition's core for the run only; frames from
    several threads at once (inline or queued) all come back right, a failing frame fails naming the
    partition, and the counts add up."""
    import os
    import threading

    from agents.bundle import MANIFEST, parse_manifest
    from agents.executor import PipelineError
    from tests.support.tiny import TABLE_ROWS, expected, frame, write_tiny_bundle

    folder = write_tiny_bundle(tmp_path / "b", stages=1, max_inflight=2)
    pipeline = Pipeline(parse_manifest((folder / MANIFEST).read_text()), folder)
    pipeline.start()
    try:
        before = os.sched_getaffinity(0)
        for i in range(20):
            assert np.array_equal(pipeline.infer(frame(i % TABLE_ROWS), timeout=30)["t0"], expected(i % TABLE_ROWS, 1))
        assert os.sched_getaffinity(0) == before  # the caller's own cores again
        stats = pipeline.stats()["s0"]
        assert stats.frames == 20 and stats.wait_s == 0.0  # never queued for the worker
        with pytest.raises(PipelineError, match="partition s0"):
            pipeline.infer(frame(TABLE_ROWS), timeout=30)
        with pytest.raises(InputError):
            pipeline.infer({"idx": np.zeros(2, dtype=np.int64)}, timeout=30)

        wrong: list[object] = []

        def caller(k: int) -> None:
            for i in range(40):
                idx = (i + k) % TABLE_ROWS
                got = pipeline.infer(frame(idx), timeout=30)["t0"]
                if not np.array_equal(got, expected(idx, 1)):
                    wrong.append((k, i))

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not wrong
        assert pipeline.in_flight == 0
        assert pipeline.frames_done == 20 + 4 * 40 and pipeline.frames_failed == 1
        assert pipeline.stats()["s0"].frames == 20 + 4 * 40
    finally:
        pipeline.stop()


def test_a_submitting_thread_runs_the_idle_entry_partition_itself(tmp_path) -> None:
    """A frame submitted while the partition reading the model's inputs is idle and waiting for it runs
    there in the submitting thread (never queued for that worker: its queue wait stays 0; the caller's
    cores are its own again after), and the later stage still gets it from its worker; frames submitted
    while it is busy queue for the worker as before, which goes on past the frames taken from it;
    ``run=False`` always hands over. A failing frame fails naming the partition, and the counts add up."""
    import os

    from agents.bundle import MANIFEST, parse_manifest
    from agents.executor import PipelineError
    from tests.support.tiny import TABLE_ROWS, expected, frame, write_tiny_bundle

    folder = write_tiny_bundle(tmp_path / "b", stages=2, max_inflight=4)
    pipeline = Pipeline(parse_manifest((folder / MANIFEST).read_text()), folder)
    pipeline.start()
    try:
        before = os.sched_getaffinity(0)
        for i in range(10):  # one at a time: s0 is idle for each
            got = pipeline.result(pipeline.submit(frame(i % TABLE_ROWS)), 30)
            assert np.array_equal(got["t1"], expected(i % TABLE_ROWS, 2))
        assert os.sched_getaffinity(0) == before
        stats = pipeline.stats()
        assert stats["s0"].frames == 10 and stats["s0"].wait_s == 0.0  # run by the submitting thread
        assert stats["s1"].frames == 10 and stats["s1"].wait_s > 0.0  # handed to s1's worker
        with pytest.raises(PipelineError, match="partition s0"):
            pipeline.result(pipeline.submit(frame(TABLE_ROWS)), 30)

        pipeline.reset_stats()
        queued = [pipeline.submit(frame(i % TABLE_ROWS), run=False) for i in range(4)]  # all to the worker
        assert all(
            np.array_equal(pipeline.result(f, 30)["t1"], expected(i % TABLE_ROWS, 2)) for i, f in enumerate(queued)
        )
        assert pipeline.stats()["s0"].frames == 4 and pipeline.stats()["s0"].wait_s > 0.0

        window = [(i, pipeline.submit(frame(i % TABLE_ROWS))) for i in range(4)]  # some inline, some queued
        for i in range(4, 44):  # a stream: a frame in, the oldest out
            window.append((i, pipeline.submit(frame(i % TABLE_ROWS))))
            k, oldest = window.pop(0)
            assert np.array_equal(pipeline.result(oldest, 30)["t1"], expected(k % TABLE_ROWS, 2))
        for k, f in window:
            assert np.array_equal(pipeline.result(f, 30)["t1"], expected(k % TABLE_ROWS, 2))
        assert pipeline.in_flight == 0
        assert pipeline.frames_done == 10 + 4 + 44 and pipeline.frames_failed == 1
    finally:
        pipeline.stop()


@pytest.fixture(scope="module")
def tiny_pipelines(tmp_path_factory):
    """Tiny pipelines of 1 to 3 stages, started once for the property test below."""
    from agents.bundle import MANIFEST, parse_manifest
    from tests.support.tiny import write_tiny_bundle

    pipelines: dict[int, Pipeline] = {}
    for stages in (1, 2, 3):
        folder = write_tiny_bundle(tmp_path_factory.mktemp(f"s{stages}"), stages=stages, max_inflight=4)
        pipelines[stages] = Pipeline(parse_manifest((folder / MANIFEST).read_text()), folder)
        pipelines[stages].start()
    yield pipelines
    for p in pipelines.values():
        p.stop()


def test_every_frame_comes_back_right_however_it_is_submitted(tiny_pipelines) -> None:
    """For any frames (some failing in stage 0), submitted by the thread running the entry partition
    itself when it is idle or handed over (``run``), with any number in flight: each frame comes back
    with its own outputs or fails naming the partition, and the pipeline's counts add up."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from agents.executor import PipelineError
    from tests.support.tiny import TABLE_ROWS, expected, frame

    @settings(max_examples=60, deadline=None)
    @given(
        stages=st.sampled_from([1, 2, 3]),
        frames=st.lists(st.tuples(st.integers(0, TABLE_ROWS + 1), st.booleans()), min_size=1, max_size=24),
        window=st.integers(1, 4),
    )
    def check(stages: int, frames: list[tuple[int, bool]], window: int) -> None:
        pipeline = tiny_pipelines[stages]
        done, failed = pipeline.frames_done, pipeline.frames_failed
        out = f"t{stages - 1}"
        pending: list[tuple[int, object]] = []

        def collect(idx: int, future) -> None:
            if idx >= TABLE_ROWS:
                with pytest.raises(PipelineError, match="partition s0"):
                    pipeline.result(future, 30)
            else:
                assert np.array_equal(pipeline.result(future, 30)[out], expected(idx, stages))

        for idx, run in frames:
            pending.append((idx, pipeline.submit(frame(idx), 30, run=run)))
            if len(pending) >= window:
                collect(*pending.pop(0))
        for item in pending:
            collect(*item)
        bad = sum(1 for idx, _ in frames if idx >= TABLE_ROWS)
        assert pipeline.in_flight == 0
        assert (pipeline.frames_done - done, pipeline.frames_failed - failed) == (len(frames) - bad, bad)

    check()
