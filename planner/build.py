"""From a solution (block -> unit) to a ``Plan``: units become assignments, stages come from the data flow.

Units that exchange data both ways belong to one stage (strongly connected components
of the unit graph); stages are the longest-path levels of the component graph, so
units of one stage work side by side and stage i only feeds stages after it. With
more levels than ``max_stages``, neighbouring levels are merged (a unit still belongs
to exactly one stage).
"""

from __future__ import annotations

import dataclasses

from device_profiles.schema import DeviceProfile
from models.graph import OpGraph
from planner.costmodel import CostModel
from planner.plan import Assignment, Plan, PlanError, PlanPrecision, Provenance, Stage
from planner.problem import Problem
from planner.segments import lower, segment_precision
from planner.simulate import PlanModel, analytic, simulate
from planner.timing import Assignment as UnitAssignment


def to_plan(
    problem: Problem,
    solution: UnitAssignment,
    blocks: OpGraph,
    profile: DeviceProfile,
    provenance: Provenance,
    name: str,
    pipelined: bool = True,
    max_stages: int | None = None,
) -> Plan:
    if solution.int8 and problem.precision is None:
        # without calibration ranges the int8 blocks cannot be built: refuse rather than run them in fp32
        raise PlanError(
            f"the solution runs {len(solution.int8)} block(s) in int8 or fp16 but the problem carries no "
            "calibration ranges (Int8Choice.precision); plan with --precision auto --calibration FILE"
        )
    # a block in reduced precision runs in its unit's: fp16 on the units that offer fp16, else int8; and int8 on
    # such a unit where the solution says so (its second reduced precision)
    half = {b for b in solution.int8 if problem.reduced(solution.block_unit[b], solution.level(b)) == "fp16"}
    used = list(dict.fromkeys(solution.block_unit))
    # each assignment lists its blocks in the order its unit runs them (the solver's order)
    blocks_of = {u: tuple(problem.blocks[b] for b in solution.sequence() if solution.block_unit[b] == u) for u in used}
    succ: dict[int, set[int]] = {u: set() for u in used}
    for i, j, _ in problem.edges:
        a, b = solution.block_unit[i], solution.block_unit[j]
        if a != b:
            succ[a].add(b)
    level = _levels(used, succ)
    count = max(level.values()) + 1
    limit = max_stages or problem.max_stages
    if count > limit:  # merge neighbouring levels evenly
        level = {u: lv * limit // count for u, lv in level.items()}
        count = limit
    free = {p.name: list(p.cores) for p in profile.pus if p.kind == "cpu"}
    stages = []
    for s in range(count):
        group = []
        for u in sorted((u for u in used if level[u] == s), key=lambda u: min(solution.block_unit.index(u), 10**9)):
            unit = problem.units[u]
            ids: tuple[int, ...] = ()
            if unit.kind == "cpu":
                ids = tuple(free[unit.pu][: unit.cores])
                del free[unit.pu][: unit.cores]
            group.append(Assignment(unit.pu, unit.cores, blocks_of[u], ids))
        if group:
            stages.append(Stage((tuple(group),)))
    return Plan(
        model_sha256=blocks.model_sha256,
        model_name=blocks.name,
        device=profile.name,
        device_sha256=profile.content_hash(),
        granularity=blocks.granularity,
        blocks={b.name: b.members for b in blocks.nodes},
        stages=tuple(stages),
        provenance=provenance,
        name=name,
        pipelined=pipelined,
        int8=tuple(problem.blocks[b] for b in sorted(solution.int8) if b not in half),
        precision=_precision(problem, solution) if solution.int8 else None,
        fp16=tuple(problem.blocks[b] for b in sorted(half)),
    )


def _precision(problem: Problem, solution: UnitAssignment) -> PlanPrecision:
    """The problem's precision record with the int8 (fp16) times of the plan's int8 (fp16) blocks on every unit
    size of that precision that runs them in fp32 too (what ``evaluate`` prices them at)."""
    assert problem.precision is not None
    times: dict[str, dict[str, dict[str, float]]] = {"int8": {}, "fp16": {}}
    for level, table in ((1, problem.int8_cost), (2, problem.second_cost)):
        for (b, u), ms in sorted(table.items()):
            if b in solution.int8 and (b, u) in problem.cost:
                unit, mine = problem.units[u], problem.reduced(solution.block_unit[b], solution.level(b))
                if problem.reduced(u, level) == mine:
                    times[mine].setdefault(problem.blocks[b], {})[f"{unit.pu}x{unit.cores}"] = ms
    half = {b: src for b, src in problem.precision.fp16_source.items() if b in times["fp16"]}
    return dataclasses.replace(problem.precision, int8_ms=times["int8"], fp16_ms=times["fp16"], fp16_source=half)


def _levels(units: list[int], succ: dict[int, set[int]]) -> dict[int, int]:
    """Longest-path level of each unit's strongly connected component (networkx's condensation)."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(units)
    g.add_edges_from((u, w) for u in units for w in succ[u])
    dag = nx.condensation(g)
    depth: dict[int, int] = {}
    for c in nx.topological_sort(dag):
        depth[c] = max((depth[p] + 1 for p in dag.predecessors(c)), default=0)
    return {u: depth[dag.graph["mapping"][u]] for u in units}


def priced(plan: Plan, graph: OpGraph, cost: CostModel) -> PlanModel:
    """The plan lowered and priced; a segment's int8 (fp16) blocks at the int8 (fp16) times the plan records (the
    cost model prices every block in fp32 on PUs that compute fp32), or the whole segment at its time measured in
    its precision mix where the cost table has one (what ``parapipe tune`` fed back)."""
    model = PlanModel(plan, graph, cost)
    if plan.reduced and plan.precision is not None:
        wholes: dict[tuple[str, int], tuple[float, float]] = {}
        for seg in model.segments:
            label = segment_precision(plan, seg, cost.profile)
            measured = None if label == "fp32" else cost.reduced_group_ms(seg.members, seg.pu, seg.cores, label)
            fp32 = saved = 0.0
            for b in seg.blocks:
                ms = cost.block_ms(plan.blocks[b], seg.pu, seg.cores)
                fp32 += ms
                int8 = plan.reduced_ms(b, f"{seg.pu}x{seg.cores}")
                if int8 is not None:
                    saved += ms - int8
            if measured is not None:
                # this partition was measured in this mix (``parapipe tune``): its time, plus the gRPC CPU time the
                # plan model added to its fp32 figure
                whole = model.ms[seg.key]
                model.ms[seg.key] = measured + whole - cost.group_ms(seg.members, seg.pu, seg.cores).ms
            elif saved and fp32 > 0:
                # what int8 saves, as the ILP counts it; a segment the cost model prices below the sum of its
                # blocks (a measured partition) keeps at least its share of the mix's time
                whole = model.ms[seg.key]
                model.ms[seg.key] = max(whole - saved, whole * (fp32 - saved) / fp32, 1e-6)
            if seg.key in model.traffic:
                # and the memory's row int8 blocks take off, as the ILP counts it (``Problem.traffic_share``): the
                # whole model's traffic times the share of the whole model's time on this unit each one saves
                memory, bytes_ms = model.traffic[seg.key]
                config = (str(seg.pu), seg.cores)
                if config not in wholes:
                    wholes[config] = (
                        sum(cost.block_ms(m, seg.pu, seg.cores) for m in plan.blocks.values()),
                        sum(cost.traffic_ms(m, seg.pu) for m in plan.blocks.values()),
                    )
                whole_ms, whole_traffic = wholes[config]
                less = 0.0
                for b in seg.blocks:
                    int8 = plan.reduced_ms(b, f"{seg.pu}x{seg.cores}")
                    ms = cost.block_ms(plan.blocks[b], seg.pu, seg.cores)
                    if int8 is not None and ms > 0 and int8 < ms:
                        own = cost.traffic_ms(plan.blocks[b], seg.pu)
                        if whole_ms > 0 and own > 0:
                            less += whole_traffic * (ms - int8) / whole_ms
                        else:
                            less += own * (1.0 - int8 / ms)
                # (below 0 for a segment of int8 blocks with few bytes of their own: the row is a frame's sum)
                model.traffic[seg.key] = (memory, bytes_ms - less)
    return model


def frame_overhead_ms(plan: Plan, graph: OpGraph, cost: CostModel) -> float:
    """What a frame of this plan alone spends outside its partitions' runs (``CostModel.frame_overhead_ms``)."""
    if not cost.calibration.frame_ms:
        return 0.0  # none learnt: no lowering to count partitions (``best_plan`` asks for every latency plan)
    segments = lower(plan, graph, cost.profile)
    return cost.frame_overhead_ms((s.pu for s in segments), len(segments))


