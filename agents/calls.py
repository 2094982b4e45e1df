"""How the agent's gRPC calls meet the pipeline, for parapipe's API (``agents.server``) and the Open Inference
Protocol (``agents.inference``) alike: the status an error becomes, waiting for a frame within the call's
deadline, one unary frame, and a stream of requests answered in order while later ones are fed."""

from __future__ import annotations

import errno
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import grpc

from agents import service
from agents.bundle import BundleError
from agents.executor import DeadlineExceeded, FrameFuture, InputError, Pipeline, PipelineError
from agents.peers import PeerError
from agents.tensors import TensorError
from profiler.measure import Cancelled
from profiler.runtime import ProviderUnavailable

log = logging.getLogger("parapipe.agent")
POLL_S = 0.5  # how often blocked calls look whether their caller is still there


def abort(context: grpc.ServicerContext, exc: BaseException) -> None:
    """Map an error to the gRPC status that says what went wrong; the agent keeps serving."""
    if isinstance(exc, (DeadlineExceeded, FutureTimeout, Cancelled)):
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc) or "the deadline passed")
    if isinstance(exc, service.NotFound):
        context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
    if isinstance(exc, service.NotReady):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, (PipelineError, ProviderUnavailable)):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, PeerError):
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    if isinstance(exc, (BundleError, TensorError, InputError, ValueError)):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        log.warning("the disk is full: %s", exc)
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "the board's disk is full (nothing was kept of this call's writes): free space on it, for example "
            "remove bundles it no longer runs from the agent's workdir/bundles",
        )
    log.exception("internal error")  # the details (paths on the board) stay in the agent's log
    context.abort(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); the agent's log has the details")


def wait_outputs(pipeline: Pipeline, future: FrameFuture, context: grpc.ServicerContext):
    """A frame's outputs; the frame is given up (and DeadlineExceeded raised) when the call's
    deadline passes or its caller goes away, so no server thread waits for ever."""
    while True:
        left = context.time_remaining()
        step = POLL_S if left is None else max(0.0, min(POLL_S, left))
        if pipeline.wait(future, step):  # on the frame's latch: a C-level lock its last worker releases
            return future.result(0)
        if not context.is_active() or (left is not None and left <= step):
            return pipeline.result(future, 0)


def infer_frame(pipeline: Pipeline, tensors: dict, context: grpc.ServicerContext) -> dict:
    """One unary call's frame: run in the calling thread where the pipeline is one idle partition, else
    submitted and waited for within the call's deadline."""
    outputs = pipeline.infer_inline(tensors, context.time_remaining())
    if outputs is None:
        outputs = wait_outputs(pipeline, pipeline.submit(tensors, timeout=context.time_remaining()), context)
    return outputs


class Refused(Exception):
    """One request of a stream refused for its own fault: answered with this message, and the stream goes on."""


def answer_in_order(
    state: service.AgentState,
    pipeline: Pipeline,
    requests: Iterable[Any],
    context: grpc.ServicerContext,
    submit: Callable[[Any], FrameFuture],
    stopped: Callable[[], str],
    broken: Callable[[Exception], str] | None = None,
    name: str = "pp-stream-feed",
) -> Iterator[tuple[Any, dict | None, str]]:
    """A stream's answers: ``(request, outputs, "")`` or ``(request, None, why it failed)``, in the requests' order.

    The requests are fed to ``pipeline`` by a thread of their own while earlier ones run (so the pipeline overlaps
    them). ``submit`` gives a request's frame future, or raises ``Refused`` (that request's own error: answered,
    the stream goes on); anything else it raises ends the stream with its status once the answers before it are
    sent. A request stream that breaks ends it the same way, or, with ``broken``, is answered last with
    ``broken(error)``. A frame that fails in the pipeline is answered with its error. When the pipeline stops,
    the stream ends with FAILED_PRECONDITION saying ``stopped()``, which also ends the feed thread."""
    pending: deque[tuple[Any, FrameFuture | None, str]] = deque()
    cond = threading.Condition()
    error: list[Exception] = []
    done = [False]

    def feed() -> None:
        try:
            for request in requests:
                try:
                    item = (request, submit(request), "")
                except Refused as exc:
                    item = (request, None, str(exc))
                with cond:
                    pending.append(item)
                    cond.notify()
        except Exception as exc:  # the request stream broke, or a request the stream cannot go on after
            with cond:
                if broken is not None:
                    pending.append((None, None, broken(exc)))
                else:
                    error.append(exc)
        finally:
            with cond:
                done[0] = True
                cond.notify()
            state.feeding(-1)

    state.feeding(+1)
    threading.Thread(target=feed, name=name, daemon=True).start()
    while True:
        with cond:
            while not pending and not done[0] and context.is_active() and not pipeline.stopping:
                cond.wait(POLL_S)
            if not pending and pipeline.stopping and not done[0]:  # ends the call, and so its feed
                abort(context, PipelineError(stopped()))
            if not pending:
                break
            request, future, why = pending.popleft()
        if future is None:
            yield request, None, why
            continue
        try:
            outputs = wait_outputs(pipeline, future, context)
        except PipelineError as exc:  # this frame failed: say so, the stream goes on
            yield request, None, str(exc)
            continue
        except Exception as exc:
            abort(context, exc)
        yield request, outputs, ""
    if error:
        abort(context, error[0])
