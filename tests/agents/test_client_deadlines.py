"""Every host-side call carries a deadline: against an agent that accepts connections and never answers,
each public method of ``AgentClient`` fails with an AgentError instead of hanging."""

from __future__ import annotations

import inspect
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from agents.client import AgentClient, AgentError
from agents.proto import parapipe_agent_pb2 as pb
from tests.support.tiny import write_tiny_bundle

GUARD_S = 60.0


@pytest.fixture
def black_hole():
    """A TCP port that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for s in held:
        s.close()
    server.close()


def test_every_client_call_has_a_deadline(black_hole: int, tmp_path: Path) -> None:
    bundle = write_tiny_bundle(tmp_path / "b")
    calls = {
        "health": lambda c: c.health(),
        "ready": lambda c: c.ready(),
        "status": lambda c: c.status(),
        "load_bundle": lambda c: c.load_bundle(bundle),
        "start": lambda c: c.start("0" * 64),
        "stop": lambda c: c.stop(),
        "infer": lambda c: c.infer({"idx": np.zeros(1, np.int64)}),
        "infer_stream": lambda c: list(c.infer_stream([{"idx": np.zeros(1, np.int64)}])),
        "infer_stream_results": lambda c: list(c.infer_stream_results([{"idx": np.zeros(1, np.int64)}])),
        "benchmark": lambda c: c.benchmark(frames=1),
        "profile_ops": lambda c: c.profile_ops(pb.ProfileRequest(model=b"")),
        "wait_serving": lambda c: c.wait_serving(0.2),
    }
    public = {n for n, f in inspect.getmembers(AgentClient, inspect.isfunction) if not n.startswith("_")} - {"close"}
    assert public == set(calls), f"a client call is not walked here: {sorted(public ^ set(calls))}"
    # the calls that may run for minutes (uploads, benchmarks) get a short deadline here too; health and
    # ready keep their own default (2 s): that default is what is checked for them
    with AgentClient(f"127.0.0.1:{black_hole}", timeout=0.2, long_timeout=0.4) as client:
        for name, call in calls.items():
            outcome: list[BaseException | None] = []

            def run(call=call, outcome=outcome) -> None:
                try:
                    call(client)
                    outcome.append(None)
                except BaseException as exc:
                    outcome.append(exc)

            t = threading.Thread(target=run, daemon=True)
            t.start()
            t.join(GUARD_S)
            assert not t.is_alive(), f"{name} has no deadline"
            assert isinstance(outcome[0], AgentError), (name, outcome[0])
