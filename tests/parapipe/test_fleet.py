"""Fleets: ``deploy/undeploy --group`` on three boards behind three real sshd processes on loopback,
one of them broken: the other two are deployed and keep serving, the broken one is reported, and
the exit code says how many failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

import parapipe
from parapipe.boards import Board, add_board
from parapipe.deploy import agent_client
from parapipe.ssh import BoardConnection
from tests.support.cli import PARAPIPE
from tests.support.serving import write_model
from tests.support.sshd import free_port, start_sshd, stop_sshd

# this machine is the board: one test at a time edits its crontab (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("this_machines_crontab")


def _cli(work: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PARAPIPE, *args], capture_output=True, text=True, env=env, cwd=work, timeout=900)


def test_group_deploy_with_one_broken_board(tmp_path: Path, monkeypatch) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("PARAPIPE_HOME", str(home))
    env = {**os.environ, "PARAPIPE_HOME": str(home)}
    model = write_model(work / "model.onnx")
    done = _cli(
        work, env, "plan", str(model), "--device", "local", "--objective", "latency", "--time-limit", "2", "--json"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    planned = json.loads(done.stdout)
    plan = Path(planned["folder"]) / f"{planned['plans'][0]['plan']}.json"
    plan = plan if plan.is_absolute() else work / plan
    with ExitStack() as stack:
        boards = []
        for i in range(3):
            info, proc = start_sshd(tmp_path / f"sshd{i}")
            stack.callback(stop_sshd, proc)
            board = Board(
                name=f"edge-{i}",
                host="127.0.0.1",
                port=info.port,
                user=info.user,
                key=str(info.user_key),
                device="local",
                known_hosts=str(info.known_hosts),
                # edge-2 is broken: its Python does not exist, so the agent cannot be installed
                python=sys.executable if i < 2 else "/nonexistent/python3",
                workdir=str(tmp_path / f"board{i}"),
                agent_port=free_port(),
                group="line-1",
            )
            add_board(board)
            boards.append(board)
        add_board(Board(**{**boards[0].__dict__, "name": "elsewhere", "group": "line-2"}))  # another group
        stack.callback(_cli, work, env, "undeploy", "--group", "line-1")  # whatever happens, stop the agents

        deployed = _cli(work, env, "deploy", str(plan), "--group", "line-1", "--json")
        assert deployed.returncode == 1, deployed.stdout + deployed.stderr  # one board failed
        rows = {r["board"]: r for r in json.loads(deployed.stdout)}
        assert set(rows) == {"edge-0", "edge-1", "edge-2"}  # one row per board of the group, no other
        assert rows["edge-0"]["ok"] and rows["edge-1"]["ok"] and not rows["edge-2"]["ok"]
        assert "nonexistent" in rows["edge-2"]["detail"]
        frame = {"x": np.ones((1, 16), np.float32), "ids": np.array([1], np.int64)}
        for board in boards[:2]:  # the two keep serving the plan
            with BoardConnection(board) as conn, agent_client(conn) as client:
                assert client.ready()
                assert set(client.infer(frame)) == {"out:a", "scores", "label"}
        with parapipe.connect("edge-1") as app:  # an application, by board name, through the SSH tunnel
            assert set(app.infer(frame)) == {"out:a", "scores", "label"}

        ran = _cli(work, env, "run", str(plan), "--group", "line-1", "--frames", "5", "--verify", "--json")
        assert ran.returncode == 1, ran.stdout + ran.stderr
        runs = {r["board"]: r for r in json.loads(ran.stdout)}
        assert runs["edge-0"]["ok"] and runs["edge-1"]["ok"] and not runs["edge-2"]["ok"]
        assert runs["edge-0"]["info"]["verified"] and runs["edge-0"]["info"]["measured"]["throughput_fps"] > 0

        checked = _cli(work, env, "boards", "check", "--group", "line-1", "--json")
        assert checked.returncode == 0, checked.stderr  # every board answered (the broken one says what it lacks)
        info = {r["board"]: r["info"] for r in json.loads(checked.stdout)}
        assert info["edge-0"]["agent_ready"] and info["edge-1"]["agent_ready"]
        assert not info["edge-2"]["agent_running"] and "missing" in info["edge-2"]["python"]

        table = _cli(work, env, "undeploy", "--group", "line-1")
        assert "edge-0" in table.stdout and "edge-2" in table.stdout
        for board in boards[:2]:
            assert not (Path(board.workdir) / "agent.pid").exists()
        missing = _cli(work, env, "deploy", str(plan), "--group", "nobody")
        assert missing.returncode == 2 and "line-1" in missing.stderr and "Traceback" not in missing.stderr
        both = _cli(work, env, "deploy", str(plan), "--group", "line-1", "--board", "edge-0")
        assert both.returncode == 2 and "either --board" in both.stderr
