"""A board that runs systemd, on this machine: a real systemd as PID 1 of its own PID, mount, UTS and
cgroup namespaces, with the board's sshd as one of its services, so that what deploy runs over SSH
(``systemctl``, the agent it starts) talks to that systemd. The host's PID 1 is never involved.

Inside the namespaces, as a container manager would set them up (systemd's "Container Interface"):
``$container`` is set, ``/run`` is a fresh tmpfs, ``/sys`` and ``/proc/sys`` are read-only,
``/sys/fs/cgroup`` is a cgroup2 mount whose root is a cgroup of its own (its cgroup namespace), and
``/dev/console`` is a file (``console.log``), so nothing of the board reaches this machine's console.
The board's own folders, which outlive a reboot as a board's disk does, stand for
``/etc/systemd/system`` (``etc``: the units deploy installs and enables go there, never to this
machine's), ``/var/lib/systemd`` (``state``: lingering users) and the crontabs (``crontabs``); root's
home is an empty tmpfs (this machine's shell start-up files stay out), where only this machine's
Python is mounted if it lives there (mode 700 here), so that the board's users can run it.
systemd loads units from ``etc`` and ``units`` only (``$SYSTEMD_UNIT_PATH``): a ``multi-user.target``
that pulls in the board's sshd and whatever deploy enabled, and the few targets services go through;
this machine's own units (its sshd, cron, ``systemd-tmpfiles``, which would empty the shared /tmp at
boot) are never started. The rest of the file system, and the network, are the host's (so the sshd
listens on 127.0.0.1).

With ``user``, the board has an account of its own that the sshd lets in through PAM (``accounts``
stand for ``/etc/passwd``, ``group`` and ``shadow``, ``home`` for ``/home``), and runs D-Bus, logind
and polkit (this machine's units), so that a login gets a session and the user a service manager
(``user@UID.service``) as on a board.

``reboot`` kills every process of the namespaces at once (the power goes) and boots again from the
same folders. Whatever happens, leaving the context kills them all and removes the cgroup.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.sshd import Sshd, configure_sshd, sshd_binary, wait_listening

SYSTEMD = Path("/lib/systemd/systemd")
BOOT_TIMEOUT_S = 30.0

# Run by `unshare` as PID 1 of the new namespaces: the mounts a container manager provides, then systemd.
_BOOT = r"""
set -e
etc="$1" units="$2" console="$3" state="$4" python_home="$5"
shift 5
mount -o remount,bind,ro /sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
mkdir -p /run/sshd /run/lock
mount --bind "$etc" /etc/systemd/system
mount --bind "$console" /dev/console
mount --bind "$state" /var/lib/systemd
if [ -n "$python_home" ]; then
  mkdir /run/python-home
  mount --bind "$python_home" /run/python-home
fi
mount -t tmpfs -o mode=755 tmpfs /root
if [ -n "$python_home" ]; then
  mkdir -p "$python_home"
  mount --move /run/python-home "$python_home"
