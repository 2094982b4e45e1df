"""A solve runs in a thread beside Python work (``planner.search.solve_objective``): its time limit can be cut
while HiGHS runs, or the solve stopped, from the other thread; HiGHS leaves fd 1 alone while it runs."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from planner.costmodel import CostModel
from planner.highs import LimitCut
from planner.ilp import solve
from planner.problem import Problem, build_problem
from planner.timing import Assignment, schedule

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 40.0  # yolo_det's latency ILP does not close in 30 s on khadas-vim3 (bench/results_planner.txt)


@pytest.fixture(scope="module")
def yolo_latency(exported) -> tuple[Problem, Assignment]:
    """A latency ILP the solver does not close within ``LIMIT``, with a warm start it accepts."""
    loaded = load_onnx(exported("yolo_det").path)
    graph = build_graph(loaded.proto, loaded.sha256, "yolo_det")
    problem = build_problem(coarsen(graph, "coarse"), graph, CostModel(load_profile("khadas-vim3"), graph), 4)
    # the bounds a latency solve computes around HiGHS's run, known already: only the run is timed here
    problem.derived["segment_bounds"] = ()
    problem.derived["configuration_bound"] = None
    return problem, Assignment(tuple(0 for _ in problem.blocks))


def _once_running(cut: LimitCut) -> None:
    deadline = time.monotonic() + LIMIT
    while not cut.running:
        assert time.monotonic() < deadline, "HiGHS never started"
        time.sleep(0.02)


def test_a_cut_made_while_highs_runs_ends_the_solve_early_with_its_incumbent(yolo_latency) -> None:
    problem, warm = yolo_latency
    cut = LimitCut()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        solving = pool.submit(solve, problem, "latency", LIMIT, warm=warm, cut=cut)
        _once_running(cut)
        cut.shorten(LIMIT)  # never below a tenth of the limit: HiGHS stops about 4 s after it started
        solution = solving.result()
    assert solution.status.startswith("time-limit"), solution.status
    assert solution.seconds < LIMIT / 2, "the cut did not stop HiGHS: it ran to its own limit"
    # what it returns is a plan, never worse than the start it was given
    assert solution.figures.latency_ms <= schedule(problem, warm).latency_ms * (1 + 1e-9)
    assert cut.seconds == LIMIT and not cut.running


def test_a_cut_made_before_highs_starts_shortens_its_limit(yolo_latency) -> None:
    problem, warm = yolo_latency
    cut = LimitCut()
    cut.shorten(LIMIT)
    solution = solve(problem, "latency", LIMIT, warm=warm, cut=cut)
    assert solution.status.startswith("time-limit"), solution.status
    assert solution.seconds < LIMIT / 2


def test_stop_ends_a_running_solve_at_once(yolo_latency) -> None:
    """An interrupt of the caller (Ctrl-C during ``plan``) stops the solver's thread too, and what follows the
    run in the solve (the bound from outside the solver) is skipped."""
    problem, warm = yolo_latency
    problem.derived.pop("configuration_bound")  # the latency floor would follow the run: a stop skips it
    try:
        cut = LimitCut()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            solving = pool.submit(solve, problem, "latency", LIMIT, warm=warm, cut=cut)
            _once_running(cut)
            cut.stop()
            solution = solving.result()
    finally:
        problem.derived["configuration_bound"] = None
    assert cut.stopped and solution.status.startswith("time-limit"), solution.status
    assert solution.seconds < LIMIT / 4
    assert solution.bound is None or solution.bound <= solution.figures.latency_ms


def test_highs_leaves_fd_1_to_other_threads_and_prints_no_banner() -> None:
    """Every line another thread writes to fd 1 while solves run comes out, and HiGHS's banner does not (it is
    printed once per process, at the first instance: that one is made with fd 1 pointed away)."""
    script = textwrap.dedent(
        """
        import os, sys, threading
        from planner.ilp import solve
        from planner.problem import Unit, toy_problem

        units = [Unit("cpu", "cpu", 1, i) for i in range(4)] + [Unit("gpu", "gpu", 1, 0)]
        n = 24
        cost = {(b, u): 1.0 + (b * 7 + u * 3) % 5 for b in range(n) for u in range(len(units))}
        edges = [(b, b + 1) for b in range(n - 1)] + [(b, b + 3) for b in range(0, n - 3, 2)]
        problem = toy_problem(units, cost, edges, transfer_ms=0.3)
        done = threading.Event()
        written = 0

        def write() -> None:
            global written
            while not done.is_set():
                os.write(1, b"line\\n")
                written += 1

        writer = threading.Thread(target=write)
        writer.start()
        for objective in ("latency", "throughput", "energy"):
            solve(problem, objective, 2.0)
        done.set()
        writer.join()
        print(written, file=sys.stderr)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    written = int(out.stderr.strip().splitlines()[-1])
    assert written > 0
    assert out.stdout.count("line\n") == written
    assert "HiGHS" not in out.stdout


