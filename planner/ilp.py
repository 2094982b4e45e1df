"""The Para-Pipe ILP: stages, units (PU, cores) per stage, and blocks per unit, in one model.

Decision variables (names as in the code):
  on[u]      unit u (a non-CPU PU, or k cores of a CPU cluster) is used
  a[b,u]     block b runs on unit u
  t[b]       start time of block b within one frame; L latency; P period (1 / throughput); E energy per frame
  r[e,p,q]   edge e carries its tensor from PU p to PU q (continuous, forced to 1 when it must)
  o[i,j]     order of independent blocks i, j when they share a unit; same[i,j] they share one
  q[b,u]     block b runs on unit u in int8, or fp16 on a unit of Problem.fp16_units (where that variant was
             validated and u runs it in fp32 too; on a unit that computes int8 only, a[b,u] itself means int8)
  q2[b,u]    block b runs on such an fp16 unit u in int8 (Problem.second_cost: its PU computes int8 too);
             q[b,u] + q2[b,u] <= a[b,u]
Every constraint is named after what it means: assign, unit_on, cores, memory,
symmetry, int8_on, accuracy_budget (the int8 blocks' summed accuracy losses alone in int8 stay within the
budget), transfer, handoff_cpu, precedence, serialize, region (a valid cut: what one unit runs
between a fork and its join fits between them), latency, period_unit, period_link, period_memory,
cluster_capacity, energy, bound_*. The objective is latency, period or energy, with the others optionally
bounded (epsilon constraints for the Pareto sweep). The scheduling part (t, o, same,
precedence, serialize) is built only when latency is the objective or is bounded.

Stages are not variables: every unit runs its blocks as segments on its own worker
(``planner.segments``), so any assignment executes. Stages are derived afterwards
from the data flow between units (``planner.build``).

Solved with HiGHS (highspy) through PuLP, CBC as fallback; a warm start (from the
best baseline) is relabelled into the symmetry rows' order and handed to the solver,
and kept if the solver's incumbent is worse, so the result is never worse than it.
With latency as the objective its latency bounds the big-M of the scheduling rows;
with latency bounded (the Pareto sweep) the bound does.

Per-partition overhead (calibration's beta) is charged per block that starts a
partition (``z``), the way the lowering (``planner.segments``) cuts partitions.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pulp

from planner.highs import BOUND_GAP, LimitCut, run_solver, solve_for_bound, status_of
from planner.plan import PlanError
from planner.problem import BUDGET_SLACK, Problem
from planner.symmetry import as_start, twin_branches
from planner.timing import Assignment, Figures, fits, partition_starts, predecessors, schedule

OBJECTIVES = ("latency", "throughput", "energy")
_TIE = 1e-3  # weight of the secondary objective, breaks ties toward better plans
_READ_BACK = 0.5  # reading a solution back and checking it takes at most this share of writing the model


@dataclass(frozen=True)
class Solution:
    assignment: Assignment
    figures: Figures  # in the ILP's own model
    solver: str
    status: str  # optimal | time-limit | time-limit (warm start kept) | ...
    gap: float | None  # proven relative gap of the solver's own incumbent
    # proven lower bound on the objective: the solver's, or for latency ``planner.bounds``' where that is higher
    # (the gap is then against it)
    bound: float | None
    seconds: float
    objective: str
    value: float = float("nan")  # the solver's objective value of its own incumbent (ms, period ms, mJ); nan: none
    warm_kept: bool = False  # the assignment is the warm start: it beat the solver's incumbent, or there was none

    @property
    def best(self) -> float:
        """The objective value of the returned assignment in the ILP's model."""
        return self.figures.value(self.objective) if self.warm_kept else self.value


@dataclass(frozen=True)
class Bounds:
    """Bounds on the figures the ILP does not optimise, in its own units (a period, not a rate)."""

    max_latency_ms: float | None = None
    max_period_ms: float | None = None
    max_energy_mj: float | None = None


NO_BOUNDS = Bounds()


def solve(
    problem: Problem,
    objective: str,
    time_limit: float = 10.0,
    bounds: Bounds = NO_BOUNDS,
    *,
    warm: Assignment | None = None,
    gap: float = 0.01,
    solver: str = "highs",
    cut: LimitCut | None = None,
) -> Solution:
    """The ILP's best assignment for ``objective`` under ``bounds``, never worse than ``warm``; ``cut``: seconds
    the caller may take off ``time_limit`` while the solve runs (``LimitCut``)."""
    max_latency_ms = bounds.max_latency_ms
    if objective not in OBJECTIVES:
        raise PlanError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    started = time.perf_counter()
    if warm is not None and not fits(problem, warm):
        warm = None  # a start that does not fit memory is no plan to keep
    if warm is not None:
        warm = as_start(problem, warm, objective == "latency" or max_latency_ms is not None)
    start = schedule(problem, warm) if warm is not None else None
    timed = objective == "latency" or max_latency_ms is not None
    if timed and warm is not None and start is not None and ordering_rows(problem) > rows_within(time_limit):
        # the scheduling rows alone take longer to write than the limit gives, let alone to solve: the warm
        # start stands, as it would after the solver's time ran out (wide graphs: 10^5 pairs of blocks)
        rows = ordering_rows(problem)
        status = f"not solved: {rows} ordering rows are too many for {time_limit:g} s"
        advice = f" (raise --time-limit: this solve needs at least {limit_for(rows):g} s, or use coarser blocks)"
        return _kept(warm, start, solver, status + advice, None, started, objective)
    # Big-M of the ordering rows: every block of a plan worth keeping ends by this time. With latency as
    # the objective, the warm start's latency (a better plan is no slower); under a latency bound, the
    # bound; never the warm start's latency when latency is only bounded (that cuts off valid plans).
    horizon = max_latency_ms
    if objective == "latency" and start is not None:
        horizon = start.latency_ms if horizon is None else min(horizon, start.latency_ms)
    cuts = Cuts(
        horizon,
        _load_bound(problem),
        start.latency_ms if objective == "latency" and start is not None else None,
        segment_cuts(problem, objective, time_limit, warm, gap) if timed else (),
    )
    # a proven bound from outside the solver, per way to cut the CPU clusters (``planner.bounds``), where
    # segment_bounds leaves stretches out: the solve leaves it time, and it is computed after the solve when the
    # solver did not close its gap, and reported when it beats the solver's bound (the model left as it is)
    reserve = _floor_reserve(problem, time_limit, objective)
    formulating = time.perf_counter()
    lp, v = _formulate(problem, objective, bounds, cuts)
    if warm is not None:
        _set_warm_start(problem, v, warm)
    # HiGHS's clock starts once PuLP has handed it the model (seconds on a large one), so its limit is set then,
    # to what is left before the deadline less what reading its solution back takes (``_READ_BACK`` of the time
    # writing the model took)
    deadline = started + time_limit - reserve - _READ_BACK * (time.perf_counter() - formulating)
    remaining = max(time_limit - reserve - (time.perf_counter() - started), 0.1 * time_limit)
    # HiGHS's primal heuristics at 0.3 of its effort (default 0.05) for throughput: googlenet on
    # khadas-vim3-armcl closes in 27 nodes instead of 499; of 18 throughput solves (7 zoo models, 3 boards)
    # the others close at the root either way, bert_small takes as many nodes, multiview_bev on
    # khadas-vim3-armcl 511 instead of 441 (in less time). Shifting on too took a quarter off the 24 throughput rows'
    # seconds but pushed bert_small on khadas-vim3 past its gap in 30 s (``bench/results_planner.txt``, 12-04)
    effort = 0.3 if objective == "throughput" and not timed else None
    backend = run_solver(lp, solver, remaining, time_limit, gap, warm is not None, effort, deadline, cut)
    seconds = time.perf_counter() - started
    status, mip_gap, bound = status_of(lp, backend)
    floor = None
    if objective == "latency" and status != "optimal" and status != "infeasible" and not (cut and cut.stopped):
        known = [x for x in (start.latency_ms if start is not None else None, _value(v["L"])) if x is not None]
        taken = cut.seconds if cut is not None else 0.0
        left = max(started + time_limit - taken - time.perf_counter(), reserve / 2)
        floor = _configuration_floor(problem, left, min(known, default=None))
    if floor is not None and status not in ("infeasible", "no solution"):
        mine = float(pulp.value(v["L"]))  # the solver's incumbent's latency
        if bound is None or floor > bound:
            bound = floor
            mip_gap = max((mine - floor) / mine, 0.0) if mine > 0 else mip_gap
    elif floor is not None and (bound is None or floor > bound):
        bound = floor
    if status == "no solution" and warm is not None and start is not None:
        # the solver ran out of time before it had a solution of its own: the warm start stands
        return _kept(warm, start, backend.name, "time-limit (warm start kept)", bound, started, objective)
    if status == "infeasible" and warm is not None and start is not None and _within(start, bounds):
        # a plan that fits and meets the bounds exists, so the model is not infeasible: CBC starved of CPU
        # before its time limit says so (seen with the cores taken by real-time work); the warm start stands
        return _kept(warm, start, backend.name, "no verdict (warm start kept)", None, started, objective)
    if status in ("infeasible", "no solution"):
        raise PlanError(_infeasible_message(problem, bounds, status))
    assign = _extract(problem, v)
    value = float(pulp.value({"latency": v["L"], "throughput": v["P"], "energy": v["E"]}[objective]))
    # the incumbent as it runs: the ILP counts partitions from below (``_partition_rows``), which on a throttled
    # unit can also decide how much of its work is past the burst, and the solver's tolerances let a row slip by a hair
    figures = schedule(problem, assign)
    if (
        start is not None
        and warm is not None
        and (
            start.value(objective) < figures.value(objective) * (1 - 1e-9)  # the warm start is better
            or (  # it is the same
                (assign.block_unit, assign.int8, assign.second) == (warm.block_unit, warm.int8, warm.second)
                and start.value(objective) <= figures.value(objective) * (1 + 1e-9)
            )
        )
    ):
        # never worse than the start it was given: the solver's own incumbent (value, gap) is reported,
        # the warm start is returned (and named as such when the incumbent is the warm start itself)
        return Solution(warm, start, backend.name, status, mip_gap, bound, seconds, objective, value, True)
    return Solution(assign, figures, backend.name, status, mip_gap, bound, seconds, objective, value)


