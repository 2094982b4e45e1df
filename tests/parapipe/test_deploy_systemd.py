"""Deploy to a board that runs systemd, as a user would (``parapipe boards add``, ``deploy``, ``undeploy``):
the board is a real systemd, PID 1 of namespaces of its own on this machine, with its sshd as one of
its services (tests/support/systemd.py), so deploy's ``systemctl`` calls over SSH drive that systemd."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from parapipe.boards import Board
from parapipe.deploy import agent_client, agent_pid
from parapipe.ssh import BoardConnection
from tests.support.cli import run_cli
from tests.support.sshd import free_port
from tests.support.systemd import SystemdBoard, systemd_board, systemd_unavailable
from tests.support.tiny import eventually

GUARD_S = 60.0  # hang guard for what should take a second or two (a start, a restart, a boot)


@pytest.fixture(params=["root", "user"])
def board_host(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SystemdBoard]:
    """The board, logged into as root (deploy installs a system unit) or as a user of its own (a user unit)."""
    reason = systemd_unavailable(user=request.param == "user")
    if reason is not None:
        pytest.skip(reason)
    with systemd_board(tmp_path / "board", user="" if request.param == "root" else "board") as host:
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


def _serving(board: Board, bundle: str, boots: int) -> None:
    """The agent answers through deploy's tunnel, has resumed ``bundle`` by itself and says it started ``boots`` times."""
    with BoardConnection(board) as conn, agent_client(conn) as client:
        eventually("the agent serves its pipeline again", client.ready, GUARD_S)
        status = client.status()
        assert status.running_bundle == bundle and status.boots == boots
        assert status.resumed == (boots > 1)


def test_deploy_runs_the_agent_under_the_boards_systemd(board_host: SystemdBoard, tmp_path: Path) -> None:
    """Deploy finds systemd and installs, enables and starts a unit (no restart loop, no crontab line): a
    system unit as root; as another user a user unit, with lingering turned on so that it starts at boot.
    systemd restarts the agent after a SIGKILL and starts it at boot, and each time it resumes the
    deployed pipeline by itself; ``systemctl stop`` drains it (exit 0, not restarted); undeploy disables
    and removes the unit, stops the agent and turns lingering off again."""
    user = board_host.user
    home = tmp_path / "home"
    name_of_dir = "board dir; $(touch pwned) 'q' & x"  # quoted in the unit, run through sh
    if user:  # where the board's user may write: its home (/home/USER there, board_host.home here)
        workdir, here = f"/home/{user}/{name_of_dir}", board_host.home / name_of_dir
        units, on_board, wants = (
            board_host.home / ".config/systemd/user",
            f"/home/{user}/.config/systemd/user",
            "default",
        )
    else:
        workdir = str(tmp_path / name_of_dir)
        here, units, on_board, wants = Path(workdir), board_host.etc, "/etc/systemd/system", "multi-user"
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
        workdir=workdir,
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

    name = f"parapipe-agent-{hashlib.sha256(workdir.encode()).hexdigest()[:12]}.service"

    def show(*props: str) -> dict[str, str]:
        return board_host.show(name, *props, user=bool(user))

    recorded = json.loads((here / "agent.unit").read_text())
    scope = "user" if user else "system"
    assert recorded == {"scope": scope, "name": name, "path": f"{on_board}/{name}", "linger": bool(user)}
    assert (units / name).is_file() and not Path("/etc/systemd/system", name).exists()
    assert (units / f"{wants}.target.wants" / name).is_symlink()  # enabled: started at boot
    assert (board_host.state / "linger" / user).is_file() if user else not (board_host.state / "linger").exists()
    assert not (here / "agent.boot").exists() and not (here / "agent.supervisor.pid").exists()
    unit = show("ActiveState", "UnitFileState", "MainPID", "NRestarts")
    assert unit["ActiveState"] == "active" and unit["UnitFileState"] == "enabled" and unit["NRestarts"] == "0"
    with BoardConnection(board) as conn:
        first = agent_pid(conn, workdir)
    assert first is not None and str(first) == unit["MainPID"]  # the agent is the unit's main process
    _serving(board, result["bundle_sha256"], boots=1)

    board_host.run("kill", "-9", str(first))  # a crash, the OOM killer
    eventually("systemd restarts the killed agent", lambda: show("NRestarts").get("NRestarts") == "1", GUARD_S)
    _serving(board, result["bundle_sha256"], boots=2)
    with BoardConnection(board) as conn:
        second = agent_pid(conn, workdir)
    assert second not in (None, first) and str(second) == show("MainPID")["MainPID"]

    board_host.reboot()  # every process of the board killed at once, then systemd boots again
    eventually("the enabled unit starts at boot", lambda: show("ActiveState").get("ActiveState") == "active", GUARD_S)
    # before anyone logged in: for a user, lingering alone started their service manager and the unit
    assert board_host.run("loginctl", "list-sessions", "--no-legend", check=False).stdout.strip() == ""
    _serving(board, result["bundle_sha256"], boots=3)

    stopped = board_host.systemctl("stop", name, user=bool(user))
    assert stopped.returncode == 0
    after = show("ActiveState", "Result", "ExecMainCode", "ExecMainStatus", "NRestarts")
    assert after["ActiveState"] == "inactive" and after["Result"] == "success", after
    assert after["ExecMainCode"] == "1" and after["ExecMainStatus"] == "0", after  # CLD_EXITED with 0: drained
    assert after["NRestarts"] == "0"  # counted since this boot: a stop asked for is not restarted
    assert "agent stopped" in (here / "agent.log").read_text()
    board_host.systemctl("start", name, user=bool(user))
    _serving(board, result["bundle_sha256"], boots=4)

    removed = run_cli("undeploy", "--board", board.name, "--json", home=home)
    assert removed.returncode == 0, removed.stderr
    assert not (units / name).exists() and not (units / f"{wants}.target.wants" / name).exists()
    assert show("LoadState")["LoadState"] == "not-found"
    assert not (board_host.state / "linger" / (user or "root")).exists()  # off again: deploy turned it on
    assert board_host.run("pgrep", "-f", "agents.server", check=False).returncode == 1  # no agent left
    assert not here.exists() and not (here.parent / "pwned").exists()


