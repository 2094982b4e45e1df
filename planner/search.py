"""Planning end to end: baselines, the ILP per objective, replication, the Pareto set.

``baselines`` returns every baseline as a ``Plan``; ``best_plan`` solves the ILP for
one objective, warm-started from the best baseline inside the ILP's search space, and
never returns a plan that predicts worse than that baseline; ``pareto_set`` sweeps
epsilon constraints and keeps the non-dominated, deduplicated plans.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from device_profiles.schema import DeviceProfile
from models.graph import OpGraph
from planner import heuristics as H
from planner.build import evaluate, frame_overhead_ms, replicate, to_plan
from planner.costmodel import CostModel
from planner.highs import LimitCut
from planner.ilp import (
    NO_BOUNDS,
    OBJECTIVES,
    Bounds,
    Solution,
    ordering_rows,
    rows_within,
    segment_cuts,
    solve,
)
from planner.local_search import polish
from planner.plan import Plan, PlanError, Provenance, memory_use
from planner.problem import Problem, build_problem
from planner.select import Constraints, meets
from planner.timing import Assignment, fits, schedule
from planner.unitname import UnitName

Progress = Callable[[str], None]
T = TypeVar("T")
UNBOUNDED = Constraints()
# The baselines whose plans lie inside the ILP's search space (the ILP may never lose to them).
IN_ILP_SPACE = ("pipe-only", "para-only", "single-pu", "layer-switched", "heft", "cpop")


@dataclass(frozen=True)
class Candidate:
    name: str
    assignment: Assignment
    pipelined: bool


def key(plan: Plan, objective: str) -> float:
    """Lower is better."""
    p = plan.predicted
    assert p is not None
    return {"latency": p.latency_ms, "throughput": 1000.0 / p.throughput_fps, "energy": p.energy_mj}[objective]


def _candidates(problem: Problem) -> list[Candidate]:
    """The in-space heuristics, computed once per problem (a Pareto sweep asks for them many times)."""
    if "candidates" not in problem.derived:
        problem.derived["candidates"] = tuple(_compute_candidates(problem))
    return list(problem.derived["candidates"])


def _compute_candidates(problem: Problem) -> list[Candidate]:
    fu = H.full_units(problem)
    out: list[Candidate] = []
    singles = [a for u in fu if (a := H.single_unit(problem, u)) is not None]
    if singles:
        out.append(Candidate("single-pu", min(singles, key=lambda a: schedule(problem, a).latency_ms), False))
    out.append(Candidate("layer-switched", H.layer_switched(problem, fu), False))
    out.append(Candidate("para-only", H.list_schedule(problem, fu), False))
    out.append(Candidate("heft", H.heft(problem, fu), False))
    out.append(Candidate("cpop", H.cpop(problem, fu), False))
    pipe = H.pipe_only(problem)
    if pipe is not None:
        out.append(Candidate("pipe-only", pipe, True))
    return out


def warm_candidates(problem: Problem, objective: str) -> list[Candidate]:
    """The in-space baselines, and the warm starts built for the objective (computed once per problem):
    load balancing for throughput, the segment-by-segment ILP for latency."""
    cands = _candidates(problem)
    if objective == "throughput":
        if "balanced" not in problem.derived:
            problem.derived["balanced"] = H.balanced(problem)
        if (bal := problem.derived["balanced"]) is not None:
            cands.append(Candidate("balanced", bal, True))
    if objective == "latency":
        if "fastest" not in problem.derived:
            problem.derived["fastest"] = H.fastest(problem)
        if (fast := problem.derived["fastest"]) is not None:
            cands.append(Candidate("segmented", fast, False))
    if problem.int8_cost:  # with a precision choice: each placement with int8 where it pays, too
        cands += [Candidate(f"{c.name}+int8", H.with_int8(problem, c.assignment), c.pipelined) for c in cands]
    return cands


def warm_start(problem: Problem, objective: str, cands: list[Candidate], bounds: Constraints = UNBOUNDED) -> Candidate:
    """The candidate that fits memory, meets the bounds (where one does) and predicts best for the objective
    in the ILP's model."""
    measure = {
        "latency": lambda a: schedule(problem, a).latency_ms,
        "throughput": lambda a: schedule(problem, a).period_ms,
        "energy": lambda a: schedule(problem, a).energy_mj,
    }[objective]
    max_period = 1000.0 / bounds.min_fps if bounds.min_fps else None
    return min(
        cands,
        key=lambda c: (
            not fits(problem, c.assignment),
            not _meets(problem, c.assignment, bounds.max_latency_ms, max_period, bounds.max_mj),
            measure(c.assignment),
        ),
    )