# the memory rows count MiB: in bytes (coefficients to 2e6, right-hand sides to 8e9) HiGHS warned of bad scaling
MIB = float(2**20)
# a latency solve's segment bounds stop at half its own gap: a bound that much under the segment's optimum still
# closes the solve at its root. inception_v3's latency objective on the three boards (one run each, a noisy VM):
# 5.5-6.5 s with the segments proven to 0.01% from no start, 4.7-5.4 s from the warm start, 3.6-4.4 s from it to half
# the gap (``bench/results_planner.txt``, 12-06)
SEGMENT_GAP_SHARE = 0.5
FLOOR_MIN_S = 0.25  # a bound computed in less time proves little
FLOOR_SHARE = 1 / 8  # of a latency solve's limit, kept for the bound from outside the solver


def segment_cuts(
    problem: Problem,
    objective: str,
    time_limit: float,
    warm: Assignment | None,
    gap: float = 0.01,
    stop: threading.Event | None = None,
) -> tuple[tuple[int, int, float], ...]:
    """``segment_bounds`` for a solve of ``time_limit`` s to a proven ``gap`` (a quarter of its time): with latency
    the objective and a warm start, each segment's bound proven to a share of the solve's own gap
    (``SEGMENT_GAP_SHARE``) from the warm start's part of the frame. Computed once per problem: a caller may
    compute them ahead of the solve (``search.solve_objective``: beside the local search)."""
    if objective == "latency" and warm is not None:
        return segment_bounds(problem, time_limit / 4, warm, gap * SEGMENT_GAP_SHARE, stop)
    return segment_bounds(problem, time_limit / 4)


def _floor_reserve(problem: Problem, time_limit: float, objective: str) -> float:
    """The seconds a latency solve leaves for ``_configuration_floor`` after it: its share of the limit where the
    bound applies (``segment_bounds`` leaves stretches out) and is not known yet, else none."""
    from planner import bounds

    budget = FLOOR_SHARE * time_limit
    if objective != "latency" or "configuration_bound" in problem.derived or budget < FLOOR_MIN_S:
        return 0.0
    return budget if bounds.big_stretches(problem) else 0.0


def _configuration_floor(problem: Problem, budget: float, ceiling: float | None) -> float | None:
    """The proven lower bound on every plan's latency of ``planner.bounds.configuration_bound`` within ``budget``
    seconds, where it applies (``_floor_reserve``), computed once per problem (a later, shorter solve of the same
    problem, in the Pareto sweep, reuses it); ``ceiling``: the best plan's latency known."""
    from planner import bounds

    if "configuration_bound" not in problem.derived:
        if budget < FLOOR_MIN_S or not bounds.big_stretches(problem):
            return None
        problem.derived["configuration_bound"] = bounds.configuration_bound(problem, budget, ceiling)
    return problem.derived["configuration_bound"]


def _value(var: pulp.LpVariable) -> float | None:
    return None if var.varValue is None else float(var.varValue)


def _within(figures: Figures, bounds: Bounds) -> bool:
    """Whether a plan's figures meet the bounds (to the solver's tolerance)."""
    pairs = (
        (figures.latency_ms, bounds.max_latency_ms),
        (figures.period_ms, bounds.max_period_ms),
        (figures.energy_mj, bounds.max_energy_mj),
    )
    return all(limit is None or value <= limit * (1 + 1e-6) for value, limit in pairs)


def _kept(
    warm: Assignment, start: Figures, solver: str, status: str, bound: float | None, started: float, objective: str
) -> Solution:
    """The warm start stands: the solver had no incumbent of its own."""
    seconds = time.perf_counter() - started
    return Solution(warm, start, solver, status, None, bound, seconds, objective, float("nan"), True)


def ordering_rows(problem: Problem) -> int:
    """About how many rows the scheduling part of the ILP has (two per pair of independent blocks, one
    per unit they may share)."""
    if "ordering_rows" not in problem.derived:
        problem.derived["ordering_rows"] = sum(
            2 + sum(1 for u in range(len(problem.units)) if problem.runs(i, u) and problem.runs(j, u))
            for i, j in problem.independent
        )
    return problem.derived["ordering_rows"]


def rows_within(time_limit: float) -> float:
    """The scheduling rows worth writing for a solve of ``time_limit`` s: PuLP writes about 10^5 rows a
    second here, and HiGHS needs several times that to solve them."""
    return max(50_000.0, ROWS_PER_SECOND * time_limit)


ROWS_PER_SECOND = 20_000.0


def limit_for(rows: int) -> float:
    """The shortest time limit (whole seconds) for which ``rows`` scheduling rows are written (``rows_within``)."""
    return float(math.ceil(rows / ROWS_PER_SECOND))


