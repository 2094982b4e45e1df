"""Selection under constraints, plan folders and objectives: the planner's side of select/pareto/compare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import read_folder, write_folder
from planner.objective import Objective, ObjectiveError, parse_objective
from planner.plan import Assignment, Plan, PlanError, Predicted, Provenance, Stage
from planner.select import Constraints, meets, ratios, select_plan


def _plan(name: str, latency: float, fps: float, mj: float) -> Plan:
    return Plan(
        model_sha256="m" * 64,
        model_name="toy",
        device="local",
        device_sha256="",
        granularity="coarse",
        blocks={"b0": ("n0",)},
        stages=(Stage(((Assignment("cpu", 1, ("b0",)),),)),),
        provenance=Provenance("hand"),
        predicted=Predicted(latency, fps, mj),
        name=name,
    )


PLANS = [_plan("fast", 10.0, 50.0, 30.0), _plan("frugal", 30.0, 20.0, 8.0), _plan("wide", 20.0, 90.0, 20.0)]


def test_select_takes_the_best_plan_meeting_every_constraint() -> None:
    assert select_plan(PLANS, Objective.ENERGY, Constraints()).name == "frugal"
    assert select_plan(PLANS, "energy", Constraints(max_latency_ms=25)).name == "wide"
    assert select_plan(PLANS, Objective.THROUGHPUT, Constraints(max_mj=25)).name == "wide"
    assert meets(PLANS[0], Constraints(max_latency_ms=10.0 * (1 + 1e-9)))  # a bound met exactly is met


def test_select_says_which_constraint_to_relax() -> None:
    with pytest.raises(PlanError, match=r"relax --max-mj \(the best plan meeting the others reaches 30.00\)"):
        select_plan(PLANS, Objective.LATENCY, Constraints(max_latency_ms=12, max_mj=10))


def test_objectives_are_parsed_once_with_a_clear_error() -> None:
    assert parse_objective("latency") is Objective.LATENCY
    assert parse_objective("pareto", allow_pareto=True) == "pareto"
    with pytest.raises(ObjectiveError, match="latency, throughput or energy"):
        parse_objective("pareto")


def test_ratios_are_better_than_one_where_ours_is_better() -> None:
    ours = {Objective.LATENCY: PLANS[0], Objective.THROUGHPUT: PLANS[2], Objective.ENERGY: PLANS[1]}
    r = ratios(ours, _plan("baseline", 40.0, 25.0, 16.0))
    assert (r.latency, r.throughput, r.energy) == (4.0, 3.6, 2.0)


def test_plan_folders_round_trip_and_refuse_indexes_pointing_outside(tmp_path: Path) -> None:
    folder = tmp_path / "plans"
    write_folder(folder, PLANS[:2], {"single/pu": PLANS[2]})
    plans, base = read_folder(folder)
    assert [p.name for p in plans] == ["fast", "frugal"] and [p.name for p in base] == ["wide"]
    (folder / "plans.json").write_text(json.dumps({"version": 1, "plans": ["../../etc/passwd.json"]}))
    with pytest.raises(PlanError, match="not a plan file inside"):
        read_folder(folder)
