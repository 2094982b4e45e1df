"""Deploy to a real OpenSSH server on loopback as a board: run a plan, undeploy, and every refusal."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from parapipe.boards import Board
from parapipe.deploy import agent_client, deploy, undeploy
from parapipe.local_agent import DeployError
from parapipe.ssh import BoardConnection
from tests.support.cli import SHORT_MEMORY
from tests.support.sshd import free_port, free_port_pair, keygen, start_sshd, stop_sshd


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    info, proc = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield info
    stop_sshd(proc)


@pytest.fixture(autouse=True)
def _crontab_kept(this_machines_crontab):
    """Deploy adds an @reboot line where crontab exists (this "board" is this machine): whatever a
    test does, this account's crontab is as it was afterwards; one test at a time edits it, under the
    machine's lock (tests/conftest.py), taken before the crontab is saved."""
    if shutil.which("crontab") is None:
        yield
        return
    saved = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    yield
    if saved.returncode == 0:
        subprocess.run(["crontab", "-"], input=saved.stdout, text=True, check=True)
    else:
        subprocess.run(["crontab", "-r"], capture_output=True)


@pytest.fixture
def board(sshd, tmp_path):
    workdir = tmp_path / "board dir; $(touch pwned) 'q' & x"  # spaces and shell metacharacters
    yield Board(
        name="loopback",
        host="127.0.0.1",
        port=sshd.port,
        user=sshd.user,
        key=str(sshd.user_key),
        device="local",
        known_hosts=str(sshd.known_hosts),
        python=sys.executable,
        workdir=str(workdir),
        agent_port=free_port_pair(),  # and the next for --metrics
    )
    # whatever the test did, leave no agent running on the "board"
    pid = workdir / "agent.pid"
    if pid.exists():
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid.read_text().split()[0]), signal.SIGTERM)


@pytest.fixture(scope="module")
def bundle(exported, tmp_path_factory):
    from compiler import compile_plan, write_bundle
    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from planner.baselines import flop_pipeline

    loaded = load_onnx(exported("squeezenet1_1").path)
    graph = build_graph(loaded.proto, loaded.sha256)
    profile = load_profile("local")
    plan = flop_pipeline(coarsen(graph, "coarse"), profile, [("cpu", 1)])
    compiled = compile_plan(plan, loaded, graph, profile)
    return write_bundle(compiled, tmp_path_factory.mktemp("b") / "bundle"), compiled


