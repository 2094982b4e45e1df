"""Regenerate docs/benchmarks.md from the benchmark scripts (``make bench``); nothing in it is typed by hand.

Each benchmark named with ``--run`` is run here and its output kept in
``bench/results_<name>.txt`` (with the command, date, commit and machine at the top);
the page then shows every results file, the machine and versions, and plots drawn from
the results: the ILP's solve time against model size (from the planner bench), the
prediction error per tune round (from the tune bench) and a Pareto front.

Run: .venv/bin/python bench/report.py [--run graph costmodel contention planner agent tune precision paper openvino gpu] [--time-limit 30]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BENCH = ROOT / "bench"
DOCS = ROOT / "docs"
IMG = DOCS / "img"
ORDER = (
    "graph",
    "costmodel",
    "contention",
    "planner",
    "paper",
    "agent",
    "turns",
    "throttle_stall",
    "tune",
    "precision",
    "openvino",
    "gpu",
    "soak",
)


def _script(name: str) -> Path:
    return BENCH / (f"{name}.py" if name == "soak" else f"bench_{name}.py")


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip()


def machine() -> dict[str, str]:
    import importlib.metadata as md

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line), "0")
    info = {
        "cpu": cpu,
        "cores": str(len(os.sched_getaffinity(0))),
        "memory": f"{int(mem) / 2**20:.1f} GiB",
        "python": platform.python_version(),
        "os": platform.platform(),
        "commit": _git("rev-parse", "--short", "HEAD"),
    }
    for pkg in ("onnxruntime", "onnx", "pulp", "highspy", "grpcio", "numpy", "torch"):
        try:
            info[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            info[pkg] = "not installed"
    return info


def run_bench(name: str, extra: list[str]) -> Path:
    script = _script(name)
    if not script.exists():
        raise SystemExit(f"no benchmark {script.name}; choose from {', '.join(ORDER)}")
    cmd = [sys.executable, str(script), *extra]
    print(f"running {' '.join(cmd[1:])}", flush=True)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    header = (
        f"# {' '.join(['.venv/bin/python', f'bench/{script.name}', *extra])}\n"
        f"# {datetime.date.today()}, commit {_git('rev-parse', '--short', 'HEAD')}, "
        f"{machine()['cores']} cores; exit code {done.returncode}\n"
    )
    out = BENCH / f"results_{name}.txt"
    out.write_text(header + done.stdout + (f"\n# stderr:\n{done.stderr[-4000:]}" if done.returncode else ""))
    return out


def plot_solver_times(results: Path) -> Path | None:
    """Solve seconds against blocks per objective, from the planner bench's table."""
    rows = []
    for line in results.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[3] in ("latency", "throughput", "energy") and parts[4].isdigit():
            try:
                rows.append((parts[3], int(parts[4]), float(parts[6])))
            except ValueError:
                continue
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for objective, marker in (("latency", "o"), ("throughput", "s"), ("energy", "^")):
        pts = [(b, s) for o, b, s in rows if o == objective]
        ax.scatter([b for b, _ in pts], [s for _, s in pts], marker=marker, label=objective)
    ax.set_xlabel("blocks the ILP places")
    ax.set_ylabel("solve time, s (time limit caps it)")
    ax.set_title("ILP solve time against model size")
    ax.legend()
    fig.tight_layout()
    IMG.mkdir(parents=True, exist_ok=True)
    path = IMG / "solver-time.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_tune(results: Path) -> Path | None:
    """Throughput RMSPE per round and model, from the tune bench's table: the newest run of each board (the file
    keeps the newest first; a model's rounds end where its round number starts again), a panel per board."""
    runs: dict[tuple[str, str], list[tuple[int, float]]] = {}
    done: set[tuple[str, str]] = set()
    for line in results.read_text().splitlines():
        m = re.match(r"^(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+([\d.]+|nan)\s+([\d.]+|nan)", line)
        if not m:
            continue
        key, rnd = (m.group(1), m.group(2)), int(m.group(3))
        if key in done:
            continue
        if runs.get(key) and rnd <= runs[key][-1][0]:
            done.add(key)  # an older run of this board and model
            continue
        runs.setdefault(key, []).append((rnd, float(m.group(6))))
    if not runs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    boards = list(dict.fromkeys(b for b, _ in runs))
    fig, axes = plt.subplots(1, len(boards), figsize=(5 * len(boards), 4), squeeze=False, sharey=True)
    for ax, board in zip(axes[0], boards, strict=True):
        models = [m for b, m in runs if b == board]
        colours = plt.get_cmap("tab20").colors  # 20 distinct colours: the default cycle repeats after 10 models
        for i, model in enumerate(models):
            pts = runs[(board, model)]
            style = {"color": colours[i % 20], "marker": "os^"[i // 20 % 3]}
            ax.plot([r for r, _ in pts], [t for _, t in pts], label=model, **style)
        ax.axhline(5.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("tune round")
        ax.set_xticks(sorted({r for (b, _), pts in runs.items() if b == board for r, _ in pts}))
        ax.set_title(f"{board} (newest run)")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("throughput RMSPE, % (predicted vs measured)")
    fig.suptitle("prediction error per round of the tune loop")
    fig.tight_layout()
    IMG.mkdir(parents=True, exist_ok=True)
    path = IMG / "tune-rmspe.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_pareto(time_limit: float) -> Path | None:
    """The Pareto set of googlenet on khadas-vim3 (its profile's figures, modelled energy) beside the baselines."""
    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.export import export_model
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from parapipe.commands.planning import _plot
    from planner.costmodel import CostModel
    from planner.search import SearchOptions, baselines, pareto_set

    path = ROOT / "build" / "bench" / "zoo" / "googlenet.onnx"
    if not path.exists():
        export_model("googlenet", path)
    loaded = load_onnx(path)
    graph = build_graph(loaded.proto, loaded.sha256, "googlenet")
    blocks = coarsen(graph, "coarse")
    cost = CostModel(load_profile("khadas-vim3"), graph, None)
    front = pareto_set(blocks, graph, cost, SearchOptions(time_limit=time_limit))
    base = baselines(blocks, graph, cost, 4)
    out = IMG / "pareto-googlenet-khadas-vim3.png"
    _plot(front, list(base.values()), out)
    return out


def write_page(plots: list[Path]) -> Path:
    info = machine()
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `make bench` (`bench/report.py`) on {datetime.date.today()}; every figure below is the "
        "output of a script in `bench/`, kept in `bench/results_*.txt`. Energy is modelled unless a line says "
        "measured; figures for boards we cannot reach come from their profiles (estimates and spec sheets).",
        "",
        "## Machine",
        "",
        "| | |",
        "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in info.items()],
        "",
    ]
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{p.stem}](img/{p.name})" for p in plots]
        lines.append("")
    for name in ORDER:
        results = BENCH / f"results_{name}.txt"
        if not results.exists():
            continue
        script = _script(name)
        doc = ""
        if script.exists():
            text = script.read_text()
            m = re.match(r'"""(.*?)"""', text, re.S)
            doc = m.group(1).strip() if m else ""
        lines += [f"## {name}", "", doc, "", "```", results.read_text().rstrip(), "```", ""]
    page = DOCS / "benchmarks.md"
    page.write_text("\n".join(lines))
    return page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", nargs="*", default=[], help=f"benchmarks to run first ({', '.join(ORDER)})")
    parser.add_argument("--time-limit", type=float, default=2.0, help="seconds per ILP solve for the Pareto plot")
    parser.add_argument("--no-pareto", action="store_true", help="skip the Pareto plot (it plans googlenet)")
    args = parser.parse_args()
    for name in args.run:
        run_bench(name, [])
    plots = []
    if (BENCH / "results_planner.txt").exists():
        plots.append(plot_solver_times(BENCH / "results_planner.txt"))
    if (BENCH / "results_tune.txt").exists():
        plots.append(plot_tune(BENCH / "results_tune.txt"))
    if not args.no_pareto:
        plots.append(plot_pareto(args.time_limit))
    page = write_page([p for p in plots if p is not None])
    print(f"wrote {page}")


if __name__ == "__main__":
    main()
