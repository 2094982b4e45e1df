"""Planning commands: plan, compare, pareto, select, show."""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from models.names import safe_name
from parapipe.app import (
    CostsOpt,
    DataOpt,
    JsonFlag,
    ModelArg,
    PlanDeviceOpt,
    ShapeOpt,
    app,
    err,
    fails_cleanly,
    option_groups,
    out,
    print_json,
)
from parapipe.commands.precision_flags import PrecisionFlags

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class UnitFlags:
    """Which of the device's units a plan may use."""

    pus: Annotated[
        str | None,
        typer.Option("--pus", help="Plan on these units only (comma-separated PU names of the device profile)."),
    ] = None
    exclude_pus: Annotated[
        str | None, typer.Option("--exclude-pus", help="Leave these units out (comma-separated PU names).")
    ] = None
    include_unavailable: Annotated[
        bool,
        typer.Option(
            "--include-unavailable",
            help="Also plan on units no onnxruntime can drive (runtime = unavailable in the profile): what-if plans, "
            "labelled not deployable; compile, run and deploy refuse them.",
        ),
    ] = False

    def select(self, profile: Any, recorded: tuple[str, ...] = ()) -> Any:
        """``profile`` restricted to these flags' units; without --pus, to ``recorded`` (a board's units) if any."""
        from device_profiles.selection import select_units

        def names(text: str | None) -> list[str]:
            return [n.strip() for n in (text or "").split(",") if n.strip()]

        chosen = names(self.pus) or list(recorded)
        return select_units(profile, chosen, names(self.exclude_pus), self.include_unavailable)


def _what_if(plans: list[Any], profile: Any) -> list[Any]:
    """Plans that use a unit no onnxruntime drives, labelled not deployable (a note in the plan file)."""
    import dataclasses

    from device_profiles.selection import undeployable_units
    from planner.unitname import UnitName

    out = []
    for p in plans:
        used = list(dict.fromkeys(part for s in p.stages for pu in s.pus() for part in UnitName(pu).parts))
        bad = undeployable_units(profile, used)
        if bad:
            note = f"not deployable: uses {', '.join(bad)}, which no onnxruntime drives (what-if plan)"
            p = dataclasses.replace(p, notes=(*p.notes, note))
        out.append(p)
    return out


def _not_deployable(plan: Any) -> bool:
    return any(n.startswith("not deployable") for n in plan.notes)


def _load_inputs(
    model: Path,
    device: str,
    costs: Path | None,
    granularity: str,
    input_shape: list[str] | None,
    input_data: Path | None = None,
    units: UnitFlags | None = None,
):
    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from parapipe.boards import resolve_device
    from parapipe.home import default_costs
    from parapipe.intake import open_model
    from planner.costmodel import CostModel
    from planner.granularity import choose_granularity
    from planner.plan import PlanError
    from profiler.costtable import CostTable

    device, recorded = resolve_device(device)  # a profile, or an inventory board's profile and units
    profile = (units or UnitFlags()).select(load_profile(device), recorded)
    loaded = open_model(model, input_shape, input_data)
    graph = build_graph(loaded.proto, loaded.sha256, model.stem)
    if costs is not None and not costs.exists():
        raise PlanError(f"no cost table at {costs}; run `parapipe profile` first or leave out --costs")
    table = CostTable.load(costs or default_costs())
    granularity = choose_granularity(graph, granularity)
    blocks = coarsen(graph, granularity)
    return profile, graph, blocks, CostModel.from_table(profile, graph, table), loaded


