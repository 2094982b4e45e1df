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
