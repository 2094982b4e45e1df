"""Measured, side by side in one run: a unit's partitions run in turn by one thread (``profiler.modulo``) vs
each partition on its own thread, the OS time-slicing those that share cores (the executor before), on plans
whose units hold several partitions, against the plan's own physical limit.

Per zoo model on ``local``: the throughput warm start (load balancing over both cores: units of many
partitions) is compiled and run in process by the agent's executor, frames back to back. The limit is the
busiest unit's load as measured: each partition's time per frame with frames one at a time (nothing
else running), summed per unit. Runs alternate (turns, threads), medians over --repeats; the ratio
turns/threads > 1 means the turns run the plan faster, and turns/limit says how close to its limit.

Run: PYTHONPATH=. chrt -f 50 .venv/bin/python bench/bench_turns.py [--models googlenet inception_v3] [--frames 120]
     [--repeats 5] [--zoo-dir build/bench/zoo]
On a machine shared with other work, run it at a real-time priority (``chrt -f 50``, root): otherwise the other
processes' threads take the cores in per-thread shares, and the variant with 42 threads gets more of them than
the one with 2 (under load 6-15 the threads variant read 1.2-1.6x the turns variant without chrt; with it, 0.73x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from agents.executor import Pipeline, generate_inputs
from compiler import compile_plan, write_bundle
from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from planner.build import to_plan
from planner.costmodel import CostModel
from planner.heuristics import balanced
from planner.plan import Provenance
from planner.problem import build_problem


def run(manifest, folder: Path, frames: int, turns: bool, one_at_a_time: bool = False) -> tuple[float, Pipeline]:
    """Frames per second through the executor (in process); the pipeline, stopped, for its stats."""
    if not turns:  # every partition on its own thread, as before
        runners, Pipeline._unit_runners = Pipeline._unit_runners, lambda self: []
    try:
        pipeline = Pipeline(manifest, folder, max_inflight=1 if one_at_a_time else 0)
    finally:
        if not turns:
            Pipeline._unit_runners = runners
    pipeline.start()
    try:
        feeds = generate_inputs(manifest.inputs, seed=0)
        for f in [pipeline.submit(feeds) for _ in range(8)]:
            f.result(timeout=300)
        pipeline.reset_stats()
        t0 = time.perf_counter()
        futures = [pipeline.submit(feeds, timeout=300) for _ in range(frames)]
        for f in futures:
            f.result(timeout=300)
        return frames / (time.perf_counter() - t0), pipeline
    finally:
        pipeline.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["googlenet", "inception_v3"])
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--zoo-dir", type=Path, default=Path("build/bench/zoo"))
    args = parser.parse_args()
    from models.export import export_model

    print(f"# load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"{'model':14} {'units':>5} {'parts':>5} {'limit fps':>9} {'turns fps':>9} {'threads fps':>11} "
        f"{'turns/threads':>13} {'turns/limit':>11} {'threads/limit':>13}"
    )
    profile = load_profile("local")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = args.zoo_dir / f"{name}.onnx"
            if not path.exists():
                export_model(name, path)
            loaded = load_onnx(path)
            graph = build_graph(loaded.proto, loaded.sha256, name)
            blocks = coarsen(graph, "coarse")
            problem = build_problem(blocks, graph, CostModel(profile, graph), 4)
            assignment = balanced(problem)
            assert assignment is not None
            plan = to_plan(problem, assignment, blocks, profile, Provenance("heuristic:balanced"), f"{name}-balanced")
            compiled = compile_plan(plan, loaded, graph, profile)
            folder = write_bundle(compiled, Path(tmp) / name)
            manifest = compiled.manifest
            units: dict[tuple[int, int, int], list[str]] = {}
            for p in manifest.partitions:
                units.setdefault((p.stage, p.group, p.unit), []).append(p.name)
            # the limit: each partition's time per frame alone, summed per unit; the busiest unit's
            _, alone = run(manifest, folder, max(20, args.frames // 4), turns=True, one_at_a_time=True)
            per = {n: s.busy_s / s.frames for n, s in alone.stats().items() if s.frames}
            limit = 1.0 / max(sum(per[n] for n in names) for names in units.values())
            got: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.repeats):
                for turns in (True, False):
                    got[turns].append(run(manifest, folder, args.frames, turns)[0])
            t, o = statistics.median(got[True]), statistics.median(got[False])
            print(
                f"{name:14} {len(units):5d} {len(manifest.partitions):5d} {limit:9.2f} {t:9.2f} {o:11.2f} "
                f"{t / o:13.3f} {t / limit:11.3f} {o / limit:13.3f}",
                flush=True,
            )
    print(f"# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
