"""Board commands: boards add/list/check, deploy, undeploy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from parapipe.app import JsonFlag, app, err, fails_cleanly, option_groups, out, print_info, print_json

boards_app = typer.Typer(help="The board inventory ($PARAPIPE_HOME/boards.toml).", no_args_is_help=True)
app.add_typer(boards_app, name="boards")


@dataclass(frozen=True)
class SshFlags:
    """How a board is reached over SSH, and where its agent lives there."""

    host: Annotated[str, typer.Option("--host", help="SSH host of the board.")] = ""
    user: Annotated[str, typer.Option("--user", help="SSH user.")] = ""
    key: Annotated[Path | None, typer.Option("--key", help="Private key file for SSH.")] = None
    port: Annotated[int, typer.Option("--port")] = 22
    known_hosts: Annotated[
        Path | None, typer.Option("--known-hosts", help="known_hosts file holding the board's key.")
    ] = None
    host_key: Annotated[str | None, typer.Option("--host-key", help="Pinned host key fingerprint, SHA256:...")] = None
    python: Annotated[str, typer.Option("--python", help="Python on the board.")] = "python3"
    workdir: Annotated[str, typer.Option("--workdir", help="Working directory on the board.")] = "~/parapipe"
    agent_port: Annotated[int, typer.Option("--agent-port", help="Port of the agent on the board's 127.0.0.1.")] = 50051


@dataclass(frozen=True)
class DirectFlags:
    """An agent reached directly over TLS with a token (no SSH)."""

    agent_address: Annotated[
        str,
        typer.Option(
            "--agent-address",
            help="HOST:PORT of an agent reachable directly over TLS (no SSH tunnel); needs --token-file and --tls-ca.",
        ),
    ] = ""
    token_file: Annotated[Path | None, typer.Option("--token-file", help="The agent's bearer token.")] = None
    tls_ca: Annotated[Path | None, typer.Option("--tls-ca", help="CA (PEM) of the agent's TLS certificate.")] = None


def _absolute(path: Path | None) -> str:
    return str(path.expanduser().resolve()) if path else ""


@boards_app.command("add")
@fails_cleanly
@option_groups(ssh=SshFlags, direct=DirectFlags)
def add(
    name: Annotated[str, typer.Argument(help="A name for the board.")],
    device: Annotated[str, typer.Option("--device", help="Device profile (name or TOML path).")],
    ssh: SshFlags,
    direct: DirectFlags,
    group: Annotated[
        str, typer.Option("--group", help="A fleet the board belongs to (deploy/undeploy --group NAME).")
    ] = "",
    units: Annotated[
        str | None,
        typer.Option(
            "--units",
            help="The profile's units this board has (comma-separated); plans and tune for it use only these. "
            "Default: every unit an onnxruntime drives (`boards check NAME --record` finds them on the board).",
        ),
    ] = None,
) -> None:
    """Add (or replace) a board: reached over SSH (--host/--user/--key), or directly (--agent-address)."""
    from parapipe.boards import Board, add_board

    board = Board(
        name=name,
        host=ssh.host,
        port=ssh.port,
        user=ssh.user,
        key=_absolute(ssh.key),
        device=device,
        known_hosts=_absolute(ssh.known_hosts),
        host_key_sha256=ssh.host_key or "",
        python=ssh.python,
        workdir=ssh.workdir,
        agent_port=ssh.agent_port,
        agent_address=direct.agent_address,
        token_file=_absolute(direct.token_file),
        tls_ca=_absolute(direct.tls_ca),
        group=group,
        units=tuple(u.strip() for u in (units or "").split(",") if u.strip()),
    )
    path = add_board(board)
    out.print(f"board {name} saved in {path}", highlight=False)


@boards_app.command("list")
@fails_cleanly
def list_boards(as_json: JsonFlag = False) -> None:
    """The boards in the inventory."""
    from dataclasses import asdict

    from parapipe.boards import load_boards

    boards = load_boards()
    if as_json:
        print_json([asdict(b) for b in boards.values()])
        return
    t = Table("board", "ssh", "agent", "device", "workdir", "host key", "group")
    for b in boards.values():
        t.add_row(
            b.name,
            f"{b.user}@{b.host}:{b.port}" if b.host else "-",
            f"{b.agent_address} (TLS)" if b.agent_address else f"tunnel to 127.0.0.1:{b.agent_port}",
            b.device,
            b.workdir if b.host else "-",
            b.host_key_sha256 or b.known_hosts or "-",
            b.group or "-",
        )
    out.print(t)


@boards_app.command("check")
@fails_cleanly
def check(
    name: Annotated[str | None, typer.Argument(help="A board of the inventory.")] = None,
    group: Annotated[str | None, typer.Option("--group", help="Every board of this inventory group, at once.")] = None,
    record: Annotated[
        bool,
        typer.Option(
            "--record",
            help="Keep the units whose provider the board's onnxruntime offers as the board's units: plans "
            "(--device BOARD) and tune then use only those.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Connect and report the board's OS, CPU, cores, Python, onnxruntime, the units it can run and the agent's
    state; exit 2 when a unit of its profile needs a provider it lacks (unless --record keeps the others)."""
    from parapipe.boards import BoardError, get_board, record_units
    from parapipe.commands.serving import check_group, one_target

    if one_target(name, group) == "group":
        if record:
            raise BoardError("--record works on one board at a time; name it")
        check_group(str(group), board_info, as_json)
        return
    board = get_board(str(name))
    info = board_info(board)
    missing = info.get("units_missing_provider") or []
    if record:
        lacking = {u["unit"] for u in missing}
        usable = tuple(u for u in info["unit_names"] if u not in lacking)
        if not usable:
            raise BoardError(f"board {board.name}: no unit of {board.device} can run there; nothing recorded")
        record_units(board.name, usable)
        info["recorded_units"] = list(usable)
        missing = []
    shown = dict(info)
    if not as_json:  # lists as one line each, for people
        shown["providers"] = ", ".join(info.get("providers") or []) or "none"
        shown["units_missing_provider"] = ", ".join(f"{u['unit']} ({u['provider']})" for u in missing) or "none"
    print_info(shown, as_json)
    if missing:
        from parapipe.availability import Runtime, refuse_missing

        runtime = Runtime(str(info["onnxruntime"]), tuple(info.get("providers") or ()), "what deploy would run")
        refuse_missing({u["unit"]: u["provider"] for u in missing}, runtime, board.name)


