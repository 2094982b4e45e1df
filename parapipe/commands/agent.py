"""Agent commands: compile, agent serve, agent status, run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from parapipe.app import (
    CostsOpt,
    DataOpt,
    JsonFlag,
    ModelArg,
    ShapeOpt,
    app,
    err,
    fails_cleanly,
    option_groups,
    out,
    print_info,
    print_json,
)
from parapipe.commands.precision_flags import PrecisionFlags

if TYPE_CHECKING:
    from parapipe.tune import Recalibration

agent_app = typer.Typer(help="The board agent: serve it here, or ask one for its status.", no_args_is_help=True)
app.add_typer(agent_app, name="agent")


@app.command("compile")
@fails_cleanly
def compile_cmd(
    plan: Annotated[Path, typer.Argument(help="A plan JSON.")],
    model: Annotated[Path, typer.Argument(help="The .onnx model the plan is for.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Bundle folder to write.")],
    input_data: DataOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Cut the model per the plan into partitions, check them chained against the full model, write the bundle.

    The model is opened with the input shapes the plan was made for; the check runs on --input-data if given.
    """
    from compiler import compile_plan, host_bundles, write_bundles
    from device_profiles.loader import load_profile
    from models.graph import build_graph
    from parapipe.run import resolve_model
    from planner.plan import load_plan

    the_plan = load_plan(plan)
    loaded = resolve_model(the_plan, model, input_data)
    compiled = compile_plan(the_plan, loaded, build_graph(loaded.proto, loaded.sha256), load_profile(the_plan.device))
    folders = write_bundles(compiled, output)
    m = compiled.manifest
    the_plan_mix = the_plan.precision_mix()
    info = {
        "bundle": str(output),
        "bundle_sha256": compiled.sha256,
        "hosts": {
            host: {"folder": str(folders[host]), "bundle_sha256": part.sha256, "files": len(part.files)}
            for host, part in host_bundles(compiled).items()
            if host
        },
        "partitions": [
            {
                "name": p.name,
                "host": p.host,
                "file": p.file,
                "pu": p.pu,
                "core_ids": list(p.core_ids),
                "inputs": list(p.inputs),
                "outputs": list(p.outputs),
            }
            for p in m.partitions
        ],
        "files": len(compiled.files),
        "max_abs_diff": None if compiled.precision else compiled.max_abs_diff,
        "precision": the_plan_mix,
        "accuracy": compiled.precision.describe() if compiled.precision else None,
    }
    if as_json:
        print_json(info)
        return
    t = Table("partition", "host", "PU", "cores", "file", "reads", "writes")
    for p in m.partitions:
        t.add_row(
            p.name, p.host, p.pu, ",".join(map(str, p.core_ids)) or "-", p.file, str(len(p.inputs)), str(len(p.outputs))
        )
    out.print(t)
    for host, folder in folders.items():
        if host:
            out.print(f"host {host}: its bundle is {folder} (entry host: {m.entry})", highlight=False)
    check = (
        f"precision {the_plan_mix}: {compiled.precision.describe()}"
        if compiled.precision
        else f"max abs diff {compiled.max_abs_diff:.2e}"
    )
    out.print(
        f"bundle {compiled.sha256[:12]}… in {output}: {len(compiled.files)} files; chained partitions vs full model: "
        f"{check}",
        highlight=False,
    )


@dataclass(frozen=True)
class AgentSecurityFlags:
    """Who may call the agent: its token and TLS files, or --insecure off loopback."""

    token_file: Annotated[Path | None, typer.Option("--token-file")] = None
    tls_cert: Annotated[Path | None, typer.Option("--tls-cert")] = None
    tls_key: Annotated[Path | None, typer.Option("--tls-key")] = None
    tls_ca: Annotated[Path | None, typer.Option("--tls-ca")] = None


@dataclass(frozen=True)
class AgentObservabilityFlags:
    """What the agent tells operators: Prometheus metrics and the log format."""

    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Serve Prometheus metrics on this port (on --host, same token and TLS; 0 picks one). Off by default.",
        ),
    ] = None
    metrics_port_file: Annotated[
        Path | None, typer.Option("--metrics-port-file", help="Write the bound metrics port here.")
    ] = None
    log_format: Annotated[
        str | None,
        typer.Option("--log-format", help="text or json (JSON lines: time, level, event, bundle, plan, peer)."),
    ] = None


def unseen(c: Recalibration) -> str:
    """A recalibration's out-of-sample RMSPEs (each plan without its own measurement), where it has them."""
    before, after = c.out_of_sample_before, c.out_of_sample_after
    if before is None or after is None:
        return ""
    only = ": next round runs measured plans only" if c.measured_plans_only else ""
    return f"; unseen {before:.1f}% -> {after:.1f}%{only}"


