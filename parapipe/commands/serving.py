"""``deploy PLAN --board local``: the plan served on this machine (see ``parapipe.local_deploy``)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import typer
from rich.table import Table

from parapipe.app import err, out, print_json
from parapipe.local_agent import DeployError


def deploy_here(plan: Path, board: str, model: Path | None, metrics: bool, as_json: bool) -> None:
    from parapipe.local_deploy import check_one_host, deploy_local
    from parapipe.reach import LOCAL_BOARDS
    from parapipe.run import build_bundle, resolve_model
    from planner.plan import load_plan

    the_plan = load_plan(plan)
    if the_plan.device not in LOCAL_BOARDS:
        raise DeployError(
            f"{plan} was planned for {the_plan.device}, not this machine; plan with --device local "
            f"(or {', '.join(sorted(b for b in LOCAL_BOARDS if b != 'local'))}) to deploy it to --board {board}"
        )
    check_one_host(the_plan, plan)
    with err.status(f"deploying {the_plan.name or plan.stem} to this machine"):
        folder, _ = build_bundle(the_plan, resolve_model(the_plan, model))
        result = deploy_local(folder, metrics)
    if as_json:
        print_json(asdict(result))
        return
    out.print(
        f"serving {the_plan.name or plan.stem} (bundle {result.bundle_sha256[:12]}…) at {result.address}"
        + (f", metrics at http://{result.metrics_address}/metrics" if result.metrics_address else "")
        + f"; agent pid {result.pid} {'started' if result.agent_started else 'reused'}; "
        f"stop it with `parapipe undeploy --board {board}`",
        highlight=False,
    )


def one_target(board: str | None, group: str | None) -> str:
    """ "board" or "group": exactly one of --board and --group."""
    if (board is None) == (group is None):
        raise DeployError("give either --board NAME or --group NAME (one of them)")
    return "board" if board is not None else "group"


def _report(what: str, outcomes, as_json: bool) -> None:
    """One row per board, then exit with the number of boards that failed."""
    from parapipe.fleet import exit_code

    if as_json:
        print_json(
            [
                {
                    "board": o.board,
                    "ok": o.ok,
                    "detail": o.detail,
                    **({"info": o.result} if isinstance(o.result, dict) else {}),
                }
                for o in outcomes
            ]
        )
    else:
        table = Table("board", what, "detail")
        for o in outcomes:
            table.add_row(o.board, "ok" if o.ok else "[bold red]failed[/]", o.detail)
        out.print(table)
        failed = sum(not o.ok for o in outcomes)
        out.print(f"{len(outcomes) - failed} of {len(outcomes)} board(s) {what}, {failed} failed", highlight=False)
    code = exit_code(outcomes)
    if code:
        raise typer.Exit(code)


def deploy_group(plan: Path, group: str, model: Path | None, metrics: bool, as_json: bool) -> None:
    from parapipe.deploy import deploy
    from parapipe.fleet import group_boards, on_group
    from parapipe.run import build_bundle, resolve_model
    from planner.plan import load_plan

    group_boards(group)  # a group with no boards is a user error before anything is built
    the_plan = load_plan(plan)
    with err.status(f"deploying {the_plan.name or plan.stem} to group {group}"):
        folder, _ = build_bundle(the_plan, resolve_model(the_plan, model))
        outcomes = on_group(
            group,
            lambda board: deploy(board, folder, metrics=metrics),
            lambda r: (
                f"bundle {r.bundle_sha256[:12]}…, agent {'restarted' if r.agent_restarted else 'kept running'}"
                + (f", metrics on the board at {r.metrics_address}" if r.metrics_address else "")
            ),
        )
    _report("deployed", outcomes, as_json)


def undeploy_group(group: str, as_json: bool) -> None:
    from parapipe.deploy import undeploy
    from parapipe.fleet import on_group

    with err.status(f"undeploying group {group}"):
        outcomes = on_group(group, undeploy, lambda removed: f"removed {len(removed)} item(s)")
    _report("undeployed", outcomes, as_json)


def check_group(group: str, board_info, as_json: bool) -> None:
    from parapipe.fleet import on_group

    def describe(info: dict) -> str:
        agent = "ready" if info.get("agent_ready") else "running" if info.get("agent_running") else "not running"
        return f"{info.get('os') or info.get('hostname', '')}, python {info.get('python', '?')}, agent {agent}"

    with err.status(f"checking group {group}"):
        outcomes = on_group(group, board_info, describe)
    _report("checked", outcomes, as_json)


def run_group(plan, group: str, model: Path | None, frames: int, verify: bool, input_data, as_json: bool) -> None:
    """``run --group``: the plan measured on every board of the group at once (a failed --verify fails that board)."""
    from parapipe.fleet import group_boards, on_group
    from parapipe.run import build_bundles, resolve_model, run_plan

    group_boards(group)
    with err.status(f"running {plan.name} on group {group}"):
        build_bundles(plan, resolve_model(plan, model, input_data))  # once, before the boards share the cache

        def one(board):
            result = run_plan(plan, board.name, model, frames, verify, input_data=input_data)
            if result.verified is False and result.accuracy is not None:
                a = result.accuracy
                raise DeployError(
                    f"outputs vs the full fp32 model: {a['metric']} loss {a['loss']:.4g} exceeds the plan's budget "
                    f"{a['budget']:g}"
                )
            if result.verified is False:
                raise DeployError(
                    f"outputs differ from the full model's: max abs diff {result.max_abs_diff:.2e} "
                    f"(output scale {result.output_scale or 0:.3g})"
                )
            return result.to_json()

        def describe(r: dict) -> str:
            m = r["measured"]
            text = f"latency {m['latency_ms']:.2f} ms, {m['throughput_fps']:.1f} fps"
            return text + (", outputs verified" if r.get("verified") else "")

        outcomes = on_group(group, one, describe)
    _report("ran", outcomes, as_json)