@dataclass
class _Model:
    """The ILP under construction: the problem, the LP, and the variables the rows are written in."""

    problem: Problem
    lp: pulp.LpProblem
    timed: bool  # the scheduling part (t, order, same) is built
    allowed: dict[int, list[int]]  # block -> the units that can run it
    units_of_pu: dict[str, list[int]]
    on: dict[int, pulp.LpVariable]
    a: dict[tuple[int, int], pulp.LpVariable]
    t: dict[int, pulp.LpVariable]
    L: pulp.LpVariable
    P: pulp.LpVariable
    E: pulp.LpVariable
    z: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    w: dict[tuple[int, int, int, str], pulp.LpVariable] = field(default_factory=dict)
    w_cost: dict[tuple[int, int, int, str], float] = field(default_factory=dict)
    w_at: dict[tuple[int, int], list[tuple[int, int, int, str]]] = field(default_factory=dict)  # (b, u): w's keys
    r: dict[tuple[int, str, str], pulp.LpVariable] = field(default_factory=dict)
    # s[e,p]: edge e's tensor passes between two different units of PU p (a handoff delay, when timed)
    s: dict[tuple[int, str], pulp.LpVariable] = field(default_factory=dict)
    comm: dict[int, pulp.LpAffineExpression] = field(default_factory=dict)
    orders: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    sames: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    # q[b,u]: block b runs on u in int8 (where it could run in fp32 too; fp16 on ``Problem.fp16_units``)
    q: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    # q2[b,u]: block b runs on u in int8 where u's first reduced precision is fp16 (``Problem.second_cost``)
    q2: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    # d[b] = block b's duration (its expression in ``dur``), for the ordering rows: one short row per pair instead
    # of a copy of the expression in each (wide graphs have 10^5 pairs)
    d: dict[int, pulp.LpVariable] = field(default_factory=dict)
    dur: dict[int, pulp.LpAffineExpression] = field(default_factory=dict)
    # used[x,y,u]: unit u runs a block of the stretch between articulation blocks x and y (``_section_rows``)
    used: dict[tuple[int, int, int], pulp.LpVariable] = field(default_factory=dict)
    # held[u,b]: how many of blocks 0..b unit u runs, where u has a next identical instance (``_symmetry_rows``)
    held: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    # on a throttled unit u (``_stall_rows``), per block b: fast[b,u] its work there at full speed, past[b,u] = 1
    # once the unit's work before it (in the order the unit runs them) is past the burst, ahead[j,b,u] block j's
    # work there if j runs before b (j independent of b); with the expressions of a block's work there (stall_own)
    # they are set from in a warm start
    fast: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    past: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    ahead: dict[tuple[int, int, int], pulp.LpVariable] = field(default_factory=dict)
    stall_before: dict[tuple[int, int], pulp.LpAffineExpression] = field(default_factory=dict)
    stall_own: dict[tuple[int, int], pulp.LpAffineExpression] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.problem.blocks)

    def int8(self, b: int, u: int) -> pulp.LpAffineExpression | pulp.LpVariable | int:
        """1 when block b runs on unit u in int8: q[b,u] where u could run it in fp32 too, a[b,u] where int8 only."""
        if (b, u) not in self.problem.int8_cost:
            return 0
        return self.q[(b, u)] if (b, u) in self.q else self.a[(b, u)]

    def work(self, b: int, u: int) -> pulp.LpAffineExpression:
        """Block b's time on unit u if it runs there (0 otherwise), in the precision it runs in."""
        problem = self.problem
        fp32, int8 = problem.cost.get((b, u)), problem.int8_cost.get((b, u))
        if int8 is None:
            return fp32 * self.a[(b, u)]
        if fp32 is None:
            return int8 * self.a[(b, u)]
        second = problem.second_cost.get((b, u))
        if second is None:
            return fp32 * self.a[(b, u)] + (int8 - fp32) * self.q[(b, u)]
        return fp32 * self.a[(b, u)] + (int8 - fp32) * self.q[(b, u)] + (second - fp32) * self.q2[(b, u)]

    def net(self, b: int, u: int) -> pulp.LpAffineExpression:
        """Block b's gRPC CPU time on unit u (``_handoff_rows``)."""
        return pulp.lpSum(self.w_cost[k] * self.w[k] for k in self.w_at.get((b, u), ()))

    def own(self, b: int, u: int) -> pulp.LpAffineExpression:
        """Block b's part of unit u's frame work: its time, its partition's overhead, its gRPC CPU time."""
        overhead = self.problem.unit_overhead[u] * self.z[(b, u)] if (b, u) in self.z else 0
        return self.work(b, u) + overhead + self.net(b, u)

    def on_pu(self, b: int, p: str) -> pulp.LpAffineExpression:
        return pulp.lpSum(self.a[(b, u)] for u in self.units_of_pu[p] if (b, u) in self.a)

    def variables(self) -> dict:
        return {
            "on": self.on,
            "a": self.a,
            "z": self.z,
            "w": self.w,
            "t": self.t,
            "L": self.L,
            "P": self.P,
            "E": self.E,
            "r": self.r,
            "s": self.s,
            "order": self.orders,
            "same": self.sames,
            "q": self.q,
            "q2": self.q2,
            "d": self.d,
            "dur": self.dur,
            "used": self.used,
            "held": self.held,
            "fast": self.fast,
            "past": self.past,
            "ahead": self.ahead,
            "stall_before": self.stall_before,
            "stall_own": self.stall_own,
        }


@dataclass(frozen=True)
class Cuts:
    """What tightens the model without cutting off a plan worth keeping: the big-M horizon (no block of such a
    plan ends later), an upper bound on any unit's load, the warm start's latency (with latency as the
    objective), and lower bounds on the spans between articulation blocks (``segment_bounds``)."""

    horizon: float | None = None
    upper_load: float | None = None
    upper_latency: float | None = None
    segments: tuple[tuple[int, int, float], ...] = ()


def _formulate(
    problem: Problem, objective: str, bounds: Bounds = NO_BOUNDS, cuts: Cuts = Cuts()
) -> tuple[pulp.LpProblem, dict]:
    max_l, max_p, max_e = bounds.max_latency_ms, bounds.max_period_ms, bounds.max_energy_mj
    m = _variables(problem, objective == "latency" or max_l is not None)
    _precision_rows(m)
    _partition_rows(m)
    _handoff_rows(m)
    dur = m.dur = _durations(m)
    if m.timed:
        _stall_rows(m, dur)
    _assignment_rows(m)
    _symmetry_rows(m)
    _flow_rows(m, dur)
    if m.timed:
        _order_rows(m, dur, _big_m(m, cuts.horizon))
        _region_rows(m, dur)
        _section_rows(m, dur)
        _latency_rows(m, dur, cuts.upper_latency if objective == "latency" else None)
        _segment_rows(m, cuts.segments)
        _chain_rows(m)
        _path_rows(m)
        _branch_symmetry_rows(m)
    _load_rows(m, cuts.upper_load)
    _link_and_memory_rows(m)
    _energy_row(m)
    lp = m.lp
    if max_l is not None:
        lp += m.L <= max_l, "bound_latency"
    if max_p is not None:
        lp += m.P <= max_p, "bound_period"
    if max_e is not None:
        lp += m.E <= max_e, "bound_energy"
    primary = {"latency": m.L, "throughput": m.P, "energy": m.E}[objective]
    # tie-break: faster frames for throughput/energy (fewer transfers when latency is not modelled)
    secondary = m.P if objective == "latency" else m.L if m.timed else pulp.lpSum(m.comm.values())
    lp += primary + _TIE * secondary
    return lp, m.variables()


def _variables(problem: Problem, timed: bool) -> _Model:
    """on[u], a[b,u] (binary), t[b] when timed, L, P, E."""
    n, units = len(problem.blocks), problem.units
    allowed = {b: [u for u in range(len(units)) if problem.runs(b, u)] for b in range(n)}
    return _Model(
        problem=problem,
        lp=pulp.LpProblem("parapipe", pulp.LpMinimize),
        timed=timed,
        allowed=allowed,
        units_of_pu={p: [u for u, x in enumerate(units) if x.pu == p] for p in problem.pus()},
        on={u: pulp.LpVariable(f"on_{u}", cat="Binary") for u in range(len(units))},
        a={(b, u): pulp.LpVariable(f"a_{b}_{u}", cat="Binary") for b in range(n) for u in allowed[b]},
        t={b: pulp.LpVariable(f"t_{b}", 0) for b in range(n)} if timed else {},
        L=pulp.LpVariable("L", 0),
        P=pulp.LpVariable("P", 0),
        E=pulp.LpVariable("E", 0),
    )


def _precision_rows(m: _Model) -> None:
    """q[b,u]: block b runs in int8 (fp16 on ``Problem.fp16_units``) on u (only where u runs it in fp32 too; on a
    unit that computes int8 only, a[b,u] says it). The blocks in int8 or fp16 keep the sum of their accuracy
    losses alone in that precision within the budget."""
    problem, lp = m.problem, m.lp
    for b, u in sorted(problem.int8_cost):
        if (b, u) in problem.cost:
            var = m.q[(b, u)] = pulp.LpVariable(f"q_{b}_{u}", cat="Binary")
            if (b, u) in problem.second_cost:  # fp16 or int8 there, not both
                also = m.q2[(b, u)] = pulp.LpVariable(f"q2_{b}_{u}", cat="Binary")
                lp += var + also <= m.a[(b, u)], f"int8_on_{b}_{u}"
            else:
                lp += var <= m.a[(b, u)], f"int8_on_{b}_{u}"
    if problem.accuracy_budget is not None and problem.int8_cost:
        # in millionths: the solver's feasibility tolerance (1e-7) would otherwise let a loss of 1e-7 through a
        # budget of 0; the budget holds to BUDGET_SLACK (1e-9), and the tolerance adds only 1e-13 to it
        # (a block's loss in its unit's reduced precision: int8, or fp16 on a unit that computes fp16; and in int8
        # where such a unit offers it too)
        spent = pulp.lpSum(1e6 * problem.loss(b, u) * m.int8(b, u) for b, u in sorted(problem.int8_cost))
        spent += pulp.lpSum(1e6 * problem.loss(b, u, 2) * var for (b, u), var in sorted(m.q2.items()))
        lp += spent <= 1e6 * (problem.accuracy_budget + BUDGET_SLACK), "accuracy_budget"


