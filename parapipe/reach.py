"""One way to reach a board's agent, for run, tune, profile and the benchmarks.

``open_board(name)`` yields a ``BoardSession``: a client of the board's agent and, where
other agents can reach it, the ``Peer`` they stream to. Three kinds of board:

- ``local``: an embedded board (``local``, ``local-biglittle``, ``local-edge-cloud``):
  an agent process started here on 127.0.0.1 for the session and stopped after it;
- ``direct``: an inventory board whose agent serves TLS with a token at its
  ``agent_address``, reached directly (and reachable by other boards);
- ``ssh``: an inventory board reached over SSH: the agent is installed and started if
  needed, and the client talks to it through a tunnel (other boards cannot reach it).

``session.start(bundle)`` loads a bundle and starts its pipeline on any kind (over SSH
through ``deploy``, which also records what it put on the board).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agents.client import AgentClient
from agents.peers import Peer
from device_profiles.loader import RUNTIME_PROFILES
from parapipe.local_agent import DeployError, LocalAgent

LOCAL_BOARDS = RUNTIME_PROFILES


@dataclass(frozen=True)
class Started:
    bundle_sha256: str
    bytes_received: int


@dataclass(frozen=True)
class BoardSession:
    name: str
    device: str  # the device profile plans for this board are made with
    kind: str  # local | direct | ssh
    client: AgentClient
    peer: Peer | None  # how other agents reach this one (None: only through the SSH tunnel)

    def start(self, bundle: Path, peers: list[Peer] | None = None, progress=None) -> Started:
        """Upload ``bundle`` (what is already there is not sent again) and start its pipeline."""
        if self.kind == "ssh":
            if peers:
                raise DeployError(f"board {self.name} is reached through an SSH tunnel, which other agents cannot use")
            from parapipe.boards import get_board
            from parapipe.deploy import deploy

            result = deploy(get_board(self.name), bundle, progress)
            return Started(result.bundle_sha256, result.bundle_uploaded_bytes)
        reply = self.client.load_bundle(bundle, progress)
        self.client.start(reply.bundle_sha256, peers=peers or [])
        return Started(reply.bundle_sha256, reply.bytes_received)

    def load(self, bundle: Path, progress=None) -> Started:
        """Upload ``bundle`` without starting it (multi-host plans start every host's agent afterwards)."""
        if self.kind == "ssh":
            raise DeployError(f"board {self.name} is reached through an SSH tunnel; load bundles with `deploy`")
        reply = self.client.load_bundle(bundle, progress)
        return Started(reply.bundle_sha256, reply.bytes_received)


def local_runtime_of(name: str):  # -> tuple[list[str] | None, parapipe.availability.Runtime]
    """How an embedded board's agent is started here and the onnxruntime it runs: this process's Python, or a
    runtime environment (``parapipe.runtimes``) where its units need a provider this process lacks."""
    from device_profiles.loader import load_profile
    from parapipe.runtimes import agent_python

    return agent_python(p.execution_provider for p in load_profile(name).pus)


def board_device(name: str) -> str:
    """The device profile of a board: the embedded boards are their own profile, inventory boards name one."""
    if name in LOCAL_BOARDS:
        return name
    from parapipe.boards import get_board

    return get_board(name).device


def board_units(name: str) -> tuple[str, ...]:
    """The units recorded for an inventory board (``boards check --record``); () for the embedded boards and where
    none are recorded (every unit an onnxruntime drives)."""
    if name in LOCAL_BOARDS:
        return ()
    from parapipe.boards import get_board

    return get_board(name).units


@contextmanager
def open_board(name: str) -> Iterator[BoardSession]:
    """A session with the agent of board ``name`` (see the module docstring for the three kinds)."""
    if name in LOCAL_BOARDS:
        python, runtime = local_runtime_of(name)
        if not runtime.version:
            raise DeployError(f"board {name}: {runtime.where}")
        with LocalAgent(python=python) as agent:
            assert agent.client is not None
            yield BoardSession(name, name, "local", agent.client, Peer("", f"127.0.0.1:{agent.port}"))
        return
    from parapipe.boards import direct_client, get_board, read_secret, read_token

    board = get_board(name)
    if board.agent_address:
        token = read_token(board.token_file) if board.token_file else ""
        ca = read_secret(board.tls_ca) if board.tls_ca else b""
        with direct_client(board) as client:
            yield BoardSession(name, board.device, "direct", client, Peer("", board.agent_address, token, ca))
        return
    from parapipe.deploy import agent_client, ensure_agent
    from parapipe.ssh import BoardConnection

    ensure_agent(board)
    with BoardConnection(board) as conn, agent_client(conn) as client:
        yield BoardSession(name, board.device, "ssh", client, None)