def plan_row(plan: Any) -> dict[str, Any]:
    p, s, prov = plan.predicted, plan.simulated, plan.provenance
    units = [f"{a.pu}x{a.cores}" for _, _, a in plan.assignments()]
    return {
        "plan": plan.name,
        "stages": len(plan.stages),
        "units": units,
        "pipelined": plan.pipelined,
        "latency_ms": p.latency_ms if p else None,
        "throughput_fps": p.throughput_fps if p else None,
        "energy_mj": p.energy_mj if p else None,
        "energy_source": p.energy_source if p else None,
        "sim_latency_p50_ms": s.latency_ms if s else None,
        "sim_throughput_fps": s.throughput_fps if s else None,
        "method": prov.method,
        "solver": prov.solver,
        "status": prov.status,
        "gap": prov.gap,
        "seconds": prov.seconds,
        "precision": plan.precision_mix(),
        "int8_blocks": len(plan.int8),
        "fp16_blocks": len(plan.fp16),
        "accuracy": _accuracy(plan),
        "accuracy_loss": _loss(plan),
    }


def _loss(plan: Any) -> float | None:
    """The loss by the plan's metric measured on held-back frames (0 for an all-fp32 plan; None: not measured)."""
    pr = plan.precision
    if not plan.reduced:
        return 0.0
    return None if pr is None else dict(pr.measured).get(pr.metric)


def _accuracy(plan: Any) -> str | None:
    """The accuracy a plan with int8/fp16 blocks promises and was measured at, e.g. ``top1 loss 0.004 (budget 0.01,
    24 held-back frames)``."""
    pr = plan.precision
    if not plan.reduced or pr is None:
        return None
    measured = dict(pr.measured).get(pr.metric)
    shown = f"{measured:.3g}" if measured is not None else "not measured"
    return f"{pr.metric} loss {shown} (budget {pr.budget:g}, {pr.held_out_frames} held-back frames)"


def _table(rows: list[dict[str, Any]], title: str = "") -> Table:
    mixed = any(r.get("precision", "fp32") != "fp32" for r in rows)  # a precision column only where one differs
    t = Table(
        "plan",
        "stages",
        "units",
        *(("precision", "accuracy") if mixed else ()),
        "latency ms",
        "fps",
        "energy mJ (modelled)",
        "sim latency@rate / fps",
        "how found",
        "s",
        title=title,
    )
    for r in rows:
        how = (
            r["method"]
            if not r["solver"]
            else ("" if r["method"] == "ilp" else f"{r['method']}; ")
            + f"{r['solver']} {r['status']}"
            + (f", gap {r['gap']:.2%}" if r["gap"] is not None else "")
        )
        t.add_row(
            r["plan"],
            str(r["stages"]),
            " ".join(r["units"]),
            *((r.get("precision", "fp32"), r.get("accuracy") or "-") if mixed else ()),
            f"{r['latency_ms']:.2f}",
            f"{r['throughput_fps']:.2f}",
            f"{r['energy_mj']:.1f}",
            f"{r['sim_latency_p50_ms']:.1f} / {r['sim_throughput_fps']:.2f}",
            how,
            f"{r['seconds']:.2f}" if r["seconds"] else "-",
        )
    return t


@dataclass(frozen=True)
class PlanFlags:
    """What ``plan`` searches for and how: the objective, the blocks, and the search's bounds and solver."""

    objective: Annotated[str, typer.Option("--objective", help="latency, throughput, energy or pareto.")] = "pareto"
    granularity: Annotated[str, typer.Option("--granularity", help="coarse, fine or auto.")] = "auto"
    max_stages: Annotated[int, typer.Option("--max-stages", min=1, help="Most pipeline stages.")] = 4
    time_limit: Annotated[
        float,
        typer.Option(
            "--time-limit",
            min=0.1,
            help="Seconds per objective, the work after the solve included: its warm start (for latency improved by "
            "local search), then the ILP solve in what is left (at least half) less the time the plan's "
            "lowering and simulation were measured to take (pareto: the sweep's bounded solves get a third).",
        ),
    ] = 10.0
    solver: Annotated[str, typer.Option("--solver", help="highs (default) or cbc.")] = "highs"


def _auto(request, loaded, graph, blocks, cost, costs: Path | None, progress):  # type: ignore[no-untyped-def]
    """``--precision auto``: what it measures."""
    from parapipe.home import default_costs
    from parapipe.precision_auto import measure
    from parapipe.reach import LOCAL_BOARDS
    from profiler.costtable import CostTable

    table_path = costs or default_costs()
    table = CostTable.load(table_path)
    return measure(loaded, graph, blocks, cost, table, table_path, request, cost.profile.name in LOCAL_BOARDS, progress)