def _flag_args(flags: object) -> list[str]:
    """A flag group as ``agents.server``'s arguments: ``--field-name value`` for every value given."""
    argv: list[str] = []
    for f in dataclasses.fields(flags):  # type: ignore[arg-type]
        value = getattr(flags, f.name)
        if value is not None:
            argv += ["--" + f.name.replace("_", "-"), str(value)]
    return argv


@agent_app.command("serve")
@option_groups(security=AgentSecurityFlags, observability=AgentObservabilityFlags)
def serve(
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 50051,
    workdir: Annotated[Path | None, typer.Option("--workdir", help="Default ~/.parapipe-agent.")] = None,
    security: AgentSecurityFlags = AgentSecurityFlags(),
    port_file: Annotated[Path | None, typer.Option("--port-file", help="Write the bound port here.")] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure", help="Serve on a network address without a token (anyone who can reach it may run models)."
        ),
    ] = False,
    observability: AgentObservabilityFlags = AgentObservabilityFlags(),
) -> None:
    """Run the board agent in the foreground (the same as `python -m agents.server`).

    Off loopback it needs --token-file (and TLS, or it warns) unless --insecure is given."""
    from agents.server import main

    argv = ["--host", host, "--port", str(port), "--workdir", str(workdir or Path.home() / ".parapipe-agent")]
    if insecure:
        argv.append("--insecure")
    if port_file is not None:
        argv += ["--port-file", str(port_file)]
    argv += _flag_args(security) + _flag_args(observability)
    raise typer.Exit(main(argv))