def test_deploy_run_redeploy_undeploy(board, bundle, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    folder, _compiled = bundle
    first = deploy(board, folder)
    assert first.wheel_uploaded and first.agent_restarted and first.bundle_uploaded_bytes > 0
    workdir = Path(board.workdir)
    assert (workdir / "agent.pid").is_file() and not (workdir.parent / "pwned").exists()
    with BoardConnection(board) as conn, agent_client(conn) as client:
        assert client.ready()
        reply = client.benchmark(frames=5, warmup=1)
        assert reply.throughput_fps > 0
    again = deploy(board, folder)
    assert not again.wheel_uploaded and not again.agent_restarted and again.bundle_uploaded_bytes == 0
    (workdir / "keep-me.txt").write_text("not ours")
    removed = undeploy(board)
    assert removed and not (workdir / "agent.pid").exists() and not (workdir / "venv").exists()
    assert (workdir / "keep-me.txt").read_text() == "not ours", "undeploy removed something it did not create"


def test_unknown_host_key_is_refused_before_login(board, sshd, tmp_path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    before = len(sshd.log.read_text())
    with pytest.raises(DeployError, match="unknown host key"):
        BoardConnection(dataclasses.replace(board, known_hosts=str(empty)))
    import time

    time.sleep(0.3)
    assert "Accepted publickey" not in sshd.log.read_text()[before:], "refused only after logging in"


def test_changed_host_key_is_refused_showing_both_fingerprints(board, tmp_path) -> None:
    keygen(tmp_path / "other")
    other = (tmp_path / "other.pub").read_text().split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{board.port} {other[0]} {other[1]}\n")
    with pytest.raises(DeployError) as info:
        BoardConnection(dataclasses.replace(board, known_hosts=str(wrong)))
    assert "CHANGED" in str(info.value) and str(info.value).count("SHA256:") == 2


def test_pinned_fingerprint_must_match(board, sshd) -> None:
    out = subprocess.run(["ssh-keygen", "-lf", str(sshd.host_key) + ".pub"], capture_output=True, text=True, check=True)
    good = out.stdout.split()[1]
    with BoardConnection(dataclasses.replace(board, known_hosts="", host_key_sha256=good)) as conn:
        assert conn.run(["echo", "hi; rm -rf /"])[1].strip() == "hi; rm -rf /"  # arguments are quoted, not run
    with pytest.raises(DeployError, match="pins"):
        BoardConnection(dataclasses.replace(board, known_hosts="", host_key_sha256="SHA256:" + "A" * 43))


def test_cut_off_upload_leaves_the_old_file(board) -> None:
    with BoardConnection(board) as conn:
        wd = conn.path(board.workdir)
        conn.run(["mkdir", "-p", wd])
        target = f"{wd}/model.bin"
        conn.upload(b"old content", target)

        class Cut(Exception):
            pass

        def cut(done: int, total: int) -> None:
            raise Cut

        with pytest.raises(Cut):
            conn.upload(b"x" * (3 << 20), target, progress=cut)
        assert conn.run(["cat", target])[1] == "old content"
        assert sorted(os.listdir(wd)) == ["model.bin"], "the cut-off upload left its temporary file"


def test_uploads_cut_off_harder_are_removed_by_the_next_deploy(board, bundle, monkeypatch, tmp_path) -> None:
    """A host killed mid-upload leaves a temporary file no code of its own can remove: the next
    deploy (and undeploy) remove exactly such files and leave look-alikes of the user's alone."""
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    folder, _ = bundle
    workdir = Path(board.workdir)
    workdir.mkdir(parents=True)
    theirs = ["notes.parapipe-partial-", "x.parapipe-partial-NOTHEX!!", "x.parapipe-partial-0123abcd9"]
    for name in theirs:
        (workdir / name).write_text("the user's")
    debris = workdir / "agent.whl.parapipe-partial-0123abcd"
    debris.write_bytes(b"half a wheel")
    deploy(board, folder)
    assert not debris.exists()
    debris.write_bytes(b"half a wheel")
    undeploy(board)
    assert not debris.exists()
    assert sorted(os.listdir(workdir)) == sorted(theirs)


def test_two_concurrent_deploys_one_fails_with_a_lock_error(board, bundle, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    folder, _ = bundle
    errors: list[BaseException] = []
    results = []

    def one() -> None:
        try:
            results.append(deploy(board, folder))
        except DeployError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 1 and len(errors) == 1
    assert "another deploy" in str(errors[0]) or "locked" in str(errors[0])
    undeploy(board)


def test_boards_cli(board, sshd, tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from parapipe.cli import app

    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    added = runner.invoke(
        app,
        [
            "boards",
            "add",
            "lb",
            "--host",
            "127.0.0.1",
            "--port",
            str(sshd.port),
            "--user",
            sshd.user,
            "--key",
            str(sshd.user_key),
            "--known-hosts",
            str(sshd.known_hosts),
            "--device",
            "local",
            "--python",
            sys.executable,
            "--workdir",
            board.workdir,
        ],
    )
    assert added.exit_code == 0, added.output
    listed = runner.invoke(app, ["boards", "list", "--json"])
    assert json.loads(listed.stdout)[0]["name"] == "lb"
    checked = runner.invoke(app, ["boards", "check", "lb", "--json"])
    assert checked.exit_code == 0, checked.output
    info = json.loads(checked.stdout)
    assert info["cores"] >= 1 and info["onnxruntime"] != "not importable by the board's Python"
    missing = runner.invoke(
        app, ["boards", "add", "x", "--host", "h", "--user", "u", "--key", str(sshd.user_key), "--device", "local"]
    )
    assert missing.exit_code == 2 and "host key" in missing.output


def test_run_a_plan_on_an_ssh_board_then_undeploy(board, sshd, tmp_path, monkeypatch, exported) -> None:
    from typer.testing import CliRunner

    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from parapipe.boards import add_board
    from parapipe.cli import app
    from parapipe.run import run_plan
    from planner.baselines import single_pu
    from planner.build import evaluate
    from planner.costmodel import CostModel

    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    add_board(dataclasses.replace(board, name="ssh-board"))
    path = exported("squeezenet1_1").path
    loaded = load_onnx(path)
    graph = build_graph(loaded.proto, loaded.sha256)
    profile = load_profile("local")
    plan = evaluate(single_pu(coarsen(graph, "coarse"), profile, "cpu", 1), graph, CostModel(profile, graph), frames=20)
    result = run_plan(dataclasses.replace(plan, model_path=str(path)), "ssh-board", None, frames=5, verify=True)
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5
    assert result.measured.throughput_fps > 0 and "throughput_fps" in result.errors_pct
    gone = CliRunner().invoke(app, ["undeploy", "--board", "ssh-board"])
    assert gone.exit_code == 0, gone.output
    assert not (Path(board.workdir) / "venv").exists()


def test_remote_profiling_session_caches_on_the_host(board, tmp_path, monkeypatch, exported) -> None:
    from typer.testing import CliRunner

    from parapipe.boards import add_board
    from parapipe.cli import app
    from parapipe.deploy import undeploy as do_undeploy

    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    add_board(dataclasses.replace(board, name="prof-board"))
    model = str(exported("squeezenet1_1").path)
    args = ["profile", model, "--board", "prof-board", "--pu", "cpu", "--repeats", "3", "--warmup", "1", "--json"]
    args += list(SHORT_MEMORY)
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    measured = json.loads(first.stdout)["measured"]
    assert measured > 0 and (tmp_path / "home" / "costs.json").is_file()
    again = CliRunner().invoke(app, args)
    assert json.loads(again.stdout)["measured"] == 0, "a repeated session reuses the host's cache"
    do_undeploy(dataclasses.replace(board, name="prof-board"))


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_lock_left_by_a_dead_or_stale_deploy_is_taken_over(board, tmp_path) -> None:
    import socket
    import time

    from parapipe.deploy import board_lock

    with BoardConnection(board) as conn:
        wd = conn.path(board.workdir)
        conn.run(["mkdir", "-p", wd])
        lock = Path(wd) / ".deploy.lock"

        def leave_lock(owner: dict, age_s: float = 0.0) -> None:
            lock.mkdir()
            (lock / "owner").write_text(json.dumps(owner, sort_keys=True))
            if age_s:
                then = time.time() - age_s
                os.utime(lock, (then, then))

        # a deploy on this host that died (its process is gone): taken over at once
        leave_lock({"host": socket.gethostname(), "pid": _dead_pid(), "id": "x", "since": 0})
        with board_lock(conn, wd):
            assert json.loads((lock / "owner").read_text())["pid"] == os.getpid()
        assert not lock.exists()

        # a running deploy elsewhere: refused, naming it
        leave_lock({"host": "other-host", "pid": 4242, "id": "y", "since": 0})
        with pytest.raises(DeployError, match="process 4242 on other-host"):
            with board_lock(conn, wd):
                pass
        assert json.loads((lock / "owner").read_text())["host"] == "other-host", "a live lock was touched"
        import shutil

        shutil.rmtree(lock)

        # a lock older than any deploy (its owner's host went away): taken over
        leave_lock({"host": "other-host", "pid": 4242, "id": "z", "since": 0}, age_s=3 * 3600)
        with board_lock(conn, wd):
            assert json.loads((lock / "owner").read_text())["pid"] == os.getpid()
        assert not lock.exists()

        # a lock folder without an owner (a deploy died right after mkdir): taken over once it is old
        lock.mkdir()
        then = time.time() - 3 * 3600
        os.utime(lock, (then, then))
        with board_lock(conn, wd):
            pass
        assert not lock.exists()


def test_a_pid_file_naming_another_process_is_neither_reported_nor_killed(board, tmp_path) -> None:
    from parapipe.deploy import agent_running, stop_agent

    other = subprocess.Popen(["sleep", "300"])
    try:
        with BoardConnection(board) as conn:
            wd = conn.path(board.workdir)
            conn.run(["mkdir", "-p", wd])
            pid_file = Path(wd) / "agent.pid"
            for text in (f"{other.pid}\n", f"{other.pid} 12345\n"):  # an old-style pid file; a wrong start time
                pid_file.write_text(text)
                assert not agent_running(conn, wd)
                assert not stop_agent(conn, wd)
                assert other.poll() is None, "stop_agent killed a process that is not the agent"
        pid_file.write_text(f"{other.pid}\n")
        undeploy(board)
        assert other.poll() is None, "undeploy killed a process that is not the agent"
    finally:
        other.kill()
        other.wait()


def test_deploy_refuses_a_workdir_holding_files_it_did_not_create(board, bundle, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    folder, _ = bundle
    workdir = Path(board.workdir)
    (workdir / "venv").mkdir(parents=True)
    (workdir / "venv" / "mine.txt").write_text("the user's")
    (workdir / "agent.log").write_text("the user's log")
    with pytest.raises(DeployError, match="did not create"):
        deploy(board, folder)
    undeploy(board)
    assert (workdir / "venv" / "mine.txt").read_text() == "the user's"
    assert (workdir / "agent.log").read_text() == "the user's log"


def test_a_crashed_agent_is_restarted_by_its_supervisor_and_resumes(board, bundle, monkeypatch, tmp_path) -> None:
    import time

    from parapipe.deploy import agent_pid, supervisor_pid

    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    folder, _ = bundle
    result = deploy(board, folder)
    with BoardConnection(board) as conn:
        wd = conn.path(board.workdir)
        first = agent_pid(conn, wd)
        supervisor = supervisor_pid(conn, wd)
        assert first is not None and supervisor is not None
        os.kill(first, signal.SIGKILL)  # a crash, the OOM killer
        deadline = time.monotonic() + 60
        while agent_pid(conn, wd) in (None, first):
            assert time.monotonic() < deadline, "the supervisor did not restart the agent"
            time.sleep(0.2)
        with agent_client(conn) as client:
            while not client.ready():
                assert time.monotonic() < deadline, "the restarted agent did not resume its pipeline"
                time.sleep(0.2)
            status = client.status()
            assert status.running_bundle == result.bundle_sha256 and status.resumed and status.boots == 2
        assert "restarting it" in (Path(wd) / "agent.log").read_text()
        second = agent_pid(conn, wd)
    undeploy(board)
    for pid in (second, supervisor):
        assert pid is not None
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            assert time.monotonic() < deadline, f"process {pid} still runs after undeploy"
            time.sleep(0.2)


@contextlib.contextmanager
def _users_crontab(lines: str) -> Iterator[str | None]:
    """This account's crontab holds ``lines`` for the test and is put back afterwards (None: no crontab)."""
    if shutil.which("crontab") is None:
        yield None
        return
    saved = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    subprocess.run(["crontab", "-"], input=lines, text=True, check=True)
    try:
        yield lines
    finally:
        if saved.returncode == 0:
            subprocess.run(["crontab", "-"], input=saved.stdout, text=True, check=True)
        else:
            subprocess.run(["crontab", "-r"], capture_output=True)


def test_a_reboot_brings_the_agent_back_with_its_pipeline(board, bundle, monkeypatch, tmp_path) -> None:
    """No systemd here: deploy adds an @reboot crontab line (where crontab exists) running the recorded
    boot script. A reboot - every process of the supervisor's session killed, pid files left behind,
    then the boot command run as cron runs it - brings the agent back serving the same pipeline;
    undeploy removes that line and only it."""
    import time

    from parapipe.deploy import supervisor_pid

    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    folder, _ = bundle
    workdir = Path(board.workdir)
    theirs = "# the user's own jobs\n0 3 * * * true\n"
    with _users_crontab(theirs) as before:
        result = deploy(board, folder)
        assert deploy(board, folder).supervisor == result.supervisor  # a redeploy adds nothing
        if before is None:
            assert result.supervisor == "none"
            boot = f"sh {shlex.quote(str(workdir / 'agent.boot'))}"
        else:
            assert result.supervisor == "cron"
            cron = subprocess.run(["crontab", "-l"], capture_output=True, text=True, check=True).stdout
            ours = [line for line in cron.splitlines() if line.startswith("@reboot ")]
            assert len(ours) == 1 and cron.startswith(theirs)
            boot = ours[0].removeprefix("@reboot ").replace("\\%", "%")
        with BoardConnection(board) as conn:
            supervisor = supervisor_pid(conn, conn.path(board.workdir))
        assert supervisor is not None
        os.killpg(supervisor, signal.SIGKILL)  # the power goes: the supervisor and the agent at once
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in _session(supervisor)):
            assert time.monotonic() < deadline, "the supervisor's session outlived SIGKILL"
            time.sleep(0.1)
        env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), "SHELL": "/bin/sh"}
        subprocess.run(["sh", "-c", boot], env=env, cwd="/", check=True, timeout=60)  # what cron runs at boot
        with BoardConnection(board) as conn, agent_client(conn) as client:
            while not client.ready():
                assert time.monotonic() < deadline + 60, "the agent started at boot did not resume its pipeline"
                time.sleep(0.2)
            status = client.status()
            assert status.running_bundle == result.bundle_sha256 and status.resumed and status.boots == 2
        undeploy(board)
        if before is not None:
            after = subprocess.run(["crontab", "-l"], capture_output=True, text=True, check=True).stdout
            assert after == theirs, "undeploy left its crontab line or removed the user's"
        assert not (workdir / "agent.boot").exists()


class _WithoutFlock(BoardConnection):
    """A board without util-linux's flock: every command runs with a PATH that lacks it."""

    bin: Path

    def shell(self, command: str, *args, **kwargs):
        return super().shell(f"env PATH={shlex.quote(str(self.bin))} {command}", *args, **kwargs)


# what a board without util-linux still has (coreutils or busybox), besides crontab
_BASE_TOOLS = ("sh", "grep", "mkdir", "rmdir", "sleep", "cat", "ln", "readlink", "rm", "ls", "uname", "date", "stat")
_BASE_TOOLS += ("sed", "cut")


def _without_flock(board: Board, folder: Path, crontab: str | None = None) -> _WithoutFlock:
    """``crontab``: a script to stand for crontab (else the real one)."""
    folder.mkdir(exist_ok=True)
    for tool in (*_BASE_TOOLS, "crontab"):
        if not (folder / tool).exists():
            if tool == "crontab" and crontab is not None:
                (folder / tool).write_text(crontab)
                (folder / tool).chmod(0o755)
            else:
                (folder / tool).symlink_to(shutil.which(tool) or tool)
    conn = _WithoutFlock(board)
    conn.bin = folder
    return conn


def _editing(lines: set[str]) -> set[str]:
    """Which of ``lines`` have a crontab edit (``sh -c SCRIPT sh LINE ...``) running on this machine (the board) now."""
    seen = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(argv) > 4 and argv[1] == b"-c" and argv[4].decode(errors="replace") in lines:
                seen.add(argv[4].decode())
    return seen


def _holder(pid: int) -> str:
    """What a crontab link lock of process ``pid`` on this machine (the board) names: host, pid, start time."""
    started = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
    return f"{os.uname().nodename} {pid} {started}"


@pytest.mark.parametrize("lock", ["flock", "link"])
def test_concurrent_crontab_edits_lose_no_line(board, tmp_path, lock) -> None:
    """Deploys and undeploys of several workdirs of one board at once edit its crontab without losing
    a line: each edit holds ~/.parapipe-crontab.lock (flock; a link lock where the board has no
    flock). While another edit holds the lock every edit waits, then each runs in turn; and a burst
    of edits with nothing held keeps every line too. The user's own lines are kept throughout."""
    import fcntl
    import time

    from parapipe.deploy import CRON_MARK, CRONTAB_LOCK, edit_crontab

    if shutil.which("crontab") is None:
        pytest.skip("no crontab here")
    if lock == "flock" and shutil.which("flock") is None:
        pytest.skip("no flock here")

    def connect() -> BoardConnection:
        return _without_flock(board, tmp_path / "bin") if lock == "link" else BoardConnection(board)

    def line(name: str) -> str:
        return f"@reboot sh {shlex.quote(str(tmp_path / name / 'agent.boot'))} {CRON_MARK} {tmp_path / name}"

    def crontab() -> list[str]:
        return subprocess.run(["crontab", "-l"], capture_output=True, text=True, check=True).stdout.splitlines()

    def at_once(edits: list[tuple[str, bool]]) -> tuple[list[object], list[threading.Thread]]:
        """Start the edits together, each on its own connection; (their results, their threads)."""
        conns = [connect() for _ in edits]  # connected first: the edits themselves start together
        results: list[object] = [RuntimeError("did not finish")] * len(edits)
        start = threading.Barrier(len(edits))

        def one(i: int) -> None:
            start.wait()
            try:
                results[i] = edit_crontab(conns[i], edits[i][0], add=edits[i][1])
            except Exception as exc:  # reported by the assertion on the results
                results[i] = exc
            finally:
                conns[i].close()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(edits))]
        for t in threads:
            t.start()
        return results, threads

    theirs = "# the user's own jobs\n0 3 * * * true\n"
    with _users_crontab(theirs):
        with connect() as conn:
            home = Path(conn.home())
            old = [line(f"old{i}") for i in range(3)]
            for x in old:
                assert edit_crontab(conn, x, add=True) == lock
        assert crontab() == theirs.splitlines() + old

        # another deploy holds the lock: three undeploys and six deploys all wait for it, then go in turn
        new = [line(f"new{i}") for i in range(6)]
        edits = [(x, False) for x in old] + [(x, True) for x in new]
        held = home / CRONTAB_LOCK
        holder = open(held, "a") if lock == "flock" else None  # released below
        if holder is not None:
            fcntl.flock(holder, fcntl.LOCK_EX)
        else:  # held by a running edit: this test's process
            (home / f"{CRONTAB_LOCK}.held").symlink_to(_holder(os.getpid()))
        threads: list[threading.Thread] = []
        try:
            results, threads = at_once(edits)
            deadline = time.monotonic() + 60  # a hang guard
            while _editing({x for x, _ in edits}) != {x for x, _ in edits}:
                assert crontab() == theirs.splitlines() + old, "a crontab edit went ahead of the lock's holder"
                assert time.monotonic() < deadline, "the edits did not all start"
                time.sleep(0.05)
            time.sleep(0.5)
            assert crontab() == theirs.splitlines() + old, "a crontab edit went ahead of the lock's holder"
            assert all(t.is_alive() for t in threads)
        finally:
            if holder is not None:
                holder.close()
            else:
                (home / f"{CRONTAB_LOCK}.held").unlink(missing_ok=True)
            for t in threads:  # before the user's crontab is put back, whatever happened
                t.join(120)
        assert results == [lock] * len(edits), results
        assert crontab()[:2] == theirs.splitlines() and sorted(crontab()[2:]) == sorted(new)

        # nothing held: eight edits at once, each of its own line, none lost
        burst = [line(f"burst{i}") for i in range(8)]
        results, threads = at_once([(x, True) for x in burst])
        for t in threads:
            t.join(120)
        assert results == [lock] * len(burst), results
        assert crontab()[:2] == theirs.splitlines() and sorted(crontab()[2:]) == sorted(new + burst)
        assert not os.path.lexists(home / f"{CRONTAB_LOCK}.held"), "the link lock was left behind"


