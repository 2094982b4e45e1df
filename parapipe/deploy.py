"""Deploy a plan to a board over SSH, run it there, and take it away again.

``deploy``: one deploy per board at a time (a lock on the host and one on the board);
the board-side wheel is installed into a venv on the board only when its content hash
changed; the agent is started under a supervisor (pidfile, log in the working directory)
or kept if it runs the current code: a systemd unit (Restart=always, enabled at boot)
where systemd runs the board (a user unit only for a user who lingers or may turn lingering
on), else a restart loop in sh started by ``agent.boot``, which
an ``@reboot`` crontab line runs at boot where crontab exists (``supervision``); the
unit and the crontab line are recorded in the workdir and undeploy removes them (every crontab
edit holds ``~/.parapipe-crontab.lock`` on the board, so deploys of several workdirs at once
keep each other's lines); the bundle goes up through the agent (temporary folder,
sha256 checked, renamed into place) unless the agent has it; then the pipeline starts
and the hashes are confirmed. Every path deploy creates is listed in
``<workdir>/.parapipe-deployed.json`` once it exists (never before, never a path that was
there already) so ``undeploy`` removes exactly that; a workdir that already holds such
paths deploy did not make is refused.

The board lock names its owner (host, process, time); a lock whose owner is a dead
process on this host, or older than ``LOCK_STALE_S``, is taken over. ``agent.pid`` holds
the agent's pid and its start time, and both (and the command line) are checked before
the process is reported as the agent or signalled, so a pid reused after a reboot is
left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from agents.client import AgentClient, AgentError
from agents.server import WORKDIR_LOCK
from agents.service import MIN_ORT_VERSION
from parapipe.agent_wheel import ORT_REQUIREMENT, build_wheel
from parapipe.availability import accelerated, bundle_units, check_board_runtime, refuse_cpu_wheel
from parapipe.boards import Board
from parapipe.home import parapipe_home
from parapipe.local_agent import DeployError
from parapipe.ssh import BoardConnection

RECORD = ".parapipe-deployed.json"
# the runtime packages, with an onnxruntime the agent runs (not older than MIN_ORT_VERSION)
DEPS_CHECK = (
    "import onnxruntime, grpc, numpy, psutil; "
    "v = tuple(int(''.join(c for c in x if c.isdigit()) or 0) for x in onnxruntime.__version__.split('.')[:2]); "
    f"assert v >= {tuple(MIN_ORT_VERSION)!r}, onnxruntime.__version__"
)
LOCK_STALE_S = 2 * 3600  # longer than any deploy takes (the slowest step, a pip install, has 30 min)


@dataclass(frozen=True)
class DeployResult:
    board: str
    bundle_sha256: str
    wheel_uploaded: bool
    bundle_uploaded_bytes: int
    agent_restarted: bool
    workdir: str
    supervisor: str = ""  # what brings the agent back after a crash and a reboot (see ``supervision``)
    metrics_address: str = ""  # the agent's Prometheus endpoint on the board's loopback ("" without --metrics)


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


def _owner() -> dict[str, object]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "id": uuid.uuid4().hex, "since": time.time()}


def _owner_dead(owner: dict) -> bool:
    """The lock's owner is a process on this host that no longer runs."""
    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _try_lock(conn: BoardConnection, lock: str, owner: str) -> tuple[bool, int, str]:
    """(taken, age in seconds by the board's clock, the holder's owner record)."""
    q = shlex.quote
    script = (
        f'L={q(lock)}; if mkdir "$L" 2>/dev/null; then printf %s {q(owner)} > "$L/owner"; echo taken; exit 0; fi; '
        'echo held "$(( $(date +%s) - $(stat -c %Y "$L" 2>/dev/null || date +%s) ))"; cat "$L/owner" 2>/dev/null; exit 0'
    )
    _, out, _ = conn.shell(script)
    first, _, rest = out.partition("\n")
    if first.strip() == "taken":
        return True, 0, ""
    return False, int(first.split()[1]), rest.strip()


def _take_over(conn: BoardConnection, lock: str, owner: str, holder: str, stale_after: int) -> bool:
    """Move a stale lock aside and take it, unless it changed since it was judged stale."""
    q = shlex.quote
    aside = f"{lock}.stale-{uuid.uuid4().hex[:8]}"
    script = (
        f'L={q(lock)}; [ "$(cat "$L/owner" 2>/dev/null)" = {q(holder)} ] || exit 1; '
        f'[ $(( $(date +%s) - $(stat -c %Y "$L") )) -ge {int(stale_after)} ] || [ {q(holder)} != "" ] || exit 1; '
        f'mv "$L" {q(aside)} || exit 1; rm -rf {q(aside)}; mkdir "$L" || exit 1; '
        f'printf %s {q(owner)} > "$L/owner"'
    )
    return conn.shell(script, check=False)[0] == 0