@app.command()
@fails_cleanly
@option_groups(flags=PlanFlags, precision=PrecisionFlags, units=UnitFlags)
def plan(
    model: ModelArg,
    device: PlanDeviceOpt,
    costs: CostsOpt = None,
    flags: PlanFlags = PlanFlags(),
    precision: PrecisionFlags = PrecisionFlags(),
    units: UnitFlags = UnitFlags(),
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Folder for the plan files.")] = None,
    input_shape: ShapeOpt = None,
    input_data: DataOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Plan MODEL on a device: the ILP's plans (one objective or the Pareto set) and every baseline.

    Each plan records the input shapes and dtypes it was made for; compile, run, deploy and tune use them.
    """
    from parapipe.intake import generated_note
    from planner.objective import parse_objective
    from planner.search import SearchOptions, baselines, best_plan, pareto_set, shared_problem

    objective, max_stages = flags.objective, flags.max_stages
    parse_objective(objective, allow_pareto=True)
    request = precision.request()
    profile, graph, blocks, cost, loaded = _load_inputs(
        model, device, costs, flags.granularity, input_shape, input_data, units
    )
    folder = output or Path("plans") / safe_name(f"{model.stem}-{profile.name}")
    auto = None
    reverted: dict[str, tuple[str, ...]] = {}
    with err.status(f"planning {model.name} on {profile.name} ({blocks.granularity} blocks)") as status:

        def progress(msg: str) -> None:
            status.update(msg)

        search = SearchOptions(flags.time_limit, max_stages, flags.solver, progress)
        problem = shared_problem(blocks, graph, cost, max_stages)
        progress("baselines")
        base = baselines(blocks, graph, cost, max_stages, problem)
        if request is not None:
            from parapipe.precision_auto import precision_plans

            auto = _auto(request, loaded, graph, blocks, cost, costs, progress)
            plans, reverted = precision_plans(blocks, graph, cost, search, auto, objective, progress)
        elif objective == "pareto":
            plans = pareto_set(blocks, graph, cost, search, problem=problem)
        else:
            plans = [best_plan(blocks, graph, cost, objective, search, problem=problem)]
    import dataclasses

    where: dict[str, Any] = {"model_path": str(model.resolve()), "inputs": loaded.inputs}
    from parapipe.boards import resolve_device

    profile_path = Path(resolve_device(device)[0])
    if profile_path.is_file():  # a profile of the user's: compile, run and deploy find it where it was planned
        where["device"] = str(profile_path.resolve())
    plans = _what_if([dataclasses.replace(p, **where) for p in plans], profile)
    base = dict(zip(base, _what_if([dataclasses.replace(p, **where) for p in base.values()], profile), strict=True))
    from planner.catalog import write_folder

    written = write_folder(folder, plans, base)
    rows = [plan_row(p) for p in plans]
    base_rows = [plan_row(p) for p in base.values()]
    if as_json:
        from parapipe.precision_auto import sweep_budgets

        print_json(
            {
                "folder": str(folder),
                "plans": rows,
                "baselines": base_rows,
                "files": written,
                "inputs": [{**s.to_json(), "made": s.describe()} for s in loaded.inputs],
                "precision": None
                if auto is None
                else {
                    "metric": auto.request.metric,
                    "budget": auto.request.budget,
                    "calibration_frames": len(auto.calibration),
                    "held_out_frames": len(auto.held_out),
                    "sensitivity": auto.sensitivity,
                    "fp16_sensitivity": auto.fp16_sensitivity,
                    "fp16_ms": {f"{b}@{pu}x{k}": ms for (b, pu, k), ms in auto.fp16_ms.items()},
                    "budgets": list(sweep_budgets(auto.request.budget))
                    if objective == "pareto"
                    else [auto.request.budget],
                    "reverted": {k: list(v) for k, v in reverted.items()},
                    "int8_checks": [dataclasses.asdict(c) for c in auto.int8_checks],
                    "notes": auto.notes,
                },
            }
        )
        return
    out.print(_table(rows, f"{objective} plans for {model.name} on {profile.name}"))
    out.print(_table(base_rows, "baselines"))
    out.print(f"wrote {len(written)} plan files and plans.json to {folder}; energy is modelled", highlight=False)
    what_if = [p.name for p in [*plans, *base.values()] if _not_deployable(p)]
    if what_if:
        out.print(
            f"not deployable (what-if, --include-unavailable): {', '.join(what_if)} use units no onnxruntime drives",
            highlight=False,
        )
    shapes = ", ".join(f"{s.name}={'x'.join(map(str, s.shape)) or 'scalar'}" for s in loaded.inputs)
    out.print(f"planned for inputs {shapes} (recorded in each plan; run, compile and deploy use them)", highlight=False)
    if generated_note(loaded):
        out.print(generated_note(loaded), highlight=False, markup=False)
    if auto is not None:
        r = auto.request
        worst = sorted(auto.sensitivity, key=lambda b: (-auto.sensitivity[b], -auto.tie_break[b]))[:3]
        out.print(
            f"precision auto: {len(auto.sensitivity)} blocks could run in int8; {r.metric} loss allowed {r.budget:g}; "
            f"calibrated on {len(auto.calibration)} frames, each plan checked on {len(auto.held_out)} held-back "
            f"frames; most sensitive: " + ", ".join(f"{b} {auto.sensitivity[b]:.3g}" for b in worst),
            highlight=False,
            markup=False,
        )
        for name, back in reverted.items():
            if back:
                out.print(f"{name}: {len(back)} int8 block(s) put back to fp32 to hold the budget: {', '.join(back)}",
                          highlight=False, markup=False)  # fmt: skip
        for note in auto.notes:
            out.print(f"note: {note}", highlight=False, markup=False)


@app.command()
@fails_cleanly
def pareto(
    folder: Annotated[Path, typer.Argument(help="A folder written by `parapipe plan`.")],
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the front as a PNG.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, json or csv.")] = "table",
) -> None:
    """The Pareto front of a folder of plans (latency, throughput, energy, and the accuracy loss measured for plans
    with int8 or fp16 blocks), baselines beside it."""
    from planner.plan import PlanError
    from planner.search import pareto_front

    if fmt not in ("table", "json", "csv"):
        raise PlanError(f"--format must be table, json or csv, not {fmt!r}")
    from planner.catalog import read_folder

    plans, base = read_folder(folder)
    front = pareto_front(plans)
    rows = [plan_row(p) for p in front]
    if plot is not None:
        _plot(front, base, plot)
    if fmt == "json":
        print_json({"front": rows, "baselines": [plan_row(p) for p in base]})
    elif fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(
            [
                "plan", "kind", "latency_ms", "throughput_fps", "energy_mj", "energy_source", "stages", "units",
                "precision", "accuracy_loss",
            ]
        )  # fmt: skip
        for kind, group in (("pareto", front), ("baseline", base)):
            for p in group:
                r = plan_row(p)
                writer.writerow(
                    [
                        r["plan"],
                        kind,
                        r["latency_ms"],
                        r["throughput_fps"],
                        r["energy_mj"],
                        r["energy_source"],
                        r["stages"],
                        " ".join(r["units"]),
                        r["precision"],
                        r["accuracy_loss"],
                    ]
                )
        sys.stdout.write(buf.getvalue())
    else:
        out.print(_table(rows, f"Pareto front of {folder} ({len(front)} of {len(plans)} plans)"))
        if base:
            out.print(_table([plan_row(p) for p in base], "baselines"))
    if plot is not None and fmt == "table":
        out.print(f"plot written to {plot}", highlight=False)


def _plot(front: list, base: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    energies = [p.predicted.energy_mj for p in [*front, *base]]
    lo, hi = min(energies), max(energies)
    sc = ax.scatter(
        [p.predicted.latency_ms for p in front],
        [p.predicted.throughput_fps for p in front],
        c=[p.predicted.energy_mj for p in front],
        cmap="viridis",
        vmin=lo,
        vmax=hi,
        s=70,
        label="Pareto plans",
        zorder=3,
    )
    ax.plot(
        [p.predicted.latency_ms for p in front],
        [p.predicted.throughput_fps for p in front],
        color="grey",
        lw=0.8,
        zorder=2,
    )
    if base:
        ax.scatter(
            [p.predicted.latency_ms for p in base],
            [p.predicted.throughput_fps for p in base],
            c=[p.predicted.energy_mj for p in base],
            cmap="viridis",
            vmin=lo,
            vmax=hi,
            marker="x",
            s=60,
            label="baselines",
        )
        for p in base:
            ax.annotate(p.name, (p.predicted.latency_ms, p.predicted.throughput_fps), fontsize=7, alpha=0.8)
    fig.colorbar(sc, label="energy per frame, mJ (modelled)")
    ax.set_xlabel("latency, ms (lower is better)")
    ax.set_ylabel("throughput, frames/s (higher is better)")
    model = (front or base)[0]
    ax.set_title(f"{model.model_name} on {model.device}")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


@app.command()
@fails_cleanly
def select(
    folder: Annotated[Path, typer.Argument(help="A folder written by `parapipe plan`.")],
    objective: Annotated[str, typer.Option("--objective", help="latency, throughput or energy.")] = "latency",
    max_latency_ms: Annotated[float | None, typer.Option("--max-latency-ms", help="Latency ceiling.")] = None,
    min_fps: Annotated[float | None, typer.Option("--min-fps", help="Throughput floor.")] = None,
    max_mj: Annotated[float | None, typer.Option("--max-mj", help="Energy ceiling per frame.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """The best plan of a folder under constraints, or which constraint to relax."""
    from planner.objective import parse_objective
    from planner.select import Constraints, select_plan

    goal = parse_objective(objective)
    from planner.catalog import read_folder

    plans, _ = read_folder(folder)
    best = select_plan(plans, goal, Constraints(max_latency_ms, min_fps, max_mj))
    row = plan_row(best)
    row["file"] = str(folder / f"{safe_name(best.name)}.json")
    if as_json:
        print_json(row)
        return
    out.print(_table([row], f"best for {goal}"))
    out.print(f"plan file: {row['file']}", highlight=False)


@app.command()
@fails_cleanly
def show(
    plan_file: Annotated[Path, typer.Argument(help="A plan JSON, solved or hand-written.")],
    model: Annotated[Path | None, typer.Option("--model", help="Also check the plan against this .onnx.")] = None,
    device: Annotated[
        str | None, typer.Option("--device", help="Profile to check against (default: the plan's).")
    ] = None,
    costs: CostsOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """A plan, readable by a person: stages, units, blocks and predicted figures.

    On a unit whose execution provider is not the CPU's, the column "on the CPU" lists the nodes that provider
    declined when they were profiled (onnxruntime runs those on the CPU), from the cost table."""
    from planner.plan import load_plan, validate

    the_plan = load_plan(plan_file)
    if model is not None:
        from device_profiles.loader import load_profile
        from models.graph import build_graph
        from parapipe.intake import open_model

        loaded = open_model(model, plan=the_plan)
        validate(the_plan, build_graph(loaded.proto, loaded.sha256), load_profile(device or the_plan.device))
    declined = _declined(the_plan, device, costs)
    if as_json:
        data = the_plan.to_json()
        if declined:
            data["declined"] = [
                {"stage": s, "group": g, "unit": i, "pu": pu, "nodes": None if nodes is None else list(nodes)}
                for (s, g, i), (pu, nodes) in declined.items()
            ]
        print_json(data)
        return
    prov = the_plan.provenance
    out.print(
        f"[bold]{the_plan.name or plan_file.stem}[/]: {the_plan.model_name} ({the_plan.model_sha256[:12]}) on {the_plan.device}, "
        f"{the_plan.granularity} blocks, {'pipelined' if the_plan.pipelined else 'one frame at a time'}; found by {prov.method}"
        + (
            f" ({prov.solver}, {prov.status}, gap {prov.gap:.2%}, {prov.seconds:.2f}s)"
            if prov.solver and prov.gap is not None
            else ""
        ),
        highlight=False,
    )
    mixed = bool(the_plan.reduced)
    t = Table(
        "stage",
        "replica",
        "PU",
        "cores",
        "core ids",
        "blocks",
        "ops",
        *(("int8 blocks", "fp16 blocks") if mixed else ()),
        *(("on the CPU",) if declined else ()),
    )
    for s, stage in enumerate(the_plan.stages):
        for g, group in enumerate(stage.groups):
            for i, a in enumerate(group):
                ops = sum(len(the_plan.blocks[b]) for b in a.blocks)
                shown = ", ".join(a.blocks[:4]) + (f" … (+{len(a.blocks) - 4})" if len(a.blocks) > 4 else "")
                int8 = sum(b in the_plan.int8 for b in a.blocks)
                half = sum(b in the_plan.fp16 for b in a.blocks)
                t.add_row(
                    str(s),
                    str(g),
                    a.pu,
                    str(a.cores),
                    ",".join(map(str, a.core_ids)) or "auto",
                    shown,
                    str(ops),
                    *((f"{int8}/{len(a.blocks)}", f"{half}/{len(a.blocks)}") if mixed else ()),
                    *((_declined_cell(declined.get((s, g, i))),) if declined else ()),
                )
    out.print(t)
    out.print(f"precision: {the_plan.precision_mix()}" + _precision_detail(the_plan), highlight=False)
    for label, p in (
        ("predicted (analytic)", the_plan.predicted),
        ("simulated (latency at full rate)", the_plan.simulated),
    ):
        if p:
            out.print(
                f"{label}: latency {p.latency_ms:.2f} ms, throughput {p.throughput_fps:.2f} fps, "
                f"energy {p.energy_mj:.1f} mJ/frame ({p.energy_source})",
                highlight=False,
            )
    for note in the_plan.notes:
        out.print(f"note: {note}", highlight=False)


def _declined(plan: Any, device: str | None, costs: Path | None) -> dict[tuple[int, int, int], tuple[str, Any]]:
    """For each assignment on a unit whose provider is not the CPU's: (PU, the nodes of it its provider declined
    when profiled, or None where none of it was profiled). {} where the plan has no such unit or its profile or
    cost table cannot be read (show works on a plan alone)."""
    from device_profiles.loader import load_profile
    from models.errors import ParapipeError
    from parapipe.home import default_costs
    from profiler.costtable import CostTable
    from profiler.runtime import CPU_PROVIDER

    try:
        profile = load_profile(device or plan.device)
    except (ParapipeError, ValueError, OSError):
        return {}
    names = {p.name: p for p in profile.pus}
    units = {
        (s, g, i): a
        for s, stage in enumerate(plan.stages)
        for g, group in enumerate(stage.groups)
        for i, a in enumerate(group)
        if a.pu in names and names[a.pu].execution_provider != CPU_PROVIDER
    }
    path = costs or default_costs()
    if not units or not path.exists():
        return {}
    table = CostTable.load(path)
    out = {}
    for key, a in units.items():
        members = [m for b in a.blocks for m in plan.blocks[b]]
        out[key] = (str(a.pu), table.declined(plan.model_sha256, profile.name, a.pu, members))
    return out


def _declined_cell(found: tuple[str, Any] | None) -> str:
    if found is None:
        return ""
    nodes = found[1]
    if nodes is None:
        return "not profiled"
    if not nodes:
        return "none"
    return f"{len(nodes)}: " + ", ".join(nodes[:4]) + (f" … (+{len(nodes) - 4})" if len(nodes) > 4 else "")


def _precision_detail(plan: Any) -> str:
    pr = plan.precision
    if not plan.reduced or pr is None:
        return " (every block as the model has it)"
    measured = ", ".join(f"{k} {v:.3g}" for k, v in pr.measured) or "not measured"
    return (
        f"; accuracy loss vs fp32 by {pr.metric} within {pr.budget:g}; measured on {pr.held_out_frames} held-back "
        f"frames: {measured}; calibrated on {pr.calibration_frames} frames ({len(pr.ranges)} tensor ranges)"
    )


@dataclass(frozen=True)
class CompareFlags:
    """The blocks and the search's bounds ``compare`` plans with."""

    granularity: Annotated[str, typer.Option("--granularity", help="coarse, fine or auto.")] = "auto"
    max_stages: Annotated[int, typer.Option("--max-stages", min=1)] = 4
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.1)] = 10.0


