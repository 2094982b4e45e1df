"""``deploy PLAN --board local``: the plan served on this machine (see ``parapipe.local_deploy``)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from parapipe.app import err, out, print_json
from parapipe.local_agent import DeployError


def deploy_here(plan: Path, board: str, model: Path | None, metrics: bool, as_json: bool) -> None:
    from parapipe.local_deploy import deploy_local
    from parapipe.reach import LOCAL_BOARDS
    from parapipe.run import build_bundle, resolve_model
    from planner.plan import load_plan

    the_plan = load_plan(plan)
    if the_plan.device not in LOCAL_BOARDS:
        raise DeployError(
            f"{plan} was planned for {the_plan.device}, not this machine; plan with --device local "
            f"(or {', '.join(sorted(b for b in LOCAL_BOARDS if b != 'local'))}) to deploy it to --board {board}"
        )
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