@contextlib.contextmanager
def board_lock(conn: BoardConnection, wd: str, stale_after: int = LOCK_STALE_S) -> Iterator[None]:
    """One deploy per board: a lock folder naming its owner; a dead or stale owner's lock is taken over."""
    lock = f"{wd}/.deploy.lock"
    owner = json.dumps(_owner(), sort_keys=True)
    taken, age, holder = _try_lock(conn, lock, owner)
    if not taken:
        try:
            record = json.loads(holder) if holder else {}
        except json.JSONDecodeError:
            record = {}
        record = record if isinstance(record, dict) else {}
        stale = _owner_dead(record) or age >= stale_after
        if not (stale and _take_over(conn, lock, owner, holder, stale_after)):
            who = (
                f"process {record.get('pid')} on {record.get('host')}"
                if record
                else "a deploy that did not say who it is"
            )
            raise DeployError(
                f"board {conn.board.name} is locked by another deploy ({who}, {age}s ago; lock {lock}); "
                f"wait for it to finish; a lock older than {stale_after // 60} min or of a dead process is taken over"
            )
    try:
        yield
    finally:
        q = shlex.quote
        # release only our own lock (a stale one may have been taken over from us)
        conn.shell(
            f'[ "$(cat {q(lock + "/owner")} 2>/dev/null)" = {q(owner)} ] && rm -rf {q(lock)}',
            check=False,
        )


def _paths(wd: str) -> dict[str, str]:
    return {
        "venv": f"{wd}/venv",
        "agent_dir": f"{wd}/agent",
        "pid": f"{wd}/agent.pid",
        "port": f"{wd}/agent.port",
        "log": f"{wd}/agent.log",
        "version": f"{wd}/agent.version",
        "supervisor": f"{wd}/agent.supervisor.pid",
        "boot": f"{wd}/agent.boot",  # starts the supervised agent: what deploy and a reboot run
        "cron": f"{wd}/agent.cron",  # the @reboot line deploy added to the user's crontab
        "unit": f"{wd}/agent.unit",  # the systemd unit deploy installed (JSON: scope, name, path, linger)
        "argv": f"{wd}/agent.argv",  # the command line the supervised agent runs (JSON): a change restarts it
        "metrics_port": f"{wd}/agent.metrics-port",  # written by the agent when it serves metrics
    }


def _recorded(conn: BoardConnection, wd: str) -> set[str]:
    code, out, _ = conn.run(["cat", f"{wd}/{RECORD}"], check=False)
    if code != 0 or not out.strip():
        return set()
    try:
        entries = json.loads(out)
    except json.JSONDecodeError:
        raise DeployError(f"{wd}/{RECORD} on board {conn.board.name} is damaged; check and remove it") from None
    return {e for e in entries if isinstance(e, str)} if isinstance(entries, list) else set()


def _existing(conn: BoardConnection, paths: list[str]) -> set[str]:
    script = 'for p in "$@"; do [ -e "$p" ] || [ -L "$p" ] && printf "%s\\0" "$p"; done; exit 0'
    _, out, _ = conn.shell(shlex.join(["sh", "-c", script, "sh", *paths]))
    return {x for x in out.split("\0") if x}


def _record(conn: BoardConnection, wd: str, created: set[str]) -> None:
    """Add paths deploy has just created (they exist now, and did not before) to the record."""
    if not created:
        return
    entries = _recorded(conn, wd) | created
    conn.run(["sh", "-c", f"cat > {shlex.quote(wd + '/' + RECORD)}"], stdin=json.dumps(sorted(entries)).encode())


class _Creations:
    """Tracks the managed paths that did not exist before this deploy, to record each once it exists."""

    def __init__(self, conn: BoardConnection, wd: str) -> None:
        self.conn, self.wd = conn, wd
        managed = list(_paths(wd).values())
        existing = _existing(conn, managed)
        foreign = sorted(existing - _recorded(conn, wd))
        if foreign:
            raise DeployError(
                f"the workdir {wd} on board {conn.board.name} already holds {', '.join(foreign)}, which parapipe "
                "did not create; deploy would overwrite them and undeploy would delete them. Give the board "
                "another workdir (boards add --workdir) or move them away"
            )
        self.absent = set(managed) - existing

    def record(self) -> None:
        now = _existing(self.conn, sorted(self.absent))
        _record(self.conn, self.wd, now)
        self.absent -= now


