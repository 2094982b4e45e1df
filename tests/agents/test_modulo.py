"""A unit's turns (``profiler.modulo``): the lag rule and the order a unit takes turns in; the executor takes its
lags from a bundle exactly as the planner's simulator takes them from the plan, and runs a unit's partitions on
one thread, one at a time, passing failed frames on."""

from __future__ import annotations

import itertools
import time

import pytest

from agents.executor import Pipeline, generate_inputs
from compiler import compile_plan, write_bundle
from planner.build import priced
from planner.costmodel import CostModel
from profiler.modulo import lags, pick
from tests.support.plans import executor_plans, model_and_graph


def test_lag_counts_hops_between_units_and_back_in_a_units_order() -> None:
    place = {"a": ("u0", 0), "b": ("u1", 0), "c": ("u0", 1), "d": ("u0", 2), "e": ("u1", 1)}
    edges = [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("d", "e"), ("b", "e")]
    assert lags(place, edges) == {"a": 0, "b": 1, "c": 2, "d": 2, "e": 3}
    # a producer later in the unit's own order than its consumer counts a frame too
    assert lags({"x": ("u", 1), "y": ("u", 0)}, [("x", "y")]) == {"x": 0, "y": 1}


def test_a_unit_runs_the_smallest_frame_plus_lag_then_the_older_frame() -> None:
    # position 1 has lag 3: its frame 0 runs in position 0's frame 3's round, before it (the older frame)
    assert pick([(4, 0, 0), (0, 3, 1), (3, 0, 0), (2, 0, 0)]) == (2, 0, 0)
    assert pick([(4, 0, 0), (0, 3, 1), (3, 0, 0)]) == (0, 3, 1)
    assert pick([(4, 0, 0), (3, 0, 0)]) == (3, 0, 0)
    assert pick([(5, 0, 2), (5, 0, 1)]) == (5, 0, 1)  # one frame's partitions in the unit's order
    assert pick([]) is None


@pytest.mark.zoo
def test_executor_lags_are_the_simulators_and_a_unit_runs_its_partitions_in_turn(
    exported, two_cores, tmp_path, monkeypatch
) -> None:
    """The executor's lags are the simulator's; the partitions of a unit run on one thread, one at a time; a
    frame that fails in a unit's first partition is passed on by the unit's later ones, and the frames after
    it come back with the full model's outputs."""
    import numpy as np
    import onnxruntime as ort

    runs: list[tuple[int, float, float]] = []  # (session, start, end) of every run
    failing: dict[int, int] = {}  # session id -> the call that raises

    class Timed(ort.InferenceSession):
        def run(self, *args, **kwargs):
            calls = sum(1 for r in runs if r[0] == id(self))
            start = time.perf_counter()
            try:
                if failing.get(id(self)) == calls:
                    raise RuntimeError("injected failure")
                return super().run(*args, **kwargs)
            finally:
                runs.append((id(self), start, time.perf_counter()))

    loaded, graph = model_and_graph(exported, "googlenet")
    full = ort.InferenceSession(loaded.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", Timed)
    cost = CostModel(two_cores, graph)
    for label, plan in executor_plans(loaded, graph, two_cores).items():
        compiled = compile_plan(plan, loaded, graph, two_cores)
        pipeline = Pipeline(compiled.manifest, write_bundle(compiled, tmp_path / label))
        model = priced(plan, graph, cost)
        lag = model.lags()
        assert {name: w.lag for name, w in pipeline.workers.items()} == {s.name: lag[s.key] for s in model.segments}
        units: dict[tuple[int, int, int], list] = {}
        for w in pipeline.workers.values():
            units.setdefault((w.spec.stage, w.spec.group, w.spec.unit), []).append(w)
        for ws in units.values():
            assert len({id(w.thread) for w in ws}) == 1, "one thread per unit"
        assert len({id(w.thread) for w in pipeline.workers.values()}) == len(units)
        shared = [sorted(ws, key=lambda w: w.spec.segment) for ws in units.values() if len(ws) > 1]
        if label == "branches":
            assert shared and max(lag.values()) >= 2, "googlenet's joins split the main unit"
        if not shared:
            continue
        runs.clear()
        pipeline.start()
        try:
            first = shared[0][0]
            failing.clear()
            failing[id(first.session)] = 5  # frame 5 fails in the unit's first partition
            unit_of = {id(w.session): i for i, ws in enumerate(shared) for w in ws}
            frames = [generate_inputs(compiled.manifest.inputs, seed=s) for s in range(8)]
            futures = [pipeline.submit(f) for f in frames]
            for k, (frame, fut) in enumerate(zip(frames, futures, strict=True)):
                if k == 5:
                    with pytest.raises(Exception, match="injected failure"):
                        fut.result(timeout=120)
                    continue
                got = fut.result(timeout=120)
                for out, ref in zip([o.name for o in full.get_outputs()], full.run(None, frame), strict=True):
                    assert np.max(np.abs(got[out].astype(np.float64) - ref)) <= 1e-5, (label, k)
        finally:
            pipeline.stop()
        by_unit: dict[int, list[tuple[float, float]]] = {}
        for session, start, end in runs:
            if session in unit_of:
                by_unit.setdefault(unit_of[session], []).append((start, end))
        assert by_unit, label
        for spans in by_unit.values():
            spans.sort()
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), "a unit ran two partitions at once"


def test_a_bundle_whose_partitions_wait_for_each_other_is_refused(tmp_path) -> None:
    from agents.bundle import Manifest, TensorSpec
    from agents.executor import PipelineError
    from tests.support.tiny import cpu_partition

    parts = (
        cpu_partition("a", "a.onnx", b"a", 0, inputs=("x", "t1"), outputs=("t0",), unit=0),
        cpu_partition("b", "b.onnx", b"b", 0, inputs=("t0",), outputs=("t1",), unit=1),
    )
    manifest = Manifest(
        model_sha256="0" * 64,
        plan_name="cycle",
        device="test",
        pipelined=True,
        max_inflight=2,
        replicas=(1,),
        inputs=(TensorSpec("x", "float32", (1,)),),
        outputs=(TensorSpec("t1", "float32", (1,)),),
        partitions=parts,
    )
    with pytest.raises(PipelineError, match="cycle"):
        Pipeline(manifest, tmp_path)
