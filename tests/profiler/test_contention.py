"""Contention: a model alone on each core and on every core at once gives a shared memory's bandwidth for it;
``parapipe profile`` stores that figure and the cost model uses it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from device_profiles.loader import load_profile
from models.graph import build_graph
from models.onnx_io import load_onnx
from parapipe.cli import app
from planner.costmodel import CostModel
from profiler.contention import Contention, measure_contention
from profiler.costtable import CostTable
from profiler.measure import PuConfig
from profiler.pinning import PinningError
from profiler.roofline import Roofline
from profiler.session import contention_configs

pytestmark = pytest.mark.exclusive  # CPU time on throttled or contended cores: run alone (Makefile)

TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
times = st.floats(0.05, 500.0)


@given(st.lists(st.tuples(times, st.floats(0.5, 4.0)), min_size=2, max_size=8), st.integers(1, 10**10))
def test_the_memory_never_slows_one_unit_alone_and_lets_through_what_all_cores_did(pus, frame_bytes) -> None:
    """For every measurement: the period floor a frame's bytes set is at most the fastest PU's time alone (a plan
    of one unit is never slowed by it) and at most what all PUs together finished per frame; the bandwidth is
    the frame's bytes over that floor."""
    alone = tuple(a for a, _ in pus)
    together = tuple(a * s for a, s in pus)
    found = Contention(tuple(f"cpu[{i}]" for i in range(len(pus))), alone, together, 3, 0.0)
    floor_ms = 1 / found.frames_per_ms
    assert floor_ms <= min(alone) * (1 + 1e-9)
    assert floor_ms <= 1 / sum(1 / t for t in together) * (1 + 1e-9)
    assert found.slowdown == pytest.approx(tuple(s for _, s in pus))
    assert frame_bytes / (found.bandwidth_gbps(frame_bytes) * 1e9) * 1e3 == pytest.approx(floor_ms)


@TWO_CORES
def test_a_model_on_both_cores_at_once(exported) -> None:
    loaded = load_onnx(exported("squeezenet1_1").path)
    cfgs = contention_configs(load_profile("local"), ["cpu"])[:2]
    assert [c.cores for c in cfgs] == [(c,) for c in sorted(os.sched_getaffinity(0))[:2]]
    found = measure_contention(loaded.ort_proto.SerializeToString(), loaded.feeds(), cfgs, seconds=0.2, rounds=2)
    assert found.rounds == 2 and len(found.alone_ms) == len(found.together_ms) == 2
    assert all(t > 0 for t in (*found.alone_ms, *found.together_ms)) and found.spread_pct >= 0
    assert "cpu[" in found.describe("squeezenet1_1") and "at once" in found.describe("squeezenet1_1")


def test_a_core_this_process_may_not_use_is_a_clear_error(exported) -> None:
    loaded = load_onnx(exported("squeezenet1_1").path)
    cfgs = [PuConfig("cpu", (0,), 1), PuConfig("cpu", (4096,), 1)]
    with pytest.raises(PinningError, match="cannot pin to cores"):
        measure_contention(loaded.ort_proto.SerializeToString(), loaded.feeds(), cfgs, seconds=0.05, rounds=1)


def test_the_local_profiles_declare_the_memory_their_cores_share() -> None:
    for name in ("local", "local-biglittle"):
        try:
            profile = load_profile(name)
        except Exception as exc:  # local-biglittle needs cgroup v1 throttling
            assert name == "local-biglittle", exc
            continue
        (memory,) = profile.memories
        assert set(memory.pus) == {p.name for p in profile.pus}
        assert memory.bandwidth_gbps.source == "estimate" and "parapipe profile" in memory.bandwidth_gbps.cite
        assert ("memories.dram.bandwidth_gbps", memory.bandwidth_gbps) in profile.quantities()
    assert load_profile("local-edge-cloud").memories == (), "two hosts share no memory"


@TWO_CORES
def test_profile_measures_the_memory_once_and_the_cost_model_uses_it(exported, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    model = exported("squeezenet1_1").path
    args = ["profile", str(model), "--board", "local", "--repeats", "3", "--warmup", "1"]
    first = CliRunner().invoke(app, [*args, "--json"])
    assert first.exit_code == 0, first.output
    (memory,) = json.loads(first.stdout)["memories"]
    assert memory["memory"] == "dram" and memory["bandwidth_gbps"] > 0 and "at once" in memory["measured"]
    table = CostTable.load(tmp_path / "costs.json")
    (record,) = [r for r in table.learnt() if r.kind == "memory-bandwidth"]
    assert record.applies_to == "dram" and record.unit == "GB/s"
    assert record.value == pytest.approx(memory["bandwidth_gbps"], rel=1e-3)
    loaded = load_onnx(model)
    graph = build_graph(loaded.proto, loaded.sha256)
    profile = load_profile("local")
    cost = CostModel.from_table(profile, graph, table)
    every = [n.name for n in graph.nodes]
    frame_bytes = Roofline(profile, graph).moved_bytes(every)
    # the measured bandwidth, unless the cost model's own time for the whole model on one unit alone (one core,
    # or both where the table measured that; profiled at another moment) is shorter than the memory's time for a
    # frame at it: a unit alone never waits for the memory
    cores = len(profile.pu("cpu").cores)
    alone = [t.ms for k in range(1, cores + 1) if (t := cost.group_ms(every, "cpu", k)).source == "measured" or k == 1]
    floor = frame_bytes / (min(alone) * 1e6)
    assert cost.memory_gbps("dram") == pytest.approx(max(record.value, floor))
    assert cost.memory_gbps("dram") != profile.memories[0].bandwidth_gbps.value
    assert cost.traffic_ms(every, "cpu") == pytest.approx(frame_bytes / (cost.memory_gbps("dram") * 1e9) * 1e3)
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "shared memory dram" in again.stdout and "reused from the cost table" in again.stdout
    assert [r.value for r in CostTable.load(tmp_path / "costs.json").learnt() if r.kind == "memory-bandwidth"] == [
        record.value
    ], "measured once"


RT_SCRIPT = """
import sys, numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
from profiler.contention import measure_contention
from profiler.measure import PuConfig

rng = np.random.default_rng(0)
nodes, inits, prev = [], [], "x"
for i in range(4):  # tens of ms a frame on one thread: long runs, so two busy workers rarely meet at the GIL
    inits.append(numpy_helper.from_array(rng.random((1024, 1024), dtype=np.float32) / 1024, f"w{i}"))
    nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"y{i}"]))
    prev = f"y{i}"
graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 1024])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [256, 1024])], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
cores = [int(c) for c in sys.argv[1:3]]
cfgs = [PuConfig("cpu", (c,), 1) for c in cores]
found = measure_contention(model, {"x": rng.random((256, 1024), dtype=np.float32)}, cfgs, seconds=0.3, rounds=1)
print("ok", found.describe("chain"))
"""


@TWO_CORES
def test_contention_under_real_time_priority_ends(tmp_path: Path) -> None:
    """Under ``chrt -f`` (as the benchmarks run on ``local``) a worker busy on every core leaves the caller's
    thread of the same priority no CPU: the measurement must end without it (it hung for minutes when the
    caller had to wake up and tell the workers to stop)."""
    import shutil
    import subprocess
    import sys

    chrt = shutil.which("chrt")
    if chrt is None or subprocess.run([chrt, "-f", "10", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot run a process under SCHED_FIFO here (chrt missing or not permitted)")
    cores = sorted(os.sched_getaffinity(0))[:2]
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [chrt, "-f", "10", sys.executable, "-c", RT_SCRIPT, *map(str, cores)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok ") and "at once" in done.stdout