def ensure_agent_installed(
    conn: BoardConnection, wd: str, progress=None, needed: Mapping[str, str] | None = None
) -> bool:
    """Install the board-side wheel into ``<wd>/venv`` unless the same version is there; True if it uploaded.
    For accelerator units in ``needed`` only the board's own onnxruntime will do (``refuse_cpu_wheel``)."""
    name, data = build_wheel()
    p = _paths(wd)
    code, out, _ = conn.run(["cat", p["version"]], check=False)
    if code == 0 and out.strip() == name:
        return False
    py = conn.board.python
    # without pip of its own where the board's Python has one the venv can run (it sees the system's
    # packages): seeding a venv with pip takes seconds here and tens of seconds on a small board
    conn.run([py, "-m", "venv", "--system-site-packages", "--without-pip", p["venv"]], timeout=300)
    vpy = f"{p['venv']}/bin/python"
    code, _, _ = conn.run([vpy, "-m", "pip", "--version"], check=False)
    if code != 0:
        conn.run([vpy, "-m", "ensurepip", "--default-pip"], timeout=300)
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
        elif accelerated(needed or {}):
            refuse_cpu_wheel(needed or {}, MIN_ORT_VERSION)
        else:
            conn.run(
                [vpy, "-m", "pip", "install", "--quiet", ORT_REQUIREMENT, "grpcio", "numpy", "psutil"], timeout=1800
            )
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


# Prints the agent's pid if agent.pid names a live process that is this workdir's agent: the start time
# recorded beside the pid (field 22 of /proc/PID/stat) matches, and its command line runs agents.server
# with this pid file. A pid reused after a reboot or a crash fails one of these.
_VERIFY_PID = r"""
f="$1"; [ -f "$f" ] || exit 1
read pid start < "$f" || [ -n "$pid" ] || exit 1
case "$pid" in ''|*[!0-9]*) exit 1;; esac
[ -r "/proc/$pid/stat" ] || exit 1
now=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f20)
[ -z "$start" ] || [ "$now" = "$start" ] || exit 1
tr '\0' '\n' < "/proc/$pid/cmdline" | grep -qx 'agents.server' || exit 1
tr '\0' '\n' < "/proc/$pid/cmdline" | grep -qxF -- "$f" || exit 1
echo "$pid"
"""


def agent_pid(conn: BoardConnection, wd: str) -> int | None:
    """The pid of this workdir's agent if it runs (pid, start time and command line checked), else None."""
    code, out, _ = conn.run(["sh", "-c", _VERIFY_PID, "sh", _paths(wd)["pid"]], check=False)
    return int(out.strip()) if code == 0 and out.strip().isdigit() else None


def agent_running(conn: BoardConnection, wd: str) -> bool:
    return agent_pid(conn, wd) is not None


# Prints the supervisor's pid if agent.supervisor.pid names it (start time and command line checked).
_VERIFY_SUPERVISOR = r"""
f="$1"; [ -f "$f" ] || exit 1
read pid start < "$f" || [ -n "$pid" ] || exit 1
case "$pid" in ''|*[!0-9]*) exit 1;; esac
[ -r "/proc/$pid/stat" ] || exit 1
now=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f20)
[ "$now" = "$start" ] || exit 1
tr '\0' '\n' < "/proc/$pid/cmdline" | grep -qx 'parapipe-agent-supervisor' || exit 1
echo "$pid"
"""


def supervisor_pid(conn: BoardConnection, wd: str) -> int | None:
    code, out, _ = conn.run(["sh", "-c", _VERIFY_SUPERVISOR, "sh", _paths(wd)["supervisor"]], check=False)
    return int(out.strip()) if code == 0 and out.strip().isdigit() else None


def _installed_unit(conn: BoardConnection, wd: str) -> dict | None:
    code, out, _ = conn.run(["cat", _paths(wd)["unit"]], check=False)
    if code != 0 or not out.strip():
        return None
    try:
        unit = json.loads(out)
    except json.JSONDecodeError:
        return None
    ok = (
        isinstance(unit, dict)
        and unit.get("scope") in ("system", "user")
        and _UNIT_NAME.fullmatch(unit.get("name", ""))
    )
    return unit if ok else None


def _systemctl(unit: dict, *args: str) -> list[str]:
    return ["systemctl", *(["--user"] if unit["scope"] == "user" else []), *args]


