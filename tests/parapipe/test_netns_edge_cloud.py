"""An edge + cloud plan over two network namespaces: each "board" has its own address and a shaped link.

The agents serve TLS with a token on their namespace's address; the inventory names
them by address (no SSH). ``parapipe run`` talks to the entry (edge) agent only, and the
agents' logs show the tensors between edge and cloud went agent to agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.client import AgentClient, AgentError
from planner.baselines import flop_pipeline
from tests.support.certs import make_certs
from tests.support.cli import run_cli as _run
from tests.support.netns import netns_unavailable, two_hosts

REPO = Path(__file__).resolve().parents[2]
why_not = netns_unavailable() or (None if len(os.sched_getaffinity(0)) >= 2 else "needs two cores")
pytestmark = pytest.mark.skipif(why_not is not None, reason=why_not or "")


def _agent(ns: str, address: str, folder: Path, certs, token: Path) -> subprocess.Popen:
    folder.mkdir(parents=True)
    argv = [
        "ip", "netns", "exec", ns, sys.executable, "-m", "agents.server", "--host", address, "--port", "50051",
        "--workdir", str(folder / "work"), "--token-file", str(token), "--tls-cert", str(certs.cert),
        "--tls-key", str(certs.key), "--port-file", str(folder / "port"),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(folder / "agent.log", "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 30
    while not (folder / "port").exists():
        assert proc.poll() is None and time.monotonic() < deadline, (folder / "agent.log").read_text()
        time.sleep(0.05)
    return proc


def test_edge_cloud_plan_streams_agent_to_agent(exported, tmp_path) -> None:
    from device_profiles.loader import load_profile
    from models.coarsen import coarsen
    from models.graph import build_graph
    from models.onnx_io import load_onnx

    home = tmp_path / "home"
    token = tmp_path / "token"
    token.write_text("edge-cloud-token\n")
    token.chmod(0o600)
    with two_hosts() as net:
        certs = make_certs(tmp_path / "certs", [net.edge_ip, net.cloud_ip])
        procs = [
            _agent(net.edge_ns, net.edge_ip, tmp_path / "edge", certs, token),
            _agent(net.cloud_ns, net.cloud_ip, tmp_path / "cloud", certs, token),
        ]
        try:
            for name, ip in (("edgebox", net.edge_ip), ("cloudbox", net.cloud_ip)):
                added = _run(
                    "boards", "add", name, "--device", "local-edge-cloud", "--agent-address", f"{ip}:50051",
                    "--token-file", str(token), "--tls-ca", str(certs.ca), home=home,
                )  # fmt: skip
                assert added.returncode == 0, added.stderr
            check = _run("boards", "check", "cloudbox", "--json", home=home)
            assert check.returncode == 0, check.stderr

            model = exported("googlenet").path
            loaded = load_onnx(model)
            graph = build_graph(loaded.proto, loaded.sha256)
            profile = load_profile("local-edge-cloud")
            plan = flop_pipeline(coarsen(graph, "coarse"), profile, [("edge", 1), ("cloud", 1)], name="edge+cloud")
            plan_file = tmp_path / "plan.json"
            plan_file.write_text(json.dumps(dict(plan.to_json(), model_path=str(model))))
            result = _run(
                "run", str(plan_file), "--board", "edge=edgebox", "--board", "cloud=cloudbox",
                "--frames", "10", "--verify", "--json", home=home,
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
            out = json.loads(result.stdout)
            assert out["max_abs_diff"] <= 1e-5
            assert out["hosts"] == {"edge": "edgebox", "cloud": "cloudbox"}
            assert any(p["host"] == "cloud" and p["frames"] >= 10 for p in out["partitions"])

            # Tensors went edge -> cloud and cloud -> edge directly; the host opened no stream.
            edge_log = (tmp_path / "edge" / "agent.log").read_text()
            cloud_log = (tmp_path / "cloud" / "agent.log").read_text()
            assert f"exchange stream from ipv4:{net.edge_ip}:" in cloud_log
            assert f"exchange stream from ipv4:{net.cloud_ip}:" in edge_log
            assert f"ipv4:{net.host_ip}:" not in cloud_log + edge_log

            # Both agents are still serving, and only with the token over TLS.
            ca = certs.ca.read_bytes()
            with AgentClient(f"{net.cloud_ip}:50051", token="nope", tls=(ca, None, None), timeout=5) as c:
                with pytest.raises(AgentError, match="UNAUTHENTICATED"):
                    c.status()
            with AgentClient(f"{net.cloud_ip}:50051", token="edge-cloud-token", tls=(ca, None, None)) as c:
                assert c.status().hostname
        finally:
            for p in procs:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
