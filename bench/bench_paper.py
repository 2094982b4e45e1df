"""Para-Pipe's table, reproduced in simulation on the paper's setup (khadas-vim3-armcl: 4x A73, 2x A53, Mali-G52).

For GoogLeNet, Inception-v3, Inception-v4 and Inception-ResNet-v2 (zoo models, coarse
blocks, the profile's roofline figures: estimates, not measurements), prints side by side
with the paper's figures:

- hybrid-T frames/J vs pipe-only and vs para-only (paper: +11.0%, +23.3%),
- hybrid-T throughput vs para-only (paper: +11.9%),
- hybrid-L latency vs pipe-only (paper: -36.0%),
- the ILP's solve time beside the paper's (< 1 min GoogLeNet, 4 min Inception-v3, 361 min for 337 operators).

hybrid-T is our throughput-optimal plan, hybrid-L our latency-optimal plan; energy is
modelled from the profile's power figures. Figures are predicted by the analytic model
that the ILP optimises (see docs/architecture.md), not measured on a board.

Run: .venv/bin/python bench/bench_paper.py [--time-limit 60] [--models googlenet inception_v3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from device_profiles.loader import load_profile
from models.coarsen import coarsen
from models.export import export_model
from models.graph import build_graph
from models.onnx_io import load_onnx
from planner.costmodel import CostModel
from planner.problem import build_problem
from planner.search import SearchOptions, baselines, best_plan

PAPER = {"fpj_vs_pipe": 11.0, "fpj_vs_para": 23.3, "fps_vs_para": 11.9, "lat_vs_pipe": -36.0}
PAPER_ILP = {"googlenet": "< 1 min", "inception_v3": "4 min", "inception_v4": "361 min*", "inception_resnet_v2": "-"}


def pct(ours: float, theirs: float) -> float:
    return (ours / theirs - 1) * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", nargs="+", default=["googlenet", "inception_v3", "inception_v4", "inception_resnet_v2"]
    )
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--zoo-dir", type=Path, default=Path("build/bench/zoo"))
    args = parser.parse_args()
    profile = load_profile("khadas-vim3-armcl")
    print(f"# khadas-vim3-armcl (the profile's estimates), coarse blocks, ILP time limit {args.time_limit:g} s")
    print(
        f"{'model':20} {'ops':>4} {'blocks':>6} {'fpJ vs pipe':>12} {'fpJ vs para':>12} {'fps vs para':>12} "
        f"{'lat vs pipe':>12} {'ILP s (T/L)':>14} {'paper ILP':>10}"
    )
    rows = []
    for name in args.models:
        path = args.zoo_dir / f"{name}.onnx"
        if not path.exists():
            export_model(name, path)
        loaded = load_onnx(path)
        graph = build_graph(loaded.proto, loaded.sha256, name)
        blocks = coarsen(graph, "coarse")
        cost = CostModel(profile, graph, None)
        problem = build_problem(blocks, graph, cost, 4)
        base = baselines(blocks, graph, cost, 4, problem)
        t0 = time.perf_counter()
        hybrid_t = best_plan(
            blocks, graph, cost, "throughput", SearchOptions(time_limit=args.time_limit), problem=problem
        )
        t_thr = time.perf_counter() - t0
        t0 = time.perf_counter()
        hybrid_l = best_plan(blocks, graph, cost, "latency", SearchOptions(time_limit=args.time_limit), problem=problem)
        t_lat = time.perf_counter() - t0
        pipe, para = base["pipe-only"].predicted, base["para-only"].predicted
        ht, hl = hybrid_t.predicted, hybrid_l.predicted
        assert ht and hl and pipe and para
        row = {
            "fpj_vs_pipe": pct(1 / ht.energy_mj, 1 / pipe.energy_mj),
            "fpj_vs_para": pct(1 / ht.energy_mj, 1 / para.energy_mj),
            "fps_vs_para": pct(ht.throughput_fps, para.throughput_fps),
            "lat_vs_pipe": pct(hl.latency_ms, pipe.latency_ms),
        }
        rows.append(row)
        print(
            f"{name:20} {len(graph.nodes):4d} {len(blocks.nodes):6d} {row['fpj_vs_pipe']:+11.1f}% "
            f"{row['fpj_vs_para']:+11.1f}% {row['fps_vs_para']:+11.1f}% {row['lat_vs_pipe']:+11.1f}% "
            f"{t_thr:6.1f}/{t_lat:<6.1f} {PAPER_ILP.get(name, '-'):>10}  "
            f"[{hybrid_t.provenance.method} {hybrid_t.provenance.status}; {hybrid_l.provenance.method} "
            f"{hybrid_l.provenance.status}]",
            flush=True,
        )
    if rows:
        mean = {k: statistics.mean(r[k] for r in rows) for k in PAPER}
        print(
            f"{'mean (ours)':20} {'':4} {'':6} {mean['fpj_vs_pipe']:+11.1f}% {mean['fpj_vs_para']:+11.1f}% "
            f"{mean['fps_vs_para']:+11.1f}% {mean['lat_vs_pipe']:+11.1f}%"
        )
        print(
            f"{'paper (Para-Pipe)':20} {'':4} {'':6} {PAPER['fpj_vs_pipe']:+11.1f}% {PAPER['fpj_vs_para']:+11.1f}% "
            f"{PAPER['fps_vs_para']:+11.1f}% {PAPER['lat_vs_pipe']:+11.1f}%"
        )
        print("* the paper's 361 min is for a 337-operator model; ours are wall seconds on 2 shared cores")


if __name__ == "__main__":
    main()