def _units_report(board, providers: list[str]) -> dict:
    """The board's profile's units (those an onnxruntime drives) and which of them its onnxruntime cannot run."""
    from device_profiles.loader import load_profile
    from device_profiles.selection import select_units
    from profiler.runtime import missing_providers

    profile = select_units(load_profile(board.device))
    needed = {p.name: p.execution_provider for p in profile.pus}
    missing = missing_providers(needed, providers)
    return {
        "providers": providers,
        "unit_names": list(needed),
        "units": ", ".join(f"{u} ({p})" for u, p in needed.items()),
        "units_missing_provider": [{"unit": m.unit, "provider": m.provider} for m in missing],
    }


def board_info(board) -> dict:
    """What ``boards check`` reports of one board."""
    from parapipe.availability import board_runtime
    from parapipe.deploy import _paths, agent_running
    from parapipe.ssh import BoardConnection

    name = board.name
    if not board.host:  # an agent-only board: what its agent says about itself
        from parapipe.boards import direct_client

        with direct_client(board) as client:
            s = client.status()
            return {
                "board": name,
                "agent_address": board.agent_address,
                "hostname": s.hostname,
                "cores": len(s.cores),
                "python": s.python_version,
                "onnxruntime": s.ort_version,
                "agent_version": s.agent_version,
                "agent_ready": s.ready,
                **_units_report(board, list(s.providers)),
            }
    with BoardConnection(board) as conn:
        _, uname, _ = conn.run(["uname", "-srm"])
        _, cpu, _ = conn.shell("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 || true", check=False)
        _, cores, _ = conn.run(["nproc"])
        code, py, _ = conn.run([board.python, "--version"], check=False)
        wd = conn.path(board.workdir)
        runtime = board_runtime(conn, wd)
        code_v, version, _ = conn.run(["cat", _paths(wd)["version"]], check=False)
        running = agent_running(conn, wd)
    info = {
        "board": name,
        "os": uname.strip(),
        "cpu": cpu.strip(),
        "cores": int(cores.strip() or 0),
        "python": py.strip() if code == 0 else f"missing ({board.python})",
        "onnxruntime": runtime.version or "not importable by the board's Python",
        "agent_installed": version.strip() if code_v == 0 else "no",
        "agent_running": running,
        **_units_report(board, list(runtime.providers)),
    }
    if running:
        from parapipe.deploy import agent_client

        with BoardConnection(board) as conn, agent_client(conn) as client:
            info["agent_ready"] = client.ready()
    return info