def _partition_rows(m: _Model) -> None:
    """z[b,u]: block b starts a partition on unit u (it has an input from elsewhere, or none), and so carries
    the unit's per-partition overhead. Only for units with an overhead. A lower bound on the lowering's
    count: a block whose inputs all come from u, but from two partitions of u, starts one too."""
    problem, lp, a = m.problem, m.lp, m.a
    preds = predecessors(problem)
    for b in range(m.n):
        for u in m.allowed[b]:
            if problem.unit_overhead[u] <= 0:
                continue
            var = m.z[(b, u)] = pulp.LpVariable(f"z_{b}_{u}", 0, 1)
            if not preds[b]:
                lp += var >= a[(b, u)], f"partition_source_{b}_{u}"
            for i, ei in preds[b]:
                lp += var >= a[(b, u)] - (a[(i, u)] if (i, u) in a else 0), f"partition_{ei}_{u}"


def _handoff_rows(m: _Model) -> None:
    """w[b,u,e,q]: block b on unit u sends edge e's tensor to (or receives it from) PU q on another host and
    spends CPU time on it (gRPC, protobuf copies): w_cost ms of u's time."""
    problem, lp = m.problem, m.lp
    pus = problem.pus()
    for (ei, p, q), ends in sorted(problem.handoff_cpu.items()):
        i, j, _ = problem.edges[ei]
        for b, other, here, there, c in ((i, j, p, q, ends[0]), (j, i, q, p, ends[1])):
            for u in m.units_of_pu[here] if c > 0 else ():
                if (b, u) not in m.a:
                    continue
                k = (b, u, ei, there)
                m.w[k] = pulp.LpVariable(f"w_{ei}_{b}_{u}_{pus.index(there)}", 0, 1)
                m.w_cost[k] = c
                m.w_at.setdefault((b, u), []).append(k)
                lp += m.w[k] >= m.a[(b, u)] + m.on_pu(other, there) - 1, f"handoff_cpu_{ei}_{b}_{u}_{pus.index(there)}"


def _durations(m: _Model) -> dict[int, pulp.LpAffineExpression]:
    """Each block's time on the unit that runs it: its cost, its partition's overhead, its gRPC CPU time."""
    problem = m.problem
    overhead = {
        b: pulp.lpSum(problem.unit_overhead[u] * m.z[(b, u)] for u in m.allowed[b] if (b, u) in m.z) for b in range(m.n)
    }
    net = {b: pulp.lpSum(m.net(b, u) for u in m.allowed[b]) for b in range(m.n)}
    return {b: pulp.lpSum(m.work(b, u) for u in m.allowed[b]) + overhead[b] + net[b] for b in range(m.n)}


def _unit_work(m: _Model, u: int) -> pulp.LpAffineExpression:
    """One frame's work on unit u: its blocks, the overhead of each of its partitions, its gRPC CPU time."""
    return pulp.lpSum(m.own(b, u) for b in range(m.n) if (b, u) in m.a)


def _most_work(m: _Model, b: int, u: int) -> float:
    """An upper bound on block b's part of ``_unit_work`` on u (its slowest precision, an overhead, its gRPC)."""
    problem = m.problem
    times = [problem.cost.get((b, u)), problem.int8_cost.get((b, u)), problem.second_cost.get((b, u))]
    net = sum(m.w_cost[k] for k in m.w_at.get((b, u), ()))
    return max(t for t in times if t is not None) + problem.unit_overhead[u] + net


def _stall_rows(m: _Model, dur: dict[int, pulp.LpAffineExpression]) -> None:
    """On throttled unit u, a frame's first ``burst`` ms of work runs at full speed, the rest at the unit's
    factor k (``Problem.stalled``), in the order the unit runs its blocks: block b's work before it there is
    its ancestors' (always before it) and ahead[j,b,u] for each block j independent of b (its work there if
    o says j runs first: a lower bound, exact where it binds, as less of it only helps b). b runs
    fast[b,u] = min(its work, max(0, burst - the work before it)) at full speed: the upper bounds, with
    past[b,u] = 1 where the max is 0 (one binary per block that can run on the unit), are exact because a
    block's full-speed work takes nothing from another's. Its duration gains (k - 1) x (its work - fast)."""
    problem, lp = m.problem, m.lp
    independent = {frozenset(pair) for pair in problem.independent}
    for u, burst in sorted(problem.burst.items()):
        k = problem.alone_factor(u)
        blocks = [b for b in range(m.n) if (b, u) in m.a]
        if problem.factor(u) <= 1.0 or not blocks:
            continue
        most = {b: _most_work(m, b, u) for b in blocks}
        if sum(most.values()) <= burst * (1 + 1e-9):
            continue  # never more than the burst
        own = {b: m.own(b, u) for b in blocks}
        m.stall_own.update({(b, u): own[b] for b in blocks})
        for b in blocks:
            terms: list = []
            for j in blocks:
                if j == b:
                    continue
                if frozenset((j, b)) not in independent:
                    if j < b:  # an ancestor (blocks are in topological order): always before b
                        terms.append(own[j])
                    continue
                first = _order_var(m, j, b)
                ahead = m.ahead[(j, b, u)] = pulp.LpVariable(f"stall_ahead_{j}_{b}_{u}", 0)
                lp += ahead >= own[j] - most[j] * (1 - first), f"stall_ahead_{j}_{b}_{u}"
                terms.append(ahead)
            before = m.stall_before[(b, u)] = pulp.lpSum(terms)
            reach = sum(most[j] for j in blocks if j != b)  # the most the work before b can be
            fast = m.fast[(b, u)] = pulp.LpVariable(f"stall_fast_{b}_{u}", 0, min(burst, most[b]))
            past = m.past[(b, u)] = pulp.LpVariable(f"stall_past_{b}_{u}", cat="Binary")
            lp += fast <= own[b], f"stall_fast_own_{b}_{u}"
            lp += fast <= burst - before + reach * past, f"stall_fast_left_{b}_{u}"
            lp += fast <= burst * (1 - past), f"stall_fast_past_{b}_{u}"
            dur[b] += (k - 1) * (own[b] - fast)


def _order_var(m: _Model, j: int, b: int) -> pulp.LpAffineExpression | pulp.LpVariable:
    """1 when independent block j runs before block b on their unit: o[j,b], or 1 - o[b,j] (made here if the
    ordering rows have not made it yet; they use the same variable)."""
    i, jj = min(j, b), max(j, b)  # ``Problem.independent`` holds (i < j)
    if (i, jj) not in m.orders:
        m.orders[(i, jj)] = pulp.LpVariable(f"o_{i}_{jj}", cat="Binary")
    o = m.orders[(i, jj)]
    return o if i == j else 1 - o


def _assignment_rows(m: _Model) -> None:
    """Every block runs once, on a used unit; cores are shared out; weights and activations fit memory."""
    problem, lp, a, units = m.problem, m.lp, m.a, m.problem.units
    for b in range(m.n):
        lp += pulp.lpSum(a[(b, u)] for u in m.allowed[b]) == 1, f"assign_{b}"  # every block runs exactly once
        for u in m.allowed[b]:
            lp += a[(b, u)] <= m.on[u], f"unit_on_{b}_{u}"  # only on a unit that is in use
    for p, cores in problem.cluster_cores.items():
        # a cluster's cores are shared out: every core belongs to at most one unit (and so one stage)
        lp += pulp.lpSum(units[u].cores * m.on[u] for u in m.units_of_pu[p]) <= cores, f"cores_{p}"
    for p in problem.pus():
        held = pulp.lpSum(problem.held_bytes(b) / MIB * m.on_pu(b, p) for b in range(m.n))
        lp += held <= problem.memory[p] / MIB, f"memory_{p}"  # weights and activations fit the PU's memory


def _symmetry_rows(m: _Model) -> None:
    """Of identical units, instance i+1 is used only after instance i, and holds a block only if instance i
    holds an earlier one (so each solution is counted once, not k! times). How many blocks up to b instance i
    holds is a variable of its own, a running sum (``held``): the sum written out in each row was two thirds of
    bert_small's model on bst-a1000 (265k of 417k nonzeros) for the same relaxation."""
    lp, a, units = m.lp, m.a, m.problem.units
    for u, x in enumerate(units):
        nxt = next(
            (w for w, y in enumerate(units) if (y.pu, y.cores, y.instance) == (x.pu, x.cores, x.instance + 1)), None
        )
        if nxt is None:
            continue
        lp += m.on[u] >= m.on[nxt], f"symmetry_on_{u}"
        before: pulp.LpVariable | None = None  # the running sum so far: blocks up to b that u holds
        for b in range(m.n):
            if (b, u) in a:
                count = m.held[(u, b)] = pulp.LpVariable(f"h_{u}_{b}", 0)
                lp += count == (before if before is not None else 0) + a[(b, u)], f"symmetry_count_{u}_{b}"
                before = count
            if (b, nxt) in a:
                lp += a[(b, nxt)] <= (before if before is not None else 0), f"symmetry_first_{u}_{b}"


