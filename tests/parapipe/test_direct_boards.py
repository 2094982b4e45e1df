"""Boards whose agent is reached directly over TLS with a token (no SSH tunnel), and plans over two hosts from the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest

from agents.client import AgentClient, AgentError
from parapipe.local_agent import LocalAgent
from planner.baselines import flop_pipeline
from tests.support.certs import make_certs
from tests.support.cli import SHORT_MEMORY
from tests.support.cli import run_cli as _run

TOKEN = "s3cret-token"
QUICK = ("--repeats", "3", "--warmup", "0", *SHORT_MEMORY)  # profiling that checks where it reaches, briefly


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"), ["127.0.0.1"])


@pytest.fixture(scope="module")
def tls_agent(certs):
    with LocalAgent(token=TOKEN, tls=(certs.cert, certs.key, certs.ca)) as agent:
        yield agent


def test_tls_agent_refuses_plaintext_and_unknown_cas(tls_agent, certs, tmp_path) -> None:
    assert tls_agent.client.status().agent_version  # TLS + token: fine
    with AgentClient(f"127.0.0.1:{tls_agent.port}", token=TOKEN, timeout=5) as plain, pytest.raises(AgentError) as exc:
        plain.status()
    assert exc.value.code == grpc.StatusCode.UNAVAILABLE
    other = make_certs(tmp_path / "other", ["127.0.0.1"], cn="another CA")
    with (
        AgentClient(
            f"127.0.0.1:{tls_agent.port}", token=TOKEN, tls=(other.ca.read_bytes(), None, None), timeout=5
        ) as c,
        pytest.raises(AgentError) as exc,
    ):
        c.status()
    assert exc.value.code == grpc.StatusCode.UNAVAILABLE
    with (
        AgentClient(f"127.0.0.1:{tls_agent.port}", token="wrong", tls=(certs.ca.read_bytes(), None, None)) as c,
        pytest.raises(AgentError) as exc,
    ):
        c.status()
    assert exc.value.code == grpc.StatusCode.UNAUTHENTICATED


def _token_file(folder: Path, token: str) -> Path:
    path = folder / f"token-{token}"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def test_direct_board_add_check_and_run(tls_agent, certs, exported, tmp_path) -> None:
    home = tmp_path / "home"
    token = _token_file(tmp_path, TOKEN)
    address = f"127.0.0.1:{tls_agent.port}"
    # refusals say what is missing
    bad = _run("boards", "add", "b", "--device", "local", "--agent-address", address, home=home)
    assert bad.returncode == 2 and "--token-file" in bad.stderr and "Traceback" not in bad.stderr
    bad = _run("boards", "add", "b", "--device", "local", "--agent-address", "nowhere", home=home)
    assert bad.returncode == 2 and "HOST:PORT" in bad.stderr
    ok = _run(
        "boards", "add", "tlsbox", "--device", "local", "--agent-address", address,
        "--token-file", str(token), "--tls-ca", str(certs.ca), home=home,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    listed = json.loads(_run("boards", "list", "--json", home=home).stdout)
    assert listed[0]["agent_address"] == address and not listed[0]["host"]
    check = _run("boards", "check", "tlsbox", "--json", home=home)
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["onnxruntime"]
    # a plan runs there with no SSH at all
    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx

    model = exported("squeezenet1_1").path
    loaded = load_onnx(model)
    graph = build_graph(loaded.proto, loaded.sha256)
    profile = load_profile("local")
    cpu = profile.pus[0].name
    plan = flop_pipeline(coarsen(graph, "coarse"), profile, [(cpu, 1), (cpu, 1)], name="two-stages")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(dict(plan.to_json(), model_path=str(model))))
    result = _run("run", str(plan_file), "--board", "tlsbox", "--frames", "5", "--verify", "--json", home=home)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["max_abs_diff"] <= 1e-5 and out["measured"]["throughput_fps"] > 0
    # profiling reaches the board the same way (no SSH): the blocks are timed by its agent
    profiled = _run("profile", str(model), "--board", "tlsbox", *QUICK, "--json", home=home)
    assert profiled.returncode == 0, profiled.stderr
    assert json.loads(profiled.stdout)["measured"] > 0
    served = tls_agent.client.status()
    assert served.agent_version  # the same agent answered throughout
    # a wrong token in the inventory: a clear error, exit code 2
    wrong = _token_file(tmp_path, "wrong")
    _run(
        "boards", "add", "tlsbox", "--device", "local", "--agent-address", address,
        "--token-file", str(wrong), "--tls-ca", str(certs.ca), home=home,
    )  # fmt: skip
    result = _run("run", str(plan_file), "--board", "tlsbox", "--frames", "5", home=home)
    assert result.returncode == 2 and "UNAUTHENTICATED" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_run_a_plan_over_two_hosts_from_the_cli(exported, tmp_path) -> None:
    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx

    home = tmp_path / "home"
    model = exported("googlenet").path
    loaded = load_onnx(model)
    graph = build_graph(loaded.proto, loaded.sha256)
    profile = load_profile("local-edge-cloud")
    plan = flop_pipeline(coarsen(graph, "coarse"), profile, [("edge", 1), ("cloud", 1)], name="edge-then-cloud")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(dict(plan.to_json(), model_path=str(model))))
    result = _run(
        "run", str(plan_file), "--board", "local-edge-cloud", "--frames", "8", "--verify", "--json", home=home
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["max_abs_diff"] <= 1e-5
    assert out["hosts"] == {"edge": "local-edge-cloud", "cloud": "local-edge-cloud"}
    assert {p["host"] for p in out["partitions"]} == {"edge", "cloud"}
    assert all(p["frames"] > 0 for p in out["partitions"])
    # a plan over two hosts with one inventory board for both: told to name a board per host
    result = _run("run", str(plan_file), "--board", "edge=x", "--board", "oops", home=home)
    assert result.returncode == 2 and "HOST=BOARD" in result.stderr
    result = _run("compile", str(plan_file), str(model), "-o", str(tmp_path / "bundle"), "--json", home=home)
    assert result.returncode == 0, result.stderr
    hosts = json.loads(result.stdout)["hosts"]
    assert set(hosts) == {"edge", "cloud"} and all(Path(h["folder"], "manifest.json").exists() for h in hosts.values())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_profile_the_two_host_board(exported, tmp_path) -> None:
    home = tmp_path / "home"
    model = exported("squeezenet1_1").path
    result = _run("profile", str(model), "--board", "local-edge-cloud", *QUICK, "--json", home=home)
    assert result.returncode == 0, result.stderr
    from profiler.costtable import CostTable

    table = CostTable.load(home / "costs.json")
    assert {e.conditions.pu for e in table} == {"edge", "cloud"}
    bad = _run("profile", str(model), "--board", "nowhere", home=home)
    assert bad.returncode == 2 and "local-edge-cloud" in bad.stderr and "Traceback" not in bad.stderr
