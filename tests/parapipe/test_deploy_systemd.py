"""Deploy to a board that runs systemd, as a user would (``parapipe boards add``, ``deploy``, ``undeploy``):
the board is a real systemd, PID 1 of namespaces of its own on this machine, with its sshd as one of
its services (tests/support/systemd.py), so deploy's ``systemctl`` calls over SSH drive that systemd."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from parapipe.boards import Board
from parapipe.deploy import agent_client, agent_pid
from parapipe.ssh import BoardConnection
from tests.support.cli import run_cli
from tests.support.sshd import free_port
from tests.support.systemd import SystemdBoard, systemd_board, systemd_unavailable

GUARD_S = 60.0  # hang guard for what should take a second or two


@pytest.fixture
def board_host(tmp_path: Path) -> Iterator[SystemdBoard]:
    reason = systemd_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with systemd_board(tmp_path / "board") as host:
        yield host


def _plan(folder: Path) -> Path:
    """A one-stage plan of a small model for this machine's profile, as a plan file naming its model."""
    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from planner.baselines import flop_pipeline
    from tests.support.serving import write_model

    model = write_model(folder / "serving.onnx")
    loaded = load_onnx(model)
    blocks = coarsen(build_graph(loaded.proto, loaded.sha256, "serving"), "coarse")
    plan = flop_pipeline(blocks, load_profile("local"), [("cpu", 1)], name="serving")
    path = folder / "serving.json"
    path.write_text(json.dumps(dict(plan.to_json(), model_path=str(model))))
    return path


def _until(what: str, check, timeout: float = GUARD_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def _serving(board: Board, bundle: str, boots: int) -> None:
    """The agent answers through deploy's tunnel, has resumed ``bundle`` by itself and says it started ``boots`` times."""
    with BoardConnection(board) as conn, agent_client(conn) as client:
        _until("the agent serves its pipeline again", client.ready)
        status = client.status()
        assert status.running_bundle == bundle and status.boots == boots
        assert status.resumed == (boots > 1)


def test_deploy_runs_the_agent_under_the_boards_systemd(board_host: SystemdBoard, tmp_path: Path) -> None:
    """Deploy finds systemd and installs, enables and starts a system unit (no restart loop, no crontab
    line); systemd restarts the agent after a SIGKILL and starts it at boot, and each time it resumes
    the deployed pipeline by itself; ``systemctl stop`` drains it (exit 0, not restarted); undeploy
    disables and removes the unit and stops the agent."""
    home = tmp_path / "home"
    workdir = tmp_path / "board dir; $(touch pwned) 'q' & x"  # quoted in the unit, run through sh
    ssh = board_host.sshd
    board = Board(
        name="sd",
        host="127.0.0.1",
        port=ssh.port,
        user=ssh.user,
        key=str(ssh.user_key),
        device="local",
        known_hosts=str(ssh.known_hosts),
        python=sys.executable,
        workdir=str(workdir),
        agent_port=free_port(),
    )
    added = run_cli(
        "boards", "add", board.name, "--host", board.host, "--port", str(board.port), "--user", board.user,
        "--key", board.key, "--known-hosts", board.known_hosts, "--device", "local", "--python", board.python,
        "--workdir", board.workdir, "--agent-port", str(board.agent_port), home=home,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    deployed = run_cli("deploy", str(_plan(tmp_path)), "--board", board.name, "--json", home=home)
    assert deployed.returncode == 0, deployed.stderr + board_host.run("systemctl", "--failed", check=False).stdout
    result = json.loads(deployed.stdout)
    assert result["supervisor"] == "systemd" and result["agent_restarted"]

    name = f"parapipe-agent-{hashlib.sha256(str(workdir).encode()).hexdigest()[:12]}.service"
    recorded = json.loads((workdir / "agent.unit").read_text())
    assert recorded == {"scope": "system", "name": name, "path": f"/etc/systemd/system/{name}", "linger": False}
    assert (board_host.etc / name).is_file() and not Path("/etc/systemd/system", name).exists()
    assert (board_host.etc / "multi-user.target.wants" / name).is_symlink()  # enabled: started at boot
    assert not (workdir / "agent.boot").exists() and not (workdir / "agent.supervisor.pid").exists()
    unit = board_host.show(name, "ActiveState", "UnitFileState", "MainPID", "NRestarts")
    assert unit["ActiveState"] == "active" and unit["UnitFileState"] == "enabled" and unit["NRestarts"] == "0"
    with BoardConnection(board) as conn:
        first = agent_pid(conn, str(workdir))
    assert first is not None and str(first) == unit["MainPID"]  # the agent is the unit's main process
    _serving(board, result["bundle_sha256"], boots=1)

    board_host.run("kill", "-9", str(first))  # a crash, the OOM killer
    _until("systemd restarts the killed agent", lambda: board_host.show(name, "NRestarts")["NRestarts"] == "1")
    _serving(board, result["bundle_sha256"], boots=2)
    with BoardConnection(board) as conn:
        second = agent_pid(conn, str(workdir))
    assert second not in (None, first) and str(second) == board_host.show(name, "MainPID")["MainPID"]

    board_host.reboot()  # every process of the board killed at once, then systemd boots again
    assert board_host.show(name, "ActiveState")["ActiveState"] in ("active", "activating")
    _serving(board, result["bundle_sha256"], boots=3)

    stopped = board_host.run("systemctl", "stop", name)
    assert stopped.returncode == 0
    after = board_host.show(name, "ActiveState", "Result", "ExecMainCode", "ExecMainStatus", "NRestarts")
    assert after["ActiveState"] == "inactive" and after["Result"] == "success", after
    assert after["ExecMainCode"] == "1" and after["ExecMainStatus"] == "0", after  # CLD_EXITED with 0: drained
    assert after["NRestarts"] == "0"  # counted since this boot: a stop asked for is not restarted
    assert "agent stopped" in (workdir / "agent.log").read_text()
    board_host.run("systemctl", "start", name)
    _serving(board, result["bundle_sha256"], boots=4)

    removed = run_cli("undeploy", "--board", board.name, "--json", home=home)
    assert removed.returncode == 0, removed.stderr
    assert not (board_host.etc / name).exists() and not (board_host.etc / "multi-user.target.wants" / name).exists()
    assert board_host.show(name, "LoadState")["LoadState"] == "not-found"
    assert board_host.run("pgrep", "-f", "agents.server", check=False).returncode == 1  # no agent left
    assert not workdir.exists() and not (tmp_path / "pwned").exists()


def test_a_board_still_booting_runs_systemd_too(tmp_path: Path) -> None:
    """A board whose boot has not finished (a slow unit: ``systemctl is-system-running`` says starting)
    is still one that systemd runs: deploy installs its unit there, not a restart loop and a crontab line."""
    from parapipe.deploy import supervision

    reason = systemd_unavailable()
    if reason is not None:
        pytest.skip(reason)
    slow = "[Unit]\nDescription=a unit that takes long at boot\n\n[Service]\nType=oneshot\nExecStart=/bin/sleep 600\n"
    with systemd_board(tmp_path / "board", units={"slow-at-boot.service": slow}, settled=False) as host:
        assert host.run("systemctl", "is-system-running", check=False).stdout.strip() == "starting"
        ssh = host.sshd
        board = Board(
            name="booting", host="127.0.0.1", port=ssh.port, user=ssh.user, key=str(ssh.user_key),
            device="local", known_hosts=str(ssh.known_hosts), python=sys.executable, workdir=str(tmp_path / "wd"),
        )  # fmt: skip
        with BoardConnection(board) as conn:
            assert supervision(conn) == "systemd-system"
