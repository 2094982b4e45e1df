"""RMSPE of predicted vs measured latency and throughput per round of ``parapipe tune``.

Para-Pipe's offline cost model sits at 15.3% RMSPE; the goal after the loop is <= 5%
on ``local`` and ``local-biglittle``. Energy is modelled here (no sensor), so it is not
part of the error.

Run: .venv/bin/python bench/bench_tune.py [--models squeezenet1_1 resnet18 googlenet] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parapipe.tune import tune


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["squeezenet1_1", "resnet18", "googlenet"])
    parser.add_argument("--boards", nargs="+", default=["local", "local-biglittle"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--zoo-dir", type=Path, default=Path("build/bench/zoo"))
    args = parser.parse_args()
    import os

    from models.export import export_model

    os.environ["PARAPIPE_HOME"] = tempfile.mkdtemp(prefix="parapipe-tune-")
    costs = Path(os.environ["PARAPIPE_HOME"]) / "costs.json"
    print(f"{'board':16} {'model':14} {'round':>5} {'plans':>5} {'RMSPE lat %':>11} {'RMSPE thr %':>11}")
    for board in args.boards:
        for name in args.models:
            path = args.zoo_dir / f"{name}.onnx"
            if not path.exists():
                export_model(name, path)
            history, _ = tune(path, board, costs, "pareto", args.rounds, 5.0, 2.0, args.frames)
            for h in history:
                print(
                    f"{board:16} {name:14} {h.index:5d} {h.plans:5d} {h.rmspe_latency:11.1f} {h.rmspe_throughput:11.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
