"""Profiles load and validate; every malformed profile is refused naming the field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from device_profiles.loader import SHIPPED_DIR, load_profile, parse_profile, shipped_names
from device_profiles.schema import SOURCES, ProfileError
from parapipe.cli import app

SHIPPED = ["khadas-vim3", "bst-a1000", "jetson-orin-nano", "rpi5", "cloud-x86", "vim3-cloud"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load_with_sources(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    for path, q in profile.quantities():
        assert q.source in SOURCES, path
        assert q.source != "measured", f"{path}: nobody measured {name}; it must not claim to be measured"
        assert q.cite, f"{path}: an unmeasured number needs a citation"


def test_required_boards_are_shipped() -> None:
    assert set(SHIPPED) | {"local", "local-biglittle"} <= set(shipped_names())
    vim3 = load_profile("khadas-vim3")
    kinds = sorted(p.kind for p in vim3.pus)
    assert kinds == ["cpu", "cpu", "gpu", "npu"]
    assert load_profile("bst-a1000").pu("npu").supported_ops, "an NPU runs only some ops"
    assert len([p for p in load_profile("bst-a1000").pus if p.kind == "dsp"]) == 2
    cloud = load_profile("vim3-cloud")
    assert {h.name for h in cloud.hosts} == {"vim3", "cloud"} and cloud.network


def test_local_profile_is_built_from_this_host() -> None:
    import os

    local = load_profile("local")
    assert sorted(c for p in local.pus for c in p.cores) == sorted(os.sched_getaffinity(0))
    assert local.origin == "built at run time"
    assert any("modelled" in n for n in local.notes)


def test_local_biglittle_throttles_one_core_or_says_why() -> None:
    try:
        bl = load_profile("local-biglittle")
    except ProfileError as exc:
        assert "unavailable" in str(exc) or "two cores" in str(exc)
        pytest.skip(str(exc))
    little = bl.pu("little")
    assert little.throttle is not None and 0 < little.throttle.quota_percent < 100
    assert bl.pu("big").throttle is None


def test_a_profile_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text((SHIPPED_DIR / "rpi5.toml").read_text().replace('name = "rpi5"', 'name = "mine"'))
    assert load_profile(str(path)).name == "mine"


def _base() -> dict:
    return tomllib.loads((SHIPPED_DIR / "khadas-vim3.toml").read_text())


def _refused(data: dict, field: str) -> str:
    with pytest.raises(ProfileError) as info:
        parse_profile(data)
    assert field in str(info.value), str(info.value)
    return str(info.value)


def test_missing_field() -> None:
    data = _base()
    del data["pus"][0]["memory_bytes"]
    _refused(data, "pus[0].memory_bytes: missing field")


def test_negative_number() -> None:
    data = _base()
    data["pus"][1]["idle_power_w"]["value"] = -0.5
    _refused(data, "pus[1].idle_power_w.value")


def test_nan_number() -> None:
    data = _base()
    data["pus"][0]["peak_gflops"]["conv"]["value"] = float("nan")
    assert "finite" in _refused(data, "pus[0].peak_gflops.conv.value")


def test_unknown_op_class() -> None:
    data = _base()
    data["pus"][0]["peak_gflops"]["winograd"] = {"value": 1.0, "source": "estimate", "cite": "x"}
    assert "unknown op class" in _refused(data, "pus[0].peak_gflops.winograd")


def test_overlapping_cores() -> None:
    data = _base()
    data["pus"][1]["cores"] = [1, 2]
    assert "also in PU 'a73'" in _refused(data, "pus[1].cores")


def test_link_to_unknown_pu() -> None:
    data = _base()
    data["links"][0]["b"] = "tpu"
    assert "unknown PU 'tpu'" in _refused(data, "links[0].b")


def test_unknown_schema_version() -> None:
    data = _base()
    data["schema_version"] = 99
    _refused(data, "schema_version")


def test_unknown_source_and_missing_citation() -> None:
    data = _base()
    data["pus"][0]["memory_bytes"]["source"] = "guess"
    _refused(data, "pus[0].memory_bytes.source")
    data = _base()
    data["pus"][0]["memory_bytes"]["cite"] = ""
    _refused(data, "pus[0].memory_bytes.cite")


def test_unknown_field_is_named() -> None:
    data = _base()
    data["pus"][0]["frequency"] = 2.2
    _refused(data, "pus[0].frequency: unknown field")


def test_cli_devices_show_refuses_a_bad_profile(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text((SHIPPED_DIR / "rpi5.toml").read_text().replace("schema_version = 1", "schema_version = 7"))
    result = CliRunner().invoke(app, ["devices", "show", str(path)])
    assert result.exit_code == 2
    assert "schema_version" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["devices", "show", "no-such-board"])
    assert result.exit_code == 2 and "khadas-vim3" in result.output


def test_cli_devices_lists_and_shows_sources() -> None:
    result = CliRunner().invoke(app, ["devices", "--json"])
    assert result.exit_code == 0
    assert "khadas-vim3" in result.output
    shown = CliRunner().invoke(app, ["devices", "show", "khadas-vim3", "--json"])
    assert shown.exit_code == 0 and '"source": "spec-sheet"' in shown.output


def test_shared_memories_and_host_cpu_per_launch_parse_with_sources() -> None:
    """``[[memories]]`` (which PUs share a memory, its bandwidth) and a GPU/NPU's ``host_cpu_us_per_tensor`` are
    optional, carry their source like every number, and are refused naming the field when wrong."""
    data = tomllib.loads((SHIPPED_DIR / "khadas-vim3.toml").read_text())
    vim3 = parse_profile(data)
    assert vim3.shared_memory("a73") is vim3.shared_memory("npu") is not None
    assert vim3.pu("npu").host_cpu_us_per_tensor is None  # not stated: the planner uses its default estimate
    data["pus"][3]["host_cpu_us_per_tensor"] = {"value": 250.0, "source": "estimate", "cite": "driver submit"}
    fed = parse_profile(data)
    assert fed.pu("npu").host_cpu_us_per_tensor.value == 250.0
    assert ("pus.npu.host_cpu_us_per_tensor", fed.pu("npu").host_cpu_us_per_tensor) in fed.quantities()
    assert any(path == "memories.lpddr4.bandwidth_gbps" for path, _ in fed.quantities())
    del data["memories"]
    assert parse_profile(data).memories == ()
    for memories, message in (
        ([{"name": "m", "pus": ["nope"], "bandwidth_gbps": {"value": 1.0, "source": "measured"}}], "unknown PU"),
        ([{"name": "m", "pus": ["a73"]}], r"memories\[0\]\.bandwidth_gbps: missing"),
        (
            [
                {"name": "m", "pus": ["a73"], "bandwidth_gbps": {"value": 1.0, "source": "measured"}},
                {"name": "n", "pus": ["a73"], "bandwidth_gbps": {"value": 1.0, "source": "measured"}},
            ],
            "also in memory",
        ),
    ):
        with pytest.raises(ProfileError, match=message):
            parse_profile({**data, "memories": memories})