def stop_agent(conn: BoardConnection, wd: str) -> bool:
    """Stop the supervisor (so nothing restarts the agent), then SIGTERM the verified agent (it drains)
    and SIGKILL it after 15 s; pid files naming other processes are removed without signalling anything."""
    p = _paths(wd)
    unit = _installed_unit(conn, wd)
    if unit is not None:  # systemd stops it (SIGTERM, the agent drains) and does not restart a stopped unit
        conn.run(_systemctl(unit, "stop", unit["name"]), check=False, timeout=60)
    supervisor = supervisor_pid(conn, wd)
    if supervisor is not None:
        conn.run(["kill", str(supervisor)], check=False)
    conn.run(["rm", "-f", p["supervisor"]], check=False)
    pid = agent_pid(conn, wd)
    if pid is None:
        conn.run(["rm", "-f", p["pid"]], check=False)
        return False
    conn.shell(
        f"kill {pid}; for i in $(seq 150); do kill -0 {pid} 2>/dev/null || exit 0; sleep 0.1; done; kill -9 {pid}",
        check=False,
    )
    conn.run(["rm", "-f", p["pid"]], check=False)
    return True


# The agent's supervisor: a restart loop (sh, so it runs on any board). An agent that exits 0 (SIGTERM,
# drained) or 2 (it refuses its configuration) stays down; any other exit (a crash, SIGKILL, the OOM
# killer) is restarted a second later, and the agent resumes its last pipeline itself.
_SUPERVISOR = r"""
echo "$$ $(sed 's/^.*) //' /proc/$$/stat | cut -d' ' -f20)" > "$1"
shift
while :; do
  "$@"
  code=$?
  case "$code" in 0|2) exit "$code";; esac
  echo "parapipe supervisor: the agent exited with $code; restarting it in 1s" >&2
  sleep 1
done
"""
SUPERVISOR_NAME = "parapipe-agent-supervisor"


# How the board brings the agent back, best first: a systemd unit (Restart=always, enabled at boot) where
# systemd runs the board (as root a system unit, else a user unit with lingering so it starts at boot
# without a login; a user the board does not let linger gets what follows instead); otherwise the sh
# restart loop, started again at boot by an @reboot crontab line where crontab exists; otherwise the
# restart loop alone (a reboot needs the next deploy, or `sh agent.boot`).
# systemd runs the board whatever state its manager reports (a boot still starting a slow unit, degraded,
# maintenance) except offline (another PID 1, or no user manager) and unknown, or no answer at all.
_SUPERVISION = r"""
running() { case "$1" in ''|offline|unknown) return 1;; esac; return 0; }
if command -v systemctl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then running "$(systemctl is-system-running 2>/dev/null)" && { echo systemd-system; exit 0; }
  else running "$(systemctl --user is-system-running 2>/dev/null)" && { echo systemd-user; exit 0; }
  fi
fi
command -v crontab >/dev/null 2>&1 && { echo cron; exit 0; }
echo none
"""
_UNIT_NAME = re.compile(r"parapipe-agent-[0-9a-f]{12}\.service")
CRON_MARK = "# parapipe agent"  # ends every crontab line deploy adds (the workdir follows it)
CRONTAB_LOCK = ".parapipe-crontab.lock"  # in the user's home: every crontab edit by deploy/undeploy holds it
CRONTAB_LOCK_WAIT_S = 60  # a crontab edit takes milliseconds; a lock held this long is reported
CRONTAB_LOCK_STALE_S = 300  # a link lock whose holder cannot be checked (another host) is taken over this old

