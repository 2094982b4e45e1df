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


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 4 MiB tmpfs (a board's full SD card, made here): skipped where this process may not mount one."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(folder: Path) -> None:
    """Write until the disk is full."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


def test_a_full_disk_neither_stops_the_agent_nor_hides_why_an_upload_failed(small_disk: Path, tmp_path: Path) -> None:
    """On a full disk the agent crashed while counting its boot (ENOSPC traceback: its supervisor restarted it for
    ever), and an upload that filled the disk said only INTERNAL (OSError). Now it starts and serves, and the upload
    is RESOURCE_EXHAUSTED saying the disk is full, with nothing of it left behind."""
    import grpc

    from agents.client import AgentError
    from tests.support.tiny import write_tiny_bundle

    workdir = small_disk / "work"
    (workdir / "bundles").mkdir(parents=True)
    (workdir / "boots").write_text("3\n")
    _fill(small_disk)
    bundle = write_tiny_bundle(tmp_path / "bundle")
    with LocalAgent(workdir=workdir) as agent:
        assert agent.client.status().boots == 4  # counted, though not written down
        with pytest.raises(AgentError) as info:
            agent.client.load_bundle(bundle)
        assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "disk is full" in str(info.value)
        assert not [p for p in (workdir / "bundles").iterdir() if p.name.startswith(".")], "no partial upload left"
        (small_disk / "filler").unlink()  # space again: the same upload goes through
        assert agent.client.load_bundle(bundle).bytes_received > 0
        assert "Traceback" not in agent.log_path.read_text()
