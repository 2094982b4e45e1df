"""Deploy a plan to a board over SSH, run it there, and take it away again.

``deploy``: one deploy per board at a time (a lock on the host and one on the board);
the board-side wheel is installed into a venv on the board only when its content hash
changed; the agent is started detached (pidfile, log in the working directory) or kept
if it runs the current code; the bundle goes up through the agent (temporary folder,
sha256 checked, renamed into place) unless the agent has it; then the pipeline starts
and the hashes are confirmed. Everything deploy creates is listed in
``<workdir>/.parapipe-deployed.json`` so ``undeploy`` removes exactly that.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agents.client import AgentClient, AgentError
from parapipe.agent_wheel import build_wheel
from parapipe.boards import Board
from parapipe.home import parapipe_home
from parapipe.local_agent import DeployError
from parapipe.ssh import BoardConnection

RECORD = ".parapipe-deployed.json"
DEPS_CHECK = "import onnxruntime, grpc, numpy, psutil"


@dataclass(frozen=True)
class DeployResult:
    board: str
    bundle_sha256: str
    wheel_uploaded: bool
    bundle_uploaded_bytes: int
    agent_restarted: bool
    workdir: str


@contextlib.contextmanager
def host_lock(board: Board) -> Iterator[None]:
    path = parapipe_home() / "locks" / f"{board.name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DeployError(
                f"another deploy to board {board.name!r} is running (lock {path}); wait for it to finish"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def board_lock(conn: BoardConnection, wd: str) -> Iterator[None]:
    lock = f"{wd}/.deploy.lock"
    code, _, _ = conn.run(["mkdir", lock], check=False)
    if code != 0:
        raise DeployError(
            f"board {conn.board.name} is locked by another deploy ({lock} exists); if no deploy is running, remove it"
        )
    try:
        yield
    finally:
        conn.run(["rm", "-rf", lock], check=False)


def _paths(wd: str) -> dict[str, str]:
    return {
        "venv": f"{wd}/venv",
        "agent_dir": f"{wd}/agent",
        "pid": f"{wd}/agent.pid",
        "port": f"{wd}/agent.port",
        "log": f"{wd}/agent.log",
        "version": f"{wd}/agent.version",
    }


def _record(conn: BoardConnection, wd: str, extra: list[str]) -> None:
    code, out, _ = conn.run(["cat", f"{wd}/{RECORD}"], check=False)
    entries = set(json.loads(out)) if code == 0 and out.strip() else set()
    entries.update(extra)
    conn.run(["sh", "-c", f"cat > {shlex.quote(wd + '/' + RECORD)}"], stdin=json.dumps(sorted(entries)).encode())


def ensure_agent_installed(conn: BoardConnection, wd: str, progress=None) -> bool:
    """Install the board-side wheel into ``<wd>/venv`` unless the same version is there; True if it uploaded."""
    name, data = build_wheel()
    p = _paths(wd)
    code, out, _ = conn.run(["cat", p["version"]], check=False)
    if code == 0 and out.strip() == name:
        return False
    py = conn.board.python
    conn.run([py, "-m", "venv", "--system-site-packages", p["venv"]], timeout=300)
    vpy = f"{p['venv']}/bin/python"
    code, _, _ = conn.run([vpy, "-c", DEPS_CHECK], check=False)
    if code != 0:
        # The board's Python may have the runtime packages where a venv does not see them (itself a venv):
        # reuse them through a .pth file; otherwise install them from the package index.
        probe = (
            "import json, sys; " + DEPS_CHECK + "; print(json.dumps([p for p in sys.path if p.endswith('-packages')]))"
        )
        code, out, _ = conn.run([py, "-c", probe], check=False)
        if code == 0:
            _, site, _ = conn.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
            pth = f"{site.strip()}/parapipe-board-python.pth"
            conn.run(["sh", "-c", f"cat > {shlex.quote(pth)}"], stdin=("\n".join(json.loads(out)) + "\n").encode())
        else:
            conn.run([vpy, "-m", "pip", "install", "--quiet", "onnxruntime", "grpcio", "numpy", "psutil"], timeout=1800)
    remote_wheel = f"{wd}/{name}"
    conn.upload(data, remote_wheel, progress)
    # pip reads "path; marker" in a requirement, so install by a relative path from inside the workdir
    pip = shlex.join(
        [vpy, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", "--no-index", f"./{name}"]
    )
    conn.shell(f"cd {shlex.quote(wd)} && {pip}", timeout=300)
    conn.run(["rm", "-f", remote_wheel])
    conn.run(["sh", "-c", f"printf %s {shlex.quote(name)} > {shlex.quote(p['version'])}"])
    return True


def agent_running(conn: BoardConnection, wd: str) -> bool:
    p = _paths(wd)
    script = f'test -f {shlex.quote(p["pid"])} && kill -0 "$(cat {shlex.quote(p["pid"])})" 2>/dev/null'
    return conn.shell(script, check=False)[0] == 0


def stop_agent(conn: BoardConnection, wd: str) -> bool:
    p = _paths(wd)
    if not agent_running(conn, wd):
        return False
    pid = shlex.quote(p["pid"])
    conn.shell(
        f'kill "$(cat {pid})"; for i in $(seq 50); do kill -0 "$(cat {pid})" 2>/dev/null || exit 0; sleep 0.1; done; kill -9 "$(cat {pid})"',
        check=False,
    )
    conn.run(["rm", "-f", p["pid"]], check=False)
    return True


def start_agent(conn: BoardConnection, wd: str) -> None:
    p = _paths(wd)
    q = shlex.quote
    conn.run(["rm", "-f", p["port"]], check=False)
    command = (
        f"cd {q(wd)} || exit 1; setsid nohup {q(p['venv'] + '/bin/python')} -m agents.server --host 127.0.0.1 "
        f"--port {int(conn.board.agent_port)} --workdir {q(p['agent_dir'])} --pid-file {q(p['pid'])} "
        f"--port-file {q(p['port'])} > {q(p['log'])} 2>&1 < /dev/null & exit 0"
    )
    conn.shell(command)
    deadline = time.monotonic() + 60
    while conn.run(["test", "-f", p["port"]], check=False)[0] != 0:
        if time.monotonic() > deadline:
            _, log, _ = conn.run(["tail", "-n", "20", p["log"]], check=False)
            raise DeployError(f"the agent on {conn.board.name} did not start; its log ends:\n{log}")
        time.sleep(0.2)


@contextlib.contextmanager
def agent_client(conn: BoardConnection) -> Iterator[AgentClient]:
    with conn.forward(conn.board.agent_port) as fwd, AgentClient(f"127.0.0.1:{fwd.port}", timeout=60) as client:
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.health() == "SERVING":
                    break
            except AgentError:
                pass
            if time.monotonic() > deadline:
                raise DeployError(f"the agent on {conn.board.name} never answered SERVING through the SSH tunnel")
            time.sleep(0.2)
        yield client


def ensure_agent(board: Board, progress=None) -> bool:
    """Install and start the agent on a board if needed (no bundle); True if it was (re)started."""
    with host_lock(board), BoardConnection(board) as conn:
        wd = conn.path(board.workdir)
        conn.run(["mkdir", "-p", wd])
        with board_lock(conn, wd):
            _record(conn, wd, [*(_paths(wd).values())])
            uploaded = ensure_agent_installed(conn, wd, progress)
            if uploaded or not agent_running(conn, wd):
                stop_agent(conn, wd)
                start_agent(conn, wd)
                return True
    return False


def deploy(board: Board, bundle: Path, progress=None) -> DeployResult:
    with host_lock(board), BoardConnection(board) as conn:
        wd = conn.path(board.workdir)
        conn.run(["mkdir", "-p", wd])
        with board_lock(conn, wd):
            _record(conn, wd, [*(_paths(wd).values())])
            uploaded = ensure_agent_installed(conn, wd, progress)
            restarted = False
            if uploaded or not agent_running(conn, wd):
                stop_agent(conn, wd)
                start_agent(conn, wd)
                restarted = True
            with agent_client(conn) as client:
                reply = client.load_bundle(bundle, progress)
                client.start(reply.bundle_sha256)
                status = client.status()
                if status.running_bundle != reply.bundle_sha256:
                    raise DeployError(
                        f"the agent runs bundle {status.running_bundle[:12]}…, not {reply.bundle_sha256[:12]}…"
                    )
        return DeployResult(board.name, reply.bundle_sha256, uploaded, reply.bytes_received, restarted, wd)


def undeploy(board: Board) -> list[str]:
    """Stop the agent and remove what deploy created, nothing else."""
    with host_lock(board), BoardConnection(board) as conn:
        wd = conn.path(board.workdir)
        stop_agent(conn, wd)
        code, out, _ = conn.run(["cat", f"{wd}/{RECORD}"], check=False)
        entries = json.loads(out) if code == 0 and out.strip() else []
        removed = [e for e in entries if e.startswith(wd + "/")]
        if removed:
            conn.run(["rm", "-rf", "--", *removed])
        conn.run(["rm", "-f", f"{wd}/{RECORD}"], check=False)
        conn.run(["rmdir", wd], check=False)  # only if deploy left it empty
        return removed
