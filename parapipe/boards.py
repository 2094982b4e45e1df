"""The board inventory: ``$PARAPIPE_HOME/boards.toml``, one table per board.

A board is reached over SSH (host key verified against a known_hosts file or a pinned
SHA256 fingerprint), runs the agent from its own Python in a venv under its working
directory, and is planned with a device profile. A board whose agent listens on an
address the host (and other boards) can reach is given as ``agent_address`` with a
token file and the CA of the agent's TLS certificate; parapipe then talks to that
agent directly, with no SSH tunnel, and other boards can stream tensors to it.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from models.errors import ParapipeError
from models.files import atomic_write, locked
from models.schema import first_problem, load_record, record_schema
from parapipe.home import parapipe_home

if TYPE_CHECKING:
    from agents.client import AgentClient

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class BoardError(ParapipeError):
    """The inventory or a board entry is wrong; the message says how to fix it."""


@dataclass(frozen=True)
class Board:
    name: str
    host: str
    port: int
    user: str
    key: str
    device: str
    known_hosts: str = ""
    host_key_sha256: str = ""  # "SHA256:..." as ssh-keygen -l prints it
    python: str = "python3"
    workdir: str = "~/parapipe"
    agent_port: int = 50051
    timeout_s: float = 15.0
    agent_address: str = ""  # HOST:PORT of an agent reachable directly (TLS + token), instead of the tunnel
    token_file: str = ""
    tls_ca: str = ""  # PEM file of the CA that signed the agent's certificate
    group: str = ""  # a fleet: deploy, undeploy take --group NAME and work on its boards at once
    # the profile's units this board runs (`boards check --record`, `boards add --units`): plans and tune for it
    # use only these unless told otherwise; () every unit an onnxruntime release drives
    units: tuple[str, ...] = ()


def inventory_path() -> Path:
    return parapipe_home() / "boards.toml"


def load_boards() -> dict[str, Board]:
    path = inventory_path()
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
        raise BoardError(f"{path} is not valid TOML ({exc}); fix or remove it") from None
    table = data.get("boards", {})
    if not isinstance(table, dict):
        raise BoardError(f"{path}: `boards` must be a table of boards ([boards.NAME] sections), not {table!r}")
    schema = record_schema(Board, exclude=frozenset({"name"}))
    boards = {}
    for name, raw in table.items():
        try:
            boards[name] = load_record(Board, schema.model_validate(raw), name=name)
        except ValidationError as exc:
            raise BoardError(
                f"{path}: {first_problem(exc, f'boards.{name}')}; fix it there or add the board again "
                "with `parapipe boards add`"
            ) from None
    return boards


@contextmanager
def inventory_lock() -> Iterator[None]:
    """Serialise read-modify-write of the inventory between processes (an flock on a file beside it)."""
    with locked(inventory_path()):
        yield


def get_board(name: str) -> Board:
    boards = load_boards()
    if name not in boards:
        known = ", ".join(sorted(boards)) or "none yet"
        raise BoardError(
            f"no board {name!r} in {inventory_path()} (boards: {known}); add it with `parapipe boards add`"
        )
    return boards[name]


def save_boards(boards: dict[str, Board]) -> Path:
    """Write the inventory atomically (TOML by tomli-w; callers hold ``inventory_lock`` around load-modify-save)."""
    import tomli_w

    data = {"boards": {name: {k: v for k, v in asdict(boards[name]).items() if k != "name"} for name in sorted(boards)}}
    text = "# parapipe board inventory (written by `parapipe boards add`)\n\n" + tomli_w.dumps(data)
    return atomic_write(inventory_path(), text)


def add_board(board: Board) -> Path:
    if not _NAME.match(board.name):
        raise BoardError(f"board name {board.name!r}: use letters, digits, '.', '_' or '-'")
    if board.group and not _NAME.match(board.group):
        raise BoardError(f"group name {board.group!r}: use letters, digits, '.', '_' or '-'")
    if board.agent_address:
        _check_direct(board)
    if board.agent_address and not board.host:
        pass  # an agent-only board: no SSH (its agent is started by whoever runs the board)
    elif not board.host or not board.user or not board.key:
        raise BoardError("give --host, --user and --key for SSH, or --agent-address with --token-file and --tls-ca")
    elif not Path(board.key).expanduser().is_file():
        raise BoardError(f"key file {board.key} does not exist")
    elif not board.known_hosts and not board.host_key_sha256:
        raise BoardError(
            "give the board's host key: --known-hosts FILE (e.g. from ssh-keyscan, checked by you) or "
            "--host-key SHA256:... (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub on the board)"
        )
    elif board.known_hosts:
        from parapipe.known_hosts import read_known_hosts

        read_known_hosts(board, adding=True)  # it exists and is a readable text file
    from device_profiles.loader import load_profile
    from device_profiles.selection import select_units

    profile = load_profile(board.device)  # refuses unknown profiles with the list of known ones
    if board.units:
        select_units(profile, board.units)  # units of the profile, each one an onnxruntime drives
    with inventory_lock():
        boards = load_boards()
        boards[board.name] = board
        return save_boards(boards)


def record_units(name: str, units: tuple[str, ...]) -> Path:
    """Keep ``units`` as the units board ``name`` runs (what ``boards check --record`` found there)."""
    with inventory_lock():
        boards = load_boards()
        if name not in boards:
            raise BoardError(f"no board {name!r} in {inventory_path()}")
        boards[name] = replace(boards[name], units=tuple(units))
        return save_boards(boards)


def resolve_device(device: str) -> tuple[str, tuple[str, ...]]:
    """``--device`` as plan and compare take it: a profile (name or TOML path) as given, or else an inventory
    board's name: its profile and the units recorded for it (() where none are)."""
    from device_profiles.loader import RUNTIME_PROFILES, shipped_names

    if device in RUNTIME_PROFILES or device in shipped_names() or Path(device).exists():
        return device, ()
    board = load_boards().get(device)
    return (board.device, board.units) if board is not None else (device, ())


