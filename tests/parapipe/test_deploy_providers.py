"""A plan whose unit needs an execution provider the board's onnxruntime lacks is refused by ``run``,
``deploy`` and ``tune`` before anything starts: exit code 2, one line naming the unit and the provider,
and nothing made on the board (a real OpenSSH server on loopback is the board; its onnxruntime is this
machine's, which has no CUDA)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from tests.device_profiles.test_runtimes import _branchy_model
from tests.support.cli import run_cli
from tests.support.sshd import free_port_pair, start_sshd, stop_sshd

MISSING = next(
    p for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider") if p not in ort.get_available_providers()
)

# ``local`` with a second unit: a GPU on a provider this machine's onnxruntime lacks
PROFILE = f"""
schema_version = 1
name = "local-gpu"
description = "this machine's first core and a GPU it does not have"
[[hosts]]
name = "local"
[[pus]]
name = "cpu"
kind = "cpu"
cores = [{sorted(os.sched_getaffinity(0))[0]}]
execution_provider = "CPUExecutionProvider"
memory_bandwidth_gbps = {{ value = 10.0, source = "estimate", cite = "test" }}
memory_bytes = {{ value = 4.0e9, source = "estimate", cite = "test" }}
launch_overhead_us = {{ value = 4.0, source = "estimate", cite = "test" }}
active_power_w = {{ value = 6.0, source = "estimate", cite = "test" }}
idle_power_w = {{ value = 1.0, source = "estimate", cite = "test" }}
[pus.peak_gflops]
conv = {{ value = 20.0, source = "estimate", cite = "test" }}
matmul = {{ value = 20.0, source = "estimate", cite = "test" }}
depthwise = {{ value = 5.0, source = "estimate", cite = "test" }}
elementwise = {{ value = 2.0, source = "estimate", cite = "test" }}
pooling = {{ value = 2.0, source = "estimate", cite = "test" }}
other = {{ value = 1.0, source = "estimate", cite = "test" }}
[[pus]]
name = "gpu"
kind = "gpu"
cores = []
execution_provider = "{MISSING}"
memory_bandwidth_gbps = {{ value = 100.0, source = "estimate", cite = "test" }}
memory_bytes = {{ value = 4.0e9, source = "estimate", cite = "test" }}
launch_overhead_us = {{ value = 10.0, source = "estimate", cite = "test" }}
active_power_w = {{ value = 20.0, source = "estimate", cite = "test" }}
idle_power_w = {{ value = 2.0, source = "estimate", cite = "test" }}
[pus.peak_gflops]
conv = {{ value = 20.0, source = "estimate", cite = "test" }}
matmul = {{ value = 20.0, source = "estimate", cite = "test" }}
depthwise = {{ value = 5.0, source = "estimate", cite = "test" }}
elementwise = {{ value = 2.0, source = "estimate", cite = "test" }}
pooling = {{ value = 2.0, source = "estimate", cite = "test" }}
other = {{ value = 1.0, source = "estimate", cite = "test" }}
[default_link]
a = "cpu"
b = "gpu"
bandwidth_gbps = {{ value = 10.0, source = "estimate", cite = "test" }}
latency_us = {{ value = 10.0, source = "estimate", cite = "test" }}
conversion_us_per_mb = {{ value = 0.0, source = "estimate", cite = "test" }}
"""


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    info, proc = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield info
    stop_sshd(proc)


def test_run_deploy_and_tune_refuse_a_unit_whose_provider_the_board_lacks(sshd, tmp_path) -> None:
    from compiler import compile_plan  # noqa: F401  (the plan compiles: the refusal is the board's, not the plan's)
    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx
    from planner.baselines import flop_pipeline

    home = tmp_path / "home"
    profile_path = tmp_path / "local-gpu.toml"
    profile_path.write_text(PROFILE)
    model = _branchy_model(tmp_path / "branchy.onnx")
    loaded = load_onnx(model)
    graph = build_graph(loaded.proto, loaded.sha256)
    profile = load_profile(profile_path)
    where = {"device": str(profile_path), "model_path": str(model)}  # as `plan --device FILE` writes it
    plan = dataclasses.replace(flop_pipeline(coarsen(graph, "fine"), profile, [("cpu", 1), ("gpu", 1)]), **where)
    assert {a.pu for s in plan.stages for g in s.groups for a in g} == {"cpu", "gpu"}
    plan_file = tmp_path / "plan.json"
    plan.save(plan_file)
    workdir = tmp_path / "board"
    added = run_cli(
        "boards", "add", "gpubox", "--host", "127.0.0.1", "--port", str(sshd.port), "--user", sshd.user,
        "--key", str(sshd.user_key), "--known-hosts", str(sshd.known_hosts), "--device", str(profile_path),
        "--python", sys.executable, "--workdir", str(workdir), "--agent-port", str(free_port_pair()), home=home,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr

    for command in (
        ("run", str(plan_file), "--board", "gpubox", "--model", str(model)),
        ("deploy", str(plan_file), "--board", "gpubox", "--model", str(model)),
        ("tune", str(model), "--board", "gpubox", "--rounds", "1"),
    ):
        done = run_cli(*command, home=home)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and f"unit gpu needs {MISSING}" in lines[0], (command, done.stderr)
        assert "board gpubox" in lines[0] and "CPUExecutionProvider" in lines[0] and "--exclude-pus gpu" in lines[0]
        assert not workdir.exists(), f"{command[0]} made something on the board before refusing"
        assert not any(p.name.startswith("agents.server") for p in Path("/proc").glob("*/comm"))

    # the same plan without the GPU unit deploys (the refusal was the unit, not the board)
    cpu_only = dataclasses.replace(flop_pipeline(coarsen(graph, "fine"), profile, [("cpu", 1)]), **where)
    cpu_only.save(tmp_path / "cpu.json")
    done = run_cli("deploy", str(tmp_path / "cpu.json"), "--board", "gpubox", "--model", str(model), home=home)
    try:
        assert done.returncode == 0, done.stderr
    finally:
        subprocess.run([sys.executable, "-m", "parapipe", "undeploy", "--board", "gpubox"],
                       env=dict(os.environ, PARAPIPE_HOME=str(home)), capture_output=True, timeout=120)  # fmt: skip


def _gpubox(sshd, tmp_path: Path) -> tuple[Path, Path, tuple[str, ...]]:
    """Board ``gpubox`` added over the test's sshd with the profile above: (home, profile file, SSH options)."""
    home = tmp_path / "home"
    profile_path = tmp_path / "local-gpu.toml"
    profile_path.write_text(PROFILE)
    common = ("--host", "127.0.0.1", "--port", str(sshd.port), "--user", sshd.user, "--key", str(sshd.user_key),
              "--known-hosts", str(sshd.known_hosts), "--python", sys.executable, "--workdir", str(tmp_path / "w"))  # fmt: skip
    assert run_cli("boards", "add", "gpubox", *common, "--device", str(profile_path), home=home).returncode == 0
    return home, profile_path, common