def bounded_candidates(problem: Problem, objective: str, bounds: Constraints) -> list[Candidate]:
    """The warm candidates for ``objective``; under bounds, those built for the other objectives too (computed
    once per problem): a floor on throughput is met by the load-balanced start before any latency start, a
    ceiling on latency by the latency start, and a solve without a start that meets its bounds may find no
    plan in its time (a Pareto sweep's bounded solves)."""
    cands = warm_candidates(problem, objective)
    if bounds == UNBOUNDED:
        return cands
    names = {c.name for c in cands}
    for other in OBJECTIVES:
        for c in warm_candidates(problem, other):
            if c.name not in names:
                names.add(c.name)
                cands.append(c)
    return cands


def baselines(
    blocks: OpGraph,
    graph: OpGraph,
    cost: CostModel,
    max_stages: int = 4,
    problem: Problem | None = None,
    frames: int = 240,
) -> dict[str, Plan]:
    """Every baseline as an evaluated Plan (same type as solved plans), simulated over ``frames`` frames (0: the
    analytic prediction only). Where units offer several runtimes, on each unit's own (the first choice)."""
    choices = cost.runtime_choices()
    if len(choices) > 1:
        return baselines(blocks, graph, choices[0], max_stages, None, frames)
    problem = problem or build_problem(blocks, graph, cost, max_stages)
    cached = f"baselines@{frames}"
    if cached not in problem.derived:
        profile = cost.profile
        plans: dict[str, Plan] = {}
        for c in _candidates(problem):
            plan = to_plan(
                problem, c.assignment, blocks, profile, Provenance(f"baseline:{c.name}"), c.name, c.pipelined
            )
            plans[c.name] = evaluate(plan, graph, cost, frames)
        ort = _ort_all_cores(blocks, profile)
        if ort is not None:
            plans["ort-all-cores"] = evaluate(ort, graph, cost, frames)
        problem.derived[cached] = plans
    return dict(problem.derived[cached])


def _ort_all_cores(blocks: OpGraph, profile: DeviceProfile) -> Plan | None:
    """What a user does without parapipe: one onnxruntime session with every CPU core of the board."""
    from planner.plan import Assignment as PlanAssignment
    from planner.plan import Stage

    cpus = [
        p
        for p in profile.pus
        if p.kind == "cpu" and p.host == profile.pus[0].host and p.execution_provider == "CPUExecutionProvider"
    ]
    if not cpus:
        return None
    pu = UnitName.spanning(p.name for p in cpus)
    cores = sum(len(p.cores) for p in cpus)
    ids = tuple(c for p in cpus for c in p.cores)
    stage = Stage(((PlanAssignment(pu, cores, tuple(b.name for b in blocks.nodes), ids),),))
    return Plan(
        model_sha256=blocks.model_sha256,
        model_name=blocks.name,
        device=profile.name,
        device_sha256=profile.content_hash(),
        granularity=blocks.granularity,
        blocks={b.name: b.members for b in blocks.nodes},
        stages=(stage,),
        provenance=Provenance("baseline:ort-all-cores"),
        name="ort-all-cores",
        pipelined=False,
    )


@dataclass(frozen=True)
class SearchOptions:
    """How hard to search: what the solver gets per objective and what the problem allows."""

    time_limit: float = 10.0  # seconds per objective: its warm start, then the solve in what is left
    max_stages: int = 4
    solver: str = "highs"
    progress: Progress | None = None


def solve_limit(time_limit: float, started: float, reserve: float = 0.0) -> float:
    """What the solve gets of an objective's ``time_limit`` once its warm start (built since ``started``) took its
    share, leaving ``reserve`` seconds for what follows the solve (``margin``); never below half of the limit,
    so a slow warm start does not leave the solver nothing."""
    return max(time_limit - (time.perf_counter() - started) - reserve, time_limit / 2)


