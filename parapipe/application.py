"""``parapipe.connect``: an application's handle on a deployed plan.

``connect("vim3")`` reaches an inventory board the way every command does (directly at its
``agent_address`` with its token and TLS CA, or through an SSH tunnel to the agent on its
127.0.0.1); ``connect("HOST:PORT", token=..., tls_ca=...)`` reaches an agent at an address.
Nothing is installed or started: the plan must be deployed (``parapipe deploy``). Frames go to
the entry agent, which runs the whole pipeline (over every host of the plan).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from agents.client import AgentClient, AgentError
from models.errors import ParapipeError


class InferenceError(ParapipeError):
    """A frame failed or the agent could not be used; the message says why and what to do."""


class Connection:
    """A deployed plan: ``infer(inputs)`` for one frame, ``stream(frames)`` to pipeline many.

    Inputs are arrays by the model's input names (dtype and shape as the plan was made for);
    outputs come back as arrays by the model's output names. Use as a context manager, or ``close()``.
    """

    def __init__(self, target: str, client: AgentClient, stack: ExitStack) -> None:
        self.target, self.client, self._stack = target, client, stack

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of one frame."""
        try:
            return self.client.infer({k: np.asarray(v) for k, v in inputs.items()})
        except AgentError as exc:
            raise InferenceError(f"{self.target}: {exc}") from None

    def stream(self, frames: Iterable[Mapping[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
        """The outputs of each frame, in order, while later frames are already in the pipeline (the
        throughput of the plan, not of one frame at a time). A failed frame raises InferenceError."""
        arrays = ({k: np.asarray(v) for k, v in f.items()} for f in frames)
        try:
            for index, result in self.client.infer_stream_results(arrays):
                if isinstance(result, AgentError):
                    raise InferenceError(f"{self.target}: frame {index} failed: {result}")
                yield result
        except AgentError as exc:
            raise InferenceError(f"{self.target}: {exc}") from None

    def ready(self) -> bool:
        """Whether a pipeline runs and takes frames."""
        try:
            return self.client.ready()
        except AgentError:
            return False

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).expanduser().read_bytes().strip()
    except OSError as exc:
        raise InferenceError(f"cannot read {path}: {exc.strerror}") from None


def connect(
    target: str,
    token: str | None = None,
    token_file: str | Path | None = None,
    tls_ca: str | Path | None = None,
    timeout: float = 30.0,
) -> Connection:
    """A connection to the plan deployed on board ``target`` (an inventory name) or at ``HOST:PORT``.

    For an address, ``token``/``token_file`` and ``tls_ca`` (the CA file of the agent's certificate)
    are those the agent serves with; an inventory board brings its own. ``timeout`` bounds each call
    and the wait for the agent to answer."""
    stack = ExitStack()
    try:
        if ":" in target:
            if token_file is not None:
                token = _read(token_file).decode()
            ca = _read(tls_ca) if tls_ca is not None else None
            client = stack.enter_context(
                AgentClient(target, token=token, tls=(ca, None, None) if ca else None, timeout=timeout)
            )
            try:
                client.wait_serving(timeout)
            except AgentError as exc:
                raise InferenceError(
                    f"no agent answers at {target}: {exc}; is the plan deployed (parapipe deploy) and the agent running?"
                ) from None
        else:
            client = _board_client(target, stack, timeout)  # checks that the board's agent answers
        return Connection(target, client, stack)
    except BaseException:
        stack.close()
        raise


def _board_client(name: str, stack: ExitStack, timeout: float) -> AgentClient:
    from parapipe.boards import direct_client, get_board

    board = get_board(name)  # says which boards there are, and how to add one
    if board.agent_address:
        return stack.enter_context(direct_client(board, timeout))
    from parapipe.deploy import agent_client
    from parapipe.ssh import BoardConnection

    conn = stack.enter_context(BoardConnection(board))
    return stack.enter_context(agent_client(conn))