# A crontab edit is load-modify-save (`crontab -l`, then `crontab -`): two deploys to one board at once
# (different workdirs) would each save what they loaded and one's line would be lost. Every edit holds
# ~/.parapipe-crontab.lock: flock(1) where util-linux is there (released by the kernel whatever ends the
# edit); otherwise a symbolic link ~/.parapipe-crontab.lock.held whose target names its holder (host, pid,
# the pid's start time), made with `ln -s`, which creates it, holder and all, at once or fails. A link
# whose holder on this board no longer runs (killed outright: no trap removed it), or whose pid now is
# another process (another start time), is taken over; one of another host (a home shared over NFS)
# once it is CRONTAB_LOCK_STALE_S old. Taking over holds ~/.parapipe-crontab.lock.breaking (a folder,
# for milliseconds) and removes the link only if it still names the holder judged gone, so two edits
# taking over at once never remove a live edit's lock. It prints which lock it took.
_CRONTAB_EDIT = r"""
line=$1 mode=$2 lock="$HOME/$3" wait=$4 stale=$5
edit() {
  if [ "$mode" = add ]; then
    { crontab -l 2>/dev/null | grep -vxF -- "$line"; printf '%s\n' "$line"; } | crontab -
  else
    crontab -l >/dev/null 2>&1 || return 0
    crontab -l | grep -vxF -- "$line" | crontab -
  fi
}
if command -v flock >/dev/null 2>&1; then
  exec 9>>"$lock" || { echo "cannot open the crontab lock $lock: the user's home must be writable" >&2; exit 3; }
  flock -w "$wait" 9 || { echo "another crontab edit has held $lock for $wait s; try again" >&2; exit 3; }
  echo flock
  edit
else
  held="$lock.held" guard="$lock.breaking" host=$(uname -n 2>/dev/null)
  started() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
  me="$host $$ $(started $$)"
  holder() { readlink "$1" 2>/dev/null || { [ -L "$1" ] && ls -l "$1" | sed 's/.* -> //'; }; }
  age() { echo $(( $(date +%s) - $(stat -c %Y "$1" 2>/dev/null || date +%s) )); }
  gone() {  # the holder $1 ("host pid start") no longer holds the lock
    set -f; set -- $1; set +f
    if [ "$1" = "$host" ] && [ -n "$2" ]; then
      kill -0 "$2" 2>/dev/null || return 0
      [ -d /proc/self ] && [ "$(started "$2")" != "$3" ] && return 0
      return 1
    fi
    [ "$(age "$held")" -ge "$stale" ]
  }
  take_over() {  # $1: the holder judged gone; remove its link unless it changed since
    mkdir "$guard" 2>/dev/null || { [ "$(age "$guard")" -ge 10 ] && rm -rf "$guard"; return 1; }
    if [ "$(holder "$held")" = "$1" ]; then
      rm -f "$held" && echo "parapipe: took over the crontab lock $held of an edit that is gone ($1)" >&2
    fi
    rmdir "$guard" 2>/dev/null
    return 0
  }
  n=0 m=0
  until ln -s "$me" "$held" 2>/dev/null; do
    if ! [ -L "$held" ]; then
      m=$((m + 1))
      [ "$m" -le 50 ] && continue  # released just now
      echo "cannot create the crontab lock $held: the user's home must be writable" >&2
      exit 3
    fi
    h=$(holder "$held")
    if gone "$h"; then take_over "$h" && continue; fi
    n=$((n + 1))
    if [ "$n" -gt "$wait" ]; then
      echo "the crontab lock $held (no flock on this board) has been held for $wait s by a running edit" \
        "($h: host, pid, start time); try again once it is done" >&2
      exit 3
    fi
    sleep 1
  done
  trap '[ "$(holder "$held")" = "$me" ] && rm -f "$held"' EXIT
  trap 'exit 129' HUP INT TERM
  echo link
  edit
fi
"""


def edit_crontab(conn: BoardConnection, line: str, add: bool) -> str:
    """Add ``line`` to the user's crontab on the board (once), or remove it (every copy, nothing else),
    holding the board's crontab lock so concurrent deploys and undeploys never lose each other's
    lines. Returns the lock it held: ``flock``, or ``link`` on a board without util-linux's flock."""
    mode = "add" if add else "remove"
    limits = [str(CRONTAB_LOCK_WAIT_S), str(CRONTAB_LOCK_STALE_S)]
    code, out, err = conn.run(
        ["sh", "-c", _CRONTAB_EDIT, "sh", line, mode, CRONTAB_LOCK, *limits],
        check=False,
        timeout=CRONTAB_LOCK_WAIT_S + 60,
    )
    if code != 0:
        raise DeployError(
            f"editing the crontab on {conn.board.name} failed ({code}): {err.strip()[-600:] or 'no message'}"
        )
    return out.strip().splitlines()[0] if out.strip() else ""


def supervision(conn: BoardConnection) -> str:
    """``systemd-system``, ``systemd-user``, ``cron`` (restart loop + @reboot) or ``none`` (restart loop)."""
    return conn.shell(_SUPERVISION)[1].strip() or "none"


def agent_argv(wd: str, port: int, metrics_port: int = 0) -> list[str]:
    """The agent's command line on the board (its venv's Python, loopback only, files in the workdir);
    with ``metrics_port`` it also serves Prometheus metrics there, on the board's loopback too."""
    p = _paths(wd)
    argv = [
        p["venv"] + "/bin/python", "-m", "agents.server", "--host", "127.0.0.1",
        "--port", str(int(port)), "--workdir", p["agent_dir"], "--pid-file", p["pid"],
        "--port-file", p["port"],
    ]  # fmt: skip
    if metrics_port:
        argv += ["--metrics-port", str(int(metrics_port)), "--metrics-port-file", p["metrics_port"]]
    return argv


def metrics_port_of(board: Board) -> int:
    """Where ``deploy --metrics`` has the agent serve its metrics on the board: the port after its gRPC port."""
    return board.agent_port + 1