def evaluate(plan: Plan, graph: OpGraph, cost: CostModel, frames: int = 240) -> Plan:
    """The plan with its analytic prediction and its simulation attached (``frames=0``: analytic only)."""
    model = priced(plan, graph, cost)
    simulated = simulate(model, frames).predicted() if frames else None
    return dataclasses.replace(plan, predicted=analytic(model), simulated=simulated)


def replicate(plan: Plan, graph: OpGraph, cost: CostModel, profile: DeviceProfile) -> Plan:
    """Copy the bottleneck stage onto free cores (same PU, same core count) while throughput improves.

    The result carries the analytic prediction only; ``evaluate`` it to add the simulation."""
    best = evaluate(plan, graph, cost, frames=0) if plan.predicted is None else plan
    while True:
        used: dict[str, set[int]] = {}
        for _, _, a in best.assignments():
            used.setdefault(a.pu, set()).update(a.core_ids)
        free = {
            p.name: [c for c in p.cores if c not in used.get(p.name, set())] for p in profile.pus if p.kind == "cpu"
        }
        model = priced(best, graph, cost)
        loads: dict[int, float] = {}
        for seg in model.segments:
            load = model.ms[seg.key] * model.factor[seg.key] / best.stages[seg.stage].replicas
            loads[seg.stage] = max(loads.get(seg.stage, 0.0), load)
        if not loads:
            return best
        s = max(loads, key=loads.__getitem__)
        stage = best.stages[s]
        copy = []
        for a in stage.groups[0]:
            if a.pu not in free or len(free[a.pu]) < a.cores:
                return best
            ids = tuple(free[a.pu][: a.cores])
            del free[a.pu][: a.cores]
            copy.append(dataclasses.replace(a, core_ids=ids))
        stages = list(best.stages)
        stages[s] = Stage((*stage.groups, tuple(copy)))
        trial = evaluate(
            dataclasses.replace(best, stages=tuple(stages), name=best.name + "+rep"), graph, cost, frames=0
        )
        if trial.predicted.throughput_fps <= best.predicted.throughput_fps * 1.001:
            return best
        best = trial
