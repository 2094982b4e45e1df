"""How long intake + OpGraph + coarsening take per zoo model (median of repeats).

Run: .venv/bin/python bench/bench_graph.py [--repeats 5]
Exports the zoo into build/bench/zoo first if the files are not there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.coarsen import coarsen
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.zoo import ZOO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--zoo-dir", type=Path, default=Path("build/bench/zoo"))
    args = parser.parse_args()
    from models.export import export_model

    print(f"{'model':14} {'ops':>5} {'fine':>5} {'coarse':>6} {'load s':>8} {'graph+coarsen s':>16} {'total s':>8}")
    for name in ZOO:
        path = args.zoo_dir / f"{name}.onnx"
        if not path.exists():
            export_model(name, path)
        loads, builds = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            loaded = load_onnx(path)
            t1 = time.perf_counter()
            graph = build_graph(loaded.proto, loaded.sha256, name)
            fine, coarse = coarsen(graph, "fine"), coarsen(graph, "coarse")
            t2 = time.perf_counter()
            loads.append(t1 - t0)
            builds.append(t2 - t1)
        load, build = statistics.median(loads), statistics.median(builds)
        print(
            f"{name:14} {len(graph.nodes):5d} {len(fine.nodes):5d} {len(coarse.nodes):6d} {load:8.3f} {build:16.4f} {load + build:8.3f}"
        )


if __name__ == "__main__":
    main()