def test_a_board_still_booting_runs_systemd_too(tmp_path: Path) -> None:
    """A board whose boot has not finished (a slow unit: ``systemctl is-system-running`` says starting)
    is still one that systemd runs: deploy chooses a unit there (``supervision``), not a restart loop and
    a crontab line."""
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


def test_a_user_who_may_not_linger_gets_the_restart_loop_and_an_at_reboot_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user unit starts at boot only for a user who lingers. Where the board does not let the user turn
    lingering on (here no polkit: logind refuses), deploy installs no unit a reboot would lose: the agent
    runs under the restart loop and an @reboot crontab line starts it at boot; undeploy removes that line."""
    import shutil

    from parapipe.deploy import deploy, undeploy
    from tests.support.tiny import write_tiny_bundle

    reason = systemd_unavailable(user=True)
    if reason is not None:
        pytest.skip(reason)
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    bundle = write_tiny_bundle(tmp_path / "bundle")
    with systemd_board(tmp_path / "board", user="board", polkit=False) as host:
        ssh = host.sshd
        board = Board(
            name="no-linger", host="127.0.0.1", port=ssh.port, user=ssh.user, key=str(ssh.user_key),
            device="local", known_hosts=str(ssh.known_hosts), python=sys.executable, workdir="/home/board/pp",
            agent_port=free_port(),
        )  # fmt: skip
        result = deploy(board, bundle)
        cron = shutil.which("crontab") is not None
        assert result.supervisor == ("cron" if cron else "none")
        here = host.home / "pp"
        assert (here / "agent.boot").is_file() and not (here / "agent.unit").exists()
        assert not list((host.home / ".config/systemd/user").glob("parapipe-agent-*"))
        assert not (host.state / "linger" / "board").exists()
        crontab = host.folder / "crontabs" / "board"
        if cron:
            assert [line for line in crontab.read_text().splitlines() if line.startswith("@reboot sh ")]
        _serving(board, result.bundle_sha256, boots=1)
        undeploy(board)
        assert not here.exists()
        assert not cron or "@reboot" not in crontab.read_text()
