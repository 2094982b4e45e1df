"""HiGHS (through PuLP) as the planner runs it: quietly, one run at a time, with a deadline and a limit another
thread may cut, a warm start handed over, and an honest status (PuLP may say Optimal after a time limit, so the
solver itself is asked). CBC is the fallback backend."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator

import pulp

from planner.plan import PlanError

BOUND_GAP = 1e-4  # the proven gap a problem solved only for its bound stops at, unless told otherwise


# HiGHS's presolve rules switched off (bit 15: probing). Probing the binaries of a latency model with thousands of
# ordering rows took all of bert_small's 19 s on bst-a1000 (interrupted in presolve, no bound at all); with it off
# and the shorter symmetry rows that solve closes at the root, and bench_planner's 72 rows took 506 s instead of 583
# with probing (655 s before both; ``bench/results_planner.txt``)
PROBING_OFF = 1 << 15


def run_solver(
    lp: pulp.LpProblem,
    solver: str,
    remaining: float,
    time_limit: float,
    gap: float,
    warm: bool,
    effort: float | None = None,
    deadline: float | None = None,
    cut: LimitCut | None = None,
):
    """Solve ``lp`` in place; returns the backend (its status is read from it). Solver crashes are PlanErrors.
    With a ``deadline`` (``time.perf_counter()``), HiGHS stops by then, however long handing it the model took;
    with a ``cut``, earlier by what the caller takes off while it runs."""
    backend = backend_for(solver, remaining, gap, warm, effort, deadline, cut)
    try:
        with quiet():
            lp.solve(backend)
    except pulp.PulpSolverError as exc:
        if solver != "cbc" or not warm:
            raise PlanError(f"the solver failed: {exc}; try --solver cbc") from None
        # CBC 2.10 can crash reading a MIP start: solve without it (the warm start is still kept if better)
        backend = backend_for(solver, time_limit, gap, False)
        try:
            with quiet():
                lp.solve(backend)
        except pulp.PulpSolverError as again:
            raise PlanError(f"the solver failed: {again}; try --solver highs") from None
    return backend


_BANNER = threading.Lock()
_banner_shown = False


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """HiGHS prints its banner from C++ to fd 1, even with output off, once per process: at the first instance
    that logs anything. That first instance is made here, once, with console logging off (HiGHS marks the banner
    written all the same), so no solve prints it and fd 1 is never touched: a solve may run beside another
    thread's output (``LimitCut``), and pointing fd 1 away even for a moment would swallow that thread's lines."""
    global _banner_shown
    with _BANNER:
        if not _banner_shown:
            from highspy.highs import _Highs

            first = _Highs()
            first.setOptionValue("log_to_console", False)
            first.setOptionValue("log_file", "")
            first.setCallback(None, None)  # the first call that logs: the banner, to nowhere
            _banner_shown = True
    yield


def solve_for_bound(
    lp: pulp.LpProblem, time_limit: float, gap: float = BOUND_GAP, warm: bool = False
) -> tuple[str, float | None] | None:
    """Solve a problem that is only there for its bound with HiGHS, quietly, within ``time_limit`` seconds, to a
    proven ``gap`` (from the variables' initial values with ``warm``): (status, proven bound), or None where the
    solver failed."""
    backend = backend_for("highs", max(time_limit, 0.05), gap, warm)
    try:
        with quiet():
            lp.solve(backend)
    except pulp.PulpSolverError:
        return None
    status, _, bound = status_of(lp, backend)
    return status, bound


# One HiGHS run at a time in the process: a solve may run in a thread beside Python work (HiGHS lets go of the
# GIL while it runs), never beside another solve (HiGHS's thread scheduler is not safe to restart under a run)
_HIGHS_RUN = threading.Lock()


class LimitCut:
    """Seconds taken off a solve's time limit while it runs, from another thread: the caller learns, beside the
    solve, that what follows it needs more time (``planner.search.solve_objective`` times the simulation of the
    warm start's plan while HiGHS runs). A cut made before HiGHS starts shortens its limit; one made while it runs
    stops it (``_interrupt``: it reports its incumbent as after a time limit) when the shortened limit is up.
    Never below a tenth of the limit, as a deadline already passed leaves the solve."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._run: tuple[object, float, float] | None = None  # (the Highs instance, when it started, its limit)
        self._timer: threading.Timer | None = None
        self._stopped = False
        self.started = threading.Event()  # HiGHS has started running (the model is written)

    @property
    def seconds(self) -> float:
        """The seconds taken off so far."""
        return self._seconds

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def running(self) -> bool:
        """HiGHS is running the solve now."""
        return self._run is not None

    def shorten(self, seconds: float) -> None:
        with self._lock:
            self._seconds += max(seconds, 0.0)
            if self._run is not None:
                run = self._run
                _, began, limit = run
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = threading.Timer(
                    max(began + self._limit(limit) - time.perf_counter(), 0.0), self._stop, (run,)
                )
                self._timer.daemon = True
                self._timer.start()

    def stop(self) -> None:
        """End the solve now (the caller was interrupted): HiGHS stops at once, and a run still to come at once."""
        with self._lock:
            self._stopped = True
            if self._run is not None:
                _interrupt(self._run[0])

    def _limit(self, limit: float) -> float:
        return 0.0 if self._stopped else max(limit - self._seconds, 0.1 * limit)

    def _stop(self, run: tuple[object, float, float]) -> None:
        with self._lock:
            if self._run is run:  # still the run the timer was set for
                _interrupt(run[0])

    @contextlib.contextmanager
    def run(self, highs: object, limit: float) -> Iterator[float]:
        """While ``highs`` runs with ``limit`` seconds: the limit less what was cut so far."""
        with self._lock:
            self._run = (highs, time.perf_counter(), limit)
            shortened = self._limit(limit)
            self.started.set()
        try:
            yield shortened
        finally:
            with self._lock:
                self._run = None
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None


def _interrupt(highs) -> None:
    """Stop a running HiGHS from another thread: its interrupt callbacks are switched on now, not for the whole
    run (they take the GIL each time HiGHS checks them, which costs a solve beside busy Python a fifth of its
    speed), and the next check stops it with its incumbent."""
    highs.HandleUserInterrupt = True
    highs.cancelSolve()


class WarmHiGHS(pulp.HiGHS):
    """PuLP's HiGHS interface, handing the variables' initial values to HiGHS as a start solution."""

    def __init__(self, warm: bool, deadline: float | None = None, cut: LimitCut | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.warm = warm
        self.deadline = deadline
        self.cut = cut

    def callSolver(self, lp) -> None:
        import highspy

        limit = self.timeLimit
        if self.deadline is not None:  # what is left now that the model is built, never below a tenth of the limit
            limit = min(max(self.deadline - time.perf_counter(), 0.1 * self.timeLimit), self.timeLimit)
        if self.warm:
            values = [v.varValue if v.varValue is not None else 0.0 for v in lp.variables()]
            start = highspy.HighsSolution()
            start.col_value = values
            start.value_valid = True
            lp.solverModel.setSolution(start)
        running = self.cut.run(lp.solverModel, limit) if self.cut else contextlib.nullcontext(limit)
        with _HIGHS_RUN, running as left:
            lp.solverModel.setOptionValue("time_limit", left)
            if lp.solverModel.run() == highspy.HighsStatus.kError and (
                lp.solverModel.getModelStatus() == highspy.HighsModelStatus.kNotset
            ):
                # HiGHS's thread scheduler is global to the process: one started with another thread count (a
                # solve elsewhere in the process) refuses this one at once; start it again with this solve's
                highspy.Highs.resetGlobalScheduler(True)
                lp.solverModel.run()
            if lp.solverModel.getModelStatus() == highspy.HighsModelStatus.kSolveError:
                # HiGHS checks its incumbent on the model as given after solving the presolved one, and where
                # the two disagree by more than its tolerance (3e-6 against 1e-6 on a 4-block problem with an
                # int8-only unit and throttled cores) reports a solve error, not the plan: solve again at a tighter
                # feasibility tolerance (1e-8), within what is left of the limit
                lp.solverModel.setOptionValue("mip_feasibility_tolerance", 1e-8)
                lp.solverModel.setOptionValue("time_limit", max(left - lp.solverModel.getRunTime(), 0.1 * left))
                lp.solverModel.run()


def backend_for(
    name: str,
    time_limit: float,
    gap: float,
    warm: bool,
    effort: float | None = None,
    deadline: float | None = None,
    cut: LimitCut | None = None,
):
    """The backend; ``effort``: HiGHS's share of its time for primal heuristics (None: its default); ``deadline``:
    HiGHS's limit is what is left of it once the model is built (``time.perf_counter()``; at most ``time_limit``);
    ``cut``: less what the caller takes off (HiGHS only; CBC runs to its limit)."""
    if name == "highs":
        solver = WarmHiGHS(warm, deadline, cut, msg=False, timeLimit=time_limit, gapRel=gap, threads=1)
        if effort is not None:
            solver.optionsDict["mip_heuristic_effort"] = effort
        solver.optionsDict["presolve_rule_off"] = PROBING_OFF
        solver.name = "highs"
        return solver
    if name == "cbc":
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, gapRel=gap, warmStart=warm)
        solver.name = "cbc"
        return solver
    raise PlanError(f"unknown solver {name!r}; choose highs or cbc")


def status_of(lp: pulp.LpProblem, solver) -> tuple[str, float | None, float | None]:
    """Honest status: after a time limit PuLP may say Optimal, so ask the solver itself."""
    if getattr(solver, "name", "") == "highs" and getattr(lp, "solverModel", None) is not None:
        import highspy

        h = lp.solverModel
        model_status = h.getModelStatus()
        info = h.getInfo()
        has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
        bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
        mip_gap = info.mip_gap if has_solution and math.isfinite(info.mip_gap) else None
        if model_status == highspy.HighsModelStatus.kOptimal:
            return "optimal", mip_gap, bound
        if model_status == highspy.HighsModelStatus.kInfeasible:
            return "infeasible", None, None
        if model_status in (highspy.HighsModelStatus.kTimeLimit, highspy.HighsModelStatus.kInterrupt):
            return ("time-limit" if has_solution else "no solution"), mip_gap, bound
        return (h.modelStatusToString(model_status).lower() if has_solution else "no solution"), mip_gap, bound
    # PuLP's status says Optimal after CBC stops on its time limit with a solution; sol_status tells them apart
    if lp.status == pulp.LpStatusInfeasible or lp.sol_status == pulp.LpSolutionInfeasible:
        return "infeasible", None, None
    if lp.sol_status == pulp.LpSolutionOptimal:
        return "optimal", None, None
    if lp.sol_status == pulp.LpSolutionIntegerFeasible:
        return "time-limit", None, None
    return "no solution", None, None
