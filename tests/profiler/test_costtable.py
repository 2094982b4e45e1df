"""CostTable: keyed by content, merged on save, written atomically, refusing unknown versions; calibration
values in their own section, and tables of version 1 (calibration values as entries) read into it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from device_profiles.loader import load_profile
from profiler.calibration import calibrate
from profiler.costtable import (
    CALIBRATION_UNITS,
    EVERY_UNIT,
    CalibrationRecord,
    Conditions,
    CostEntry,
    CostTable,
    CostTableError,
    entry_key,
)
from profiler.roofline import Roofline
from tests.support.graphs import dag_graph


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
    for version in (42, True, "2"):
        path.write_text(json.dumps({"version": version, "entries": []}))
        with pytest.raises(CostTableError, match=f"version {version}; this parapipe reads versions 1, 2"):
            CostTable.load(path)
    path.write_text("{not json")
    with pytest.raises(CostTableError, match="move it away"):
        CostTable.load(path)


def _learnt(kind: str = "handoff", value: float = 0.3, board: str = "local") -> CalibrationRecord:
    cond = Conditions(board, EVERY_UNIT, 0, 0, "", "1.0", "all")
    return CalibrationRecord.learnt("sha", kind, value, cond, runs=2)  # type: ignore[arg-type]


def _load_error(tmp_path: Path, table: CostTable, section: str, change) -> str:
    """The error loading ``table`` gives once ``change`` spoiled the first record of ``section``."""
    data = json.loads(json.dumps(table.to_json()))
    change(data[section][0])
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CostTableError) as info:
        CostTable.load(path)
    return str(info.value)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda e: e.update(members="a"), "entries[0].members"),
        (lambda e: e.update(kind="handoff"), "entries[0].kind: Input should be 'op', 'block' or 'partition'"),
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
    message = _load_error(tmp_path, table, "entries", change)
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


def test_calibration_values_are_their_own_section_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    table = CostTable()
    table.add(_entry("a", 1.0))
    table.learn(_learnt("handoff", 0.3))
    table.learn(_learnt("power-active-scale", 2.5))
    assert len(table) == 1, "a calibration value is not a timing entry"
    table.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == 2 and [e["kind"] for e in data["entries"]] == ["block"]
    assert sorted(r["kind"] for r in data["calibration"]) == ["handoff", "power-active-scale"]
    assert all("median_ms" not in r for r in data["calibration"]), "no placeholder times"
    loaded = CostTable.load(path)
    assert loaded.calibration == table.calibration and loaded.entries == table.entries
    assert {r.unit for r in loaded.learnt(board="local")} == {"ms", "x"} and not loaded.learnt(board="rpi5")
    # learning the same value again replaces it (same model, kind, scope and conditions)
    again = CostTable()
    again.learn(_learnt("handoff", 0.5))
    again.save(path)
    values = {r.kind: r.value for r in CostTable.load(path).learnt()}
    assert values == {"handoff": 0.5, "power-active-scale": 2.5}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: r.update(kind="speed"), "calibration[0].kind: Input should be 'handoff'"),
        (lambda r: r.update(value="0.3"), "calibration[0].value"),
        (lambda r: r.pop("applies_to"), "calibration[0].applies_to: missing field"),
        (lambda r: r["conditions"].update(threads=None), "calibration[0].conditions.threads"),
        (lambda r: r.update(median_ms=0.0), "calibration[0].median_ms: unknown field"),
    ],
)
def test_a_malformed_calibration_value_is_one_line_naming_the_field(tmp_path: Path, change, field: str) -> None:
    table = CostTable()
    table.learn(_learnt())
    message = _load_error(tmp_path, table, "calibration", change)
    assert f"({field}" in message and "\n" not in message and "move the file away" in message, message


def _v1_entry(kind: str, name: str, members: list[str], ms: float, value: float | None, at: float) -> dict:
    """An entry as parapipe wrote it in a version 1 table (``value`` on every entry, placeholder times)."""
    board_wide = kind in ("handoff", "power")
    cond = {
        "board": "local",
        "pu": "*" if board_wide else "cpu",
        "cores": 0 if board_wide else 1,
        "threads": 0 if board_wide else 1,
        "ep": "" if board_wide else "CPUExecutionProvider",
        "ort_version": "1.20.1",
        "opt_level": "all",
        "throttle_percent": None,
    }
    return {
        "key": f"{kind}-{name}-{at}",
        "kind": kind,
        "model_sha256": "0" * 64,
        "name": name,
        "members": members,
        "conditions": cond,
        "median_ms": ms,
        "mean_ms": ms,
        "p10_ms": ms,
        "p90_ms": ms,
        "repeats": 3,
        "energy_mj": None,
        "energy_source": "measured" if kind == "power" else "none",
        "flops": 0,
        "measured_at": at,
        "value": value,
    }


def test_a_version_1_table_moves_its_handoff_and_power_entries_to_the_calibration_section(tmp_path: Path) -> None:
    """A table tune wrote before calibration values had a section: they load as calibration values, the
    latest of each kind is what ``calibrate`` uses, and saving writes the table in the new format."""
    old = {
        "version": 1,
        "entries": [
            _v1_entry("block", "b0", ["n0a", "n0b"], 1.5, None, 10.0),
            _v1_entry("handoff", "handoff", [], 0.2, None, 20.0),
            _v1_entry("handoff", "handoff", [], 0.75, None, 30.0),  # learnt later (another onnxruntime)
            _v1_entry("power", "active-scale", ["active-scale"], 0.0, 3.0, 20.0),
            _v1_entry("power", "idle-scale", ["idle-scale"], 0.0, 0.5, 20.0),
            _v1_entry("power", "idle-scale", ["idle-scale"], 0.0, None, 5.0),  # no value: meant nothing
        ],
    }
    old["entries"][2]["conditions"]["ort_version"] = "1.22.0"
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(old))
    table = CostTable.load(path)
    assert [e.kind for e in table] == ["block"] and table.entries["block-b0-10.0"].mean_ms == 1.5
    learnt = sorted((r.kind, r.value, r.measured_at) for r in table.learnt())
    assert learnt == [
        ("handoff", 0.2, 20.0),
        ("handoff", 0.75, 30.0),
        ("power-active-scale", 3.0, 20.0),
        ("power-idle-scale", 0.5, 20.0),
    ]
    assert all(r.applies_to == EVERY_UNIT and r.runs == 3 and r.conditions.board == "local" for r in table.learnt())

    op, _ = dag_graph([10**6], [], [4096])
    calibration = calibrate(Roofline(load_profile("local"), op), table)
    assert calibration.handoff_ms == 0.75
    assert (calibration.power_active_scale, calibration.power_idle_scale) == (3.0, 0.5)

    table.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == 2 and {e["kind"] for e in data["entries"]} == {"block"}
    assert all("value" not in e for e in data["entries"])
    assert CostTable.load(path).calibration == table.calibration


def test_a_version_1_entry_of_an_unknown_kind_is_named(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"version": 1, "entries": [_v1_entry("power", "turbo", [], 0.0, 2.0, 1.0)]}))
    with pytest.raises(CostTableError, match=r"\(entries\[0\]: kind 'power' named 'turbo'"):
        CostTable.load(path)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(CALIBRATION_UNITS)),
            st.floats(min_value=0, max_value=1e6, allow_nan=False),
            st.sampled_from(["local", "rpi5"]),
            st.sampled_from([EVERY_UNIT, "cpu", "gpu"]),
        ),
        max_size=6,
    )
)
def test_any_calibration_section_survives_a_round_trip(values) -> None:
    table = CostTable()
    for kind, value, board, applies_to in values:
        cond = Conditions(board, applies_to, 0, 0, "", "1.0", "all")
        table.learn(CalibrationRecord.learnt("sha", kind, value, cond, runs=1, applies_to=applies_to))
    loaded = CostTable.from_json(json.loads(json.dumps(table.to_json())))
    assert loaded.calibration == table.calibration and len(loaded) == 0


def test_a_learnt_frame_overhead_is_the_calibrations_frame_ms(tmp_path: Path) -> None:
    """``tune``'s frame overhead, saved and loaded, is what the cost model adds to a pipelined frame's latency;
    the later of two values learnt is the one in use."""
    op, _ = dag_graph([10**6], [], [4096])
    cond = Conditions("local", EVERY_UNIT, 0, 0, "", "1.0", "all")
    table = CostTable()
    for value in (0.4, 0.55):
        table.learn(CalibrationRecord.learnt(op.model_sha256, "frame-overhead", value, cond, runs=2))
    path = tmp_path / "costs.json"
    table.save(path)
    calibration = calibrate(Roofline(load_profile("local"), op), CostTable.load(path))
    assert calibration.frame_ms == 0.55 and calibration.handoff_ms == 0.0


def test_declined_nodes_are_kept_and_found_per_partition(tmp_path: Path) -> None:
    """What an execution provider declined in a measurement is kept in the table (and read back from its file),
    and found for any partition that holds those nodes; None where nothing of the partition was measured."""
    cond = Conditions("board", "gpu", 1, 1, "CUDAExecutionProvider", "1.0", "all")
    table = CostTable()
    for members, declined in ((("a", "b"), ("b",)), (("c",), ()), (("d", "e"), ("e",))):
        key = entry_key("sha", "block", members, cond)
        table.add(CostEntry(key, "block", "sha", members[0], members, cond, 1, 1, 1, 1, 3, declined=declined))
    table.save(tmp_path / "costs.json")
    loaded = CostTable.load(tmp_path / "costs.json")
    assert loaded.declined("sha", "board", "gpu", ["a", "b", "c", "e"]) == ("b", "e")
    assert loaded.declined("sha", "board", "gpu", ["c"]) == ()
    assert loaded.declined("sha", "board", "gpu", ["z"]) is None
    assert loaded.declined("sha", "board", "cpu", ["a"]) is None