@pytest.fixture
def googlenet_latency(exported):
    """googlenet's latency objective on khadas-vim3, as ``best_plan`` solves it."""
    from planner.search import UNBOUNDED, _Goal

    loaded = load_onnx(exported("googlenet").path)
    graph = build_graph(loaded.proto, loaded.sha256, "googlenet")
    blocks = coarsen(graph, "coarse")
    cost = CostModel(load_profile("khadas-vim3"), graph)
    return _Goal(blocks, graph, cost, "latency", UNBOUNDED, build_problem(blocks, graph, cost, 4))


def test_the_segment_bounds_are_computed_in_the_solvers_thread_while_the_local_search_runs(
    googlenet_latency, monkeypatch
) -> None:
    import threading

    import planner.search as search

    spans: dict[str, tuple[float, float, str]] = {}

    def timed(name, fn):
        def run(*args, **kwargs):
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spans[name] = (began, time.perf_counter(), threading.current_thread().name)

        return run

    monkeypatch.setattr(search, "segment_cuts", timed("bounds", search.segment_cuts))
    monkeypatch.setattr(search, "polish", timed("polish", search.polish))
    solved = search.solve_objective(googlenet_latency, search.SearchOptions(time_limit=30.0), 0)
    (b0, b1, bounds_thread), (p0, p1, polish_thread) = spans["bounds"], spans["polish"]
    assert bounds_thread.startswith("parapipe-solver") and polish_thread == threading.current_thread().name
    assert b0 < p1 and p0 < b1, "the bounds and the local search did not run at the same time"
    segments = googlenet_latency.problem.derived["segment_bounds"]
    assert len(segments) >= 8  # computed once, ahead of the solve, which used them and closed its gap
    assert solved.solution.status == "optimal"


def test_an_interrupt_of_the_local_search_stops_the_segment_bounds(googlenet_latency, monkeypatch) -> None:
    """Ctrl-C during the local search: the bounds beside it stop after the segment they are at (the plan command
    exits then, not after the bounds' share of the limit), and what they computed is not kept."""
    import planner.ilp as ilp
    import planner.search as search

    solved: list[int] = []
    bound = ilp.latency_bound

    def slow_bound(problem, *args, **kwargs):
        time.sleep(0.1)  # every segment takes a while: the interrupt comes while the first is solved
        solved.append(len(problem.blocks))
        return bound(problem, *args, **kwargs)

    def interrupted(*args, **kwargs):
        time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(ilp, "latency_bound", slow_bound)
    monkeypatch.setattr(search, "polish", interrupted)
    with pytest.raises(KeyboardInterrupt):
        search.solve_objective(googlenet_latency, search.SearchOptions(time_limit=400.0), 0)
    assert len(solved) <= 2, solved  # of googlenet's 9 segments (none, where the thread started late)
    assert "segment_bounds" not in googlenet_latency.problem.derived
