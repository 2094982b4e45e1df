"""How much a CFS-throttled unit slows the other units of its agent in a pipeline, side by side.

``local-biglittle`` emulates a LITTLE core by a CFS quota. Measured on 12-05, a unit on the big core
of a pipelined plan spent 15-20% of its partitions' run time off the CPU (wall time of ``session.run``
minus the thread's CPU time) whenever the throttled unit ran in the same agent, and none when the
same bundle ran with the throttle removed. This bench replays one bundle both ways, ``--repeats``
times interleaved, and prints per unit the median wall and CPU time a frame and their gap, and the
pipeline's throughput: the gap is what the cost model does not price (it prices a partition's
CPU work; ``parapipe tune`` feeds back the wall time of each partition run in a pipeline).

A bundle is any folder ``parapipe deploy`` or ``parapipe tune`` wrote (a ``manifest.json`` and
its partitions), e.g. one under a tune home's ``bundles/``.

Run: PYTHONPATH=. .venv/bin/python bench/bench_throttle_stall.py BUNDLE [--frames 120] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.benchmark import run_benchmark
from agents.bundle import MANIFEST, BundleError, parse_manifest
from agents.executor import Pipeline


def unthrottled_copy(bundle: Path, into: Path) -> Path:
    """The bundle with every partition's throttle removed (same files, same cores)."""
    shutil.copytree(bundle, into)
    manifest = json.loads((into / MANIFEST).read_text())
    for p in manifest["partitions"]:
        p["throttle_percent"] = None
        p["throttled_cores"] = []
    (into / MANIFEST).write_text(json.dumps(manifest))
    return into


def unit_of(partition: str) -> str:
    """A partition's unit: its name up to the segment suffix (``s0g0u1_big_p3`` -> ``s0g0u1_big``)."""
    return partition.rsplit("_p", 1)[0]


def measure(bundle: Path, frames: int) -> dict[str, object]:
    """One benchmark of the bundle's pipeline: throughput and, per unit, wall and CPU ms a frame."""
    pipeline = Pipeline(parse_manifest((bundle / MANIFEST).read_text()), bundle)
    pipeline.start()
    try:
        result = run_benchmark(pipeline, frames=frames, warmup=3)
    finally:
        pipeline.stop()
    units: dict[str, list[float]] = {}
    for part in result.partitions:
        wall_cpu = units.setdefault(unit_of(part.name), [0.0, 0.0])
        wall_cpu[0] += part.busy_ms / max(part.frames, 1)
        wall_cpu[1] += part.cpu_ms / max(part.cpu_frames, 1)
    return {"fps": result.throughput_fps, "units": units}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path, help="a bundle folder (manifest.json and its partitions)")
    parser.add_argument("--frames", type=int, default=120, help="frames per benchmark (default 120)")
    parser.add_argument("--repeats", type=int, default=3, help="benchmarks per variant, interleaved (default 3)")
    parser.add_argument("--json", action="store_true", help="print the medians as JSON")
    args = parser.parse_args(argv)
    if args.frames < 10 or args.repeats < 1:
        print("error: --frames must be at least 10 and --repeats at least 1", file=sys.stderr)
        return 2
    try:
        manifest = parse_manifest((args.bundle / MANIFEST).read_text())
    except (OSError, BundleError, ValueError) as exc:
        print(
            f"error: {args.bundle} is no bundle ({exc}); give a folder parapipe deploy or tune wrote", file=sys.stderr
        )
        return 2
    if not any(p.throttle_percent for p in manifest.partitions):
        print(f"error: no partition of {args.bundle} is throttled: nothing to compare", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="parapipe-stall-") as tmp:
        variants = {"as planned": args.bundle, "unthrottled": unthrottled_copy(args.bundle, Path(tmp) / "b")}
        runs: dict[str, list[dict[str, object]]] = {k: [] for k in variants}
        for i in range(args.repeats):
            for name, folder in variants.items():
                runs[name].append(measure(folder, args.frames))
                print(f"  {name} {i + 1}/{args.repeats}: {runs[name][-1]['fps']:.1f} fps", file=sys.stderr)
    out: dict[str, object] = {"bundle": str(args.bundle), "plan": manifest.plan_name, "frames": args.frames}
    for name, rs in runs.items():
        unit_names = sorted({u for r in rs for u in r["units"]})  # type: ignore[attr-defined]
        out[name] = {
            "fps": statistics.median(r["fps"] for r in rs),  # type: ignore[misc]
            "units": {
                u: {
                    "wall_ms": statistics.median(r["units"][u][0] for r in rs),  # type: ignore[index]
                    "cpu_ms": statistics.median(r["units"][u][1] for r in rs),  # type: ignore[index]
                }
                for u in unit_names
            },
        }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{manifest.plan_name}: {args.frames} frames, medians of {args.repeats}")
    for name in runs:
        figures = out[name]
        print(f"  {name:12} {figures['fps']:7.1f} fps")  # type: ignore[index]
        for u, f in figures["units"].items():  # type: ignore[index]
            gap = (f["wall_ms"] - f["cpu_ms"]) / f["wall_ms"] * 100 if f["wall_ms"] else 0.0
            print(f"    {u:24} wall {f['wall_ms']:6.2f} ms  cpu {f['cpu_ms']:6.2f} ms  off-CPU {gap:4.1f}%")
    ratio = out["as planned"]["fps"] / out["unthrottled"]["fps"]  # type: ignore[index]
    print(f"  throughput as planned / unthrottled: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
