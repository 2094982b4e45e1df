"""Before anyone shows the token, nobody can take the agent down: idle connections to either port are bounded and
closed, the metrics port's TLS handshakes never block its other scrapes, and a tokenless call is refused before
its message is read (issue 42, items 1, 2 and 11)."""

from __future__ import annotations

import os
import socket
import ssl
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from agents.proto import parapipe_agent_pb2 as pb
from agents.proto import parapipe_agent_pb2_grpc as rpc
from parapipe.local_agent import LocalAgent
from tests.agents.test_metrics import prometheus_env, scrape  # noqa: F401  (a fixture)
from tests.support.certs import make_certs

pytestmark = pytest.mark.agent
TOKEN = "metrics-token"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _hold(port: int, n: int) -> list[socket.socket]:
    """``n`` TCP connections to ``port`` that never send a byte (those the agent closes at once included)."""
    held = []
    for _ in range(n):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            pass
    return held


def test_idle_connections_do_not_exhaust_the_agents_file_descriptors(tmp_path: Path, prometheus_env) -> None:  # noqa: F811
    """Under 256 file descriptors, 300 silent connections to each port: the agent still answers and is scraped at
    once (was: "File descriptor limit reached", health failing; then scrapes refused while silent connections held
    every place), and holds at most its bounds."""
    python = ["prlimit", "--nofile=256", sys.executable, "-m", "agents.server"]
    with LocalAgent(token=TOKEN, metrics=True, python=python, extra_env=prometheus_env) as agent:
        held = _hold(agent.port, 300) + _hold(agent.metrics_port, 300)
        try:
            time.sleep(0.5)
            assert agent.client.status() is not None
            from agents.metrics import IDLE_S, MAX_SCRAPES
            from agents.server import MAX_CONNECTIONS

            open_fds = len(os.listdir(f"/proc/{agent.process.pid}/fd"))
            assert open_fds < MAX_CONNECTIONS + MAX_SCRAPES + 64, open_fds
            # the metrics port's places are all held by silent connections: a scraper takes the place of the
            # oldest of them at once (they filled every place, and scrapes failed until they timed out)
            for _ in range(3):
                started = time.monotonic()
                assert scrape(agent.metrics_port)
                assert time.monotonic() - started < IDLE_S / 2
        finally:
            for s in held:
                s.close()
        assert "File descriptor limit" not in agent.log_path.read_text()


def test_a_silent_tls_connection_does_not_block_the_metrics_port(tmp_path: Path, prometheus_env) -> None:  # noqa: F811
    """The TLS handshake ran in accept() on the one serving thread: one connection that sent nothing held every
    scrape behind it. Now it runs in the connection's own thread, with a timeout."""
    certs = make_certs(tmp_path / "certs", ["127.0.0.1"])
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with LocalAgent(
        token=TOKEN, metrics=True, tls=(certs.cert, certs.key, certs.ca), extra_env=prometheus_env
    ) as agent:
        silent = socket.create_connection(("127.0.0.1", agent.metrics_port))
        try:
            time.sleep(0.2)
            context = ssl.create_default_context(cafile=str(certs.ca))
            request = urllib.request.Request(f"https://127.0.0.1:{agent.metrics_port}/metrics")
            request.add_header("Authorization", f"Bearer {TOKEN}")
            with urllib.request.urlopen(request, timeout=5, context=context) as reply:
                assert b"parapipe_" in reply.read()
        finally:
            silent.close()


def test_a_non_ascii_authorization_header_is_a_wrong_token(prometheus_env) -> None:  # noqa: F811
    with LocalAgent(token=TOKEN, metrics=True, extra_env=prometheus_env) as agent:
        with socket.create_connection(("127.0.0.1", agent.metrics_port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\nAuthorization: Bearer \xe9t\xe9\r\n\r\n")
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
        assert reply.startswith(b"HTTP/1.0 401"), reply[:80]
        assert "Traceback" not in agent.log_path.read_text()


def test_tokenless_calls_are_refused_before_their_message_is_read() -> None:
    """12 tokenless 60 MiB Infer calls at once took the agent from 77 to 359 MiB (327 held after): a unary
    handler reads the whole message before it can refuse it."""
    with LocalAgent(token=TOKEN) as agent:
        pid = agent.process.pid
        before = _rss_mib(pid)
        channel = grpc.insecure_channel(f"127.0.0.1:{agent.port}", options=[("grpc.max_send_message_length", 1 << 30)])
        stub = rpc.AgentStub(channel)
        frame = pb.Frame(tensors=[pb.Tensor(name="x", data=b"\0" * (60 << 20))])
        codes: list[grpc.StatusCode] = []
        peak = [before]
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _rss_mib(pid))
                time.sleep(0.02)

        def call() -> None:
            try:
                stub.Infer(frame, timeout=60)
            except grpc.RpcError as exc:
                codes.append(exc.code())

        watcher = threading.Thread(target=watch)
        watcher.start()
        callers = [threading.Thread(target=call) for _ in range(12)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        done.set()
        watcher.join()
        channel.close()
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 12
        assert peak[0] - before < 120, f"the agent grew from {before:.0f} to {peak[0]:.0f} MiB"
