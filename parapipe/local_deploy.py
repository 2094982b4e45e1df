"""``deploy PLAN --board local``: a plan served by an agent on this machine, left running on 127.0.0.1.

The agent runs detached from the command (its own session), with its workdir, log, pid file
and port files under ``$PARAPIPE_HOME/local-agent/``; ``agent.json`` there records what was
started. Deploying again reuses the running agent (restarting it only to turn metrics on or
off); ``undeploy --board local`` stops exactly that agent (pid, start time and command line
must all match) and removes the folder. A plan over several hosts is refused before it is compiled,
saying how to plan for one host or run it over its hosts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agents.client import AgentClient, AgentError
from agents.server import process_start_time
from models.files import atomic_write, locked
from parapipe.home import parapipe_home
from parapipe.local_agent import DeployError

if TYPE_CHECKING:
    from planner.plan import Plan

STARTUP_S = 60.0
STOP_S = 20.0


@dataclass(frozen=True)
class LocalDeployment:
    address: str
    metrics_address: str  # "" without --metrics
    pid: int
    workdir: str
    bundle_sha256: str
    bundle_uploaded_bytes: int
    agent_started: bool  # False: the running agent was reused


def _folder() -> Path:
    return parapipe_home() / "local-agent"


def _record_path() -> Path:
    return _folder() / "agent.json"


def _read_record() -> dict | None:
    try:
        return json.loads(_record_path().read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise DeployError(f"{_record_path()} is unreadable ({exc}); remove {_folder()} by hand") from None


def _ours(record: dict) -> bool:
    """Whether the recorded process is still the agent we started (a pid may be reused)."""
    pid = int(record.get("pid", 0))
    if pid <= 0 or process_start_time(pid) != record.get("start_time"):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"agents.server" in cmdline and str(_folder() / "work").encode() in cmdline


def _start(metrics: bool) -> dict:
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    port_file, metrics_file = folder / "port", folder / "metrics-port"
    for f in (port_file, metrics_file):
        f.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "agents.server", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--workdir", str(folder / "work"), "--port-file", str(port_file), "--pid-file", str(folder / "agent.pid")]
    if metrics:
        argv += ["--metrics-port", "0", "--metrics-port-file", str(metrics_file)]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(folder / "agent.log", "ab") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    deadline = time.monotonic() + STARTUP_S
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                process.kill()
            tail = (folder / "agent.log").read_text(errors="replace")[-800:]
            raise DeployError(f"the local agent did not start: {tail}")
        time.sleep(0.05)
    record = {
        "pid": process.pid,
        "start_time": process_start_time(process.pid),
        "address": f"127.0.0.1:{int(port_file.read_text())}",
        "metrics_address": f"127.0.0.1:{int(metrics_file.read_text())}" if metrics else "",
    }
    atomic_write(_record_path(), json.dumps(record) + "\n")
    return record


def _stop(record: dict) -> bool:
    """SIGTERM the recorded agent if it is still ours (it drains), SIGKILL after STOP_S; True if it ran."""
    if not _ours(record):
        return False
    pid = int(record["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_S
    while _ours(record) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _ours(record):
        os.kill(pid, signal.SIGKILL)
    return True


def several_hosts(what: str, hosts: list[str] | tuple[str, ...], device: str, plan: str = "PLAN") -> str:
    """Why a plan over several hosts is not deployed here, and what to do instead."""
    # the embedded boards of one host that need no runtime environment (local-openvino, local-gpu do)
    single = " or ".join(f"--device {b}" for b in ("local", "local-biglittle"))
    pairs = " ".join(f"--board {h}=BOARD" for h in hosts)
    return (
        f"{what} runs over hosts {', '.join(hosts)}; a deploy to this machine serves a plan of one host. "
        f"To serve the model here, plan it for one host ({single}) and deploy that plan. To run this plan over "
        f"its hosts, give each host its own agent: on this machine `parapipe run {plan} --board {device}`, "
        f"on boards `parapipe run {plan} {pairs}` (measured, then stopped)"
    )


def check_one_host(plan: Plan, path: Path) -> None:
    """Refuse (DeployError, before anything is compiled) a plan whose units sit on several hosts."""
    from device_profiles.loader import load_profile
    from planner.unitname import UnitName

    profile = load_profile(plan.device)
    hosts: list[str] = []
    for stage in plan.stages:
        for pu in stage.pus():
            for part in UnitName(pu).parts:
                host = profile.pu(part).host
                if host not in hosts:
                    hosts.append(host)
    if len(hosts) > 1:
        raise DeployError(several_hosts(f"plan {plan.name or path.stem!r}", hosts, plan.device, str(path)))


def deploy_local(bundle: Path, metrics: bool = False) -> LocalDeployment:
    """Serve ``bundle`` (one host's) from the local agent, starting it if needed."""
    from agents.bundle import MANIFEST, parse_manifest

    manifest = parse_manifest((Path(bundle) / MANIFEST).read_text())
    if manifest.hosts:
        raise DeployError(several_hosts(f"bundle {manifest.plan_name!r}", manifest.hosts, manifest.device))
    with locked(_record_path()):
        record = _read_record()
        started = False
        if record is None or not _ours(record) or bool(record.get("metrics_address")) != metrics:
            if record is not None:
                _stop(record)
            record = _start(metrics)
            started = True
        with AgentClient(record["address"], timeout=60) as client:
            try:
                client.wait_serving(STARTUP_S)
                reply = client.load_bundle(bundle)
                client.start(reply.bundle_sha256)
            except AgentError as exc:
                raise DeployError(f"the local agent at {record['address']} refused the plan: {exc}") from None
    return LocalDeployment(
        address=record["address"],
        metrics_address=record["metrics_address"],
        pid=int(record["pid"]),
        workdir=str(_folder() / "work"),
        bundle_sha256=reply.bundle_sha256,
        bundle_uploaded_bytes=reply.bytes_received,
        agent_started=started,
    )


def undeploy_local() -> list[str]:
    """Stop the local agent deploy started and remove its folder; what was removed (nothing if none)."""
    import shutil

    with locked(_record_path()):
        record = _read_record()
        if record is None:
            return []
        stopped = _stop(record)
        removed = [f"agent pid {record['pid']}"] if stopped else []
        removed.append(str(_folder()))
        shutil.rmtree(_folder(), ignore_errors=True)
    return removed


def local_deployment() -> dict | None:
    """The running local deployment's record (address, metrics_address, pid), or None."""
    record = _read_record()
    return record if record is not None and _ours(record) else None


__all__ = ["LocalDeployment", "check_one_host", "deploy_local", "local_deployment", "undeploy_local"]
