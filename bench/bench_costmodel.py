"""How well the calibrated CostModel predicts whole partitions it was not fitted on.

For every zoo model on each local board: profile it (operators, coarse blocks, and
partitions made of 1..4 consecutive pieces), fit the cost model with every other
partition held back, and compare its predictions for the held-back partitions with
their measured latency. Also prints the uncalibrated roofline's error beside it, so
the value of measuring is visible. Goal: median error <= 10%.

Run: .venv/bin/python bench/bench_costmodel.py [--boards local local-biglittle] [--models ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from device_profiles.loader import load_profile
from models.graph import build_graph
from models.onnx_io import load_onnx
from models.zoo import ZOO
from planner.costmodel import CostModel
from profiler.costtable import CostTable
from profiler.session import ProfileOptions, held_out, pu_configs, run_profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boards", nargs="+", default=["local", "local-biglittle"])
    parser.add_argument("--models", nargs="+", default=list(ZOO))
    parser.add_argument("--zoo-dir", type=Path, default=Path("build/bench/zoo"))
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    from models.export import export_model

    costs = Path(tempfile.mkdtemp(prefix="parapipe-bench-")) / "costs.json"
    print(
        f"{'board':16} {'model':14} {'held-out':>8} {'median %':>9} {'RMSPE %':>8} {'roofline median %':>18} {'profile s':>9}"
    )
    all_errors: dict[str, list[float]] = {}
    for board in args.boards:
        profile = load_profile(board)
        for name in args.models:
            path = args.zoo_dir / f"{name}.onnx"
            if not path.exists():
                export_model(name, path)
            loaded = load_onnx(path)
            graph = build_graph(loaded.proto, loaded.sha256, name)
            table = CostTable.load(costs)
            t0 = time.perf_counter()
            run_profile(loaded, graph, profile, table, costs, pu_configs(profile), ProfileOptions(repeats=args.repeats))
            seconds = time.perf_counter() - t0
            holdout = held_out(table, loaded.sha256, board)
            calibrated = CostModel.from_table(profile, graph, table, holdout=holdout).evaluate()
            roof = CostModel(profile, graph, None)
            roof_errs = [
                abs(roof.group_ms(e.members, e.conditions.pu, e.conditions.cores).ms - e.mean_ms) / e.mean_ms * 100
                for e in table.select(model_sha256=loaded.sha256, kind="partition", board=board)
                if e.name in holdout
            ]
            errs = [abs(p - m) / m * 100 for _, m, p in calibrated.rows]
            all_errors.setdefault(board, []).extend(errs)
            print(
                f"{board:16} {name:14} {calibrated.count:8d} {calibrated.median_abs_pct:9.1f} {calibrated.rmspe_pct:8.1f} "
                f"{statistics.median(roof_errs):18.1f} {seconds:9.1f}",
                flush=True,
            )
    for board, errs in all_errors.items():
        print(
            f"{board}: median held-out error over all models {statistics.median(errs):.1f}% ({len(errs)} partitions); goal <= 10%"
        )


if __name__ == "__main__":
    main()
