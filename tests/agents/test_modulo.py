"""A unit's turns (``agents.modulo``): the lag rule, the order a unit grants turns in, skipped frames and stop;
and the executor takes its lags from a bundle exactly as the planner's simulator takes them from the plan."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from agents.executor import Pipeline, generate_inputs
from agents.modulo import UnitTurns, lags
from compiler import compile_plan, write_bundle
from planner.build import priced
from planner.costmodel import CostModel
from tests.support.plans import executor_plans, model_and_graph
from tests.support.tiny import eventually


def test_lag_counts_hops_between_units_and_back_in_a_units_order() -> None:
    place = {"a": ("u0", 0), "b": ("u1", 0), "c": ("u0", 1), "d": ("u0", 2), "e": ("u1", 1)}
    edges = [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("d", "e"), ("b", "e")]
    assert lags(place, edges) == {"a": 0, "b": 1, "c": 2, "d": 2, "e": 3}
    # a producer later in the unit's own order than its consumer counts a frame too
    assert lags({"x": ("u", 1), "y": ("u", 0)}, [("x", "y")]) == {"x": 0, "y": 1}


def _waiters(turns: UnitTurns, entries: list[tuple[int, int, int]], order: list[tuple[int, int]]) -> list:
    def take(frame: int, position: int, lag: int) -> None:
        assert turns.acquire(frame, position, lag)
        order.append((frame, position))
        turns.release(frame, position)

    threads = [threading.Thread(target=take, args=e, daemon=True) for e in entries]
    for t in threads:
        t.start()
    eventually("every waiter queued", lambda: len(turns._waiting) == len(entries))
    return threads


def test_a_unit_runs_the_smallest_frame_plus_lag_among_those_whose_turn_it_is() -> None:
    turns = UnitTurns(2)
    assert turns.acquire(0, 0, 0)  # the unit is busy while the others queue
    order: list[tuple[int, int]] = []
    # position 1 has lag 3: its frame 0 runs in position 0's frame 3's round (before it: the older frame),
    # its frame 1 in frame 4's, and only after frame 1's position 0
    threads = _waiters(turns, [(4, 0, 0), (0, 1, 3), (1, 1, 3), (3, 0, 0), (1, 0, 0), (2, 0, 0)], order)
    turns.release(0, 0)
    for t in threads:
        t.join(10)
    assert order == [(1, 0), (2, 0), (0, 1), (3, 0), (1, 1), (4, 0)]


def test_a_skipped_turn_passes_the_frame_on_and_stop_wakes_every_waiter() -> None:
    turns = UnitTurns(3)
    order: list[tuple[int, int]] = []
    threads = _waiters(turns, [(7, 2, 0)], order)
    turns.skip(7, 1)  # before its turn: remembered
    assert order == []
    turns.skip(7, 0)  # frame 7's positions 0 and 1 gave it up: position 2 runs
    threads[0].join(10)
    assert order == [(7, 2)]
    assert not turns._cursor and not turns._passed  # a frame every position passed is forgotten

    stuck = UnitTurns(2)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(stuck.acquire(5, 1, 0)), daemon=True)
    t.start()
    eventually("the waiter queued", lambda: len(stuck._waiting) == 1)
    stuck.close()
    t.join(10)
    assert result == [False]


@pytest.mark.zoo
def test_executor_lags_are_the_simulators_and_units_take_turns(exported, two_cores, tmp_path, monkeypatch) -> None:
    import onnxruntime as ort

    spans: list[tuple[str, float, float]] = []  # (worker thread, start, end) of every session.run

    class Timed(ort.InferenceSession):
        def run(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return super().run(*args, **kwargs)
            finally:
                spans.append((threading.current_thread().name, start, time.perf_counter()))

    monkeypatch.setattr(ort, "InferenceSession", Timed)
    loaded, graph = model_and_graph(exported, "googlenet")
    cost = CostModel(two_cores, graph)
    for label, plan in executor_plans(loaded, graph, two_cores).items():
        compiled = compile_plan(plan, loaded, graph, two_cores)
        pipeline = Pipeline(compiled.manifest, write_bundle(compiled, tmp_path / label))
        model = priced(plan, graph, cost)
        lag = model.lags()
        assert {name: w.lag for name, w in pipeline.workers.items()} == {s.name: lag[s.key] for s in model.segments}
        shared = {f"pp-{w.spec.name}": id(w.turns) for w in pipeline.workers.values() if w.turns is not None}
        if label == "branches":
            assert len(shared) >= 3 and max(lag.values()) >= 2, "googlenet's joins split the main unit"
        if not shared:
            continue
        spans.clear()
        pipeline.start()
        try:
            futures = [pipeline.submit(generate_inputs(compiled.manifest.inputs, seed=s)) for s in range(6)]
            for f in futures:
                f.result(timeout=120)
        finally:
            pipeline.stop()
        by_unit: dict[int, list[tuple[float, float]]] = {}
        for thread, start, end in spans:
            if thread in shared:
                by_unit.setdefault(shared[thread], []).append((start, end))
        assert by_unit and sum(map(len, by_unit.values())) >= 6 * len(shared)
        for runs in by_unit.values():
            runs.sort()
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(runs)), "a unit ran two partitions at once"


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
