"""A folder of plans keeps the best plan per objective under a name that is the same on every machine."""

from __future__ import annotations

import json
from pathlib import Path

from planner.catalog import read_folder, write_folder
from planner.plan import Assignment, Plan, Predicted, Provenance, Stage, load_plan


def _plan(name: str, latency: float, fps: float, mj: float, predicted: bool = True) -> Plan:
    return Plan(
        model_sha256="m" * 64,
        model_name="toy",
        device="local",
        device_sha256="",
        granularity="coarse",
        blocks={"b0": ("n0",)},
        stages=(Stage(((Assignment("cpu", 1, ("b0",)),),)),),
        provenance=Provenance("hand"),
        predicted=Predicted(latency, fps, mj) if predicted else None,
        name=name,
    )


FRONT = [
    _plan("pareto-0-ilp-latency", 10.0, 50.0, 30.0),
    _plan("pareto-1-ilp-energy", 30.0, 20.0, 8.0),
    _plan("pareto-2-ilp-throughput", 20.0, 90.0, 20.0),
]


def test_the_best_plan_per_objective_has_a_fixed_name(tmp_path: Path) -> None:
    folder = tmp_path / "plans"
    # a baseline better than every plan on every figure is not a plan of ours: it never becomes a best-of copy
    written = write_folder(folder, FRONT, {"heft": _plan("heft", 1.0, 1000.0, 1.0)})
    index = json.loads((folder / "plans.json").read_text())
    assert index["best"] == {"latency": "latency.json", "throughput": "throughput.json", "energy": "energy.json"}
    assert {"latency.json", "throughput.json", "energy.json"} <= set(written)
    assert load_plan(folder / "latency.json") == FRONT[0]
    assert load_plan(folder / "throughput.json") == FRONT[2]
    assert load_plan(folder / "energy.json") == FRONT[1]
    # what was there stays as it was: every plan under its own name, the index's lists, read_folder's answer
    assert index["version"] == 1 and index["plans"] == [f"{p.name}.json" for p in FRONT]
    assert index["baselines"] == ["baselines/heft.json"]
    assert all(load_plan(folder / f"{p.name}.json") == p for p in FRONT)
    assert (folder / "latency.json").read_bytes() == (folder / "pareto-0-ilp-latency.json").read_bytes()
    plans, base = read_folder(folder)
    assert [p.name for p in plans] == [p.name for p in FRONT] and [p.name for p in base] == ["heft"]
    (folder / "plans.json").unlink()  # without the index, the copies are not counted as plans of their own
    plans, _ = read_folder(folder)
    assert sorted(p.name for p in plans) == sorted(p.name for p in FRONT)


def test_one_plan_is_the_best_for_every_objective(tmp_path: Path) -> None:
    write_folder(tmp_path, [_plan("ilp-latency", 10.0, 50.0, 30.0)], {})
    for objective in ("latency", "throughput", "energy"):
        assert load_plan(tmp_path / f"{objective}.json").name == "ilp-latency"


def test_ties_are_broken_as_select_breaks_them(tmp_path: Path) -> None:
    write_folder(tmp_path, [_plan("b", 10.0, 50.0, 30.0), _plan("a", 10.0, 50.0, 30.0)], {})
    assert load_plan(tmp_path / "latency.json").name == "a"


def test_no_stale_copy_outlives_its_index(tmp_path: Path) -> None:
    write_folder(tmp_path, FRONT, {})
    write_folder(tmp_path, [_plan("unpriced", 0, 0, 0, predicted=False)], {})
    assert json.loads((tmp_path / "plans.json").read_text())["best"] == {}
    assert not list(tmp_path.glob("latency.json"))