def test_boards_check_reports_the_providers_and_refuses_a_unit_the_board_cannot_run(sshd, tmp_path) -> None:
    import json

    home, _, common = _gpubox(sshd, tmp_path)
    assert run_cli("boards", "add", "cpubox", *common, "--device", "local", home=home).returncode == 0
    refused = run_cli("boards", "check", "gpubox", "--json", home=home)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    info = json.loads(refused.stdout)
    assert info["providers"] == ort.get_available_providers()
    assert info["units_missing_provider"] == [{"unit": "gpu", "provider": MISSING}]
    assert f"unit gpu needs {MISSING}" in refused.stderr
    fine = run_cli("boards", "check", "cpubox", home=home)
    assert fine.returncode == 0, fine.stderr
    assert "units_missing_provider none" in " ".join(fine.stdout.split())


def test_boards_check_records_the_units_a_board_has_and_plans_for_it_use_only_those(sshd, tmp_path) -> None:
    """``boards check --record`` keeps the units whose provider the board's onnxruntime offers; a plan made with
    ``--device BOARD`` (and tune for it) then uses only those, and a unit it lacks is refused by name."""
    import json

    home, profile_path, common = _gpubox(sshd, tmp_path)
    recorded = run_cli("boards", "check", "gpubox", "--record", "--json", home=home)
    assert recorded.returncode == 0, recorded.stderr
    assert json.loads(recorded.stdout)["recorded_units"] == ["cpu"]
    listed = json.loads(run_cli("boards", "list", "--json", home=home).stdout)
    assert [b["units"] for b in listed] == [["cpu"]]
    model = _branchy_model(tmp_path / "m.onnx")
    folder = tmp_path / "plans"
    planned = run_cli("plan", str(model), "--device", "gpubox", "--objective", "latency", "--time-limit", "1",
                      "-o", str(folder), "--json", home=home)  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    plan = json.loads((folder / "ilp-latency.json").read_text())
    assert {a["pu"] for s in plan["stages"] for g in s["groups"] for a in g} == {"cpu"}
    assert plan["device"] == str(profile_path.resolve())  # run and deploy find the board's profile
    bad = run_cli("boards", "add", "other", *common, "--device", str(profile_path), "--units", "cpu,npu", home=home)
    assert bad.returncode == 2 and "no unit 'npu'" in bad.stderr and "Traceback" not in bad.stderr
