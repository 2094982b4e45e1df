"""Profiles tell the truth about what drives each unit: execution provider names are onnxruntime's own
(``get_all_providers()``), a unit no onnxruntime release drives is labelled with why, and plans leave such
units out unless asked (``--include-unavailable``: what-if plans, labelled, that the compiler refuses)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from device_profiles.loader import SHIPPED_DIR, load_profile, parse_profile, shipped_names
from device_profiles.schema import ProfileError
from device_profiles.selection import select_units
from tests.support.cli import run_cli


@pytest.mark.parametrize("name", shipped_names())
def test_every_shipped_profile_names_providers_onnxruntime_knows(name: str) -> None:
    try:
        profile = load_profile(name)
    except ProfileError as exc:  # a runtime profile this machine cannot have (local-gpu without a GPU)
        pytest.skip(str(exc))
    for pu in profile.pus:
        if pu.deployable:
            assert pu.execution_provider in ort.get_all_providers(), (name, pu.name)
        else:
            assert pu.runtime is not None and pu.runtime.cite, f"{name}.{pu.name}: say why nothing drives it"
            assert pu.execution_provider in ("", *ort.get_all_providers()), (name, pu.name)


def test_units_no_onnxruntime_drives_are_labelled() -> None:
    vim3 = load_profile("khadas-vim3")
    assert [p.name for p in vim3.undeployable()] == ["mali", "npu"]
    assert vim3.pu("npu").execution_provider == "VSINPUExecutionProvider"
    a1000 = load_profile("bst-a1000")
    assert [p.name for p in a1000.undeployable()] == ["npu", "dsp0", "dsp1"]
    assert [p.name for p in load_profile("jetson-orin-nano").undeployable()] == []


def _vim3_data() -> dict:
    return tomllib.loads((SHIPPED_DIR / "khadas-vim3.toml").read_text())


def test_a_misspelt_provider_is_refused_with_the_close_match() -> None:
    data = _vim3_data()
    npu = next(p for p in data["pus"] if p["name"] == "npu")
    del npu["runtime"]
    npu["execution_provider"] = "VsiNpuExecutionProvider"
    with pytest.raises(ProfileError, match="did you mean 'VSINPUExecutionProvider'") as info:
        parse_profile(data)
    assert "pus[3].execution_provider" in str(info.value) and "\n" not in str(info.value)
    npu["execution_provider"] = "ArmNNExecutionProvider"
    with pytest.raises(ProfileError, match="'ArmNNExecutionProvider' is no onnxruntime execution provider"):
        parse_profile(data)
    npu["runtime"] = {"value": "unavailable", "source": "estimate"}
    with pytest.raises(ProfileError, match=r"runtime\.cite: say why"):
        parse_profile(data)
    npu["runtime"] = {"value": "maybe", "source": "estimate", "cite": "x"}
    with pytest.raises(ProfileError, match=r"runtime\.value: 'maybe' is not one of onnxruntime, unavailable"):
        parse_profile(data)


def test_plans_use_units_onnxruntime_drives_unless_asked() -> None:
    vim3 = load_profile("khadas-vim3")
    assert [p.name for p in select_units(vim3).pus] == ["a73", "a53"]
    assert [p.name for p in select_units(vim3, include_unavailable=True).pus] == ["a73", "a53", "mali", "npu"]
    assert [p.name for p in select_units(vim3, exclude=["a53"]).pus] == ["a73"]
    assert [p.name for p in select_units(vim3, pus=["mali"], include_unavailable=True).pus] == ["mali"]
    with pytest.raises(ProfileError, match="unit mali of khadas-vim3 cannot run: no onnxruntime execution provider"):
        select_units(vim3, pus=["mali"])
    with pytest.raises(ProfileError, match="has no unit 'gpu'; its units are a73, a53, mali, npu"):
        select_units(vim3, exclude=["gpu"])
    with pytest.raises(ProfileError, match="no unit of khadas-vim3 is left"):
        select_units(vim3, exclude=["a73", "a53"])
    kept = select_units(vim3)
    assert all({link.a, link.b} <= {"a73", "a53"} for link in kept.links)
    assert all(set(m.pus) <= {"a73", "a53"} for m in kept.memories)


def _branchy_model(path: Path) -> Path:
    """A small CNN with two parallel branches (what a plan spreads over units)."""
    rng = np.random.default_rng(0)

    def conv(name: str, x: str, cin: int, cout: int) -> tuple[onnx.NodeProto, onnx.TensorProto]:
        w = numpy_helper.from_array(rng.standard_normal((cout, cin, 3, 3)).astype(np.float32) * 0.1, f"{name}.w")
        return helper.make_node("Conv", [x, w.name], [name], name=name, pads=[1, 1, 1, 1]), w

    nodes, inits = [], []
    for name, x, cin, cout in (("stem", "x", 3, 16), ("a1", "stem", 16, 32), ("a2", "a1", 32, 16),
                               ("b1", "stem", 16, 32), ("b2", "b1", 32, 16)):  # fmt: skip
        n, w = conv(name, x, cin, cout)
        nodes.append(n)
        inits.append(w)
    nodes += [helper.make_node("Add", ["a2", "b2"], ["sum"], name="add"), helper.make_node("Relu", ["sum"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "branchy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 56, 56])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _units(folder: Path) -> dict[str, set[str]]:
    index = json.loads((folder / "plans.json").read_text())
    out = {}
    for name in index["plans"] + index["baselines"]:
        plan = json.loads((folder / name).read_text())
        out[name] = {part for s in plan["stages"] for g in s["groups"] for a in g for part in a["pu"].split("+")}
    return out


@pytest.mark.parametrize(("device", "drivable"), [("khadas-vim3", {"a73", "a53"}), ("bst-a1000", {"a55"})])
def test_cli_plans_leave_out_units_no_onnxruntime_drives(tmp_path, device: str, drivable: set[str]) -> None:
    model = _branchy_model(tmp_path / "branchy.onnx")
    folder = tmp_path / "plans"
    args = ("plan", str(model), "--device", device, "--objective", "latency", "--time-limit", "1", "--json")
    done = run_cli(*args, "-o", str(folder), home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    used = _units(folder)
    assert used and all(units <= drivable for units in used.values()), used

    what_if = tmp_path / "what-if"
    done = run_cli(*args, "-o", str(what_if), "--include-unavailable", home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    labelled = {
        name: json.loads((what_if / name).read_text()).get("notes", [])
        for name, units in _units(what_if).items()
        if not units <= drivable
    }
    if device == "khadas-vim3":  # the Mali GPU is priced far faster than the cores: some plan uses it
        assert labelled
    for name, notes in labelled.items():
        assert any(n.startswith("not deployable") for n in notes), name
        refused = run_cli("compile", str(what_if / name), str(model), "-o", str(tmp_path / "b"), home=tmp_path / "home")
        assert refused.returncode == 2 and "no onnxruntime drives" in refused.stderr
        assert "Traceback" not in refused.stderr
        break
    refused = run_cli("plan", str(model), "--device", device, "--pus", "npu", home=tmp_path / "home")
    assert refused.returncode == 2 and "--include-unavailable" in refused.stderr and "Traceback" not in refused.stderr


def test_a_board_whose_runtime_is_not_installed_says_how_to_install_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PARAPIPE_RUNTIMES", str(tmp_path / "no-runtimes"))
    model = _branchy_model(tmp_path / "branchy.onnx")
    done = run_cli("profile", str(model), "--board", "local-openvino", home=tmp_path / "home")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "`parapipe runtimes install openvino`" in done.stderr
