"""`parapipe export` and `parapipe inspect` as a user runs them: the installed console script."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import PARAPIPE, USER_MODELS


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PARAPIPE, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_export_googlenet_then_inspect(tmp_path: Path) -> None:
    result = _run("export", "googlenet", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["max_rel_diff"] <= 1e-4
    onnx_file = tmp_path / "googlenet.onnx"
    assert onnx_file.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["googlenet.onnx"]

    result = _run("inspect", str(onnx_file), "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["ops_by_type"]["Conv"] == 57
    assert info["parallel_branches"] == 4
    assert info["max_branches_at_fork"] == 4
    assert 3.0e9 < info["flops"] < 3.3e9
    assert info["opset"] == report["opset"]
    human = _run("inspect", str(onnx_file), cwd=tmp_path)
    assert human.returncode == 0 and "parallel branches" in human.stdout


def test_export_a_user_module(tmp_path: Path) -> None:
    out = tmp_path / "tiny.onnx"
    result = _run("export", f"{USER_MODELS}:Tiny", "--input-shape", "1,3,32,32", "-o", str(out), "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["inputs"][0]["shape"] == [1, 3, 32, 32]
    assert out.is_file()


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("DataDependent", "user_models.py:"),  # graph break reported with the source line
        ("NeedsArgs", "cannot be built without arguments"),
        ("Missing", "defines no 'Missing'"),
    ],
)
def test_export_failures_explain_what_to_change(tmp_path: Path, target: str, needle: str) -> None:
    result = _run("export", f"{USER_MODELS}:{target}", "--input-shape", "1,3,8,8", cwd=tmp_path)
    assert result.returncode == 2
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*.onnx")), "a failed export must not leave a file"


def test_data_dependent_branch_names_the_line_and_the_fix(tmp_path: Path) -> None:
    result = _run("export", f"{USER_MODELS}:DataDependent", "--input-shape", "1,3,8,8", cwd=tmp_path)
    assert "if x.sum() > 0:" in result.stderr
    assert "torch.where" in result.stderr


def test_unknown_model_name(tmp_path: Path) -> None:
    result = _run("export", "alexnet", cwd=tmp_path)
    assert result.returncode == 2 and "neither a zoo model" in result.stderr
