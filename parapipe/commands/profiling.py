"""`parapipe profile` (measure costs on a board) and `parapipe simulate` (run a plan through the cost model)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from parapipe.app import (
    CostsOpt,
    DataOpt,
    DeviceOpt,
    JsonFlag,
    ShapeOpt,
    app,
    err,
    fails_cleanly,
    option_groups,
    out,
    print_json,
)


@dataclass(frozen=True)
class ProfileFlags:
    """What ``profile`` measures and how often, as ``profiler.session.ProfileOptions`` takes them."""

    granularity: Annotated[str, typer.Option("--granularity", help="Blocks to time: coarse, fine or both.")] = "coarse"
    repeats: Annotated[int, typer.Option("--repeats", min=3, help="Timed runs per measurement.")] = 10
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs first.")] = 3
    memory_seconds: Annotated[
        float,
        typer.Option(
            "--memory-seconds",
            min=0.05,
            help="Each run of a shared memory's bandwidth measurement (the model alone on each core set, then on "
            "all at once; 3 rounds): longer on a noisy board.",
        ),
    ] = 0.5


@app.command()
@fails_cleanly
@option_groups(flags=ProfileFlags)
def profile(
    model: Annotated[Path, typer.Argument(help="The .onnx model to measure.")],
    board: Annotated[
        str,
        typer.Option(
            "--board", help="Board to measure on: local, local-biglittle, local-edge-cloud or an inventory board."
        ),
    ] = "local",
    pu: Annotated[list[str] | None, typer.Option("--pu", help="Only these PUs (repeatable); default all.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Cost table (merged, not overwritten).")] = None,
    flags: ProfileFlags = ProfileFlags(),
    input_shape: ShapeOpt = None,
    input_data: DataOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Measure every operator, block and a few whole partitions of MODEL on each PU configuration."""
    from models.graph import build_graph
    from parapipe.home import default_costs
    from parapipe.intake import generated_note, open_model
    from parapipe.profiling import profile_on_board
    from profiler.costtable import CostTable
    from profiler.session import ProfileOptions

    loaded = open_model(model, input_shape, input_data)
    graph = build_graph(loaded.proto, loaded.sha256, model.stem)
    if generated_note(loaded) and not as_json:
        err.print(generated_note(loaded), highlight=False, markup=False)
    path = output or default_costs()
    table = CostTable.load(path)
    before = len(table)
    with _progress_bar(f"profiling {model.name} on {board}", board, quiet=as_json) as progress:
        options = ProfileOptions(flags.granularity, flags.repeats, flags.warmup, progress, flags.memory_seconds)
        done = profile_on_board(loaded, graph, board, table, path, pu, options)
    summary = done.summary
    result = _summarise(table, loaded.sha256, done.profile.name, done.configs, graph)
    result.update(
        {
            "costs": str(path),
            "measured": summary.measured,
            "reused": summary.reused,
            "entries_before": before,
            "entries": summary.entries,
            "seconds": round(summary.seconds, 2),
            "interrupted": summary.interrupted,
            "energy_source": summary.energy_source,
            "memories": [
                {"memory": m, "bandwidth_gbps": round(gbps, 3), "measured": how} for m, gbps, how in summary.memories
            ],
            "skipped": list(summary.skipped),
        }
    )
    if as_json:
        print_json(result)
    else:
        _print_profile(result)
    if summary.interrupted:
        err.print("interrupted: what was measured is saved; run the same command to continue")
        raise typer.Exit(130)


@contextmanager
def _progress_bar(description: str, label: str, quiet: bool) -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar on stderr (none when ``quiet``), yielding the ``progress(what, done, total)`` callback that
    shows ``label: what``."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=quiet, disable=quiet) as bar:
        task = bar.add_task(description, total=None)

        def progress(what: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total or None, description=f"{label}: {what}"[:60])

        yield progress


def _print_profile(result: dict) -> None:
    """The profile's summary as a table: per PU configuration, then what was measured and reused."""
    t = Table("PU config", "ops", "blocks", "whole model ms", "sum of blocks ms", "energy mJ/frame", "held-out error")
    for row in result["configs"]:
        t.add_row(
            row["config"],
            str(row["ops"]),
            str(row["blocks"]),
            f"{row['model_ms']:.2f}",
            f"{row['blocks_sum_ms']:.2f}",
            f"{row['energy_mj']:.1f} ({row['energy_source']})" if row["energy_mj"] is not None else "-",
            f"{row['holdout_median_pct']:.1f}%" if row["holdout_median_pct"] is not None else "-",
        )
    out.print(t)
    out.print(
        f"{result['measured']} measured, {result['reused']} reused from {result['costs']} ({result['entries']} "
        f"entries) in {result['seconds']:.1f}s; energy is {result['energy_source']}",
        highlight=False,
    )
    for what in result.get("skipped", []):
        out.print(f"not measured (its unit's EP could not load it; calibration only): {what}",
                  highlight=False, markup=False)  # fmt: skip
    for m in result.get("memories", []):
        out.print(
            f"shared memory {m['memory']}: {m['bandwidth_gbps']:.2f} GB/s for this model ({m['measured']})",
            highlight=False,
            markup=False,
        )


