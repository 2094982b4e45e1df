"""SSH to boards with paramiko: host keys verified (RejectPolicy), commands quoted, timeouts everywhere.

``BoardConnection`` runs commands (built with ``shlex.join``), uploads files through a
temporary name checked by sha256 on the board before an atomic rename, and forwards a
local port to the agent on the board's 127.0.0.1 (the agent never listens publicly).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import select
import shlex
import socket
import threading
import uuid
from pathlib import Path

import paramiko

from parapipe.boards import Board
from parapipe.known_hosts import fingerprint, read_known_hosts
from parapipe.local_agent import DeployError

log = logging.getLogger(__name__)

PARTIAL = ".parapipe-partial-"  # an upload's temporary name: <target>.parapipe-partial-<8 hex digits>


class _PinnedKey(paramiko.MissingHostKeyPolicy):
    """Accept exactly the pinned fingerprint, unless a known_hosts line revokes it; anything else is
    refused before authentication."""

    def __init__(self, expected: str, revoked: frozenset[str] = frozenset()) -> None:
        self.expected, self.revoked = expected, revoked

    def missing_host_key(self, client, hostname, key) -> None:
        got = fingerprint(key)
        if got in self.revoked:
            raise DeployError(
                f"host key of {hostname} is {got}, which the known_hosts file marks @revoked: refusing to connect"
            )
        if got != self.expected:
            raise DeployError(
                f"host key of {hostname} is {got}, but the inventory pins {self.expected}; if the board was "
                "reinstalled, check the new key on the board and update it with `parapipe boards add`"
            )


class BoardConnection:
    def __init__(self, board: Board) -> None:
        self.board = board
        self.client = paramiko.SSHClient()
        known = read_known_hosts(board) if board.known_hosts else None
        if known is not None:
            known.install(self.client.get_host_keys())
        key = Path(board.key).expanduser()
        try:
            key.open("rb").close()
        except OSError as exc:
            raise DeployError(
                f"board {board.name}: cannot read its SSH key {key} ({exc.strerror or exc}); restore it, or add the "
                f"board again with `parapipe boards add {board.name} ... --key FILE`"
            ) from None
        if board.host_key_sha256:
            self.client.set_missing_host_key_policy(
                _PinnedKey(board.host_key_sha256, known.revoked if known is not None else frozenset())
            )
        else:
            self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            self.client.connect(
                board.host,
                port=board.port,
                username=board.user,
                key_filename=str(key),
                timeout=board.timeout_s,
                banner_timeout=board.timeout_s,
                auth_timeout=board.timeout_s,
                allow_agent=False,
                look_for_keys=False,
            )
        except paramiko.BadHostKeyException as exc:
            raise DeployError(
                f"the host key of {board.host}:{board.port} CHANGED: the board presents {fingerprint(exc.key)}, "
                f"{board.known_hosts} expects {fingerprint(exc.expected_key)}. Refusing to connect; if the board was "
                "reinstalled, verify the new key on the board and update the known_hosts file."
            ) from None
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise DeployError(
                    f"{board.host}:{board.port} is not in {board.known_hosts or 'a known_hosts file'}: refusing an unknown "
                    "host key. Add the board's key (checked on the board) to the known_hosts file."
                    + (known.why_not_found() if known is not None else "")
                ) from None
            raise DeployError(f"cannot connect to {board.user}@{board.host}:{board.port}: {exc}") from None
        except DeployError:
            raise
        except (TimeoutError, OSError) as exc:
            raise DeployError(f"cannot reach {board.host}:{board.port}: {exc}") from None
        transport = self.client.get_transport()
        assert transport is not None
        transport.set_keepalive(15)
        self.transport = transport

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> BoardConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self, argv: list[str], timeout: float = 120.0, check: bool = True, stdin: bytes | None = None
    ) -> tuple[int, str, str]:
        """Run one command on the board; every argument is quoted with shlex."""
        return self.shell(shlex.join(argv), timeout, check, stdin)

    def shell(
        self, command: str, timeout: float = 120.0, check: bool = True, stdin: bytes | None = None
    ) -> tuple[int, str, str]:
        """Run a command line the caller built from quoted parts."""
        try:
            chan_in, chan_out, chan_err = self.client.exec_command(command, timeout=timeout)
            if stdin is not None:
                chan_in.write(stdin)
                chan_in.channel.shutdown_write()
            out = chan_out.read().decode(errors="replace")
            err = chan_err.read().decode(errors="replace")
            code = chan_out.channel.recv_exit_status()
        except (TimeoutError, paramiko.SSHException) as exc:
            raise DeployError(f"command on {self.board.name} timed out or failed: {command[:120]}: {exc}") from None
        if check and code != 0:
            raise DeployError(f"command on {self.board.name} failed ({code}): {command[:160]}\n{err.strip()[-800:]}")
        return code, out, err

    def home(self) -> str:
        return self.run(["sh", "-c", 'printf %s "$HOME"'])[1]

    def path(self, p: str) -> str:
        """Expand a leading ~ (the board's home); everything else is used literally."""
        if p == "~" or p.startswith("~/"):
            return self.home() + p[1:]
        return p

    def upload(self, data: bytes, remote: str, progress=None) -> None:
        """Write to a temporary name beside ``remote``, check its sha256 on the board, then rename over
        ``remote``. An upload cut off here (an error, the connection dropping, Ctrl-C) removes its
        temporary file; one cut off harder (the host killed) leaves a ``.parapipe-partial-`` file that
        the next deploy removes (``remove_partial_uploads``)."""
        tmp = f"{remote}{PARTIAL}{uuid.uuid4().hex[:8]}"
        done = False
        try:
            sftp = self.client.open_sftp()
            try:
                sftp.get_channel().settimeout(self.board.timeout_s * 4)
                with sftp.open(tmp, "wb") as fh:
                    fh.set_pipelined(True)
                    step = 1 << 20
                    for off in range(0, len(data), step):
                        fh.write(data[off : off + step])
                        if progress:
                            progress(min(off + step, len(data)), len(data))
            except (OSError, paramiko.SSHException) as exc:
                raise DeployError(f"upload of {remote} to {self.board.name} failed: {exc}") from None
            finally:
                sftp.close()
            expected = hashlib.sha256(data).hexdigest()
            _, out, _ = self.run(["sha256sum", tmp])
            if out.split()[0] != expected:
                raise DeployError(f"upload of {remote} arrived damaged (sha256 mismatch); nothing was replaced")
            self.run(["mv", "-f", tmp, remote])
            done = True
        finally:
            if not done:
                self._remove_quietly(tmp)

    def _remove_quietly(self, path: str) -> None:
        """Best effort: the connection may be the thing that failed (the next deploy cleans up then)."""
        try:
            self.run(["rm", "-f", path], timeout=self.board.timeout_s, check=False)
        except (DeployError, OSError, paramiko.SSHException, EOFError):
            pass

    def remove_partial_uploads(self, folder: str) -> list[str]:
        """Remove the temporary files of uploads into ``folder`` cut off before they could clean up
        (only names ``upload`` makes: ``<name>.parapipe-partial-<8 hex digits>``); returns them."""
        script = (
            'for p in "$1"/*"$2"????????; do [ -f "$p" ] && [ ! -L "$p" ] || continue; '
            'case "${p##*$2}" in *[!0-9a-f]*) continue;; esac; rm -f -- "$p" && printf "%s\\0" "$p"; done; exit 0'
        )
        _, out, _ = self.run(["sh", "-c", script, "sh", folder, PARTIAL])
        return [p for p in out.split("\0") if p]

    def forward(self, remote_port: int) -> LocalForward:
        return LocalForward(self.transport, remote_port)


class LocalForward:
    """127.0.0.1:<free port> on the host -> 127.0.0.1:<remote_port> on the board, through the SSH transport.

    A connection the board refuses (nothing listens on the port, sshd forbids forwarding) is closed at
    once; why is logged and kept in ``failures``, since TCP itself can only say "reset"."""

    def __init__(self, transport: paramiko.Transport, remote_port: int) -> None:
        self.transport, self.remote_port = transport, remote_port
        self.failures: list[str] = []
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, name="pp-forward", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            try:
                chan = self.transport.open_channel("direct-tcpip", ("127.0.0.1", self.remote_port), sock.getpeername())
            except (paramiko.SSHException, OSError) as exc:
                why = f"the board refused a forwarded connection to its 127.0.0.1:{self.remote_port}: {exc!r}"
                self.failures.append(why)
                log.warning("%s", why)
                sock.close()
                continue
            threading.Thread(target=self._pump, args=(sock, chan), name="pp-forward-pump", daemon=True).start()

    @staticmethod
    def _pump(sock: socket.socket, chan: paramiko.Channel) -> None:
        try:
            while True:
                ready, _, _ = select.select([sock, chan], [], [], 1.0)
                if sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in ready:
                    data = chan.recv(65536)
                    if not data:
                        break
                    sock.sendall(data)
        except OSError:
            pass
        finally:
            chan.close()
            sock.close()

    def close(self) -> None:
        """Stop listening: shut down first, which wakes the accept thread (a plain close leaves it blocked in
        accept(2), and the port listening, for the life of the process)."""
        self.stopping = True
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(timeout=5)

    def __enter__(self) -> LocalForward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