@agent_app.command("status")
@fails_cleanly
def agent_status(
    address: Annotated[str, typer.Option("--address", help="HOST:PORT of the agent.")],
    token_file: Annotated[Path | None, typer.Option("--token-file")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Health, readiness, loaded bundles, cores and versions of an agent."""
    from agents.client import AgentClient, AgentError
    from parapipe.boards import read_token
    from parapipe.local_agent import DeployError

    token = read_token(str(token_file)) if token_file else None
    with AgentClient(address, token, timeout=5) as client:
        try:
            live = client.health()
            ready = client.ready()
            s = client.status()
        except AgentError as exc:
            raise DeployError(f"agent at {address}: {exc}") from None
    info = {
        "address": address,
        "live": live,
        "ready": ready,
        "agent_version": s.agent_version,
        "ort_version": s.ort_version,
        "python_version": s.python_version,
        "hostname": s.hostname,
        "cores": list(s.cores),
        "bundles": list(s.bundles),
        "running_bundle": s.running_bundle,
        "providers": list(s.providers),
        "devices": list(s.devices),
        "workdir": s.workdir,
        "boots": s.boots,
        "frames_done": s.frames_done,
        "frames_failed": s.frames_failed,
        "bounds": dict(sorted(s.bounds.items())),
    }
    print_info(info, as_json)


@app.command()
@fails_cleanly
def run(
    plan: Annotated[Path, typer.Argument(help="A plan JSON.")],
    board: Annotated[
        list[str] | None,
        typer.Option(
            "--board",
            help="local, local-biglittle, local-edge-cloud, or an inventory board; for a plan over several hosts "
            "one HOST=BOARD per host (repeat the option).",
        ),
    ] = None,
    model: Annotated[
        Path | None, typer.Option("--model", help="The .onnx model (default: where it was planned).")
    ] = None,
    frames: Annotated[int, typer.Option("--frames", min=1, help="Frames to benchmark.")] = 50,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Also compare one frame's outputs with the full model's (fails above 1e-4 of the output scale).",
        ),
    ] = False,
    input_data: DataOpt = None,
    group: Annotated[
        str | None, typer.Option("--group", help="Every board of this inventory group, at once (one row each).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Deploy a plan to a board's agent, benchmark it there, and print predicted vs measured.

    The model is opened with the input shapes the plan was made for. Frames are made as the plan's
    inputs say (sample values it recorded, index ranges, or random); --input-data gives real ones
    for --verify.
    """
    from parapipe.local_agent import DeployError
    from parapipe.run import run_plan
    from planner.plan import load_plan

    if group is not None:
        from parapipe.commands.serving import run_group

        if board:
            raise DeployError("give either --board or --group (one of them)")
        run_group(load_plan(plan), group, model, frames, verify, input_data, as_json)
        return
    boards = board or ["local"]
    target: str | dict[str, str]
    if len(boards) == 1 and "=" not in boards[0]:
        target = boards[0]
    else:
        pairs = [b.partition("=") for b in boards]
        bad = [b for b, (h, eq, name) in zip(boards, pairs, strict=True) if not (h and eq and name)]
        if bad or len({h for h, _, _ in pairs}) != len(pairs):
            raise DeployError(
                f"--board {' '.join(bad) or ' '.join(boards)}: give one board, or HOST=BOARD once per host of the plan"
            )
        target = {h: name for h, _, name in pairs}
    the_plan = load_plan(plan)
    shown = boards[0] if isinstance(target, str) else ", ".join(boards)
    with err.status(f"running {the_plan.name or plan.stem} on {shown}") as status:
        result = run_plan(the_plan, target, model, frames, verify, progress=status.update, input_data=input_data)
    if as_json:
        print_json(result.to_json())
        if result.verified is False:
            raise typer.Exit(1)
        return
    t = Table("figure", "predicted", "measured", "error")
    predicted = result.predicted.to_json() if result.predicted else {}
    for k, v in result.measured.to_json().items():
        p = predicted.get(k)
        e = result.errors_pct.get(k)
        t.add_row(k, f"{p:.2f}" if p is not None else "-", f"{v:.2f}", f"{e:+.1f}%" if e is not None else "-")
    out.print(t)
    out.print(f"energy is {result.energy_source}; bundle {result.bundle_sha256[:12]}…", highlight=False)
    out.print("inputs: " + "; ".join(result.inputs), highlight=False, markup=False)
    runtimes = _runtimes_line(result.partitions)
    if runtimes:
        out.print(runtimes, highlight=False, markup=False)
    if result.hosts:
        out.print(
            "hosts: " + ", ".join(f"{h} on {b}" for h, b in result.hosts.items()) + " (tensors between them went "
            "agent to agent; the modelled energy counts the entry host's cores only)",
            highlight=False,
        )
    if result.max_abs_diff is not None:
        verdict = "ok" if result.verified else "FAILED"
        out.print(
            f"outputs vs the full model: max abs diff {result.max_abs_diff:.2e}, output scale "
            f"{result.output_scale or 0:.3g}: {verdict}",
            highlight=False,
        )
        if not result.verified:
            raise typer.Exit(1)
    if result.accuracy is not None:
        a = result.accuracy
        verdict = "ok" if result.verified else "FAILED"
        out.print(
            f"outputs vs the full fp32 model ({result.precision}): {a['metric']} loss {a['loss']:.4g} over "
            f"{a['frames']} frame(s), budget {a['budget']:g}: {verdict}"
            + (
                ""
                if result.verified or all(i.endswith("(data)") for i in result.inputs)
                else " (on generated inputs; accuracy means something on real ones: --input-data FILE.npz)"
            ),
            highlight=False,
            markup=False,
        )
        if not result.verified:
            raise typer.Exit(1)


def _runtimes_line(partitions) -> str:  # type: ignore[no-untyped-def]
    """Where the partitions ran, as their sessions reported: per unit, its provider, the load (EP compilation
    included: a deploy cost, not in the figures above) and whether a compiled model came from the cache."""
    units: dict[str, list] = {}
    for p in partitions:
        if p.provider:
            units.setdefault(p.pu, []).append(p)
    parts = []
    for unit, ps in units.items():
        cached = sum(1 for p in ps if p.compile_cache_hit)
        parts.append(
            f"{unit} on {ps[0].provider} ({len(ps)} partition{'s' if len(ps) > 1 else ''}, loaded in "
            f"{sum(p.load_s for p in ps):.2f} s" + (f", {cached} from the compile cache" if cached else "") + ")"
        )
    return "ran: " + "; ".join(parts) if parts else ""


@dataclass(frozen=True)
class TuneFlags:
    """The options of the tune loop, as ``parapipe.tune.TuneOptions`` takes them."""

    objective: Annotated[str, typer.Option("--objective", help="pareto, latency, throughput or energy.")] = "pareto"
    rounds: Annotated[int, typer.Option("--rounds", min=1)] = 3
    target_error: Annotated[float, typer.Option("--target-error", help="Stop when RMSPE (%) is below this.")] = 5.0
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.1, help="Seconds per ILP solve.")] = 2.0
    frames: Annotated[
        int, typer.Option("--frames", min=5, help="Frames per measured plan (doubled while the noise is large).")
    ] = 30
    max_frames: Annotated[
        int | None, typer.Option("--max-frames", min=5, help="Cap for the grown --frames (default 8x --frames).")
    ] = None
    min_seconds: Annotated[
        float,
        typer.Option(
            "--min-seconds",
            min=0.0,
            help="Each measurement lasts at least this long at the plan's rate: a fast model gets more than --frames "
            "(short runs carry the machine's own bursts). 0: exactly --frames.",
        ),
    ] = 1.0
    pus: Annotated[str | None, typer.Option("--pus", help="Plan on these units only (comma-separated PU names).")] = (
        None
    )
    exclude_pus: Annotated[
        str | None, typer.Option("--exclude-pus", help="Leave these units out (comma-separated PU names).")
    ] = None