fi
while [ $# -ge 2 ]; do mount --bind "$1" "$2"; shift 2; done
exec env -i container=parapipe-test "SYSTEMD_UNIT_PATH=/etc/systemd/system:$units" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /lib/systemd/systemd --log-target=console --log-level=info --unit=multi-user.target
"""
# What a board needs for users' own service managers: D-Bus, logind (login sessions, lingering), polkit
# (which lets a user turn lingering on for themselves), the per-user manager and its runtime folder.
LOGIN_UNITS = (
    "dbus.socket", "dbus.service", "systemd-logind.service", "polkit.service", "user@.service",
    "user-runtime-dir@.service", "user.slice", "systemd-user-sessions.service",
)  # fmt: skip
BOARD_UID = 4242
CGROUP_PREFIX = "parapipe-test-board-"  # each board's cgroup, in this machine's cgroup2 hierarchy
PR_SET_PDEATHSIG = 1  # prctl(2)
CRONTABS = Path("/var/spool/cron/crontabs")


def _cgroup2_root() -> Path | None:
    """Where this machine mounts the cgroup2 hierarchy (all of /sys/fs/cgroup, or its ``unified`` part)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def systemd_unavailable(user: bool = False) -> str | None:
    """Why no systemd can be run here in namespaces of its own (with ``user``: with logins for a user), or None."""
    if os.geteuid() != 0:
        return "running systemd in namespaces of its own needs root"
    if not SYSTEMD.exists():
        return f"systemd is not installed ({SYSTEMD} is missing; .ci/run installs it)"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is not installed"
    if _cgroup2_root() is None:
        return "no cgroup2 hierarchy is mounted here (systemd needs one to manage services)"
    if user:
        missing = [name for name in LOGIN_UNITS if not Path("/lib/systemd/system", name).exists()]
        if missing:
            return f"a user's service manager needs {', '.join(missing)} (dbus, polkitd; .ci/run installs them)"
        if not list(Path("/usr/lib").glob("*/security/pam_systemd.so")) + list(
            Path("/lib").glob("*/security/pam_systemd.so")
        ):
            return "logins get no session without pam_systemd (libpam-systemd; .ci/run installs it)"
    return None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, however it dies; `unshare
    --kill-child` then kills the board's systemd, and with it every process of the board."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class SystemdBoard:
    """The board: its sshd (reached from this machine), its folders, and its systemd's pid on this machine."""

    folder: Path
    sshd: Sshd
    cgroup: Path
    settled: bool = True  # boot waits until systemd says the boot is done (else only until the sshd listens)
    user: str = ""  # the board's own account that the sshd lets in ("": root); its home is home/USER
    pid1: int = 0
    _proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def etc(self) -> Path:
        """The board's /etc/systemd/system."""
        return self.folder / "etc"

    @property
    def home(self) -> Path:
        """The board user's home (``/home/USER`` on the board)."""
        return self.folder / "home" / self.user

    @property
    def state(self) -> Path:
        """The board's /var/lib/systemd (lingering users: ``linger/USER``)."""
        return self.folder / "state"

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a command inside the board's namespaces (as root, as the board's own shell would)."""
        cmd = ["nsenter", "--target", str(self.pid1), "--mount", "--uts", "--pid", "--cgroup", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout)

    def systemctl(self, *args: str, user: bool = False, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``systemctl`` on the board: its systemd, or with ``user`` the board user's own service manager."""
        if not user:
            return self.run("systemctl", *args, check=check)
        runtime = f"XDG_RUNTIME_DIR=/run/user/{BOARD_UID}"
        return self.run("runuser", "-u", self.user, "--", "env", runtime, "systemctl", "--user", *args, check=check)

    def show(self, unit: str, *props: str, user: bool = False) -> dict[str, str]:
        """``systemctl show`` (of the user's manager with ``user``): property -> value; {} while that is not up."""
        out = self.systemctl("show", unit, *(f"--property={p}" for p in props), user=user, check=False).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def console(self) -> str:
        path = self.folder / "console.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def boot(self) -> None:
        """Start systemd in new namespaces; return once it reports the boot done and the sshd listens."""
        self.cgroup.mkdir(exist_ok=True)
        (self.folder / "console.log").touch()
        script = 'echo $$ > "$1" && shift && exec "$@"'  # into the board's cgroup, then its namespaces
        unshare = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--cgroup"]
        unshare += ["--propagation", "private"]
        args = [str(self.etc), str(self.folder / "units"), str(self.folder / "console.log"), str(self.state)]
        # root's home is the board's own (empty), but for this machine's Python if it lives there
        args.append(sys.base_prefix if sys.base_prefix.startswith("/root/") else "")
        if self.user:
            for name in ("passwd", "group", "shadow"):
                args += [str(self.folder / "accounts" / name), f"/etc/{name}"]
            args += [str(self.folder / "home"), "/home"]
        if (self.folder / "crontabs").is_dir():  # the board's crontabs are its own too
            args += [str(self.folder / "crontabs"), str(CRONTABS)]
        with open(self.folder / "boot.log", "ab") as log:
            self._proc = subprocess.Popen(
                ["sh", "-c", script, "sh", str(self.cgroup / "cgroup.procs"), *unshare, "sh", "-c", _BOOT, "sh", *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        children = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children")
        while not self.pid1:
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int(children.read_text().split()[0])
                if Path(f"/proc/{pid}/exe").resolve() == SYSTEMD.resolve():
                    self.pid1 = pid
            self._check_booting(deadline)
            time.sleep(0.05)
        while True:
            state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
            if state == "running" or (state == "starting" and not self.settled):
                break
            if state == "degraded":
                failed = self.run("systemctl", "--failed", "--no-pager", check=False).stdout
                raise RuntimeError(f"the board's systemd booted degraded:\n{failed}\n{self.console()[-3000:]}")
            self._check_booting(deadline)
            time.sleep(0.1)
        wait_listening(self.sshd.port, lambda: self._proc is not None and self._proc.poll() is None, self.sshd.log)

    def _check_booting(self, deadline: float) -> None:
        assert self._proc is not None
        if self._proc.poll() is not None or time.monotonic() > deadline:
            boot = (self.folder / "boot.log").read_text(errors="replace")
            raise RuntimeError(f"the board's systemd did not boot:\n{boot[-2000:]}\n{self.console()[-3000:]}")

    def power_off(self) -> None:
        """Every process of the board killed at once (SIGKILL to its PID 1 ends the whole PID namespace)."""
        if self.pid1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid1, signal.SIGKILL)
            self.pid1 = 0
        if self._proc is not None:
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        kill = self.cgroup / "cgroup.kill"  # anything that entered the board's cgroup another way
        if kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")

    def reboot(self) -> None:
        self.power_off()
        self.boot()

    def remove_cgroup(self) -> None:
        _remove_cgroup(self.cgroup)


def _remove_cgroup(cgroup: Path) -> None:
    deadline = time.monotonic() + 10
    while cgroup.exists():
        for folder in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                folder.rmdir()
        with contextlib.suppress(OSError):
            cgroup.rmdir()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the board's cgroup {cgroup} could not be removed")
        time.sleep(0.05)


def _remove_dead_boards(root: Path) -> None:
    """The cgroups of boards whose test process was killed outright: no process left in them (and not
    one a test has just made, which its board enters a moment later)."""
    for cgroup in root.glob(f"{CGROUP_PREFIX}*"):
        with contextlib.suppress(OSError):
            dead = "populated 0" in (cgroup / "cgroup.events").read_text().splitlines()
            if dead and time.time() - cgroup.stat().st_mtime > 60:
                _remove_cgroup(cgroup)


def _write_accounts(folder: Path, user: str, key: Path) -> None:
    """This machine's accounts plus the board's ``user`` (uid BOARD_UID, home /home/USER holding ``key``)."""
    accounts = folder / "accounts"
    accounts.mkdir()
    lines = {name: Path(f"/etc/{name}").read_text() for name in ("passwd", "group", "shadow")}
    if any(line.split(":")[0] == user for line in lines["passwd"].splitlines()):
        raise ValueError(f"the board's account {user!r} exists on this machine; pick another name")
    lines["passwd"] += f"{user}:x:{BOARD_UID}:{BOARD_UID}:test board user:/home/{user}:/bin/sh\n"
    lines["group"] += f"{user}:x:{BOARD_UID}:\n"
    lines["shadow"] += f"{user}:*:20000:0:99999:7:::\n"
    for name, text in lines.items():
        (accounts / name).write_text(text)
    (accounts / "shadow").chmod(0o640)
    home = folder / "home" / user
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(key, home / ".ssh" / "authorized_keys")
    for path in (home, home / ".ssh", home / ".ssh" / "authorized_keys"):
        os.chown(path, BOARD_UID, BOARD_UID)


def _write_units(folder: Path, sshd_config: Path, log: Path, extra: dict[str, str], logins: bool, polkit: bool) -> None:
    units = folder / "units"
    (units / "multi-user.target.wants").mkdir(parents=True)
    if logins:
        for name in LOGIN_UNITS:
            if polkit or name != "polkit.service":
                (units / name).symlink_to(Path("/lib/systemd/system", name))
        for name in ("systemd-logind.service", "systemd-user-sessions.service"):
            (units / "multi-user.target.wants" / name).symlink_to(f"../{name}")
    targets = {  # the targets every service and a boot go through, as on a board, without what they pull in there
        "sysinit.target": "the test board's system is initialised",
        "basic.target": "the test board's basic system\nRequires=sysinit.target\nAfter=sysinit.target",
        "multi-user.target": "the test board is up\nRequires=basic.target\nAfter=basic.target\nAllowIsolate=yes",
        "network-online.target": "the test board's network is up",
        "shutdown.target": "the test board shuts down\nDefaultDependencies=no",
        **(
            {"sockets.target": "the test board's sockets", "slices.target": "the test board's slices"} if logins else {}
        ),
    }
    for name, description in targets.items():
        (units / name).write_text(f"[Unit]\nDescription={description}\n")
    (units / "board-sshd.service").write_text(
        "[Unit]\nDescription=the test board's OpenSSH server\n\n[Service]\n"
        f"ExecStart={sshd_binary()} -D -f {sshd_config} -E {log}\nKillMode=process\n"
    )
    for name, text in {"board-sshd.service": "", **extra}.items():
        if text:
            (units / name).write_text(text)
        (units / "multi-user.target.wants" / name).symlink_to(f"../{name}")
    (folder / "etc").mkdir()
    (folder / "state").mkdir()
    if CRONTABS.is_dir():
        info = CRONTABS.stat()
        (folder / "crontabs").mkdir()
        os.chown(folder / "crontabs", info.st_uid, info.st_gid)
        (folder / "crontabs").chmod(info.st_mode & 0o7777)


@contextlib.contextmanager
def systemd_board(
    folder: Path, units: dict[str, str] | None = None, settled: bool = True, user: str = "", polkit: bool = True
) -> Iterator[SystemdBoard]:
    """A booted board running systemd, its sshd serving on 127.0.0.1; everything of it killed afterwards.
    ``units``: more units the board starts at boot (name -> text); ``settled``: see ``SystemdBoard``;
    ``user``: an account of the board's own (not root) that the sshd lets in through PAM, as a board's
    user logs in, with D-Bus, logind and polkit running so that the user has a service manager (without
    ``polkit``, logind refuses that user what needs it, such as lingering)."""
    folder.mkdir(parents=True, exist_ok=True)
    if any(c.isspace() for c in str(folder)):
        raise ValueError(f"the board's folder must have no spaces (systemd unit lines name it): {folder}")
    keys = f"/home/{user}/.ssh/authorized_keys" if user else ""
    sshd, config = configure_sshd(folder / "sshd", user=user, authorized_keys=keys, pam=bool(user))
    if user:
        _write_accounts(folder, user, folder / "sshd" / "user_key.pub")
    _write_units(folder, config, sshd.log, units or {}, logins=bool(user), polkit=polkit)
    root = _cgroup2_root()
    assert root is not None
    _remove_dead_boards(root)
    board = SystemdBoard(folder, sshd, root / f"{CGROUP_PREFIX}{uuid.uuid4().hex[:8]}", settled, user)
    try:
        board.boot()
        yield board
    finally:
        board.power_off()
        board.remove_cgroup()