def _flow_rows(m: _Model, dur: dict[int, pulp.LpAffineExpression]) -> None:
    """r[e,p,q]: edge e's tensor crosses from PU p to PU q; when timed, a block waits for its inputs."""
    problem, lp = m.problem, m.lp
    pus = problem.pus()
    for ei, (i, j, _) in enumerate(problem.edges):
        terms, waits = [], []
        for p in pus:
            for q in pus:
                delay = problem.handoff_delay.get((ei, p, q), 0.0)
                if p == q or (problem.transfer[(ei, p, q)] == 0 and problem.transfer_mj[(ei, p, q)] == 0 and not delay):
                    continue
                var = pulp.LpVariable(f"r_{ei}_{pus.index(p)}_{pus.index(q)}", 0)
                m.r[(ei, p, q)] = var
                lp += var >= m.on_pu(i, p) + m.on_pu(j, q) - 1, f"transfer_{ei}_{p}_{q}"  # tensor crosses p -> q
                terms.append(problem.transfer[(ei, p, q)] * var)
                waits.append((problem.transfer[(ei, p, q)] + delay) * var)
        m.comm[ei] = pulp.lpSum(terms)
        if m.timed:  # a block waits for its inputs: their transfers and the handoff delays
            waits.extend(_same_pu_handoffs(m, ei, i, j))
            lp += m.t[j] >= m.t[i] + dur[i] + pulp.lpSum(waits), f"precedence_{ei}"


def _same_pu_handoffs(m: _Model, ei: int, i: int, j: int) -> list[pulp.LpAffineExpression]:
    """The handoff delay where edge ei joins two different units of one PU: s >= 1 when i runs on unit u of
    PU p and j on p but not on u (a partition handing on to a later one of its own unit pays none)."""
    problem, lp = m.problem, m.lp
    out = []
    for p in problem.pus():
        delay = problem.handoff_delay.get((ei, p, p), 0.0)
        here = [u for u in m.units_of_pu[p] if (i, u) in m.a]
        if not delay or not here or not any((j, u) in m.a for u in m.units_of_pu[p]):
            continue
        var = pulp.LpVariable(f"s_{ei}_{problem.pus().index(p)}", 0)
        m.s[(ei, p)] = var
        for u in here:
            apart = m.on_pu(j, p) - (m.a[(j, u)] if (j, u) in m.a else 0)
            lp += var >= m.a[(i, u)] + apart - 1, f"handoff_{ei}_{u}"
        out.append(delay * var)
    return out


def _big_m(m: _Model, horizon: float | None) -> float:
    """Big-M of the ordering rows: no block of any plan ends later (or, given, of any plan worth keeping)."""
    problem = m.problem
    # a throttled unit's work alone past its burst (``Problem.stalled``)
    stall = max((problem.factor(u) for u in problem.burst), default=1.0)
    big_m = max(stall, 1.0) * (
        sum(max(problem.slowest(b, u) for u in m.allowed[b]) for b in range(m.n))
        + m.n * max(problem.unit_overhead.values(), default=0.0)
        + sum(sum(ends) for ends in problem.handoff_cpu.values())
    ) + sum(
        max(
            (
                *(v + problem.handoff_delay.get(k, 0.0) for k, v in problem.transfer.items() if k[0] == ei),
                *(v for k, v in problem.handoff_delay.items() if k[0] == ei and k[1] == k[2]),
            ),
            default=0.0,
        )
        for ei in range(len(problem.edges))
    )
    if horizon is not None:
        big_m = min(big_m, horizon * 1.0001)  # every block of a plan worth keeping ends by then
    return big_m


def _order_rows(m: _Model, dur: dict[int, pulp.LpAffineExpression], big_m: float) -> None:
    """o[i,j], same[i,j]: independent blocks that share a unit run one after the other, in either order."""
    lp, a, t = m.lp, m.a, m.t
    allowed = {b: set(us) for b, us in m.allowed.items()}
    ge = pulp.LpConstraintGE

    def row(terms: list[tuple[pulp.LpVariable, float]], rhs: float, name: str) -> None:
        # rows built from their coefficients: a wide graph has 10^5 pairs, and PuLP's operators copy
        # an expression per operation
        lp.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms), ge, rhs=rhs), name)

    for i, j in m.problem.independent:
        shared = [u for u in m.allowed[i] if u in allowed[j]]
        if not shared:
            continue
        if (i, j) not in m.orders:  # the stall rows may have made it
            m.orders[(i, j)] = pulp.LpVariable(f"o_{i}_{j}", cat="Binary")
        o = m.orders[(i, j)]
        same = m.sames[(i, j)] = pulp.LpVariable(f"same_{i}_{j}", 0, 1)
        for u in shared:  # same >= a[i,u] + a[j,u] - 1
            row([(same, 1), (a[(i, u)], -1), (a[(j, u)], -1)], -1, f"same_{i}_{j}_{u}")
        di, dj = _duration_var(m, i, dur), _duration_var(m, j, dur)
        # t[j] >= t[i] + d[i] - M (1 - o) - M (1 - same);  t[i] >= t[j] + d[j] - M o - M (1 - same)
        row([(t[j], 1), (t[i], -1), (di, -1), (o, -big_m), (same, -big_m)], -2 * big_m, f"serialize_{i}_{j}_a")
        row([(t[i], 1), (t[j], -1), (dj, -1), (o, big_m), (same, -big_m)], -big_m, f"serialize_{i}_{j}_b")


def _duration_var(m: _Model, b: int, dur: dict[int, pulp.LpAffineExpression]) -> pulp.LpVariable:
    if b not in m.d:
        var = m.d[b] = pulp.LpVariable(f"d_{b}", 0)
        m.lp += var == dur[b], f"duration_{b}"
    return m.d[b]


def _region_rows(m: _Model, dur: dict[int, pulp.LpAffineExpression]) -> None:
    """Cut: whatever a unit runs between a fork and its join runs after the fork and before the join."""
    problem, lp = m.problem, m.lp
    for x, y, between in problem.regions:
        for u in range(len(problem.units)):
            inside = [(b, u) for b in between if (b, u) in m.a]
            if len(inside) >= 2:
                work = pulp.lpSum(m.work(*k) + (problem.unit_overhead[u] * m.z[k] if k in m.z else 0) for k in inside)
                lp += m.t[y] >= m.t[x] + dur[x] + work, f"region_{x}_{y}_{u}"


def section_gaps(problem: Problem) -> tuple[tuple[tuple[float, float], ...], ...]:
    """Per stretch (``Problem.sections``) and unit u: the least time from the stretch's start (x's end) before any
    block of it can start on u, and from any block's end on u to the stretch's end (y's start, the frame's
    departure): the least of ``section_paths`` over the stretch's blocks. Computed once per problem."""
    if "section_gaps" in problem.derived:
        return problem.derived["section_gaps"]
    units = range(len(problem.units))
    out = []
    for (_, _, between), (head, tail) in zip(problem.sections(), section_paths(problem), strict=True):
        out.append(
            tuple(
                (min((head[b][u] for b in between), default=0.0), min((tail[b][u] for b in between), default=0.0))
                for u in units
            )
        )
    problem.derived["section_gaps"] = tuple(out)
    return problem.derived["section_gaps"]