@app.command()
@fails_cleanly
def deploy(
    plan: Annotated[Path, typer.Argument(help="A plan JSON.")],
    board: Annotated[
        str | None, typer.Option("--board", help="A board of the inventory, or local (this machine).")
    ] = None,
    model: Annotated[
        Path | None, typer.Option("--model", help="The .onnx model (default: where it was planned).")
    ] = None,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics",
            help="Also serve Prometheus metrics: on 127.0.0.1 here (--board local), or on the board's "
            "loopback at its agent port + 1 (needs prometheus_client there; pip installs it if missing).",
        ),
    ] = False,
    group: Annotated[str | None, typer.Option("--group", help="Every board of this inventory group, at once.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Ship the agent and the plan's bundle to a board over SSH and start the pipeline there.

    --board local leaves an agent serving the plan on 127.0.0.1 (undeploy --board local stops it).
    --group NAME deploys to every board of the group concurrently, one row per board; the exit code
    is the number of boards that failed."""
    from parapipe.commands.serving import deploy_group, one_target

    if one_target(board, group) == "group":
        deploy_group(plan, str(group), model, metrics, as_json)
        return
    assert board is not None
    from parapipe.boards import get_board
    from parapipe.deploy import deploy as do_deploy
    from parapipe.reach import LOCAL_BOARDS
    from parapipe.run import build_bundle, resolve_model
    from planner.plan import load_plan

    if board in LOCAL_BOARDS:
        from parapipe.commands.serving import deploy_here

        deploy_here(plan, board, model, metrics, as_json)
        return
    the_board = get_board(board)
    the_plan = load_plan(plan)
    with err.status(f"deploying {the_plan.name or plan.stem} to {board}") as status:
        folder, _ = build_bundle(the_plan, resolve_model(the_plan, model))

        def progress(done: int, total: int) -> None:
            status.update(f"uploading {done / 2**20:.1f} / {total / 2**20:.1f} MiB")

        result = do_deploy(the_board, folder, progress, metrics=metrics)
    if as_json:
        print_json(result.__dict__)
        return
    out.print(
        f"deployed bundle {result.bundle_sha256[:12]}… to {board} ({result.workdir}): agent "
        f"{'installed' if result.wheel_uploaded else 'up to date'}, {'restarted' if result.agent_restarted else 'kept running'}, "
        f"{result.bundle_uploaded_bytes} bundle bytes uploaded; {SUPERVISION.get(result.supervisor, result.supervisor)}"
        + (
            f"; metrics at http://{result.metrics_address}/metrics on the board (its loopback: "
            f"ssh -L {result.metrics_address.rsplit(':', 1)[1]}:{result.metrics_address} to scrape it from here)"
            if result.metrics_address
            else ""
        ),
        highlight=False,
    )


SUPERVISION = {
    "systemd": "a systemd unit brings the agent back after a crash or a reboot",
    "cron": "a restart loop brings the agent back after a crash, an @reboot crontab line after a reboot",
    "none": "a restart loop brings the agent back after a crash; after a reboot the next deploy starts it "
    "(the board has neither systemd nor crontab)",
}


@app.command()
@fails_cleanly
def undeploy(
    board: Annotated[str | None, typer.Option("--board")] = None,
    group: Annotated[str | None, typer.Option("--group", help="Every board of this inventory group, at once.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Stop the agent on a board (or every board of --group) and remove what deploy put there, nothing else."""
    from parapipe.commands.serving import one_target, undeploy_group

    if one_target(board, group) == "group":
        undeploy_group(str(group), as_json)
        return
    assert board is not None
    from parapipe.boards import get_board
    from parapipe.deploy import undeploy as do_undeploy
    from parapipe.reach import LOCAL_BOARDS

    if board in LOCAL_BOARDS:
        from parapipe.local_deploy import undeploy_local

        removed = undeploy_local()
    else:
        removed = do_undeploy(get_board(board))
    if as_json:
        print_json({"board": board, "removed": removed})
        return
    out.print(f"removed {len(removed)} item(s) from {board}", highlight=False)