def _running_argv(conn: BoardConnection, wd: str) -> list[str] | None:
    code, out, _ = conn.run(["cat", _paths(wd)["argv"]], check=False)
    try:
        return json.loads(out) if code == 0 and out.strip() else None
    except json.JSONDecodeError:
        return None


def _ensure_metrics_package(conn: BoardConnection, wd: str) -> None:
    """prometheus_client in the board's agent venv (from the package index when the board lacks it)."""
    vpy = f"{_paths(wd)['venv']}/bin/python"
    if conn.run([vpy, "-c", "import prometheus_client"], check=False)[0] == 0:
        return
    code, _, err = conn.run([vpy, "-m", "pip", "install", "--quiet", "prometheus-client"], check=False, timeout=600)
    if code != 0:
        raise DeployError(
            f"--metrics needs prometheus_client on {conn.board.name} and pip could not install it "
            f"({err.strip().splitlines()[-1] if err.strip() else 'no output'}); install it into "
            f"{_paths(wd)['venv']} or deploy without --metrics"
        )


def boot_script(wd: str, agent: list[str]) -> str:
    """The sh script that starts the agent under its restart loop, detached; deploy and @reboot run it."""
    p = _paths(wd)
    q = shlex.quote
    supervised = shlex.join(["sh", "-c", _SUPERVISOR, SUPERVISOR_NAME, p["supervisor"], *agent])
    return (
        "#!/bin/sh\n# written by parapipe deploy: starts this workdir's agent under its restart loop\n"
        f"cd {q(wd)} || exit 1\nrm -f {q(p['port'])}\n"
        f"setsid nohup {supervised} >> {q(p['log'])} 2>&1 < /dev/null &\nexit 0\n"
    )


def _systemd_quote(arg: str) -> str:
    if "\n" in arg or "\r" in arg:
        raise DeployError(f"a path for the agent's systemd unit holds a line break: {arg!r}; use another workdir")
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def _systemd_path(path: str) -> str:
    if "\n" in path or "\r" in path:
        raise DeployError(f"a path for the agent's systemd unit holds a line break: {path!r}; use another workdir")
    return path.replace("%", "%%")


def unit_text(wd: str, agent: list[str], user: bool, grace_s: float = 30.0) -> str:
    """The agent's systemd unit: restarted whatever way it ends, except a refusal of its
    configuration (exit 2) and a stop asked for (systemctl stop: SIGTERM, it drains); enabled at boot."""
    p = _paths(wd)
    if any(c in agent[0] for c in "'\"\\"):  # systemd refuses these in the program's path, not in arguments
        agent = ["/bin/sh", "-c", 'exec "$0" "$@"', *agent]
    program = f'"{_systemd_path(agent[0])}"'  # no $-substitution in the program's path, only in arguments
    return "\n".join(
        [
            "# written by parapipe deploy; parapipe undeploy removes it",
            "[Unit]",
            f"Description=parapipe agent ({_systemd_path(wd)})",
            "Wants=network-online.target",
            "After=network-online.target",
            "StartLimitIntervalSec=0",
            "",
            "[Service]",
            "Type=simple",
            f"WorkingDirectory={_systemd_path(wd)}",
            "ExecStart=" + " ".join([program, *(_systemd_quote(a) for a in agent[1:])]),
            "Restart=always",
            "RestartSec=1",
            "RestartPreventExitStatus=2",
            "KillSignal=SIGTERM",
            f"TimeoutStopSec={int(grace_s) + 15}",
            f"StandardOutput=append:{_systemd_path(p['log'])}",
            f"StandardError=append:{_systemd_path(p['log'])}",
            "",
            "[Install]",
            f"WantedBy={'default.target' if user else 'multi-user.target'}",
            "",
        ]
    )


def _lingering(conn: BoardConnection) -> bool:
    _, out, _ = conn.run(["loginctl", "show-user", conn.board.user, "-p", "Linger"], check=False)
    return out.strip() == "Linger=yes"


