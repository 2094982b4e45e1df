"""``service.serve_unary``: a unary call waits for an away peer within its deadline, in process (the agent
processes' version is ``tests/agents/test_reliability.py::test_a_unary_infer_waits_within_its_deadline_for_an_away_peer``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agents import service
from agents.executor import PeerAway, PipelineError
from agents.peers import PeerError


class _Fake:
    """Stands for a pipeline: ``serve_unary`` only hands it to the call."""

    def __init__(self, name: str) -> None:
        self.name = name


def _state(tmp_path: Path, pipeline: object) -> service.AgentState:
    state = service.AgentState(tmp_path / "work")
    state.pipeline = pipeline  # type: ignore[assignment]
    return state


def _deadline(seconds: float):
    until = time.monotonic() + seconds
    return lambda: until - time.monotonic()


def test_a_call_refused_by_an_away_peer_runs_on_the_pipeline_that_replaces_it(tmp_path: Path) -> None:
    old, new = _Fake("old"), _Fake("new")
    state = _state(tmp_path, old)
    calls: list[str] = []

    def call(pipeline: _Fake) -> str:
        calls.append(pipeline.name)
        if pipeline is old:
            raise PeerAway("the link to host 'b' failed")
        return "outputs"

    def replace() -> None:
        time.sleep(0.2)  # the recovery starting the part again
        state.pipeline = new  # type: ignore[assignment]
        state.replaced()

    threading.Thread(target=replace).start()
    assert service.serve_unary(state, call, _deadline(30.0)) == "outputs"
    assert calls == ["old", "new"]


def test_a_deadline_too_short_for_the_peer_is_unavailable_saying_so(tmp_path: Path) -> None:
    state = _state(tmp_path, _Fake("old"))

    def call(pipeline: _Fake) -> str:
        raise PeerAway("the link to host 'b' failed")

    with pytest.raises(PeerError, match=r"away.*host 'b'.*Retry"):
        service.serve_unary(state, call, _deadline(0.3))
    with pytest.raises(PeerError):  # a caller that went away stops waiting too
        service.serve_unary(state, call, _deadline(30.0), active=lambda: False)


def test_other_failures_are_not_waited_for(tmp_path: Path) -> None:
    state = _state(tmp_path, _Fake("p"))

    def failing(pipeline: _Fake) -> str:
        raise PipelineError("partition s0 failed on frame 3")

    with pytest.raises(PipelineError, match="partition s0") as raised:
        service.serve_unary(state, failing, _deadline(30.0))
    assert not isinstance(raised.value, PeerAway)
    state.pipeline = None
    with pytest.raises(service.NotReady):
        service.serve_unary(state, failing, _deadline(30.0))