@app.command()
@fails_cleanly
@option_groups(flags=CompareFlags, precision=PrecisionFlags, units=UnitFlags)
def compare(
    model: ModelArg,
    device: PlanDeviceOpt,
    costs: CostsOpt = None,
    flags: CompareFlags = CompareFlags(),
    precision: PrecisionFlags = PrecisionFlags(),
    units: UnitFlags = UnitFlags(),
    input_shape: ShapeOpt = None,
    input_data: DataOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Our best plan per objective against every baseline, with ratios (>1 means ours is better)."""
    from planner.objective import Objective
    from planner.problem import build_problem
    from planner.search import SearchOptions, baselines, best_plan, shared_problem
    from planner.select import ratios

    request = precision.request()
    profile, graph, blocks, cost, loaded = _load_inputs(
        model, device, costs, flags.granularity, input_shape, input_data, units
    )
    with err.status("planning") as status:
        problem = shared_problem(blocks, graph, cost, flags.max_stages)
        base = baselines(blocks, graph, cost, flags.max_stages, problem)
        search = SearchOptions(flags.time_limit, flags.max_stages)
        auto = None
        if request is not None:
            from parapipe.precision_auto import checked_plans

            auto = _auto(request, loaded, graph, blocks, cost, costs, status.update)
            problem = build_problem(blocks, graph, cost, flags.max_stages, int8=auto.choice())
        ours = {o: best_plan(blocks, graph, cost, o, search, problem=problem) for o in Objective}
        if auto is not None:
            checked = checked_plans(list(ours.values()), auto, cost, graph, status.update, {})
            ours = dict(zip(ours, checked, strict=True))
    rows = []
    for name, b in base.items():
        r = ratios(ours, b)
        rows.append(
            {
                "baseline": name,
                "latency_ms": b.predicted.latency_ms,
                "throughput_fps": b.predicted.throughput_fps,
                "energy_mj": b.predicted.energy_mj,
                "latency_ratio": r.latency,
                "throughput_ratio": r.throughput,
                "energy_ratio": r.energy,
            }
        )
    result = {
        "model": model.name,
        "device": profile.name,
        "ours": {str(o): plan_row(p) for o, p in ours.items()},
        "baselines": rows,
        "note": "ratios > 1 mean our plan is better; figures are predicted (energy modelled)",
    }
    if as_json:
        print_json(result)
        return
    out.print(_table([plan_row(p) for p in ours.values()], f"our plans for {model.name} on {profile.name}"))
    t = Table(
        "baseline", "latency ms", "fps", "energy mJ", "latency: theirs/ours", "fps: ours/theirs", "energy: theirs/ours"
    )
    for r in rows:
        t.add_row(
            r["baseline"],
            f"{r['latency_ms']:.2f}",
            f"{r['throughput_fps']:.2f}",
            f"{r['energy_mj']:.1f}",
            f"{r['latency_ratio']:.2f}x",
            f"{r['throughput_ratio']:.2f}x",
            f"{r['energy_ratio']:.2f}x",
        )
    out.print(t)
    out.print(result["note"])