def margin(fixed_seconds: float, simulation_seconds: float) -> float:
    """The seconds to leave after the solve for the work that follows it (lowering, analytic prediction,
    labelling: ``fixed_seconds``; the simulation: ``simulation_seconds``), from the same work timed on the warm
    start's plan before the solve; with room for a plan of more segments and for the machine's noise."""
    return RESERVE_FACTOR * (fixed_seconds + simulation_seconds) + RESERVE_S


def simulation_seconds(plan: Plan, graph: OpGraph, cost: CostModel, frames: int) -> float:
    """The seconds simulating ``plan`` over ``frames`` frames takes, beyond pricing it: timed (most of it is the
    simulator's own setup, so fewer frames would not tell)."""
    if not frames:
        return 0.0
    started = time.perf_counter()
    evaluate(plan, graph, cost, 0)
    priced = time.perf_counter() - started
    evaluate(plan, graph, cost, frames)
    return max(time.perf_counter() - started - 2 * priced, 0.0)


RESERVE_FACTOR, RESERVE_S = 1.5, 0.05
# The local search on a latency warm start takes at most this share of the objective's time limit (less when
# the solver's half of the limit and the reserve would not be left; it stops earlier when it stalls). On
# yolo_det (khadas-vim3) HiGHS's bound settles about 16 s into a 30 s solve, and the search takes its start
# from 87.7 to 84.9-85.1 ms in 7.5 s (the solver alone finds nothing better in 30 s).
POLISH_SHARE = 0.25


def polish_deadline(time_limit: float, started: float, reserve: float) -> float:
    """When the local search on the latency warm start must stop (``time.perf_counter()``): after its share of
    the limit, and early enough to leave the solver half of it and the reserve."""
    now = time.perf_counter()
    return min(now + POLISH_SHARE * time_limit, started + time_limit / 2 - reserve)


def polished(
    problem: Problem, objective: str, warm: Candidate, deadline: float, bounds: Bounds = NO_BOUNDS
) -> Candidate:
    """For latency, the warm start improved by local search (``planner.local_search``) until ``deadline``, named
    ``<start>+local-search`` when it found a better plan; for the other objectives, or past the deadline, the
    warm start itself."""
    if objective != "latency" or time.perf_counter() >= deadline:
        return warm
    result = polish(problem, warm.assignment, deadline, bounds)
    return Candidate(f"{warm.name}+local-search", result.assignment, warm.pipelined) if result.improved else warm


@dataclass(frozen=True)
class Solved:
    """One objective's solve and what it was started from: the warm start as the solver got it (``warm``: after
    the local search, for latency) and every candidate's plan (``tried``: what ``best_plan`` holds it to)."""

    solution: Solution
    warm: Candidate
    tried: list[tuple[Candidate, Plan]]


