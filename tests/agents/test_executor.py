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
