"""The agent's command line refuses what it cannot serve with exit code 2 and one line, never a traceback and
never a silent substitute; one workdir has one agent (a flock held for the agent's life)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from parapipe.local_agent import DeployError, LocalAgent

ROOT = Path(__file__).resolve().parents[2]


def _agent(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "agents.server", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--port", "70000"), "--port 70000: a port is 0 to 65535"),
        (("--port", "0", "--metrics-port", "70000"), "--metrics-port 70000: a port is 0 to 65535"),
        (("--port", "0", "--port-file", "/nonexistent-folder/port"), "the folder /nonexistent-folder does not exist"),
    ],
)
def test_bad_arguments_are_refused_before_serving(tmp_path, args, says) -> None:
    done = _agent(*args, "--workdir", str(tmp_path / "w"))
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_workdir_that_is_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    done = _agent("--port", "0", "--workdir", str(tmp_path / "file"))
    assert done.returncode == 2 and "is a file, not a folder" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("content", [b"\xff\xfe token", "t\u00f6ken".encode(), b"tok\x01en", b"  \n"])
def test_a_token_file_that_is_not_printable_ascii_is_refused(tmp_path, content: bytes) -> None:
    token = tmp_path / "token"
    token.write_bytes(content)
    done = _agent("--port", "0", "--workdir", str(tmp_path / "w"), "--token-file", str(token))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "token file" in done.stderr


@pytest.mark.agent
def test_a_second_agent_on_the_same_workdir_is_refused_and_the_first_serves_on(tmp_path) -> None:
    workdir = tmp_path / "work"
    with LocalAgent(workdir=workdir) as first:
        with pytest.raises(DeployError, match=r"another agent \(pid \d+\) serves workdir"):
            with LocalAgent(workdir=workdir):
                pass
        assert first.client.status().workdir == str(workdir)
    with LocalAgent(workdir=workdir) as again:  # the lock went with the first agent
        assert again.client.status().boots == 2


def test_host_side_commands_refuse_unreadable_inventory_and_token_files(tmp_path) -> None:
    from tests.support.cli import run_cli

    home = tmp_path / "home"
    home.mkdir()
    (home / "boards.toml").write_bytes(b"[boards.x]\nhost = '\xff\xfe'\n")
    listed = run_cli("boards", "list", home=home)
    assert listed.returncode == 2 and "not valid TOML" in listed.stderr and "Traceback" not in listed.stderr
    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe\x00binary")
    status = run_cli("agent", "status", "--address", "127.0.0.1:1", "--token-file", str(token), home=home)
    assert status.returncode == 2 and "not ASCII" in status.stderr and "Traceback" not in status.stderr