def section_paths(problem: Problem) -> tuple[tuple[dict[int, list[float]], dict[int, list[float]]], ...]:
    """Per stretch (``Problem.sections``), per block b of it and unit u (inf where u cannot run b): the least time from
    the stretch's start (x's end) before b can start on u (head), and from b's end on u to the stretch's end
    (y's start, the frame's departure; tail): shortest paths within the stretch as in ``path_bounds``, each
    block on the unit that serves the bound best, a transfer wherever the path changes PU. An input from
    before x adds nothing (it was there when x ran), nor an output past y. Computed once per problem."""
    if "section_paths" in problem.derived:
        return problem.derived["section_paths"]
    n, units = len(problem.blocks), range(len(problem.units))
    pu = [x.pu for x in problem.units]

    def comm(ei: int, p: str, q: str) -> float:
        return 0.0 if p == q else problem.transfer[(ei, p, q)] + problem.handoff_delay.get((ei, p, q), 0.0)

    preds, succs = predecessors(problem), [[] for _ in range(n)]
    for ei, (i, j, _) in enumerate(problem.edges):
        succs[i].append((j, ei))
    ms = {b: [least_ms(problem, b, u) for u in units] for b in range(n)}
    out = []
    for x, y, between in problem.sections():
        inside = set(between)
        head: dict[int, list[float]] = {}
        for b in between:
            head[b] = []
            for u in units:
                waits = [0.0]
                for i, ei in preds[b]:
                    if i == x:
                        waits.append(min((comm(ei, pu[v], pu[u]) for v in units if ms[x][v] < math.inf), default=0.0))
                    elif i in inside:
                        waits.append(min(head[i][v] + ms[i][v] + comm(ei, pu[v], pu[u]) for v in units))
                head[b].append(max(waits) if ms[b][u] < math.inf else math.inf)
        tail: dict[int, list[float]] = {}
        for b in reversed(between):
            tail[b] = []
            for u in units:
                waits = [0.0]
                for j, ei in succs[b]:
                    if j == y:
                        waits.append(min((comm(ei, pu[u], pu[v]) for v in units if ms[y][v] < math.inf), default=0.0))
                    elif j in inside:
                        waits.append(min(comm(ei, pu[u], pu[v]) + ms[j][v] + tail[j][v] for v in units))
                tail[b].append(max(waits) if ms[b][u] < math.inf else math.inf)
        out.append((head, tail))
    problem.derived["section_paths"] = tuple(out)
    return problem.derived["section_paths"]


def _section_rows(m: _Model, dur: dict[int, pulp.LpAffineExpression]) -> None:
    """Cut: between two consecutive articulation blocks (or the frame's arrival and departure) the time is at
    least what any one unit runs there, and a CPU cluster's cores deliver at most their number of core-ms per
    ms of it (units of one cluster have cores of their own). Fork/join regions say the first within a module;
    this says both for the stretches no fork opens (the independent sources of a multi-view model)."""
    problem, lp = m.problem, m.lp
    for (x, y, between), gaps in zip(problem.sections(), section_gaps(problem), strict=True):
        early = (m.t[x] + dur[x]) if x >= 0 else 0
        late = m.t[y] if y < m.n else m.L
        work: dict[int, pulp.LpAffineExpression] = {}
        for u in range(len(problem.units)):
            inside = [(b, u) for b in between if (b, u) in m.a]
            if len(inside) >= 2:
                work[u] = pulp.lpSum(
                    m.work(*k) + (problem.unit_overhead[u] * m.z[k] if k in m.z else 0) for k in inside
                )
                idle = gaps[u][0] + gaps[u][1]
                if idle > 0:  # used[u]: u runs a block of the stretch (1 in every plan where it does)
                    used = pulp.LpVariable(f"used_{x + 1}_{u}", 0, 1)
                    for k in inside:
                        lp += used >= m.a[k], f"used_{x + 1}_{k[0]}_{u}"
                    lp += late >= early + work[u] + idle * used, f"section_{x}_{y}_{u}"
                    m.used[(x, y, u)] = used
                else:
                    lp += late >= early + work[u], f"section_{x}_{y}_{u}"
        for p, cores in problem.cluster_cores.items():
            mine = [u for u in m.units_of_pu[p] if u in work]
            if mine:
                core_time = pulp.lpSum(problem.units[u].cores * work[u] for u in mine)
                lp += core_time <= cores * (late - early), f"section_cluster_{x}_{y}_{p}"


def _branch_symmetry_rows(m: _Model) -> None:
    """Of twin branches (``twin_branches``), each starts no earlier than the one before it in index order: any
    plan is one with its twin branches swapped into that order (``sorted_branches``), so this cuts off no
    figure, only copies of plans (k! of them for k twins)."""
    for members in twin_branches(m.problem):
        for k, (one, two) in enumerate(itertools.pairwise(members)):
            m.lp += m.t[two[0]] >= m.t[one[0]], f"branch_symmetry_{members[0][0]}_{k}"


def _latency_rows(m: _Model, dur: dict[int, pulp.LpAffineExpression], upper: float | None) -> None:
    """A frame leaves when its last block ends; no worse than the warm start (``upper``) when given."""
    for b in range(m.n):
        m.lp += m.L >= m.t[b] + dur[b], f"latency_{b}"
    if upper is not None:
        m.lp += m.L <= upper * 1.0001, "bound_latency_warm"


def _segment_rows(m: _Model, segments: tuple[tuple[int, int, float], ...]) -> None:
    """Cut: between two blocks nothing runs beside (articulations), at least the span their segment takes
    on its own (``segment_bounds``); -1 stands for the frame's arrival, n for its departure."""
    for x, y, span in segments:
        early = m.t[x] if x >= 0 else 0
        late = m.t[y] if y < m.n else m.L
        m.lp += late >= early + span, f"segment_{x}_{y}"


def chain_spans(problem: Problem) -> tuple[tuple[int, int, tuple[float, ...]], ...]:
    """For every run of consecutive articulation blocks k..m (a chain: each block's only input from the run is
    the one before it, and all run one after the other), and every later block j of it: (k, j, s) with s[u]
    the least time from k's start to j's start when j runs on unit u (a shortest path over the units of
    k..j-1: each block's time there, the transfer and handoff delay where consecutive blocks change PU).
    A relaxation: no partition overhead, no gRPC CPU time, no other edges into the run. Computed once per
    problem. The ordering rows leave a chain's transfers to the LP's fractional assignment, which pays none."""
    if "chain_spans" in problem.derived:
        return problem.derived["chain_spans"]
    edge = {(i, j): ei for ei, (i, j, _) in enumerate(problem.edges)}
    units = range(len(problem.units))
    cuts = problem.articulations()
    out: list[tuple[int, int, tuple[float, ...]]] = []
    runs: list[list[int]] = []
    for b in cuts:
        if runs and runs[-1][-1] == b - 1 and (b - 1, b) in edge:
            runs[-1].append(b)
        else:
            runs.append([b])
    for run in (r for r in runs if len(r) >= 3):
        k = run[0]
        # finish[u]: the least time from k's start to the end of the latest block of the run on unit u
        finish = [least_ms(problem, k, u) for u in units]
        for j in run[1:]:
            ei = edge[(j - 1, j)]
            arrive = []
            for v in units:
                q = problem.units[v].pu
                arrive.append(
                    min(
                        (
                            f
                            if problem.units[u].pu == q
                            else f
                            + problem.transfer[(ei, problem.units[u].pu, q)]
                            + problem.handoff_delay.get((ei, problem.units[u].pu, q), 0.0)
                        )
                        for u, f in zip(units, finish, strict=True)
                    )
                )
            if j - k >= 2:
                out.append((k, j, tuple(arrive)))
            finish = [a + least_ms(problem, j, v) for v, a in enumerate(arrive)]
    problem.derived["chain_spans"] = tuple(out)
    return problem.derived["chain_spans"]


def _chain_rows(m: _Model) -> None:
    """Cut: along a chain of articulation blocks, a block starts no earlier than the shortest path from the
    chain's first block to it on the unit that runs it (``chain_spans``)."""
    for k, j, spans in chain_spans(m.problem):
        least = min(spans)
        terms = [(m.t[j], 1.0), (m.t[k], -1.0)]
        terms += [(m.a[(j, u)], -(s - least)) for u, s in enumerate(spans) if (j, u) in m.a and s > least]
        row = pulp.LpConstraint(pulp.LpAffineExpression(terms), pulp.LpConstraintGE, rhs=least)
        m.lp.addConstraint(row, f"chain_{k}_{j}")


