"""The planning and running commands as a user runs them (the installed console script)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.cli import PARAPIPE, SHORT_MEMORY, run_cli

_run = run_cli


@pytest.fixture(scope="module")
def planned(exported, tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    model = exported("squeezenet1_1").path
    folder = home / "plans"
    result = _run(
        "profile", str(model), "--board", "local", "--repeats", "3", "--warmup", "1", *SHORT_MEMORY, "--json", home=home
    )
    assert result.returncode == 0, result.stderr
    result = _run("plan", str(model), "--device", "local", "--time-limit", "1", "-o", str(folder), "--json", home=home)
    assert result.returncode == 0, result.stderr
    return home, model, folder, json.loads(result.stdout)


def test_plan_writes_plans_and_baselines(planned) -> None:
    _home, _model, folder, out = planned
    assert out["plans"] and {b["plan"] for b in out["baselines"]} >= {
        "pipe-only",
        "para-only",
        "heft",
        "cpop",
        "ort-all-cores",
    }
    index = json.loads((folder / "plans.json").read_text())
    for name in index["plans"] + index["baselines"]:
        assert (folder / name).is_file()
    assert all(p["energy_source"] == "modelled" for p in out["plans"])


def test_pareto_select_show(planned, tmp_path) -> None:
    home, model, folder, _ = planned
    csv = _run("pareto", str(folder), "--format", "csv", "--plot", str(tmp_path / "front.png"), home=home)
    assert csv.returncode == 0, csv.stderr
    assert csv.stdout.splitlines()[0].startswith("plan,kind,latency_ms")
    assert (tmp_path / "front.png").stat().st_size > 1000
    best = _run("select", str(folder), "--objective", "energy", "--json", home=home)
    assert best.returncode == 0, best.stderr
    chosen = json.loads(best.stdout)
    shown = _run("show", chosen["file"], "--model", str(model), home=home)
    assert shown.returncode == 0 and "predicted (analytic)" in shown.stdout
    impossible = _run("select", str(folder), "--min-fps", "100000", "--max-mj", "0.001", home=home)
    assert impossible.returncode == 2
    assert "relax" in impossible.stderr and "Traceback" not in impossible.stderr


def test_corrupt_and_mismatched_plans_are_refused(planned, tmp_path, exported) -> None:
    home, _model, folder, _ = planned
    index = json.loads((folder / "plans.json").read_text())
    plan = json.loads((folder / index["plans"][0]).read_text())
    del plan["stages"][0]["groups"][0][0]["pu"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(plan))
    result = _run("show", str(broken), home=home)
    assert result.returncode == 2 and "pu: missing field" in result.stderr
    good = folder / index["plans"][0]
    other = exported("resnet18").path
    result = _run("show", str(good), "--model", str(other), home=home)
    assert result.returncode == 2 and "model_sha256" in result.stderr


def test_compile_then_run_on_the_local_agent(planned, tmp_path) -> None:
    home, model, folder, _ = planned
    index = json.loads((folder / "plans.json").read_text())
    plan = folder / index["plans"][0]
    compiled = _run("compile", str(plan), str(model), "-o", str(tmp_path / "bundle"), "--json", home=home)
    assert compiled.returncode == 0, compiled.stderr
    assert json.loads(compiled.stdout)["max_abs_diff"] <= 1e-5
    ran = _run("run", str(plan), "--board", "local", "--frames", "10", "--verify", "--json", home=home)
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["max_abs_diff"] <= 1e-5
    assert set(result["measured"]) >= {"latency_ms", "throughput_fps", "energy_mj"}
    assert result["energy_source"] == "modelled"
    assert {"latency_ms", "throughput_fps"} <= set(result["errors_pct"])
    lines = (home / "measurements.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["result"]["bundle_sha256"] == result["bundle_sha256"]


def test_run_refuses_a_plan_for_another_board(planned, tmp_path) -> None:
    home, model, _folder, _ = planned
    other = _run(
        "plan",
        str(model),
        "--device",
        "rpi5",
        "--objective",
        "latency",
        "--time-limit",
        "1",
        "-o",
        str(tmp_path / "p"),
        home=home,
    )
    assert other.returncode == 0, other.stderr
    ran = _run("run", str(tmp_path / "p" / "ilp-latency.json"), "--board", "local", home=home)
    assert ran.returncode == 2 and "re-plan" in ran.stderr.lower()


def test_agent_status_command() -> None:
    from parapipe.local_agent import LocalAgent

    with LocalAgent() as agent:
        result = subprocess.run(
            [PARAPIPE, "agent", "status", "--address", f"127.0.0.1:{agent.port}", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["live"] == "SERVING" and info["ready"] is False and info["cores"]
    # every size a client controls has its limit in Status (issue 42); the devices onnxruntime sees (issue 41)
    from agents.bundle import MAX_PARTITIONS, MAX_TENSOR_BYTES
    from agents.server import MAX_CONNECTIONS, MAX_MESSAGE_BYTES

    bounds = info["bounds"]
    assert bounds["tensor_bytes"] == MAX_TENSOR_BYTES and bounds["partitions"] == MAX_PARTITIONS
    assert bounds["message_bytes"] == MAX_MESSAGE_BYTES and bounds["connections"] == MAX_CONNECTIONS
    assert {"bundle_bytes", "profile_repeats", "handshake_timeout_ms", "metrics_scrapes"} <= set(bounds)
    assert any(d.startswith("CPUExecutionProvider: cpu") for d in info["devices"])
    down = subprocess.run(
        [PARAPIPE, "agent", "status", "--address", "127.0.0.1:1"], capture_output=True, text=True, timeout=60
    )
    assert down.returncode == 2 and "UNAVAILABLE" in down.stderr


def test_simulate_command(planned) -> None:
    home, model, folder, _ = planned
    index = json.loads((folder / "plans.json").read_text())
    result = _run(
        "simulate",
        str(folder / index["plans"][0]),
        str(model),
        "--device",
        "local",
        "--frames",
        "20",
        "--json",
        home=home,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["energy_source"] == "modelled" and out["simulated"]["throughput_fps"] > 0
    assert out["analytic"]["throughput_fps"] == pytest.approx(out["simulated"]["throughput_fps"], rel=0.15)
