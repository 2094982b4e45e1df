"""The board-side wheel and deploy's dependency check ask for an onnxruntime the agent runs."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from packaging.requirements import Requirement

from agents.service import runtime_problem
from parapipe.agent_wheel import build_wheel
from parapipe.deploy import DEPS_CHECK


def _wheel_requirement(name: str) -> Requirement:
    _, data = build_wheel()
    with zipfile.ZipFile(BytesIO(data)) as wheel:
        metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        lines = wheel.read(metadata).decode().splitlines()
    requirements = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
    return next(r for r in requirements if r.name == name)


@given(st.integers(0, 3), st.integers(0, 40), st.integers(0, 9))
def test_the_wheel_admits_exactly_the_onnxruntime_releases_the_agent_runs(major: int, minor: int, patch: int) -> None:
    version = f"{major}.{minor}.{patch}"
    admitted = _wheel_requirement("onnxruntime").specifier.contains(version)
    assert admitted == (runtime_problem(version) is None)


def _fake_runtime(root: Path, ort_version: str) -> dict[str, str]:
    """A site folder whose onnxruntime reports ``ort_version`` (the other packages are this machine's)."""
    (root / "onnxruntime").mkdir(parents=True)
    (root / "onnxruntime" / "__init__.py").write_text(f"__version__ = {ort_version!r}\n")
    return {"PYTHONPATH": str(root)}


def test_deploys_dependency_check_refuses_an_onnxruntime_the_agent_would_not_run(tmp_path) -> None:
    """A board whose Python has onnxruntime 1.12 fails the check, so deploy installs a supported one into the
    agent's venv instead of reusing it; a current one passes."""
    old = subprocess.run(
        [sys.executable, "-c", DEPS_CHECK], env=_fake_runtime(tmp_path / "old", "1.12.1"), capture_output=True
    )
    new = subprocess.run(
        [sys.executable, "-c", DEPS_CHECK], env=_fake_runtime(tmp_path / "new", "1.18.0"), capture_output=True
    )
    assert old.returncode != 0 and b"1.12.1" in old.stderr
    assert new.returncode == 0, new.stderr
