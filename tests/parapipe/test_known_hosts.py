"""A board whose known_hosts file vanished, turned into a folder, or holds lines paramiko cannot read:
every command that reaches the board ends with one clear line naming the file and what to do, exit 2,
never a traceback (the installed ``parapipe`` command against a real sshd on loopback)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.support.cli import run_cli
from tests.support.sshd import free_port, start_sshd, stop_sshd

ED25519 = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"  # some other key
HASHED = "|1|c2FsdA==|aGFzaA=="  # a hashed host name whose salt is 4 bytes, not 20


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    info, proc = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield info
    stop_sshd(proc)


@pytest.fixture(scope="module")
def model_and_plan(tmp_path_factory) -> tuple[Path, Path]:
    """A two-node model and a plan of it for the board's device (``local``)."""
    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from planner.baselines import flop_pipeline

    folder = tmp_path_factory.mktemp("model")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    w = numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"), helper.make_node("Relu", ["t"], ["y"], name="r")]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [w])
    model = folder / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model)
    loaded = load_onnx(model)
    plan = flop_pipeline(
        coarsen(build_graph(loaded.proto, loaded.sha256), "coarse"), load_profile("local"), [("cpu", 1)]
    )
    return model, plan.save(folder / "plan.json")


@pytest.fixture
def added(sshd, tmp_path) -> tuple[Path, Path]:
    """(PARAPIPE_HOME, the known_hosts file) of a board `loopback` added with a copy of the sshd's known_hosts."""
    home, known = tmp_path / "home", tmp_path / "known_hosts"
    shutil.copy(sshd.known_hosts, known)
    done = run_cli(
        "boards", "add", "loopback", "--device", "local", "--host", "127.0.0.1", "--port", str(sshd.port),
        "--user", sshd.user, "--key", str(sshd.user_key), "--known-hosts", str(known), "--python", sys.executable,
        "--workdir", str(tmp_path / "workdir"), "--agent-port", str(free_port()), home=home, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return home, known


def _vanished(known: Path) -> None:
    known.unlink()


def _dangling(known: Path) -> None:
    known.unlink()
    known.symlink_to(known.parent / "gone")


def _a_folder(known: Path) -> None:
    known.unlink()
    known.mkdir()


def _not_text(known: Path) -> None:
    known.write_bytes(b"\xff\xfe\x00junk\n")


def _bad_base64(known: Path) -> None:
    host = known.read_text().split()[0]
    known.write_text(f"{host} ssh-ed25519 AAAA!!!notbase64\n")  # paramiko: InvalidHostKey


def _truncated_rsa(known: Path) -> None:
    host = known.read_text().split()[0]
    known.write_text(f"{host} ssh-rsa AAAAB3NzaC1yc2EAAAAD\n")  # the crypto library: ValueError


def _cert_authority(known: Path) -> None:
    known.write_text(f"@cert-authority * ssh-ed25519 {ED25519}\n")  # paramiko: InvalidHostKey


def _bad_hashed_name(known: Path) -> None:
    known.write_text(f"{HASHED} ssh-ed25519 {ED25519}\n")  # paramiko: AssertionError mid-connection


# what damaged the file -> what the error must say besides the file's name
FILE_GONE = {_vanished: "No such file", _dangling: "No such file", _a_folder: "a folder", _not_text: "not text"}
BAD_LINES = {
    _bad_base64: "line 1",
    _truncated_rsa: "line 1",
    _cert_authority: "@cert-authority",
    _bad_hashed_name: "line 1",
}


def _commands(home: Path, model: Path, plan: Path) -> dict[str, list[str]]:
    return {
        "boards check": ["boards", "check", "loopback"],
        "deploy": ["deploy", str(plan), "--board", "loopback", "--model", str(model)],
        "undeploy": ["undeploy", "--board", "loopback"],
        "run": ["run", str(plan), "--board", "loopback", "--model", str(model), "--frames", "1"],
        "profile --board": ["profile", str(model), "--board", "loopback", "--repeats", "3"],
    }


def _assert_clean_failure(done, command: str, known: Path, needles: tuple[str, ...]) -> None:
    said = done.stderr + done.stdout
    assert "Traceback" not in said, f"{command}: a traceback\n{said[-3000:]}"
    assert done.returncode == 2, f"{command}: exit {done.returncode}\n{said[-3000:]}"
    assert str(known) in said, f"{command}: the message does not name {known}\n{said}"
    for needle in needles:
        assert needle in said, f"{command}: the message does not say {needle!r}\n{said}"


@pytest.mark.parametrize("damage", list(FILE_GONE) + list(BAD_LINES), ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_known_hosts_file_is_a_clear_error_from_every_command(added, model_and_plan, damage) -> None:
    home, known = added
    model, plan = model_and_plan
    damage(known)
    if damage in FILE_GONE:  # the file itself: restore it or add the board again
        needles = (FILE_GONE[damage], "known_hosts file", "parapipe boards add loopback")
    else:  # lines that cannot be read are skipped as OpenSSH skips them; the board's key is then unknown
        needles = (BAD_LINES[damage], "could not be read", "refusing an unknown host key")
    commands = _commands(home, model, plan)
    if damage not in (_vanished, _bad_base64):  # every command for one of each kind, `boards check` for the rest
        commands = {"boards check": commands["boards check"]}
    for command, argv in commands.items():
        _assert_clean_failure(run_cli(*argv, home=home, timeout=300), command, known, needles)


def test_unreadable_lines_beside_the_boards_own_line_are_skipped(added, sshd) -> None:
    """As OpenSSH does: the lines paramiko cannot read are skipped, the board's own line is used."""
    home, known = added
    own = sshd.known_hosts.read_text()
    junk = [
        f"@cert-authority * ssh-ed25519 {ED25519}",
        f"{HASHED} ssh-ed25519 {ED25519}",
        "x ssh-rsa AAAAB3NzaC1yc2EAAAAD",
    ]
    known.write_text("\n".join([*junk, "not a line", own]))
    done = run_cli("boards", "check", "loopback", "--json", home=home, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_a_revoked_key_is_refused_even_when_pinned(added, sshd) -> None:
    """An @revoked line wins over a line trusting the same key and over a pinned fingerprint."""
    import subprocess

    home, known = added
    own = sshd.known_hosts.read_text().split()
    known.write_text(f"{' '.join(own)}\n@revoked * {own[1]} {own[2]}\n")
    done = run_cli("boards", "check", "loopback", home=home, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "unknown host key" in done.stderr, done.stderr
    fp = subprocess.run(["ssh-keygen", "-lf", f"{sshd.host_key}.pub"], capture_output=True, text=True, check=True)
    pinned = run_cli(
        "boards", "add", "loopback", "--device", "local", "--host", "127.0.0.1", "--port", str(sshd.port),
        "--user", sshd.user, "--key", str(sshd.user_key), "--known-hosts", str(known),
        "--host-key", fp.stdout.split()[1], home=home, timeout=120,
    )  # fmt: skip
    assert pinned.returncode == 0, pinned.stderr
    done = run_cli("boards", "check", "loopback", home=home, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "@revoked" in done.stderr, done.stderr


def test_boards_add_refuses_a_known_hosts_file_it_cannot_read(tmp_path) -> None:
    key = tmp_path / "key"
    key.write_text("k")
    for damage in (_a_folder, _not_text):
        known = tmp_path / f"known_hosts{damage.__name__}"
        known.write_text("")
        damage(known)
        done = run_cli(
            "boards", "add", "b", "--device", "local", "--host", "h", "--user", "u", "--key", str(key),
            "--known-hosts", str(known), home=tmp_path / "home", timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert str(known) in done.stderr and "--known-hosts FILE" in done.stderr, done.stderr