def test_a_crontab_lock_left_by_a_killed_edit_is_taken_over(board, tmp_path, monkeypatch) -> None:
    """On a board without flock, an edit killed outright (SIGKILL: no trap runs) leaves its link lock; the
    next edit finds its holder gone and takes the lock over, as it does a lock whose pid now is another
    process, or another host's lock once it is old. A running edit's lock, and another host's young one,
    are waited for, and reported after the wait naming their holder."""
    import time

    from parapipe import deploy as deploy_module
    from parapipe.deploy import CRON_MARK, CRONTAB_LOCK, edit_crontab

    if shutil.which("crontab") is None:
        pytest.skip("no crontab here")
    monkeypatch.setattr(deploy_module, "CRONTAB_LOCK_WAIT_S", 3)  # a lock not taken over fails in seconds

    def line(name: str) -> str:
        return f"@reboot sh {shlex.quote(str(tmp_path / name / 'agent.boot'))} {CRON_MARK} {tmp_path / name}"

    def crontab() -> list[str]:
        return subprocess.run(["crontab", "-l"], capture_output=True, text=True, check=True).stdout.splitlines()

    stuck = tmp_path / "stuck"  # while this file exists, crontab waits: an edit holding the lock
    entered = tmp_path / "entered"  # crontab ran: the edit holds the lock
    wrapper = (
        f"#!/bin/sh\n: > {shlex.quote(str(entered))}\nwhile [ -e {shlex.quote(str(stuck))} ]; do sleep 0.1; done\n"
    )
    wrapper += f'exec {shlex.quote(shutil.which("crontab") or "crontab")} "$@"\n'
    theirs = "# the user's own jobs\n0 3 * * * true\n"
    with _users_crontab(theirs), _without_flock(board, tmp_path / "stuck-bin", crontab=wrapper) as conn:
        home = Path(conn.home())
        held = home / f"{CRONTAB_LOCK}.held"
        held.unlink(missing_ok=True)
        # an edit killed outright while it holds the lock
        stuck.touch()
        killed = line("killed")
        outcome: list[object] = []
        editor = threading.Thread(target=lambda: outcome.append(_result_of(edit_crontab, conn, killed, True)))
        editor.start()
        try:
            deadline = time.monotonic() + 30  # a hang guard
            while not (entered.exists() and _editors(killed)):
                assert time.monotonic() < deadline, "the edit never took the lock"
                time.sleep(0.05)
            for pid in _editors(killed):
                os.kill(pid, signal.SIGKILL)
        finally:
            stuck.unlink()
            editor.join(60)
        assert isinstance(outcome[0], DeployError)
        left = os.path.lexists(held)
    first = line("first")
    with _users_crontab(theirs), _without_flock(board, tmp_path / "bin") as conn:
        assert edit_crontab(conn, first, add=True) == "link"
        assert crontab() == [*theirs.splitlines(), first]
        assert left and not os.path.lexists(held), "the killed edit left no lock, or the next edit left its own"

        # a pid that is now another process (its start time differs): taken over
        me = _holder(os.getpid())
        held.symlink_to(me.rsplit(" ", 1)[0] + " 1")
        assert edit_crontab(conn, first, add=False) == "link"
        assert crontab() == theirs.splitlines() and not os.path.lexists(held)

        # another host's lock: waited for while young, taken over once old
        held.symlink_to(f"{os.uname().nodename}-other 4242 77")
        with pytest.raises(DeployError, match=r"held for 3 s by a running edit .*-other 4242 77"):
            edit_crontab(conn, first, add=True)
        old = time.time() - deploy_module.CRONTAB_LOCK_STALE_S - 60
        os.utime(held, (old, old), follow_symlinks=False)
        assert edit_crontab(conn, first, add=True) == "link"
        assert crontab() == [*theirs.splitlines(), first] and not os.path.lexists(held)

        # a running edit's lock (this test's process) is never taken over
        held.symlink_to(me)
        try:
            with pytest.raises(DeployError, match="held for 3 s by a running edit"):
                edit_crontab(conn, line("second"), add=True)
            assert crontab() == [*theirs.splitlines(), first] and os.readlink(held) == me
        finally:
            held.unlink()


