"""A frame's future (``executor.FrameFuture``): what ``concurrent.futures.Future`` promised the agent's callers,
for any order of callbacks, waits and outcomes, and from several threads at once."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.executor import FrameFuture

OUTPUTS = {"y": np.arange(3, dtype=np.float32)}

# an operation on a future: add a callback, wait without blocking, or finish it (with outputs or an error)
operation = st.sampled_from(["callback", "wait", "result", "error"])


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, min_size=1, max_size=12))
def test_callbacks_run_once_in_order_and_the_first_outcome_stands(ops: list[str]) -> None:
    future = FrameFuture(7)
    calls: list[int] = []
    added = 0
    outcome: str | None = None
    for op in ops:
        if op == "callback":
            future.add_done_callback(lambda f, k=added: calls.append(k))
            added += 1
            if outcome is not None:  # done already: called at once, in this thread
                assert calls[-1] == added - 1
        elif op == "wait":
            assert future.wait(0) == (outcome is not None)
            if outcome is None:
                with pytest.raises(FutureTimeout):
                    future.result(0)
                with pytest.raises(FutureTimeout):
                    future.exception(0)
        elif op == "result":
            future.set_result(OUTPUTS)
            outcome = outcome or "result"
        else:
            future.set_exception(RuntimeError("failed"))
            outcome = outcome or "error"
    assert future.done() == (outcome is not None) and not future.cancelled()
    assert calls == (list(range(added)) if outcome else []), "each callback once, in the order added"
    if outcome == "result":
        assert future.result(0) is OUTPUTS and future.exception(0) is None
    elif outcome == "error":
        assert isinstance(future.exception(0), RuntimeError)
        with pytest.raises(RuntimeError, match="failed"):
            future.result(0)


def test_a_callback_that_raises_is_logged_and_the_others_still_run(caplog) -> None:
    future = FrameFuture(3)
    seen: list[str] = []

    def bad(_f: FrameFuture) -> None:
        raise ValueError("boom")

    future.add_done_callback(bad)
    future.add_done_callback(lambda f: seen.append("after"))
    with caplog.at_level(logging.ERROR, logger="parapipe.agent"):
        future.set_result(OUTPUTS)
    assert seen == ["after"]
    assert "done-callback of frame 3 raised" in caplog.text
    assert future.result(0) is OUTPUTS


def _one_round(error: bool) -> None:
    future = FrameFuture(1)
    start = threading.Barrier(9)
    got: list[object] = []
    called: list[int] = []
    lock = threading.Lock()

    def waiter(timeout: float | None) -> None:
        start.wait()
        try:
            value: object = future.result(timeout)
        except RuntimeError as exc:
            value = exc
        with lock:
            got.append(value)

    def adder(k: int) -> None:
        start.wait()
        future.add_done_callback(lambda f: called.append(k))

    def finisher() -> None:
        start.wait()
        if error:
            future.set_exception(RuntimeError("failed"))
        else:
            future.set_result(OUTPUTS)

    threads = [threading.Thread(target=waiter, args=(t,)) for t in (None, 30.0, None, 30.0)]
    threads += [threading.Thread(target=adder, args=(k,)) for k in range(4)]
    threads.append(threading.Thread(target=finisher))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert sorted(called) == [0, 1, 2, 3]
    assert len(got) == 4
    if error:
        assert all(isinstance(v, RuntimeError) for v in got)
    else:
        assert all(v is OUTPUTS for v in got)


@pytest.mark.parametrize("error", [False, True])
def test_waiters_and_callbacks_from_many_threads_all_see_the_outcome(error: bool) -> None:
    """Threads wait (with and without a timeout) and add callbacks while another thread finishes the frame:
    every waiter wakes with the outcome and every callback runs exactly once, whichever came first."""
    for _ in range(200):
        _one_round(error)
