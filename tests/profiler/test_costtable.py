"""CostTable: keyed by content, merged on save, written atomically, refusing unknown versions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.costtable import Conditions, CostEntry, CostTable, CostTableError, entry_key


def _entry(name: str, ms: float, board: str = "local") -> CostEntry:
    cond = Conditions(board, "cpu", 1, 1, "CPUExecutionProvider", "1.0", "all")
    return CostEntry(entry_key("sha", "block", (name,), cond), "block", "sha", name, (name,), cond, ms, ms, ms, ms, 10)


def test_key_depends_on_every_condition() -> None:
    base = Conditions("local", "cpu", 1, 1, "CPUExecutionProvider", "1.0", "all")
    keys = {entry_key("sha", "block", ("a",), base)}
    for change in (
        {"board": "rpi5"},
        {"cores": 2},
        {"threads": 2},
        {"ep": "X"},
        {"ort_version": "2.0"},
        {"opt_level": "disable"},
    ):
        keys.add(entry_key("sha", "block", ("a",), Conditions(**{**base.__dict__, **change})))
    keys.add(entry_key("other", "block", ("a",), base))
    keys.add(entry_key("sha", "op", ("a",), base))
    assert len(keys) == 9
    assert entry_key("sha", "block", ("a", "b"), base) == entry_key("sha", "block", ("b", "a"), base)


def test_save_merges_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    first, second = CostTable(), CostTable()
    first.add(_entry("a", 1.0))
    second.add(_entry("b", 2.0))
    first.save(path)
    assert second.save(path) == 2, "saving must merge with what is on disk, not overwrite it"
    loaded = CostTable.load(path)
    assert sorted(e.name for e in loaded) == ["a", "b"]
    assert loaded.entries == second.entries
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".costs.json.tmp")]


def test_unknown_version_and_garbage_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"version": 42, "entries": []}))
    with pytest.raises(CostTableError, match="version 42"):
        CostTable.load(path)
    path.write_text("{not json")
    with pytest.raises(CostTableError, match="move it away"):
        CostTable.load(path)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda e: e.update(members="a"), "entries[0].members"),
        (lambda e: e["conditions"].update(cores="1"), "entries[0].conditions.cores"),
        (lambda e: e["conditions"].pop("board"), "entries[0].conditions.board: missing field"),
        (lambda e: e.update(mean_ms=None), "entries[0].mean_ms"),
        (lambda e: e.update(repeats=True), "entries[0].repeats"),
        (lambda e: e.update(colour="red"), "entries[0].colour: unknown field"),
    ],
)
def test_a_malformed_entry_is_one_line_naming_the_field(tmp_path: Path, change, field: str) -> None:
    table = CostTable()
    table.add(_entry("a", 1.0))
    data = json.loads(json.dumps(table.to_json()))
    change(data["entries"][0])
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CostTableError) as info:
        CostTable.load(path)
    message = str(info.value)
    assert f"({field}" in message and "\n" not in message, message
    assert "move the file away" in message


def test_a_table_written_before_precisions_loads_with_integer_times(tmp_path: Path) -> None:
    table = CostTable()
    table.add(_entry("a", 2.0))
    data = json.loads(json.dumps(table.to_json()))
    data["entries"][0]["mean_ms"] = 2  # JSON written by hand or another tool: an integer time
    assert "precision" not in data["entries"][0]["conditions"]
    (entry,) = CostTable.from_json(data)
    assert entry.mean_ms == 2.0 and entry.conditions.precision == "fp32" and entry.members == ("a",)
    assert entry == _entry("a", 2.0).__class__(**{**entry.__dict__})
