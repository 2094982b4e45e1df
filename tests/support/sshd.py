"""A real OpenSSH server on 127.0.0.1 for deploy tests: its own config, keys and pidfile in a temp dir."""

from __future__ import annotations

import dataclasses
import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Sshd:
    port: int
    host_key: Path
    user_key: Path
    known_hosts: Path
    pid: int
    log: Path
    user: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A free port whose next one is free too: an agent deployed with --metrics serves them on the next."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two consecutive free ports on 127.0.0.1")


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def sshd_binary() -> str:
    """The sshd to run, or a skip saying why none can run here."""
    binary = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(binary).exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    if os.geteuid() != 0:
        pytest.skip("sshd with privilege separation needs root here")
    return binary


def configure_sshd(
    folder: Path, user: str = "", authorized_keys: str = "", pam: bool = False, home: Path | None = None
) -> tuple[Sshd, Path]:
    """Keys, ``authorized_keys`` and an ``sshd_config`` for an sshd on a free port of 127.0.0.1 (not started:
    ``pid`` is 0), and the config's path. ``user``: the one account it lets in (default: this one);
    ``authorized_keys``: where it reads that account's keys (default: ``folder/authorized_keys``);
    ``pam``: sessions go through PAM (as on a board, where pam_systemd gives them a login session);
    ``home``: the $HOME of its sessions (created empty; default: the account's own, from passwd)."""
    folder.mkdir(parents=True, exist_ok=True)
    if home is not None:
        home.mkdir(parents=True, exist_ok=True)
    keygen(folder / "host_key")
    keygen(folder / "user_key")
    shutil.copy(folder / "user_key.pub", folder / "authorized_keys")
    port = free_port()
    user = user or getpass.getuser()
    config = folder / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {folder / 'host_key'}",
                f"PidFile {folder / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized_keys or folder / 'authorized_keys'}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                f"UsePAM {'yes' if pam else 'no'}",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                f"AllowUsers {user}",
                "Subsystem sftp internal-sftp",
                "LogLevel VERBOSE",
                *([f'SetEnv "HOME={home}"'] if home is not None else []),
                "",
            ]
        )
    )
    key_line = (folder / "host_key.pub").read_text().split()
    (folder / "known_hosts").write_text(f"[127.0.0.1]:{port} {key_line[0]} {key_line[1]}\n")
    info = Sshd(port, folder / "host_key", folder / "user_key", folder / "known_hosts", 0, folder / "sshd.log", user)
    return info, config


def wait_listening(port: int, alive: Callable[[], bool], log: Path, timeout: float = 15) -> None:
    """Until something accepts on 127.0.0.1:``port``; fails with the log if ``alive`` turns false or on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if not alive() or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {log.read_text() if log.exists() else ''}") from None
            time.sleep(0.1)


def start_sshd(folder: Path) -> tuple[Sshd, subprocess.Popen]:
    """An sshd letting this account in, its sessions with a fresh, empty $HOME (``folder/home``), as on a
    newly set-up board: the account's real home may hold shell startup files that are this machine's, not
    a board's (root's ~/.bashrc here runs ``pyenv init``, which made every command over SSH 0.45 s instead
    of 0.05 s; bash reads ~/.bashrc for every command sshd runs)."""
    binary = sshd_binary()
    info, config = configure_sshd(folder, home=folder / "home")
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen([binary, "-D", "-f", str(config), "-E", str(info.log)])
    wait_listening(info.port, lambda: proc.poll() is None, info.log)
    return dataclasses.replace(info, pid=proc.pid), proc


def stop_sshd(proc: subprocess.Popen) -> None:
    proc.terminate()  # only this sshd, by its own pid
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