def _install_unit(conn: BoardConnection, wd: str, agent: list[str], scope: str) -> bool:
    """Write, enable and (re)start the agent's unit; its name, path and scope go to agent.unit first, so
    undeploy finds it even if this is cut off. False, and no unit, for a user unit that could not start at
    boot: the user does not linger and the board does not let them turn it on (no polkit, or a policy)."""
    p = _paths(wd)
    name = f"parapipe-agent-{hashlib.sha256(wd.encode()).hexdigest()[:12]}.service"
    folder = "/etc/systemd/system" if scope == "system" else conn.path("~/.config/systemd/user")
    unit = {"scope": scope, "name": name, "path": f"{folder}/{name}", "linger": False}
    if scope == "user":  # a user's units start at boot only for a user who lingers
        unit["linger"] = not _lingering(conn)  # deploy turns it on, so undeploy turns it off again
    conn.run(["sh", "-c", f"cat > {shlex.quote(p['unit'])}"], stdin=json.dumps(unit).encode())
    if unit["linger"]:
        conn.run(["loginctl", "enable-linger", conn.board.user], check=False)
        if not _lingering(conn):  # refused: the record now says only which unit a past deploy may have left
            conn.run(
                ["sh", "-c", f"cat > {shlex.quote(p['unit'])}"], stdin=json.dumps(dict(unit, linger=False)).encode()
            )
            return False
    conn.run(["mkdir", "-p", folder])
    text = unit_text(wd, agent, user=scope == "user")
    conn.run(["sh", "-c", 'cat > "$1"', "sh", unit["path"]], stdin=text.encode())
    conn.run(_systemctl(unit, "daemon-reload"))
    conn.run(_systemctl(unit, "enable", name))
    conn.run(_systemctl(unit, "restart", name))
    return True


def _add_cron(conn: BoardConnection, wd: str) -> None:
    """An @reboot line that runs agent.boot; the line goes to agent.cron first, so undeploy removes it."""
    p = _paths(wd)
    line = f"@reboot sh {shlex.quote(p['boot'])} {CRON_MARK} {wd}".replace("%", "\\%")
    if "\n" in line:
        raise DeployError(f"the workdir {wd!r} holds a line break; a crontab line cannot name it; use another workdir")
    conn.run(["sh", "-c", f"cat > {shlex.quote(p['cron'])}"], stdin=line.encode())
    edit_crontab(conn, line, add=True)


def remove_boot_hooks(conn: BoardConnection, wd: str) -> None:
    """Undo what deploy installed outside the workdir to start the agent at boot: its systemd unit
    (disabled, removed, lingering turned off again if deploy turned it on) and its crontab line."""
    _remove_unit(conn, wd)
    _remove_cron(conn, wd)


def _remove_unit(conn: BoardConnection, wd: str) -> None:
    unit = _installed_unit(conn, wd)
    if unit is not None:
        conn.run(_systemctl(unit, "disable", "--now", unit["name"]), check=False, timeout=60)
        path = str(unit.get("path", ""))
        if path.endswith("/" + unit["name"]):
            conn.run(["rm", "-f", path], check=False)
        conn.run(_systemctl(unit, "daemon-reload"), check=False)
        if unit.get("linger"):
            conn.run(["loginctl", "disable-linger", conn.board.user], check=False)
        conn.run(["rm", "-f", _paths(wd)["unit"]], check=False)


def _remove_cron(conn: BoardConnection, wd: str) -> None:
    p = _paths(wd)
    code, line, _ = conn.run(["cat", p["cron"]], check=False)
    line = line.strip("\n")
    if code == 0 and line.startswith("@reboot ") and CRON_MARK in line:
        edit_crontab(conn, line, add=False)  # a failure stops here, agent.cron kept: undeploy can run again
    conn.run(["rm", "-f", p["cron"]], check=False)


def start_agent(conn: BoardConnection, wd: str, metrics_port: int = 0) -> str:
    """Start the agent under its supervisor (``supervision``); wait until it listens. Returns the supervision."""
    p = _paths(wd)
    agent = agent_argv(wd, conn.board.agent_port, metrics_port)
    conn.run(["rm", "-f", p["port"], p["metrics_port"]], check=False)
    conn.run(["sh", "-c", f"cat > {shlex.quote(p['argv'])}"], stdin=json.dumps(agent).encode())
    mode = supervision(conn)
    if mode.startswith("systemd"):
        if _install_unit(conn, wd, agent, mode.removeprefix("systemd-")):
            _remove_cron(conn, wd)  # a board that gained systemd since the last deploy: one way to start at boot
        else:  # a user unit would not start at boot: the restart loop and an @reboot line do
            mode = conn.shell("command -v crontab >/dev/null 2>&1 && echo cron || echo none")[1].strip()
    if not mode.startswith("systemd"):
        _remove_unit(conn, wd)
        conn.run(["sh", "-c", f"cat > {shlex.quote(p['boot'])}"], stdin=boot_script(wd, agent).encode())
        if mode == "cron":
            _add_cron(conn, wd)
        conn.run(["sh", "-c", f": > {shlex.quote(p['log'])}"])  # a fresh log per deploy; a reboot appends
        conn.run(["sh", p["boot"]])
    deadline = time.monotonic() + 60
    while conn.run(["test", "-f", p["port"]], check=False)[0] != 0:
        if time.monotonic() > deadline:
            _, log, _ = conn.run(["tail", "-n", "20", p["log"]], check=False)
            raise DeployError(f"the agent on {conn.board.name} did not start; its log ends:\n{log}")
        time.sleep(0.2)
    return "systemd" if mode.startswith("systemd") else mode


