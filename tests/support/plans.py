"""Plans that exercise the executor (parallel branches, a two-stage pipeline, a replicated stage), for agent tests."""

from __future__ import annotations

import dataclasses

from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from planner.baselines import flop_pipeline, single_pu
from planner.build import to_plan
from planner.costmodel import CostModel
from planner.plan import Assignment, Plan, Provenance, Stage
from planner.problem import build_problem
from planner.timing import Assignment as UnitAssignment


def model_and_graph(exported, name: str):
    loaded = load_onnx(exported(name).path)
    return loaded, build_graph(loaded.proto, loaded.sha256, name)


def branch_plan(blocks, graph, profile, main: str, side: str, name: str, max_units: int) -> Plan:
    """Everything on one core of ``main`` except the first branch of every fork, which runs on ``side``."""
    problem = build_problem(blocks, graph, CostModel(profile, graph), max_units)
    home = next(u for u, x in enumerate(problem.units) if x.pu == main)
    away = next(u for u, x in enumerate(problem.units) if x.pu == side)
    first_branch = {succ[0] for succ in blocks.successors.values() if len(succ) >= 2}
    return to_plan(
        problem,
        UnitAssignment(tuple(away if b in first_branch else home for b in problem.blocks)),
        blocks,
        profile,
        Provenance("hand"),
        name,
    )


def executor_plans(loaded, graph, profile) -> dict[str, Plan]:
    """Plans with parallel branches on two units, a two-stage pipeline, and a replicated stage."""
    blocks = coarsen(graph, "coarse")
    branches = branch_plan(blocks, graph, profile, "c0", "c1", "branches", 4)
    pipeline = flop_pipeline(blocks, profile, [("c0", 1), ("c1", 1)], name="two-stages")
    one = single_pu(blocks, profile, "c0", 1)
    names = one.stages[0].groups[0][0].blocks
    replicated = dataclasses.replace(
        one,
        name="replicated",
        stages=(
            Stage(
                (
                    (Assignment("c0", 1, names, profile.pu("c0").cores),),
                    (Assignment("c1", 1, names, profile.pu("c1").cores),),
                )
            ),
        ),
    )
    return {"branches": branches, "two-stages": pipeline, "replicated": replicated}