def solve_objective(goal: _Goal, search: SearchOptions, frames: int) -> Solved:
    """The objective's warm start, the local search on it (latency), the solve in what is left of
    ``search.time_limit``, leaving the margin that what follows the solve (lowering, pricing, simulating
    ``frames`` frames) needs.

    HiGHS lets go of the GIL while it runs, so the solve runs in a thread of its own, and the simulation of the
    warm start's plan, which sizes the margin, is timed here while HiGHS runs; the solve's limit is then cut by
    that share of the margin (``LimitCut``). Only HiGHS's run overlaps Python: the solve's other work (the
    model written, the bounds computed) is Python, and beside the simulation both would take twice as long
    (bert_small: a solve of 12 s took 22). HiGHS runs one solve at a time (``planner.ilp``)."""
    problem, objective, bounds = goal.problem, goal.objective, goal.bounds
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="parapipe-solver") as solver:
        cands = warm_candidates(problem, objective)
        start = warm_start(problem, objective, bounded_candidates(problem, objective, bounds), goal.internal)
        # what follows the solve, timed on the start's plan before it: the margin the solve leaves for it
        probe = time.perf_counter()
        start_plan = goal.plan_of(start.assignment, Provenance("ilp"))
        finished = goal.finish(start_plan, Provenance("ilp"), 0)
        reserve = margin(time.perf_counter() - probe, 0.0)
        # every candidate's plan (what the solve changes is only their labels)
        tried = [(c, goal.plan_of(c.assignment, Provenance("ilp"))) for c in cands if c != start] + [
            (start, start_plan)
        ]
        # the latency ILP's segment bounds (``ilp.segment_cuts``: HiGHS, mostly, which lets go of the GIL) are
        # computed from the start beside the local search on it (Python), not after it: googlenet's latency
        # objective took 2.5 s instead of 3.2, inception_v3's 5.1 instead of 5.6 (khadas-vim3, medians of 3
        # interleaved runs on a slow VM; 3.6 and 7.0 with the segments proven to 0.01% from no start,
        # ``bench/results_planner.txt``). Not for a model the solve would not write (``ilp.rows_within``).
        halt = threading.Event()  # an interrupt of the local search stops the bounds after the segment they are at
        bounding = (
            solver.submit(segment_cuts, problem, objective, search.time_limit, start.assignment, stop=halt)
            if objective == "latency"
            and search.solver == "highs"
            and ordering_rows(problem) <= rows_within(search.time_limit / 2)
            else None
        )
        try:
            deadline = polish_deadline(search.time_limit, started, reserve)
            warm = polished(problem, objective, start, deadline, goal.limits)
        except BaseException:
            halt.set()
            raise
        if bounding is not None:
            bounding.result()
        if warm != start:
            tried.append((warm, goal.plan_of(warm.assignment, Provenance("ilp"))))
        if search.solver != "highs":  # CBC runs to its limit, uncut: the simulation is timed first
            reserve += RESERVE_FACTOR * simulation_seconds(finished, goal.graph, goal.cost, frames)
        limit = solve_limit(search.time_limit, started, reserve)
        cut = LimitCut()
        solving = solver.submit(goal.solve, dataclasses.replace(search, time_limit=limit), warm, cut)
        try:
            # The simulation's share of the margin, timed while HiGHS runs, not while the model is written (that is
            # Python too: the two would share the GIL, each take twice as long, and the margin would be twice too
            # large); cut from the solve's limit, never below half the objective's.
            while search.solver == "highs" and not cut.started.wait(0.02) and not solving.done():
                pass
            if not solving.done():
                simulated = simulation_seconds(finished, goal.graph, goal.cost, frames)
                cut.shorten(min(RESERVE_FACTOR * simulated, limit - search.time_limit / 2))
            solution = solving.result()
        except BaseException:
            cut.stop()  # an interrupt, or the simulation failed: the solve ends now, not at its limit
            raise
    return Solved(solution, warm, tried)


def best_plan(
    blocks: OpGraph,
    graph: OpGraph,
    cost: CostModel,
    objective: str,
    search: SearchOptions = SearchOptions(),
    bounds: Constraints = UNBOUNDED,
    problem: Problem | None = None,
    frames: int = 240,
) -> Plan:
    """The ILP's plan for ``objective`` under the bounds, never worse than the best in-space baseline; with
    its simulation over ``frames`` frames (0: the analytic prediction only). Where units offer several runtimes
    (``DeviceProfile.runtime_choices``), the best over every choice, each solved on its own (``problem`` is
    ignored: no one problem holds them all without counting shared cores twice)."""
    choices = cost.runtime_choices()
    if len(choices) > 1:
        return min(
            _each_choice(choices, lambda c: best_plan(blocks, graph, c, objective, search, bounds, None, frames)),
            key=lambda p: key(p, objective),
        )
    goal = _Goal(
        blocks, graph, cost, objective, bounds, problem or build_problem(blocks, graph, cost, search.max_stages)
    )
    solved = solve_objective(goal, search, frames)
    solution, warm, tried = solved.solution, solved.warm, solved.tried
    provenance = Provenance(
        method=f"heuristic:{warm.name}" if solution.warm_kept else "ilp",
        solver=solution.solver,
        status=solution.status,
        objective=objective,
        gap=solution.gap,
        bound=_in_predicted_unit(solution.bound, objective),
        seconds=round(solution.seconds, 3),
        solver_value=_in_predicted_unit(solution.value, objective),
    )
    plan = goal.plan_of(solution.assignment, provenance)
    if objective == "latency" and (overhead := frame_overhead_ms(plan, graph, cost)):
        # the ILP's latency is the partitions' and handoffs'; the plan's adds what a frame spends outside them
        provenance = dataclasses.replace(
            provenance,
            bound=None if provenance.bound is None else provenance.bound + overhead,
            solver_value=None if provenance.solver_value is None else provenance.solver_value + overhead,
        )
        plan = dataclasses.replace(plan, provenance=provenance)
    if solution.warm_kept:
        plan = dataclasses.replace(
            plan, notes=(f"{warm.name}, given to the solver as a start, predicts better than the solver's incumbent",)
        )
    # Never return less than a plan inside the ILP's space: every candidate evaluated the same way (the start
    # the solver was given was one, or is one the solver's plan was held to)
    for c, other in tried:
        if goal.better(other, plan):
            plan = dataclasses.replace(
                other,
                provenance=dataclasses.replace(provenance, method=f"heuristic:{c.name}"),
                notes=(f"{c.name}, given to the solver as a start, predicts better than the solver's incumbent",),
            )
    return goal.finish(plan, provenance, frames)


