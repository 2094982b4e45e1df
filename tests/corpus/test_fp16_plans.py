"""fp16 blocks of a trained detector, planned for jetson-orin-nano's GPU, compiled into fp16 partitions and checked.

The detector (YOLOv8n from nudenet) is calibrated on real photographs. ``--precision auto``'s own steps give the
candidate blocks their fp16 loss (each alone in fp16, run in onnxruntime here: real fp16 rounding) and their fp16
time on the Ampere GPU (derived from its fp16 peak in the profile, labelled with that figure's source); the candidates
are the backbone's /model.8/ and /model.9/ blocks, which the fp32 latency plan runs on the GPU (all of them would
take half a minute to measure). The ILP puts fp16 blocks on the GPU only, the plan is checked end to end on held-back
photographs, and its compiled partitions hold the fp16 graph and stay within the budget against fp32.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from compiler import compile_plan
from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.precision import QUANTIZABLE, MixEvaluator, fp16_nodes, write_ranges
from parapipe.precision_auto import Auto, PrecisionRequest, check_and_repair, fp16_sensitivity, fp16_times
from planner.costmodel import CostModel
from planner.plan import load_plan
from planner.problem import build_problem
from planner.search import SearchOptions, best_plan
from profiler.costtable import CostTable
from tests.support.images import CALIBRATION, HELD_BACK, frames
from tests.support.realmodels import CORPUS, fetch

pytestmark = pytest.mark.corpus

BUDGET = 0.01
CANDIDATES = ("/model.8/", "/model.9/")


def test_fp16_blocks_of_a_trained_detector_run_on_the_gpu_only_and_within_the_budget(tmp_path: Path) -> None:
    path = fetch(next(m for m in CORPUS if m.name == "nudenet_320n"))
    loaded = load_onnx(path, {"images": (1, 3, 320, 320)})
    graph = build_graph(loaded.proto, loaded.sha256, "nudenet_320n")
    blocks = coarsen(graph, "coarse")
    calibration = [{"images": x} for x in frames(CALIBRATION, 3, (320, 320), seed=1)]
    held = [{"images": x} for x in frames(HELD_BACK, 2, (320, 320), seed=2)]
    profile = load_profile("jetson-orin-nano")
    cost = CostModel(profile, graph)
    op_type = {n.name: n.op_type for n in graph.nodes}
    groups = {
        b.name: b.members
        for b in blocks.nodes
        if any(op_type[m] in QUANTIZABLE for m in b.members) and b.members[0].startswith(CANDIDATES)
    }
    assert groups

    ms, source, notes = fp16_times(loaded, groups, cost, CostTable())
    assert {pu for _, pu, _ in ms} == {"ampere"}, "fp16 is offered on the GPU only: the CPU cores lack it"
    assert set(source.values()) == {"estimate"} and any("derived from its fp16 peak" in n for n in notes)
    assert all(ms[k] < cost.block_ms(groups[k[0]], "ampere", 1) for k in ms), "fp16 above the fp32 peak"
    with tempfile.TemporaryDirectory() as tmp:
        evaluator = MixEvaluator(loaded, groups, calibration, "relerr", write_ranges({}, Path(tmp) / "r.json"))
        sens, rel = fp16_sensitivity(loaded, groups, calibration, evaluator, "relerr", lambda _: None)
    assert all(0 < s < BUDGET for s in sens.values()), "fp16 rounds (a loss above 0), far less than int8"

    request = PrecisionRequest(path, BUDGET, "relerr")
    auto = Auto(loaded, graph, request, calibration, held, {}, {}, {}, {}, notes, sens, rel, ms, source)
    problem = build_problem(blocks, graph, cost, int8=auto.choice())
    plan = best_plan(blocks, graph, cost, "latency", SearchOptions(2, 4), problem=problem)
    plan, reverted = check_and_repair(plan, auto, cost, graph, lambda _: None)

    assert plan.fp16 and not plan.int8 and not reverted
    on_gpu = {b for _, _, a in plan.assignments() if a.pu == "ampere" for b in a.blocks}
    assert set(plan.fp16) <= on_gpu, "fp16 blocks run on the GPU only"
    assert plan.precision is not None and dict(plan.precision.measured)["relerr"] <= BUDGET
    assert plan.precision.held_out_frames == 2
    assert {s for b in plan.fp16 for s in plan.precision.fp16_source[b].values()} == {"estimate"}
    assert plan.precision_mix().startswith(f"fp16 {len(plan.fp16)}/{len(blocks.nodes)} blocks")

    plan_file = tmp_path / "plan.json"
    plan.save(plan_file)
    stored = json.loads(plan_file.read_text())
    assert stored["version"] == 3 and stored["fp16"] == list(plan.fp16)
    again = load_plan(plan_file)
    compiled = compile_plan(again, loaded, graph, profile)  # the chained partitions vs fp32, by the plan's metric
    half = {m for b in again.fp16 for m in again.blocks[b]}
    for p in compiled.manifest.partitions:
        holds_fp16 = any(m in half for m in _members(compiled.files[p.file]))
        assert (fp16_nodes(compiled.files[p.file]) > 0) == holds_fp16, p.name
        assert not holds_fp16 or p.pu == "ampere"
    assert compiled.precision is not None and compiled.precision.ok, compiled.precision.describe()


def _members(model: bytes) -> set[str]:
    import onnx

    return {n.name for n in onnx.load_from_string(model).graph.node}
