"""A board's known_hosts file, read the way OpenSSH reads it, with a clear error instead of a traceback.

paramiko's own loader raises whatever its parsers raise (``InvalidHostKey`` for a bad
base64 key or an ``@cert-authority`` line, ``ValueError`` from the crypto library for a
truncated RSA key, ``UnicodeDecodeError`` for a file that is not text) and a hashed host
name with a bad salt fails only later, in the middle of the connection
(``AssertionError``, ``binascii.Error``). Here every line is read on its own:

- a line that cannot be read is skipped, as OpenSSH skips it, and named (file and line)
  in the error if the board's key is then not found;
- ``@revoked`` keys are never trusted, not even when another line or a pinned
  fingerprint names them;
- ``@cert-authority`` lines are skipped: host certificates are not checked, so a board
  needs a line with its own host key;
- a file that is missing, unreadable, a folder or not UTF-8 text is a ``BoardError``
  naming the file and what to do.
"""

from __future__ import annotations

import base64
import hashlib
import stat
from dataclasses import dataclass
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry

from parapipe.boards import Board, BoardError


def fingerprint(key: paramiko.PKey) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def _what_to_do(board: Board, adding: bool) -> str:
    again = "" if adding else "restore it, or "
    return (
        f"{again}add the board {'' if adding else 'again '}with `parapipe boards add {board.name} ... --known-hosts FILE` "
        "(a readable file holding the board's host key, e.g. from ssh-keyscan, checked by you) or --host-key SHA256:..."
    )


@dataclass(frozen=True)
class KnownHosts:
    path: Path
    entries: tuple[HostKeyEntry, ...]
    revoked: frozenset[str]  # fingerprints of the keys of @revoked lines
    skipped: tuple[str, ...]  # "line N: why" for every line that could not be read

    def install(self, keys: paramiko.HostKeys) -> None:
        """Add the trusted keys (none that is revoked) to a client's host keys."""
        for entry in self.entries:
            if fingerprint(entry.key) in self.revoked:
                continue
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)

    def why_not_found(self) -> str:
        """What to add to an 'unknown host key' error: the lines that were skipped, if any."""
        notes = []
        if self.skipped:
            shown = "; ".join(self.skipped[:3]) + ("; ..." if len(self.skipped) > 3 else "")
            notes.append(f"{len(self.skipped)} line(s) of {self.path} could not be read and were skipped: {shown}")
        if self.revoked:
            notes.append(f"{len(self.revoked)} key(s) marked @revoked there are never trusted")
        return f" ({'; '.join(notes)})" if notes else ""


def read_known_hosts(board: Board, adding: bool = False) -> KnownHosts:
    """The board's known_hosts file (``board.known_hosts``), or a BoardError naming it and what to do
    (``adding``: while the board is being added to the inventory)."""
    path = Path(board.known_hosts).expanduser()
    try:
        mode = path.stat().st_mode
        # a folder, or a FIFO or device that would block the read or never end
        problem = "" if stat.S_ISREG(mode) else ("a folder" if stat.S_ISDIR(mode) else "not a regular file")
        data = b"" if problem else path.read_bytes()
    except OSError as exc:
        problem = exc.strerror or str(exc)
    if problem:
        raise BoardError(
            f"board {board.name}: cannot read its known_hosts file {path} ({problem}); {_what_to_do(board, adding)}"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BoardError(
            f"board {board.name}: its known_hosts file {path} is not text (byte {exc.start} is not UTF-8); "
            f"{_what_to_do(board, adding)}"
        ) from None
    entries: list[HostKeyEntry] = []
    revoked: set[str] = set()
    skipped: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        marker = ""
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            line = line.strip()
            if marker == "@cert-authority":
                skipped.append(f"line {number}: @cert-authority (host certificates are not checked)")
                continue
            if marker != "@revoked":
                skipped.append(f"line {number}: unknown marker {marker[:40]!r}")
                continue
        entry, why = _parse(line)
        if entry is None:
            skipped.append(f"line {number}: {why}")
        elif marker == "@revoked":
            revoked.add(fingerprint(entry.key))
        else:
            entries.append(entry)
    return KnownHosts(path, tuple(entries), frozenset(revoked), tuple(skipped))


def _parse(line: str) -> tuple[HostKeyEntry | None, str]:
    """One host key line, or None and why it cannot be read."""
    try:
        entry = HostKeyEntry.from_line(line)
    except Exception as exc:  # paramiko and the crypto library raise many kinds for a malformed key
        return None, f"not a host key ({type(exc).__name__})"
    if entry is None:
        return None, "not 'HOSTS KEYTYPE KEY', or a key type paramiko does not know"
    for name in entry.hostnames:
        if name.startswith("|1|"):  # a hashed host name: its salt is checked when it is compared
            try:
                paramiko.HostKeys.hash_host("probe", name)
            except Exception as exc:  # binascii.Error, AssertionError for a salt of the wrong length
                return None, f"a hashed host name that cannot be read ({type(exc).__name__})"
    return entry, ""