def path_bounds(problem: Problem) -> tuple[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]]:
    """Per block b and unit u (inf where u cannot run b): the least time before b can start on u (head) and
    the least time from b's end on u to the frame's departure (tail), over every path into and out of b, each
    block of it on the unit that serves the bound best, with the transfer and handoff delay wherever the
    path changes PU. A relaxation: no partition overhead, no gRPC CPU time, no unit busy with anything else.
    The LP's fractional assignment pays no transfers; these pay the ones a path cannot avoid."""
    if "path_bounds" in problem.derived:
        return problem.derived["path_bounds"]
    n, units = len(problem.blocks), range(len(problem.units))
    pu = [x.pu for x in problem.units]

    def comm(ei: int, p: str, q: str) -> float:
        return 0.0 if p == q else problem.transfer[(ei, p, q)] + problem.handoff_delay.get((ei, p, q), 0.0)

    ms = [[least_ms(problem, b, u) for u in units] for b in range(n)]
    preds, succs = predecessors(problem), [[] for _ in range(n)]
    for ei, (i, j, _) in enumerate(problem.edges):
        succs[i].append((j, ei))
    head = [[0.0] * len(units) for _ in range(n)]
    for b in range(n):
        for u in units:
            if ms[b][u] == math.inf:
                head[b][u] = math.inf
                continue
            head[b][u] = max(
                (min(head[i][v] + ms[i][v] + comm(ei, pu[v], pu[u]) for v in units) for i, ei in preds[b]),
                default=0.0,
            )
    tail = [[0.0] * len(units) for _ in range(n)]
    for b in reversed(range(n)):
        for u in units:
            if ms[b][u] == math.inf:
                tail[b][u] = math.inf
                continue
            tail[b][u] = max(
                (min(comm(ei, pu[u], pu[v]) + ms[j][v] + tail[j][v] for v in units) for j, ei in succs[b]),
                default=0.0,
            )
    problem.derived["path_bounds"] = (tuple(map(tuple, head)), tuple(map(tuple, tail)))
    return problem.derived["path_bounds"]


def _path_rows(m: _Model) -> None:
    """Cut: every block starts no earlier than its head on the unit that runs it, and the frame leaves no
    earlier than its start, its time there and its tail (``path_bounds``)."""
    head, tail = path_bounds(m.problem)
    ge = pulp.LpConstraintGE
    for b in range(m.n):
        on = [u for u in m.allowed[b]]
        if any(head[b][u] > 0 for u in on):
            terms = [(m.t[b], 1.0)] + [(m.a[(b, u)], -head[b][u]) for u in on if head[b][u] > 0]
            m.lp.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms), ge, rhs=0.0), f"head_{b}")
        terms = [(m.L, 1.0), (m.t[b], -1.0)] + [(m.a[(b, u)], -(tail[b][u] + least_ms(m.problem, b, u))) for u in on]
        m.lp.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms), ge, rhs=0.0), f"tail_{b}")


def least_ms(problem: Problem, b: int, u: int) -> float:
    """Block b's time on unit u in its faster precision there; inf where u cannot run it."""
    times = [
        t
        for t in (problem.cost.get((b, u)), problem.int8_cost.get((b, u)), problem.second_cost.get((b, u)))
        if t is not None
    ]
    return min(times, default=math.inf)


