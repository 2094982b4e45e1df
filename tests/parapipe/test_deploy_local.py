"""``deploy PLAN --board local`` leaves an agent serving the plan on 127.0.0.1; ``undeploy --board local`` stops it."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import parapipe
from parapipe.application import InferenceError
from tests.support.cli import PARAPIPE
from tests.support.packages import folders_for, python_path
from tests.support.serving import ROWS, write_model, write_two_host_plan


def _cli(work: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PARAPIPE, *args], capture_output=True, text=True, env=env, cwd=work, timeout=600)


def _json(work: Path, env: dict[str, str], *args: str) -> dict:
    done = _cli(work, env, *args, "--json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.agent
def test_deploy_to_this_machine_serves_until_undeploy(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PARAPIPE_HOME": str(tmp_path / "home")}
    # the agent needs prometheus_client for --metrics: the environment's, or one installed outside it
    env["PYTHONPATH"] = python_path(
        *folders_for("prometheus_client", "prometheus-client-0.26.0", "prometheus-client==0.26.0", no_deps=True)
    )
    model = write_model(work / "model.onnx")
    planned = _json(work, env, "plan", str(model), "--device", "local", "--objective", "latency", "--time-limit", "2")
    plan = Path(planned["folder"]) / f"{planned['plans'][0]['plan']}.json"
    if not plan.is_absolute():
        plan = work / plan

    deployed = _json(work, env, "deploy", str(plan), "--board", "local", "--metrics")
    address, metrics = deployed["address"], deployed["metrics_address"]
    assert address.startswith("127.0.0.1:") and metrics.startswith("127.0.0.1:") and deployed["agent_started"]
    frame = {"x": np.ones((1, 16), np.float32), "ids": np.array([ROWS - 1], np.int64)}
    import onnxruntime as ort

    want = dict(zip(["out:a", "scores", "label"], ort.InferenceSession(str(model)).run(None, frame), strict=True))
    with parapipe.connect(address) as served:  # the command has ended; the agent goes on serving
        got = served.infer(frame)
        for name, value in want.items():
            assert np.max(np.abs(got[name].astype(np.float64) - value)) <= 1e-5, name
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=30) as reply:
        assert "parapipe_frames_completed_total 1.0" in reply.read().decode()

    again = _json(work, env, "deploy", str(plan), "--board", "local", "--metrics")
    assert again["address"] == address and again["pid"] == deployed["pid"] and not again["agent_started"]

    foreign = json.loads(plan.read_text())
    foreign["device"] = "khadas-vim3"
    (work / "foreign.json").write_text(json.dumps(foreign))
    refused = _cli(work, env, "deploy", str(work / "foreign.json"), "--board", "local")
    assert refused.returncode == 2 and "--device local" in refused.stderr and "Traceback" not in refused.stderr

    done = _cli(work, env, "undeploy", "--board", "local")
    assert done.returncode == 0, done.stderr
    assert (
        not Path(f"/proc/{deployed['pid']}").exists()
        or b"agents.server" not in Path(f"/proc/{deployed['pid']}/cmdline").read_bytes()
    )
    assert not (tmp_path / "home" / "local-agent").exists()
    with pytest.raises(InferenceError, match="no agent answers"):
        parapipe.connect(address, timeout=2)
    assert _cli(work, env, "undeploy", "--board", "local").returncode == 0  # nothing left: nothing to do


def test_a_plan_over_several_hosts_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    """Exit 2 before anything is compiled or started, naming the hosts and the commands that work."""
    home = tmp_path / "home"
    env = {**os.environ, "PARAPIPE_HOME": str(home)}
    plan = write_two_host_plan(tmp_path)
    for board in ("local", "local-edge-cloud"):
        for extra in ((), ("--json",), ("--metrics",)):
            refused = _cli(tmp_path, env, "deploy", str(plan), "--board", board, *extra)
            message = " ".join(refused.stderr.split())  # the console wraps long lines
            assert refused.returncode == 2, refused.stdout + refused.stderr
            assert "Traceback" not in refused.stderr and not refused.stdout
            assert "'edge-then-cloud' runs over hosts edge, cloud" in message, message
            assert "plan it for one host (--device local or --device local-biglittle)" in message, message
            assert f"parapipe run {plan} --board local-edge-cloud" in message, message
            assert f"parapipe run {plan} --board edge=BOARD --board cloud=BOARD" in message, message
    assert not (home / "bundles").exists() and not (home / "local-agent").exists()  # nothing compiled or started