@dataclass(frozen=True)
class _Goal:
    """One objective under bounds on one problem: the values ``best_plan``'s steps all need."""

    blocks: OpGraph
    graph: OpGraph
    cost: CostModel
    objective: str
    bounds: Constraints
    problem: Problem

    @property
    def name(self) -> str:
        return f"ilp-{self.objective}"

    def solve(self, search: SearchOptions, warm: Candidate, cut: LimitCut | None = None) -> Solution:
        if search.progress:
            search.progress(
                f"solving for {self.objective} ({len(self.problem.blocks)} blocks, {len(self.problem.units)} units)"
            )
        limits = self.limits
        max_l, max_period, max_e = limits.max_latency_ms, limits.max_period_ms, limits.max_energy_mj
        return solve(
            self.problem,
            self.objective,
            search.time_limit,
            limits,
            warm=warm.assignment if _meets(self.problem, warm.assignment, max_l, max_period, max_e) else None,
            solver=search.solver,
            cut=cut,
        )

    @property
    def internal(self) -> Constraints:
        """The bounds on the ILP's model of latency, which leaves out the frame overhead of a pipeline of several
        partitions (``CostModel.frame_overhead_ms``, the same for every such plan): a ceiling that much lower."""
        if self.bounds.max_latency_ms is None or not self.cost.calibration.frame_ms:
            return self.bounds
        return dataclasses.replace(
            self.bounds, max_latency_ms=self.bounds.max_latency_ms - self.cost.calibration.frame_ms
        )

    @property
    def limits(self) -> Bounds:
        """The bounds in the ILP's own units (a period, not a rate; latency without the frame overhead)."""
        max_period = 1000.0 / self.bounds.min_fps if self.bounds.min_fps else None
        return Bounds(self.internal.max_latency_ms, max_period, self.bounds.max_mj)

    def finish(self, plan: Plan, provenance: Provenance, frames: int) -> Plan:
        """What follows the solve: one session on every CPU core where that predicts better, replication for
        throughput and energy, the simulation over ``frames`` frames."""
        plan = self.or_ort_all_cores(plan, provenance)
        if self.objective != "latency":
            plan = self.replicated(plan, provenance)
        return evaluate(plan, self.graph, self.cost, frames)

    def plan_of(self, a: Assignment, provenance: Provenance) -> Plan:
        plan = to_plan(self.problem, a, self.blocks, self.cost.profile, provenance, self.name)
        return evaluate(plan, self.graph, self.cost, frames=0)

    def acceptable(self, plan: Plan) -> bool:
        """Meets the bounds and fits the PUs' memory."""
        return meets(plan, self.bounds) and _fits(plan, self.graph, self.cost.profile)

    def better(self, other: Plan, current: Plan) -> bool:
        """``other`` predicts better for the objective, meets the bounds and fits the PUs' memory."""
        return key(other, self.objective) < key(current, self.objective) * (1 - 1e-9) and self.acceptable(other)

    def or_ort_all_cores(self, plan: Plan, provenance: Provenance) -> Plan:
        """Outside the ILP's space: one session over every CPU core of the board (threads spanning clusters)."""
        ort = _ort_all_cores(self.blocks, self.cost.profile)
        if ort is None:
            return plan
        provenance = dataclasses.replace(provenance, method="heuristic:ort-all-cores")
        other = evaluate(
            dataclasses.replace(ort, provenance=provenance, name=self.name), self.graph, self.cost, frames=0
        )
        if not self.better(other, plan):
            return plan
        return dataclasses.replace(
            other, notes=("one onnxruntime session on every CPU core predicts better than the solver's plan",)
        )

    def replicated(self, plan: Plan, provenance: Provenance) -> Plan:
        """Replication (frames alternate between copies of a stage) is outside the ILP: try it on the
        solution and on the whole model per core (one session per core), keep what predicts best."""
        seeds = [(plan, "")]
        try:
            seeds.append((_single_core(self.problem, self.blocks, self.cost.profile, self.graph, self.cost), "fp32"))
            if self.problem.int8_cost and self.problem.precision is not None:
                # the same with blocks in int8 where that pays within the budget: one int8 session per core
                mixed = _single_core(self.problem, self.blocks, self.cost.profile, self.graph, self.cost, int8=True)
                if mixed.int8:
                    seeds.append((mixed, "int8"))
        except PlanError:
            pass
        for seed, precision in seeds:
            rep = replicate(seed, self.graph, self.cost, self.cost.profile)
            if rep is seed or not key(rep, self.objective) < key(plan, self.objective) or not self.acceptable(rep):
                continue
            if seed is plan:
                note, method = "stage replicated onto free cores", f"{plan.provenance.method}+replicated"
            elif precision == "int8":
                note = "one copy of the model per core, int8 where it pays within the budget, beat the ILP's plan"
                method = "heuristic:single-core+int8+replicated"
            else:
                note, method = "one copy of the model per core beat the ILP's plan", "heuristic:single-core+replicated"
            plan = dataclasses.replace(
                rep,
                provenance=dataclasses.replace(provenance, method=method),
                name=self.name,
                notes=(*plan.notes, note),
            )
        return plan


