"""How much the cores of this machine slow each other, and what that does to predictions on ``local``.

Part 1, per zoo model: the whole model on one core alone (each core in turn) and on every core at
once, back to back, interleaved over rounds (``profiler.contention``, what ``parapipe profile
--board local`` runs); the slowdown per core and the shared-memory bandwidth that implies for the
model (its bytes per frame times the frames every core finishes together per second). The load
average is printed before and after: on a shared machine other work on the cores is contention too.

Part 2 (``--plans``), per model: profile on ``local`` (the contention included), plan the latency
and throughput objectives, run each plan on a local agent, and print its predicted figures with the
measured shared memory, without it (the profile's no-contention estimate), and measured.

Run: .venv/bin/python bench/bench_contention.py [--models googlenet resnet18] [--plans googlenet resnet18]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def model_path(zoo: Path, name: str) -> Path:
    from models.export import export_model

    path = zoo / f"{name}.onnx"
    if not path.exists():
        export_model(name, path)
    return path


def contention_table(names: list[str], zoo: Path, seconds: float, rounds: int) -> None:
    from device_profiles.loader import load_profile
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from profiler.contention import measure_contention
    from profiler.roofline import Roofline
    from profiler.session import contention_configs

    profile = load_profile("local")
    memory = profile.memories[0]
    cfgs = contention_configs(profile, memory.pus)
    print(f"# part 1: {len(cfgs)} cores, {rounds} rounds of {seconds:g} s per run; load average {load_average()}")
    print(
        f"{'model':14} {'MB/frame':>8} {'alone ms':>16} {'together ms':>16} {'slowdown':>12} {'spread %':>8} "
        f"{'GB/s':>6} {'floor ms':>8}"
    )
    for name in names:
        loaded = load_onnx(model_path(zoo, name))
        graph = build_graph(loaded.proto, loaded.sha256, name)
        found = measure_contention(loaded.ort_proto.SerializeToString(), loaded.feeds(), cfgs, seconds, rounds)
        frame_bytes = Roofline(profile, graph).moved_bytes([n.name for n in graph.nodes])
        print(
            f"{name:14} {frame_bytes / 1e6:8.1f} {' '.join(f'{a:7.2f}' for a in found.alone_ms):>16} "
            f"{' '.join(f'{t:7.2f}' for t in found.together_ms):>16} "
            f"{' '.join(f'{s:5.2f}' for s in found.slowdown):>12} {found.spread_pct:8.0f} "
            f"{found.bandwidth_gbps(frame_bytes):6.2f} {1 / found.frames_per_ms:8.2f}",
            flush=True,
        )
    print(f"# load average after: {load_average()}")


def plans_table(names: list[str], zoo: Path, frames: int) -> None:
    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from parapipe.intake import open_model
    from parapipe.profiling import profile_on_board
    from parapipe.run import run_plan
    from planner.build import evaluate
    from planner.costmodel import CostModel
    from planner.search import SearchOptions, best_plan
    from profiler.costtable import CostTable

    costs = Path(os.environ["PARAPIPE_HOME"]) / "costs.json"
    profile = load_profile("local")
    print()
    print(f"# part 2: plans on local, {frames} frames per run; load average {load_average()}")
    print(
        f"{'model':14} {'objective':10} {'units':18} {'figure':14} {'predicted':>9} {'no contention':>13} "
        f"{'measured':>9} {'error %':>8} {'error without %':>15}"
    )
    for name in names:
        path = model_path(zoo, name)
        loaded = open_model(path, None, None)
        graph = build_graph(loaded.proto, loaded.sha256, name)
        table = CostTable.load(costs)
        done = profile_on_board(loaded, graph, "local", table, costs)
        for memory, gbps, how in done.summary.memories:
            print(f"# {name}: shared memory {memory} {gbps:.2f} GB/s ({how})")
        cost = CostModel.from_table(profile, graph, table)
        plain = cost.recalibrated(dataclasses.replace(cost.calibration, memory_gbps={}))
        blocks = coarsen(graph, "coarse")
        for objective in ("latency", "throughput"):
            plan = best_plan(blocks, graph, cost, objective, SearchOptions(time_limit=2.0))
            plan = dataclasses.replace(plan, model_path=str(path.resolve()), inputs=loaded.inputs)
            without = evaluate(plan, graph, plain, frames=0).predicted
            result = run_plan(plan, "local", None, frames)
            assert result.predicted is not None and without is not None
            units = " ".join(f"{a.pu}x{a.cores}" for s in plan.stages for g in s.groups for a in g)
            for figure in ("latency_ms", "throughput_fps"):
                p, w, m = (getattr(f, figure) for f in (result.predicted, without, result.measured))
                print(
                    f"{name:14} {objective:10} {units[:18]:18} {figure:14} {p:9.2f} {w:13.2f} {m:9.2f} "
                    f"{(p - m) / m * 100:+8.1f} {(w - m) / m * 100:+15.1f}",
                    flush=True,
                )
    print(f"# load average after: {load_average()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["googlenet", "resnet18", "squeezenet1_1", "bert_tiny"])
    parser.add_argument("--plans", nargs="*", default=["googlenet", "resnet18"])
    parser.add_argument("--seconds", type=float, default=1.0, help="each run of part 1")
    parser.add_argument("--rounds", type=int, default=5, help="alone/together rounds of part 1")
    parser.add_argument("--frames", type=int, default=120, help="frames per plan run of part 2")
    parser.add_argument("--zoo-dir", type=Path, default=Path("build/bench/zoo"))
    args = parser.parse_args()
    os.environ["PARAPIPE_HOME"] = tempfile.mkdtemp(prefix="parapipe-contention-")
    if args.models:
        contention_table(args.models, args.zoo_dir, args.seconds, args.rounds)
    if args.plans:
        plans_table(args.plans, args.zoo_dir, args.frames)


if __name__ == "__main__":
    main()
