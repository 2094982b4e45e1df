"""``ProfileOps`` on the board: time a model (whole, or per node) on the cores and provider a request names, within
bounds, stopping when its caller goes away."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from agents.external_data import check_external_data
from agents.isolated import time_isolated
from agents.proto import parapipe_agent_pb2 as pb
from agents.service import MAX_REPEATS, MAX_THREADS, MAX_WARMUP
from profiler.runtime import (
    CPU_PROVIDER,
    ProviderUnavailable,
    available_providers,
    check_options,
    open_session,
    own_threads,
)


def check_profile_request(request: pb.ProfileRequest) -> None:
    """Refuse requests that would tie the board up: bounded threads, repeats, warm-up runs, known cores."""
    usable = sorted(os.sched_getaffinity(0))
    if request.threads > min(MAX_THREADS, len(usable)):
        raise ValueError(
            f"threads must be at most {min(MAX_THREADS, len(usable))} (the cores here), got {request.threads}"
        )
    if request.repeats > MAX_REPEATS:
        raise ValueError(f"repeats must be at most {MAX_REPEATS}, got {request.repeats}")
    if request.warmup > MAX_WARMUP:
        raise ValueError(f"warmup must be at most {MAX_WARMUP}, got {request.warmup}")
    unknown = sorted(set(request.cores) - set(usable))
    if unknown:
        raise ValueError(f"cores {unknown} are not among this agent's cores {usable}")
    if not 0.0 <= request.throttle_percent <= 100.0:
        raise ValueError(f"throttle_percent must be within 0..100, got {request.throttle_percent}")
    check_options(request.provider_options, "the profile request")


def profile_ops(request: pb.ProfileRequest, stop: Callable[[], bool] | None = None) -> pb.ProfileReply:
    """Time the request's model (whole, or per node) on the cores it names; ``stop`` is asked before each run, so
    a caller that went away or whose deadline passed stops it (``profiler.measure.Cancelled``)."""
    import onnxruntime as ort

    check_profile_request(request)
    check_external_data(request.model, None, "the model to profile")

    from agents.executor import generate_inputs
    from agents.tensors import arrays_from
    from profiler.measure import PuConfig, declined_in, time_model
    from profiler.measure import profile_ops as op_profile

    provider = request.provider or CPU_PROVIDER
    available = available_providers()
    if provider not in available:  # before any session: the unit cannot be profiled here
        raise ProviderUnavailable("remote", provider, available, f"onnxruntime {_ort_version()}")
    session = open_session(request.model, ort.SessionOptions(), CPU_PROVIDER, "remote")  # the inputs' types only
    if request.inputs:
        feeds = arrays_from(request.inputs)
    else:
        from agents.bundle import TensorSpec

        specs = tuple(
            TensorSpec(i.name, _np_type(i.type), tuple(d if isinstance(d, int) and d > 0 else 1 for d in i.shape))
            for i in session.get_inputs()
        )
        feeds = generate_inputs(specs)
    cores = tuple(request.cores) or tuple(sorted(os.sched_getaffinity(0)))[: max(1, request.threads)]
    cfg = PuConfig(
        "remote",
        cores,
        max(1, request.threads or len(cores)),
        provider,
        throttle_percent=request.throttle_percent or None,
        provider_options=tuple(sorted(request.provider_options.items())),
    )
    repeats, warmup = max(3, request.repeats or 10), request.warmup or 3
    if own_threads(provider):
        # its thread pool keeps to the unit's cores only as a process's affinity: timed in a process of its own,
        # as the executor runs it (``agents.isolated``); it compiles the graph into its own kernels, so it has no
        # per-node times
        outputs = [o.name for o in session.get_outputs()]
        timings = (
            {} if request.per_op else {"": time_isolated(request.model, feeds, outputs, cfg, warmup, repeats, stop)}
        )
        if timings:  # which nodes it declined: one profiled run here (it runs them on the CPU)
            timings[""] = dataclasses.replace(timings[""], declined=declined_in(request.model, feeds, cfg))
    elif request.per_op:
        timings = op_profile(request.model, feeds, cfg, warmup, repeats, stop)
    else:
        timings = {"": time_model(request.model, feeds, cfg, warmup, repeats, stop=stop)}
    return pb.ProfileReply(
        timings=[
            pb.OpTiming(
                node=k,
                median_ms=t.median_ms,
                mean_ms=t.mean_ms,
                p10_ms=t.p10_ms,
                p90_ms=t.p90_ms,
                repeats=t.repeats,
                declined=t.declined,
            )
            for k, t in timings.items()
        ],
        ort_version=ort.__version__,
    )


def _np_type(ort_type: str) -> str:
    return {
        "tensor(float)": "float32",
        "tensor(float16)": "float16",
        "tensor(double)": "float64",
        "tensor(int64)": "int64",
        "tensor(int32)": "int32",
        "tensor(int8)": "int8",
        "tensor(uint8)": "uint8",
        "tensor(bool)": "bool",
    }.get(ort_type, "float32")


def _ort_version() -> str:
    import onnxruntime as ort

    return str(ort.__version__)
