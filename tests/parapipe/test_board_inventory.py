"""The board inventory under concurrent writers, and bad inventory files as one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from parapipe.app import fails_cleanly
from parapipe.cli import app

ROOT = Path(__file__).resolve().parents[2]
GUARD_S = 120.0


def test_concurrent_boards_add_keeps_every_board(tmp_path: Path) -> None:
    key, known = tmp_path / "key", tmp_path / "known_hosts"
    key.write_text("not read by boards add")
    known.write_text("")
    env = dict(os.environ, PARAPIPE_HOME=str(tmp_path / "home"))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    names = [f"b{i}" for i in range(6)]
    base = ["--host", "h", "--user", "u", "--key", str(key), "--known-hosts", str(known), "--device", "local"]
    procs = [
        subprocess.Popen([sys.executable, "-m", "parapipe", "boards", "add", n, *base], env=env, stderr=subprocess.PIPE)
        for n in names
    ]
    for p in procs:
        _, stderr = p.communicate(timeout=GUARD_S)
        assert p.returncode == 0, stderr.decode()
    listed = subprocess.run(
        [sys.executable, "-m", "parapipe", "boards", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    import json

    assert sorted(b["name"] for b in json.loads(listed.stdout)) == names
    assert not [p for p in (tmp_path / "home").iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize(
    "text",
    ["boards = 5\n", "[boards]\nx = 5\n", '[boards.x]\nhost = "h"\nport = "22"\n', "[boards.x]\ntimeout_s = true\n"],
)
def test_a_bad_inventory_is_one_line_and_exit_2(tmp_path: Path, monkeypatch, text: str) -> None:
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    (tmp_path / "boards.toml").write_text(text)
    result = CliRunner().invoke(app, ["boards", "list"])
    assert result.exit_code == 2, result.output
    assert "boards" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[boards.x]\nhost = "h"\nport = "22"\n', "boards.x.port"),
        ('[boards.x]\nhots = "h"\n', "boards.x.hots: unknown field"),
        ("[boards.x]\ntimeout_s = true\n", "boards.x.timeout_s"),
        ("[boards]\nx = 5\n", "boards.x: expected an object (a table) of fields"),
    ],
)
def test_a_malformed_inventory_is_one_line_naming_the_field(tmp_path: Path, monkeypatch, text: str, field: str) -> None:
    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    (tmp_path / "boards.toml").write_text(text)
    result = CliRunner().invoke(app, ["boards", "list"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and field in lines[0] and "parapipe boards add" in lines[0], result.output


def test_an_inventory_round_trips_through_its_schema(tmp_path: Path, monkeypatch) -> None:
    from parapipe.boards import Board, load_boards, save_boards

    monkeypatch.setenv("PARAPIPE_HOME", str(tmp_path))
    board = Board("b1", "10.0.0.7", 2222, "pi", "/k", "rpi5", host_key_sha256="SHA256:x", timeout_s=20)
    save_boards({"b1": board})
    assert load_boards() == {"b1": board}
    (tmp_path / "boards.toml").write_text(
        '[boards.b2]\nhost = "h"\nport = 22\nuser = "u"\nkey = "k"\ndevice = "local"\n'
    )
    assert load_boards()["b2"] == Board("b2", "h", 22, "u", "k", "local")


def test_an_agent_failure_is_a_user_error() -> None:
    from agents.client import AgentError

    @fails_cleanly
    def failing() -> None:
        raise AgentError("infer: UNAVAILABLE: the board went away")

    with pytest.raises(typer.Exit) as info:
        failing()
    assert info.value.exit_code == 2


def test_agent_status_with_a_missing_token_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["agent", "status", "--address", "127.0.0.1:1", "--token-file", str(tmp_path / "nope")]
    )
    assert result.exit_code == 2 and "cannot read" in result.output


@pytest.mark.parametrize(
    ("kind", "content", "needle"),
    [
        ("plan", {"version": 1, "model_sha256": "x", "device": "local", "blocks": {"b": ["n"]},
                  "stages": [{"groups": [[{"pu": "cpu", "cores": 1, "blocks": ["b"]}]]}],
                  "provenance": {"seconds": "fast"}}, "provenance.seconds"),
        ("plan", {"version": 1, "model_sha256": "x", "device": "local", "blocks": {"b": ["n"]},
                  "stages": [{"groups": [[{"pu": "cpu", "cores": 1, "blocks": ["b"]}]]}], "notes": 5}, "notes"),
        ("plan", {"version": 1, "model_sha256": "x", "device": "local", "blocks": [[1]], "stages": []}, "blocks"),
    ],
)  # fmt: skip
def test_bad_plan_files_are_one_line_errors(tmp_path, kind: str, content: dict, needle: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(content))
    done = subprocess.run([sys.executable, "-m", "parapipe", "show", str(path)], capture_output=True, text=True)
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("content", [b'{"version": 1, "entries": [5]}', b"\xff\xfe not utf-8", b'{"version": 1}'])
def test_bad_cost_tables_are_one_line_errors(tmp_path, content: bytes) -> None:
    costs = tmp_path / "costs.json"
    costs.write_bytes(content)
    from profiler.costtable import CostTable, CostTableError

    with pytest.raises(CostTableError, match="move"):
        CostTable.load(costs)
