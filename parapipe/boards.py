"""The board inventory: ``$PARAPIPE_HOME/boards.toml``, one table per board.

A board is reached over SSH (host key verified against a known_hosts file or a pinned
SHA256 fingerprint), runs the agent from its own Python in a venv under its working
directory, and is planned with a device profile.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from models.errors import ParapipeError
from parapipe.home import parapipe_home

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


def inventory_path() -> Path:
    return parapipe_home() / "boards.toml"


def load_boards() -> dict[str, Board]:
    path = inventory_path()
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, OSError) as exc:
        raise BoardError(f"{path} is not valid TOML ({exc}); fix or remove it") from None
    boards = {}
    fields = set(Board.__dataclass_fields__)
    for name, raw in data.get("boards", {}).items():
        unknown = set(raw) - fields
        if unknown:
            raise BoardError(f"{path}: boards.{name}: unknown field(s) {sorted(unknown)}")
        try:
            boards[name] = Board(name=name, **{k: v for k, v in raw.items() if k != "name"})
        except TypeError as exc:
            raise BoardError(f"{path}: boards.{name}: {exc}") from None
    return boards


def get_board(name: str) -> Board:
    boards = load_boards()
    if name not in boards:
        known = ", ".join(sorted(boards)) or "none yet"
        raise BoardError(
            f"no board {name!r} in {inventory_path()} (boards: {known}); add it with `parapipe boards add`"
        )
    return boards[name]


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


def save_boards(boards: dict[str, Board]) -> Path:
    lines = ["# parapipe board inventory (written by `parapipe boards add`)", ""]
    for name in sorted(boards):
        lines.append(f"[boards.{json.dumps(name)}]")
        for k, v in asdict(boards[name]).items():
            if k != "name":
                lines.append(f"{k} = {_toml_value(v)}")
        lines.append("")
    path = inventory_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("\n".join(lines))
    os.replace(tmp, path)
    return path


def add_board(board: Board) -> Path:
    if not _NAME.match(board.name):
        raise BoardError(f"board name {board.name!r}: use letters, digits, '.', '_' or '-'")
    if not Path(board.key).expanduser().is_file():
        raise BoardError(f"key file {board.key} does not exist")
    if not board.known_hosts and not board.host_key_sha256:
        raise BoardError(
            "give the board's host key: --known-hosts FILE (e.g. from ssh-keyscan, checked by you) or "
            "--host-key SHA256:... (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub on the board)"
        )
    if board.known_hosts and not Path(board.known_hosts).expanduser().is_file():
        raise BoardError(f"known_hosts file {board.known_hosts} does not exist")
    from device_profiles.loader import load_profile

    load_profile(board.device)  # refuses unknown profiles with the list of known ones
    boards = load_boards()
    boards[board.name] = board
    return save_boards(boards)