def _in_predicted_unit(value: float | None, objective: str) -> float | None:
    """A value of the ILP's objective (latency ms, period ms, energy mJ) in the unit of the predicted figure."""
    if value is None or value != value:
        return None
    if objective == "throughput":
        return 1000.0 / value if value > 0 else None
    return value


def _single_core(
    problem: Problem, blocks: OpGraph, profile: DeviceProfile, graph: OpGraph, cost: CostModel, int8: bool = False
) -> Plan:
    """The whole model on the fastest one-core unit (the seed for replication, one session per core); with
    ``int8``, its blocks in int8 where that saves time there, within the accuracy budget (``H.with_int8``)."""
    options = [u for u, x in enumerate(problem.units) if x.kind == "cpu" and x.cores == 1 and x.instance == 0]
    best = None
    for u in options:
        a = H.single_unit(problem, u)
        if a is not None and (best is None or schedule(problem, a).period_ms < schedule(problem, best).period_ms):
            best = a
    if best is None:
        raise PlanError("no CPU core can run the whole model")
    if int8:
        best = H.with_int8(problem, best)
    return evaluate(to_plan(problem, best, blocks, profile, Provenance("ilp"), "single-core"), graph, cost, frames=0)


def _meets(problem: Problem, a: Assignment, max_l: float | None, max_p: float | None, max_e: float | None) -> bool:
    f = schedule(problem, a)
    return (
        fits(problem, a)
        and (max_l is None or f.latency_ms <= max_l)
        and (max_p is None or f.period_ms <= max_p)
        and (max_e is None or f.energy_mj <= max_e)
    )


def _fits(plan: Plan, graph: OpGraph, profile: DeviceProfile) -> bool:
    """Weights and activations fit every PU's memory (what ``validate`` checks)."""
    return all(used <= profile.pu(pu).memory_bytes.value for pu, used in memory_use(plan, graph).items())


TIE = 1e-9  # relative difference below which two predicted figures are the same


def dominates(a: Plan, b: Plan) -> bool:
    """``a`` is no worse than ``b`` in latency, throughput, energy and accuracy loss (``Plan.accuracy_loss``), and
    better in one of them."""
    pa, pb = a.predicted, b.predicted
    assert pa and pb
    # lower is better in each; figures within a relative TIE of each other are equal (a plan whose fps was
    # higher only in the 15th digit was kept beside one that beat it on every other figure)
    mine = (pa.latency_ms, -pa.throughput_fps, pa.energy_mj, a.accuracy_loss())
    theirs = (pb.latency_ms, -pb.throughput_fps, pb.energy_mj, b.accuracy_loss())

    def below(x: float, y: float) -> bool:
        return x < y - TIE * max(abs(x), abs(y))

    no_worse = all(not below(y, x) for x, y in zip(mine, theirs, strict=True))
    return no_worse and any(below(x, y) for x, y in zip(mine, theirs, strict=True))