def _result_of(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # the caller asserts on it
        return exc


def _editors(line: str) -> list[int]:
    """The pids of the shells running a crontab edit of ``line`` on this machine (the board) now."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(argv) > 4 and argv[1] == b"-c" and argv[4].decode(errors="replace") == line:
                pids.append(int(entry.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False


def _session(sid: int) -> list[int]:
    """The processes of session ``sid`` (the supervisor was started with setsid)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:
                pids.append(int(entry.name))
    return pids


def test_the_systemd_unit_is_valid_and_runs_the_agent_exactly(tmp_path) -> None:
    """Where the board runs systemd, deploy installs this unit instead of the restart loop: it must
    pass ``systemd-analyze verify``, restart the agent always (but not after it refused its
    configuration, exit 2), start at boot, and run the agent's command line exactly, whatever the
    workdir is called."""
    import configparser

    from parapipe.deploy import agent_argv, unit_text

    plain = tmp_path / "board dir; $(touch pwned) & x %h"
    quoted = tmp_path / "board dir 'q' \\ \"end\""  # systemd refuses these in a program's path
    for wd, user, target in ((plain, False, "multi-user.target"), (quoted, True, "default.target")):
        argv = agent_argv(str(wd), 50051)
        (wd / "venv" / "bin").mkdir(parents=True)
        (wd / "venv" / "bin" / "python").symlink_to(sys.executable)  # verify checks the program exists
        text = unit_text(str(wd), argv, user=user)
        unit = tmp_path / f"parapipe-agent-{'0' * 12}.service"
        unit.write_text(text)
        if shutil.which("systemd-analyze"):
            out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
            assert out.returncode == 0 and unit.name not in out.stderr, out.stderr
        ini = configparser.ConfigParser(interpolation=None, strict=True)
        ini.optionxform = str  # type: ignore[assignment,method-assign]
        ini.read_string(text)
        service = ini["Service"]
        assert service["Restart"] == "always" and service["RestartPreventExitStatus"] == "2"
        assert ini["Install"]["WantedBy"] == target
        assert service["WorkingDirectory"].replace("%%", "%") == str(wd)
        program, *args = shlex.split(service["ExecStart"])
        got = [program.replace("%%", "%"), *(a.replace("$$", "$").replace("%%", "%") for a in args)]
        if wd == quoted:  # run through sh, which is given the agent's command line as arguments
            assert got[:3] == ["/bin/sh", "-c", 'exec "$0" "$@"']
            got = got[3:]
        assert got == argv
    assert not (tmp_path / "pwned").exists()


def test_deploy_with_metrics_serves_them_on_the_boards_loopback(board, bundle, monkeypatch, tmp_path, exported) -> None:
    """``deploy --metrics`` on an SSH board: the agent serves Prometheus metrics on the board's loopback
    (scraped here through an SSH tunnel, parsed by prometheus_client's parser) counting the frames sent;
    run/profile's ensure_agent keeps them on; a deploy without --metrics restarts the agent without them."""
    import urllib.request

    import numpy as np
    import onnx

    from parapipe.deploy import ensure_agent
    from tests.support.packages import folders_for

    for folder in folders_for(
        "prometheus_client", "prometheus-client-0.26.0", "prometheus-client==0.26.0", no_deps=True
    ):
        if str(folder) not in sys.path:  # this process parses the scrapes
            sys.path.insert(0, str(folder))
    from prometheus_client.parser import text_string_to_metric_families

    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path / "home"))
    folder, _compiled = bundle
    first = deploy(board, folder, metrics=True)
    port = board.agent_port + 1
    assert first.metrics_address == f"127.0.0.1:{port}" and first.agent_restarted
    (spec,) = onnx.load(str(exported("squeezenet1_1").path), load_external_data=False).graph.input
    shape = [d.dim_value for d in spec.type.tensor_type.shape.dim]
    frame = {spec.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}

    def scrape(conn: BoardConnection) -> dict[str, float]:
        with conn.forward(port) as fwd:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{fwd.port}/metrics", timeout=30) as r:
                    text = r.read().decode()
            except OSError as exc:  # say why the board refused the tunnel's connection, if it did
                raise OSError(f"{exc!r}; the forward's failures: {fwd.failures}") from exc
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}

    with BoardConnection(board) as conn:
        with agent_client(conn) as client:
            for _ in range(3):
                client.infer(frame)
        samples = scrape(conn)
    assert samples["parapipe_frames_completed_total"] == 3 and samples["parapipe_pipeline_ready"] == 1
    assert not ensure_agent(board), "run/profile restarted the agent (and would have dropped its metrics)"
    with BoardConnection(board) as conn:
        assert scrape(conn)["parapipe_frames_completed_total"] == 3
    plain = deploy(board, folder)
    assert plain.agent_restarted and plain.metrics_address == ""
    with BoardConnection(board) as conn, pytest.raises(OSError):
        scrape(conn)
    undeploy(board)


def test_a_forward_the_board_refuses_says_why_and_a_closed_forward_stops_listening(board, tmp_path) -> None:
    """Nothing listens on the board's port: the connection is closed, and the forward keeps why (TCP can
    only say "reset"); once closed, its local port refuses connections (no accept thread left behind)."""
    import socket

    nothing = free_port()
    with BoardConnection(board) as conn:
        with conn.forward(nothing) as fwd:
            with socket.create_connection(("127.0.0.1", fwd.port), timeout=30) as sock:
                sock.settimeout(30)
                with contextlib.suppress(ConnectionResetError):
                    assert sock.recv(1) == b""
            deadline = time.monotonic() + 30
            while not fwd.failures:
                assert time.monotonic() < deadline, "the refused connection was not recorded"
                time.sleep(0.05)
            assert f"127.0.0.1:{nothing}" in fwd.failures[0]
        assert not fwd.thread.is_alive()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", fwd.port), timeout=5).close()