@contextlib.contextmanager
def agent_client(conn: BoardConnection) -> Iterator[AgentClient]:
    with conn.forward(conn.board.agent_port) as fwd, AgentClient(f"127.0.0.1:{fwd.port}", timeout=60) as client:
        try:
            client.wait_serving(30)
        except AgentError as exc:
            raise DeployError(
                f"the agent on {conn.board.name} never answered SERVING through the SSH tunnel: {exc}"
            ) from None
        yield client


def _install_and_start(
    conn: BoardConnection, wd: str, progress=None, metrics_port: int | None = None, needed: Mapping[str, str] = {}
) -> tuple[bool, bool, str]:
    """(wheel uploaded, agent restarted, supervision); records each managed path once deploy has created it.
    The agent is restarted when the wheel changed, it is not running, or its command line changes
    (metrics turned on or off; ``metrics_port`` None keeps what the running agent does)."""
    if metrics_port is None:
        running = _running_argv(conn, wd) or []
        metrics_port = int(running[running.index("--metrics-port") + 1]) if "--metrics-port" in running else 0
    creations = _Creations(conn, wd)
    conn.remove_partial_uploads(wd)  # left by a deploy killed mid-upload (we hold the board lock)
    try:
        uploaded = ensure_agent_installed(conn, wd, progress, needed)
        if metrics_port:
            _ensure_metrics_package(conn, wd)
        creations.record()
        restarted = False
        wanted = agent_argv(wd, conn.board.agent_port, metrics_port)
        if uploaded or not agent_running(conn, wd) or _running_argv(conn, wd) != wanted:
            stop_agent(conn, wd)
            mode = start_agent(conn, wd, metrics_port)
            restarted = True
        else:
            mode = (
                "systemd"
                if _installed_unit(conn, wd)
                else ("cron" if _existing(conn, [_paths(wd)["cron"]]) else "none")
            )
    finally:
        creations.record()
    return uploaded, restarted, mode


def ensure_agent(board: Board, progress=None) -> bool:
    """Install and start the agent on a board if needed (no bundle); True if it was (re)started."""
    with host_lock(board), BoardConnection(board) as conn:
        wd = conn.path(board.workdir)
        conn.run(["mkdir", "-p", wd])
        with board_lock(conn, wd):
            return _install_and_start(conn, wd, progress)[1]


def deploy(board: Board, bundle: Path, progress=None, metrics: bool = False) -> DeployResult:
    """Install and start the supervised agent (with Prometheus metrics on the board's loopback if
    ``metrics``), upload the bundle and start its pipeline."""
    metrics_port = metrics_port_of(board) if metrics else 0
    needed = bundle_units(bundle)
    with host_lock(board), BoardConnection(board) as conn:
        wd = conn.path(board.workdir)
        check_board_runtime(conn, wd, needed)  # before anything is made on the board
        conn.run(["mkdir", "-p", wd])
        with board_lock(conn, wd):
            uploaded, restarted, mode = _install_and_start(conn, wd, progress, metrics_port, needed)
            with agent_client(conn) as client:
                reply = client.load_bundle(bundle, progress)
                client.start(reply.bundle_sha256)
                status = client.status()
                if status.running_bundle != reply.bundle_sha256:
                    raise DeployError(
                        f"the agent runs bundle {status.running_bundle[:12]}…, not {reply.bundle_sha256[:12]}…"
                    )
        address = f"127.0.0.1:{metrics_port}" if metrics_port else ""
        return DeployResult(
            board.name, reply.bundle_sha256, uploaded, reply.bytes_received, restarted, wd, mode, address
        )


def undeploy(board: Board) -> list[str]:
    """Stop the agent and remove what deploy created, nothing else."""
    with host_lock(board), BoardConnection(board) as conn:
        wd = conn.path(board.workdir)
        stop_agent(conn, wd)
        remove_boot_hooks(conn, wd)
        conn.remove_partial_uploads(wd)
        code, out, _ = conn.run(["cat", f"{wd}/{RECORD}"], check=False)
        entries = json.loads(out) if code == 0 and out.strip() else []
        removed = [e for e in entries if e.startswith(wd + "/")]
        if removed:
            conn.run(["rm", "-rf", "--", *removed])
        conn.run(["rm", "-f", f"{wd}/{RECORD}", f"{wd}/{WORKDIR_LOCK}"], check=False)  # the stopped agent's lock
        conn.run(["rmdir", wd], check=False)  # only if deploy left it empty
        return removed