@app.command()
@fails_cleanly
@option_groups(flags=TuneFlags, precision=PrecisionFlags)
def tune(
    model: ModelArg,
    board: Annotated[str, typer.Option("--board", help="local, local-biglittle or an inventory board.")] = "local",
    flags: TuneFlags = TuneFlags(),
    precision: PrecisionFlags = PrecisionFlags(),
    costs: CostsOpt = None,
    input_shape: ShapeOpt = None,
    input_data: DataOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Profile, plan, run every plan, feed the measurements back and re-plan, until predictions match.

    With --precision auto every round plans as ``plan --precision auto`` does, within the same budget."""
    from parapipe.home import default_costs
    from parapipe.tune import TuneOptions
    from parapipe.tune import tune as run_tune
    from planner.objective import parse_objective

    parse_objective(flags.objective, allow_pareto=True)
    request = precision.request()
    target_error = flags.target_error
    with err.status(f"tuning {model.name} on {board}") as status:
        history, last = run_tune(
            model,
            board,
            costs or default_costs(),
            TuneOptions(**dataclasses.asdict(flags)),
            status.update,
            input_shape=input_shape,
            input_data=input_data,
            precision=request,
        )
    if as_json:
        print_json(
            {
                "rounds": [h.to_json() for h in history],
                "noise": history[-1].noise.to_json() if history[-1].noise else None,
                "noise_limited": history[-1].noise_limited,
                "effective_target_pct": history[-1].effective_target_pct,
                "stop": history[-1].stop,
                "front_measured": [
                    {
                        "plan": p.name,
                        "measured": r.measured.to_json(),
                        "precision": p.precision_mix(),
                        "accuracy_loss": p.accuracy_loss(),
                    }
                    for p, r in last
                ],
                "target_error_pct": target_error,
            }
        )
        return
    t = Table(
        "round",
        "plans",
        "frames",
        "RMSPE latency %",
        "RMSPE throughput %",
        "RMSPE energy %",
        "calibration (all measured plans)",
        "handoff learnt ms",
        "frame overhead learnt ms",
        "shared memory learnt GB/s",
        "network link learnt GB/s, CPU us/msg, us/MB",
        "throttled PU sustained x",
        "run overhead learnt ms",
    )
    for h in history:
        c = h.calibration
        counts = sorted({int(row.get("frames", h.frames)) for row in h.rows} or {h.frames})
        t.add_row(
            str(h.index),
            str(h.plans),
            str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}",  # --min-seconds: more for fast plans
            f"{h.rmspe_latency:.1f}",
            f"{h.rmspe_throughput:.1f}",
            f"{h.rmspe_energy:.1f}" if h.rmspe_energy is not None else "n/a (energy modelled)",
            "-"
            if c is None
            else f"{'kept' if c.kept else 'reverted'} ({c.rmspe_before:.1f}% -> {c.rmspe_after:.1f}%{unseen(c)})",
            f"{h.handoff_ms:.2f}" if h.handoff_ms is not None else "-",
            f"{c.frame_ms:.2f}" if c is not None and c.frame_ms is not None else "-",
            ", ".join(f"{m} {gbps:.2f}" for m, gbps in c.memory_gbps) if c is not None and c.memory_gbps else "-",
            ", ".join(f"{n} {gbps:.2f}, {m:.0f}, {mb:.0f}" for n, gbps, m, mb in c.network)
            if c is not None and c.network
            else "-",
            ", ".join(f"{pu} {x:.2f}" for pu, x in c.sustained) if c is not None and c.sustained else "-",
            ", ".join(f"{pu} {ms:.2f}" for pu, ms in c.run_overhead) if c is not None and c.run_overhead else "-",
        )
    out.print(t)
    out.print(history[-1].note, highlight=False, markup=False)
    f = Table("plan (last round)", "precision", "latency ms", "fps", "energy mJ", title="the front as measured")
    for p, r in last:
        f.add_row(
            p.name,
            p.precision_mix(),
            f"{r.measured.latency_ms:.2f}",
            f"{r.measured.throughput_fps:.2f}",
            f"{r.measured.energy_mj:.1f}",
        )
    out.print(f)
    final = history[-1]
    if final.stop == "noise":
        verdict = f"within the noise ({final.effective_target_pct:.1f}%; the {target_error:g}% target is below it)"
    elif final.stop == "target":
        verdict = "reached"
    else:
        verdict = "NOT reached" + (
            f" (nor the noise floor {final.effective_target_pct:.1f}%)" if final.noise_limited else ""
        )
    out.print(
        f"target {target_error:g}% {verdict} after {final.index} round(s): "
        f"latency {final.rmspe_latency:.1f}%, throughput {final.rmspe_throughput:.1f}%",
        highlight=False,
    )