def _summarise(table, sha: str, board: str, configs, graph) -> dict:
    """Per PU config: counts, whole-model time, sum of blocks, and the cost model's held-out error."""
    from device_profiles.loader import load_profile
    from planner.costmodel import CostModel
    from profiler.session import held_out

    rows = []
    entries = table.select(model_sha256=sha, board=board)
    holdout = held_out(table, sha, board)
    cost = CostModel.from_table(load_profile(board), graph, table, holdout=holdout)
    evaluation = cost.evaluate()
    for cfg in configs:
        mine = [e for e in entries if e.conditions.pu == cfg.pu and e.conditions.cores == len(cfg.cores)]
        whole = [e for e in mine if e.kind == "partition" and len(e.members) == len(graph.nodes)]
        blocks = [e for e in mine if e.kind == "block"]
        label = f"{cfg.pu}x{len(cfg.cores)}"
        errs = [abs(p - m) / m * 100 for name, m, p in evaluation.rows if name.endswith(f"@{label}")]
        rows.append(
            {
                "config": label,
                "ops": sum(1 for e in mine if e.kind == "op"),
                "blocks": len(blocks),
                "model_ms": whole[0].mean_ms if whole else float("nan"),
                "blocks_sum_ms": sum(e.mean_ms for e in blocks if len(e.members) < len(graph.nodes)),
                "energy_mj": whole[0].energy_mj if whole else None,
                "energy_source": whole[0].energy_source if whole else "",
                "holdout_median_pct": statistics.median(errs) if errs else None,
            }
        )
    return {
        "board": board,
        "model_sha256": sha,
        "configs": rows,
        "holdout": {
            "count": evaluation.count,
            "median_abs_pct": evaluation.median_abs_pct,
            "rmspe_pct": evaluation.rmspe_pct,
        },
    }


@app.command()
@fails_cleanly
def simulate(
    plan: Annotated[Path, typer.Argument(help="A plan JSON (solved or hand-written).")],
    model: Annotated[Path, typer.Argument(help="The .onnx model the plan is for.")],
    device: DeviceOpt,
    costs: CostsOpt = None,
    frames: Annotated[int, typer.Option("--frames", min=1, help="Frames to simulate.")] = 200,
    input_shape: ShapeOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Run a plan through the cost model: analytic figures and a discrete-event simulation side by side."""
    from device_profiles.loader import load_profile
    from models.graph import build_graph
    from parapipe.home import default_costs
    from parapipe.intake import open_model
    from planner.costmodel import CostModel
    from planner.plan import load_plan, validate
    from planner.simulate import PlanModel, analytic
    from planner.simulate import simulate as run_sim
    from profiler.costtable import CostTable

    the_plan = load_plan(plan)
    prof = load_profile(device)
    loaded = open_model(model, input_shape, plan=the_plan)
    graph = build_graph(loaded.proto, loaded.sha256, model.stem)
    validate(the_plan, graph, prof)
    cost = CostModel.from_table(prof, graph, CostTable.load(costs or default_costs()))
    lowered = PlanModel(the_plan, graph, cost)
    a, s = analytic(lowered), run_sim(lowered, frames)
    result = {
        "plan": str(plan),
        "device": prof.name,
        "analytic": {"latency_ms": a.latency_ms, "throughput_fps": a.throughput_fps, "energy_mj": a.energy_mj},
        "simulated": {
            "frames": s.frames,
            "latency_p50_ms": s.latency_p50_ms,
            "latency_p99_ms": s.latency_p99_ms,
            "throughput_fps": s.throughput_fps,
            "energy_mj": s.energy_mj,
            "busy_ms": dict(s.busy_ms),
        },
        "energy_source": "modelled",
        "cost_sources": sorted(lowered.sources),
    }
    if as_json:
        print_json(result)
        return
    t = Table("figure", "analytic", f"simulated ({frames} frames)")
    t.add_row("latency ms", f"{a.latency_ms:.2f}", f"p50 {s.latency_p50_ms:.2f} / p99 {s.latency_p99_ms:.2f}")
    t.add_row("throughput fps", f"{a.throughput_fps:.2f}", f"{s.throughput_fps:.2f}")
    t.add_row("energy mJ/frame (modelled)", f"{a.energy_mj:.1f}", f"{s.energy_mj:.1f}")
    out.print(t)
    out.print(f"costs from: {', '.join(result['cost_sources'])}", highlight=False)