def segment_bounds(
    problem: Problem,
    budget: float,
    warm: Assignment | None = None,
    gap: float = BOUND_GAP,
    stop: threading.Event | None = None,
) -> tuple[tuple[int, int, float], ...]:
    """Lower bounds on the time between consecutive articulation blocks (x, y, ms), each the proven bound of
    the latency ILP of the blocks from x to y on their own (a relaxation: no partition overhead, no gRPC
    CPU time, y costing nothing): the latency of a chain of fork/join modules is the sum of its modules'
    spans, which the big-M ordering rows alone bound weakly. Computed once per problem, within ``budget``
    seconds; x = -1 is the frame's arrival, y = n its departure (the last segment includes its last block).
    Segments of two blocks (the precedence row says as much) or of more than a quarter of a large model
    (its ILP costs about as much as the model's and proves little in its share of the time) are left out.

    Each segment's ILP stops at a proven ``gap`` between its bound and its best plan, and is handed ``warm``'s
    part of the frame as its first plan: a bound is all it is solved for, and proving the last hundredths of a
    percent took most of a latency solve's seconds (inception_v3 on bst-a1000: 5 of 7.6 s, in two segments
    whose root bound was within 0.4% of their optimum). The bound stays a proven one (the solver's dual bound),
    at most ``gap`` under the segment's optimum. Once ``stop`` is set, no further segment is solved, and what was
    computed is returned, not kept for the problem."""
    if "segment_bounds" in problem.derived:
        return problem.derived["segment_bounds"]
    n = len(problem.blocks)
    cuts = list(problem.articulations())
    ends = ([-1] if not cuts or cuts[0] != 0 else []) + cuts + ([n] if not cuts or cuts[-1] != n - 1 else [])
    pairs = [(x, y) for x, y in itertools.pairwise(ends) if 2 <= y - x <= max(n // 4, 8)]
    deadline = time.perf_counter() + budget
    out = []
    for k, (x, y) in enumerate(pairs):
        left = deadline - time.perf_counter()
        if left <= 0.05:
            break
        if stop is not None and stop.is_set():
            return tuple(out)
        sink = y < n
        sub = problem.segment(max(x, 0), y if sink else n - 1, sink=sink)
        part = _within_segment(warm, max(x, 0), y if sink else n - 1) if warm is not None else None
        span = latency_bound(sub, left / (len(pairs) - k), part, gap)
        if span is not None and span > 0:
            out.append((x, y, span))
    problem.derived["segment_bounds"] = tuple(out)
    return problem.derived["segment_bounds"]


def _within_segment(warm: Assignment, lo: int, hi: int) -> Assignment:
    """``warm``'s placement of blocks lo..hi, re-indexed from 0 as ``Problem.segment`` does."""
    inside = range(lo, hi + 1)
    return Assignment(
        warm.block_unit[lo : hi + 1],
        tuple(b - lo for b in warm.order if b in inside),
        frozenset(b - lo for b in warm.int8 if b in inside),
        frozenset(b - lo for b in warm.second if b in inside),
    )


def latency_bound(
    problem: Problem, time_limit: float, warm: Assignment | None = None, gap: float = BOUND_GAP
) -> float | None:
    """The proven lower bound on a problem's latency (HiGHS's dual bound of the pure latency ILP), solved to a
    proven ``gap``, from ``warm`` where given."""
    lp, v = _formulate(problem, "latency", cuts=Cuts(upper_load=_load_bound(problem)))
    lp.setObjective(v["L"])
    if warm is not None:
        _set_warm_start(problem, v, as_start(problem, warm, True))
    solved = solve_for_bound(lp, time_limit, gap, warm is not None)
    if solved is None:
        return None
    status, bound = solved
    return bound if status != "infeasible" else None


def relaxed_shares(
    problem: Problem, unit_sets: Sequence[Sequence[int]], time_limit: float
) -> list[dict[tuple[int, int], float] | None]:
    """For each set of units, the throughput model's LP relaxation with only those units in use: every block's
    share on every unit (``a[b,u]``), or None where the relaxation was not solved to optimality (or has no
    solution on those units) within what is left of ``time_limit`` seconds for them all. The model is written
    once; each set bounds the units' use (``on[u]``) and is solved again."""
    deadline = time.perf_counter() + time_limit
    lp, v = _formulate(problem, "throughput", cuts=Cuts(upper_load=_load_bound(problem)))
    for var in lp.variables():
        var.cat = pulp.LpContinuous
    out: list[dict[tuple[int, int], float] | None] = []
    for units in unit_sets:
        left = deadline - time.perf_counter()
        if left <= 0:
            out.append(None)
            continue
        keep = set(units)
        for u, var in v["on"].items():
            var.upBound = 1 if u in keep else 0
        solved = solve_for_bound(lp, left)
        optimal = solved is not None and solved[0] == "optimal"
        out.append({k: var.value() or 0.0 for k, var in v["a"].items()} if optimal else None)
    return out


def _load_rows(m: _Model, upper_load: float | None) -> None:
    """Throughput: the period is at least every unit's load (its blocks, the overhead of each of its
    partitions, its gRPC CPU time; times its sustained factor), and a cluster delivers at most its cores'
    worth of work."""
    problem, lp, units = m.problem, m.lp, m.problem.units
    loads = {u: _unit_work(m, u) for u in range(len(units))}
    for u in range(len(units)):
        lp += m.P >= problem.factor(u) * loads[u], f"period_unit_{u}"
        if m.timed:
            lp += m.L >= loads[u], f"latency_load_{u}"  # one frame's work on a unit fits in its latency
        if upper_load is not None:
            lp += loads[u] <= upper_load * m.on[u], f"unit_cap_{u}"  # cut: an unused unit carries nothing
    for p, cores in problem.cluster_cores.items():
        # cut: a cluster of n cores delivers at most n core-periods of work per period (and per frame)
        core_time = pulp.lpSum(units[u].cores * loads[u] for u in m.units_of_pu[p])
        sustained = pulp.lpSum(units[u].cores * problem.factor(u) * loads[u] for u in m.units_of_pu[p])
        lp += sustained <= cores * m.P, f"cluster_capacity_period_{p}"
        if m.timed:
            lp += core_time <= cores * m.L, f"cluster_capacity_latency_{p}"


def _link_and_memory_rows(m: _Model) -> None:
    """... or the period is the busiest link, or a shared memory's time for the bytes every unit on it moves."""
    problem, lp = m.problem, m.lp
    pus = problem.pus()
    for p in pus:
        for q in pus:
            link = [problem.transfer[k] * var for k, var in m.r.items() if k[1] == p and k[2] == q]
            if link:
                lp += m.P >= pulp.lpSum(link), f"period_link_{pus.index(p)}_{pus.index(q)}"
    for mi, (name, members) in enumerate(problem.shared_memories.items()):
        traffic = pulp.lpSum(
            problem.traffic[(b, name)] * m.on_pu(b, p) for b in range(m.n) for p in members if p in m.units_of_pu
        )
        # an int8 block moves its share of the fp32 bytes (``Problem.traffic_share``)
        saved = pulp.lpSum(
            problem.traffic[(b, name)] * (1.0 - problem.traffic_share(b, u, level)) * var
            for level, chosen in ((1, m.q), (2, m.q2))
            for (b, u), var in chosen.items()
            if problem.units[u].pu in members and problem.traffic_share(b, u, level) < 1.0
        )
        lp += m.P >= traffic - saved, f"period_memory_{mi}"


def _energy_row(m: _Model) -> None:
    """Energy per frame: busy power above idle, every PU's idle power over one period, transfers."""
    problem = m.problem
    busy = pulp.lpSum(problem.busy_extra_w[u] * m.work(b, u) for (b, u) in m.a) + pulp.lpSum(
        problem.unit_overhead[u] * problem.busy_extra_w[u] * var for (_, u), var in m.z.items()
    )
    busy += pulp.lpSum(m.w_cost[k] * problem.busy_extra_w[k[1]] * var for k, var in m.w.items())
    moved = pulp.lpSum(problem.transfer_mj[k] * var for k, var in m.r.items())
    m.lp += m.E >= busy + moved + problem.idle_w * m.P, "energy"


def _load_bound(problem: Problem) -> float:
    """An upper bound on any unit's load: every block at its slowest, each its own partition."""
    slowest: dict[int, float] = {}
    for (b, _), v in [*problem.cost.items(), *problem.int8_cost.items(), *problem.second_cost.items()]:
        slowest[b] = max(slowest.get(b, 0.0), v)
    return (
        sum(slowest.values())
        + len(problem.blocks) * max(problem.unit_overhead.values(), default=0.0)
        + sum(sum(ends) for ends in problem.handoff_cpu.values())
    )


def _set_warm_start(problem: Problem, v: dict, warm: Assignment) -> None:
    figures = schedule(problem, warm)
    used = set(warm.block_unit)
    for u, var in v["on"].items():
        var.setInitialValue(1 if u in used else 0)
    for (b, u), var in v["a"].items():
        var.setInitialValue(1 if warm.block_unit[b] == u else 0)
    for (b, u), var in v["q"].items():
        var.setInitialValue(1 if warm.block_unit[b] == u and warm.level(b) == 1 else 0)
    for (b, u), var in v["q2"].items():
        var.setInitialValue(1 if warm.block_unit[b] == u and warm.level(b) == 2 else 0)
    starts = partition_starts(problem, warm)
    for (b, u), var in v["z"].items():
        var.setInitialValue(1 if warm.block_unit[b] == u and starts[b] else 0)
    for (b, u, ei, there), var in v["w"].items():
        i, j, _ = problem.edges[ei]
        other = j if b == i else i
        var.setInitialValue(1 if warm.block_unit[b] == u and problem.units[warm.block_unit[other]].pu == there else 0)
    for b, var in v["t"].items():
        var.setInitialValue(figures.starts[b])
    for name, var in v["order"].items():
        i, j = name
        var.setInitialValue(1 if figures.starts[i] <= figures.starts[j] else 0)
    for name, var in v["same"].items():
        i, j = name
        var.setInitialValue(1 if warm.block_unit[i] == warm.block_unit[j] else 0)
    for (ei, p, q), var in v["r"].items():
        i, j, _ = problem.edges[ei]
        moved = problem.units[warm.block_unit[i]].pu == p and problem.units[warm.block_unit[j]].pu == q
        var.setInitialValue(1 if moved else 0)
    for (ei, p), var in v["s"].items():
        i, j, _ = problem.edges[ei]
        ui, uj = warm.block_unit[i], warm.block_unit[j]
        var.setInitialValue(1 if ui != uj and problem.units[ui].pu == p == problem.units[uj].pu else 0)
    for (x, y, u), var in v["used"].items():
        var.setInitialValue(1 if u in warm.block_unit[x + 1 : y] else 0)
    counts: dict[int, list[int]] = {}  # unit -> how many of blocks 0..b it runs, per b
    for (u, b), var in v["held"].items():
        if u not in counts:
            counts[u] = list(itertools.accumulate(1 if x == u else 0 for x in warm.block_unit))
        var.setInitialValue(counts[u][b])
    for (j, b, u), var in v["ahead"].items():  # after a, q, q2, z, w and the orders (``own`` reads them)
        i, jj = min(j, b), max(j, b)
        o = 1 if figures.starts[i] <= figures.starts[jj] else 0  # as the order is set above
        first = o if i == j else 1 - o
        var.setInitialValue(v["stall_own"][(j, u)].value() if first else 0.0)
    for (b, u), var in v["fast"].items():
        burst, before = problem.burst[u], v["stall_before"][(b, u)].value()
        var.setInitialValue(min(v["stall_own"][(b, u)].value(), max(0.0, burst - before)))
        v["past"][(b, u)].setInitialValue(1 if before > burst else 0)
    for b, var in v["d"].items():  # after every variable its expression reads
        var.setInitialValue(v["dur"][b].value())
    v["L"].setInitialValue(figures.latency_ms)
    v["P"].setInitialValue(figures.period_ms)
    v["E"].setInitialValue(figures.energy_mj)


def _extract(problem: Problem, v: dict) -> Assignment:
    """The incumbent's assignment, with the order its start times give (when the model has them)."""
    n = len(problem.blocks)
    block_unit = []
    for b in range(n):
        best = max((u for (bb, u) in v["a"] if bb == b), key=lambda u: v["a"][(b, u)].varValue or 0.0)
        block_unit.append(best)
    second = frozenset(
        b for b, u in enumerate(block_unit) if (b, u) in v["q2"] and (v["q2"][(b, u)].varValue or 0.0) > 0.5
    )
    int8 = second | frozenset(
        b
        for b, u in enumerate(block_unit)
        if (b, u) in problem.int8_cost and ((b, u) not in v["q"] or (v["q"][(b, u)].varValue or 0.0) > 0.5)
    )
    if not v["t"]:
        return Assignment(tuple(block_unit), int8=int8, second=second)
    start = {b: round(var.varValue or 0.0, 9) for b, var in v["t"].items()}
    order = tuple(sorted(range(n), key=lambda b: (start[b], b)))
    return Assignment(tuple(block_unit), () if order == tuple(range(n)) else order, int8, second)


def _infeasible_message(problem: Problem, given: Bounds, status: str) -> str:
    max_l, max_p, max_e = given.max_latency_ms, given.max_period_ms, given.max_energy_mj
    bounds = []
    if max_l is not None:
        bounds.append(f"--max-latency-ms {max_l:g}")
    if max_p is not None:
        bounds.append(f"--min-fps {1000 / max_p:g}")
    if max_e is not None:
        bounds.append(f"--max-mj {max_e:g}")
    if status == "no solution":
        return "the solver found no plan within the time limit; raise --time-limit or use --granularity coarse"
    if bounds:
        return f"no plan meets {' and '.join(bounds)}; relax {'one of them' if len(bounds) > 1 else 'it'}"
    weights = sum(problem.param_bytes.values())
    return (
        f"no plan fits: the weights ({weights / 2**20:.0f} MiB) do not fit the memory of the PUs that can run them, "
        "or --max-stages is too small; raise --max-stages or give the profile's PUs more memory_bytes"
    )