def _check_direct(board: Board) -> None:
    host, sep, port = board.agent_address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BoardError(f"--agent-address {board.agent_address!r}: give HOST:PORT, e.g. 10.0.0.7:50051")
    if not board.token_file or not board.tls_ca:
        raise BoardError(
            "an agent reached directly needs --token-file (its bearer token) and --tls-ca (the CA of its TLS "
            "certificate); without them use SSH, which tunnels to an agent on the board's 127.0.0.1"
        )
    for what, path in (("token file", board.token_file), ("TLS CA file", board.tls_ca)):
        if not Path(path).expanduser().is_file():
            raise BoardError(f"{what} {path} does not exist")
    if not read_secret(board.token_file).strip():
        raise BoardError(f"token file {board.token_file} is empty")


def read_secret(path: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes().strip()
    except OSError as exc:
        raise BoardError(f"cannot read {path}: {exc.strerror}") from None


def read_token(path: str) -> str:
    """A bearer token file's token: printable ASCII (gRPC metadata carries nothing else)."""
    data = read_secret(path)
    try:
        token = data.decode("ascii")
    except UnicodeDecodeError:
        raise BoardError(f"token file {path} holds bytes that are not ASCII; a token is printable ASCII") from None
    if not token or not token.isprintable():
        raise BoardError(f"token file {path} is empty or holds control characters; a token is printable ASCII")
    return token


@contextmanager
def direct_client(board: Board, timeout: float = 60.0) -> Iterator[AgentClient]:
    """A client of a board's agent at its ``agent_address`` (TLS, token); checks it answers first."""
    from agents.client import AgentClient, AgentError

    token = read_token(board.token_file)
    ca = read_secret(board.tls_ca)
    with AgentClient(board.agent_address, token=token, tls=(ca, None, None), timeout=timeout) as client:
        try:
            client.health(timeout=board.timeout_s)
        except AgentError as exc:
            raise BoardError(
                f"the agent of board {board.name} at {board.agent_address} does not answer: {exc}; "
                "is it running with this token and certificate?"
            ) from None
        yield client