def signature(plan: Plan) -> tuple:
    """Where every block runs and in which precision."""
    return tuple(
        (s, g, a.pu, a.cores, tuple(sorted((b, plan.precision_of(b)) for b in a.blocks)))
        for s, st in enumerate(plan.stages)
        for g, grp in enumerate(st.groups)
        for a in grp
    )


def shared_problem(blocks: OpGraph, graph: OpGraph, cost: CostModel, max_stages: int) -> Problem | None:
    """The problem ``baselines``, ``best_plan`` and ``pareto_set`` can share; None where units offer several
    runtimes (each choice is a problem of its own, built where it is solved)."""
    return build_problem(blocks, graph, cost, max_stages) if len(cost.runtime_choices()) == 1 else None


def _each_choice(choices: list[CostModel], solve: Callable[[CostModel], T]) -> list[T]:
    """``solve`` on each runtime choice; the choices no plan fits left out (the first refusal raised if all are)."""
    out: list[T] = []
    refused: PlanError | None = None
    for c in choices:
        try:
            out.append(solve(c))
        except PlanError as exc:
            refused = refused or exc
    if not out:
        assert refused is not None
        raise refused
    return out


def _unnumbered(name: str) -> str:
    """A Pareto plan's name without its ``pareto-N-`` prefix."""
    head, _, rest = name.partition("-")
    number, _, tail = rest.partition("-")
    return tail if head == "pareto" and number.isdigit() else name


def pareto_front(plans: list[Plan]) -> list[Plan]:
    """Non-dominated plans, duplicates (same placement) removed, ordered by latency."""
    unique: dict[tuple, Plan] = {}
    for p in plans:
        unique.setdefault(signature(p), p)
    front = [p for p in unique.values() if not any(dominates(q, p) for q in unique.values() if q is not p)]
    return sorted(front, key=lambda p: (p.predicted.latency_ms, -p.predicted.throughput_fps))


def pareto_set(
    blocks: OpGraph,
    graph: OpGraph,
    cost: CostModel,
    search: SearchOptions = SearchOptions(),
    steps: int = 4,
    problem: Problem | None = None,
) -> list[Plan]:
    """Epsilon-constraint sweep: the three single-objective optima, then latency-optimal plans under
    throughput floors between them, and energy-optimal plans under latency ceilings. The single-objective
    solves get ``search.time_limit`` each, the sweep's bounded ones a third of it; only the plans on the
    front are simulated. Where units offer several runtimes, the front of every choice's sets."""
    choices = cost.runtime_choices()
    if len(choices) > 1:
        found = [p for ps in _each_choice(choices, lambda c: pareto_set(blocks, graph, c, search, steps)) for p in ps]
        return [
            dataclasses.replace(p, name=f"pareto-{i}-{_unnumbered(p.name)}") for i, p in enumerate(pareto_front(found))
        ]
    problem = problem or build_problem(blocks, graph, cost, search.max_stages)
    sweep = dataclasses.replace(search, time_limit=search.time_limit / 3)

    def solved(objective: str, bounds: Constraints = UNBOUNDED) -> Plan:
        return best_plan(blocks, graph, cost, objective, search if bounds == UNBOUNDED else sweep, bounds, problem, 0)

    found = [solved(objective) for objective in OBJECTIVES]
    lat_best, thr_best = found[0], found[1]
    fps_lo, fps_hi = lat_best.predicted.throughput_fps, thr_best.predicted.throughput_fps
    for i in range(1, steps):
        fps = fps_lo + (fps_hi - fps_lo) * i / steps
        try:
            plan = solved("latency", Constraints(min_fps=fps))
        except PlanError:
            continue
        found.append(dataclasses.replace(plan, name=f"ilp-latency@{fps:.1f}fps"))
    lat_lo, lat_hi = lat_best.predicted.latency_ms, found[2].predicted.latency_ms
    for i in range(1, steps):
        ceiling = lat_lo + (lat_hi - lat_lo) * i / steps
        try:
            plan = solved("energy", Constraints(max_latency_ms=ceiling))
        except PlanError:
            continue
        found.append(dataclasses.replace(plan, name=f"ilp-energy@{ceiling:.0f}ms"))
    return [
        dataclasses.replace(evaluate(p, graph, cost), name=f"pareto-{i}-{p.name}")
        for i, p in enumerate(pareto_front(found))
    ]
