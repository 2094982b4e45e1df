"""Timing ONNX models and their operators with onnxruntime on a pinned worker thread.

Only onnxruntime, numpy and the stdlib are used here, so the board-side agent can
run the same code for remote profiling sessions.

Per-operator times come from onnxruntime's profiler run at ORT_DISABLE_ALL: at that
level no node is fused or renamed, so every "<node>_kernel_time" event maps back to
an ONNX node name of the file. Fused execution (ORT_ENABLE_ALL, what deployments
run) is measured on whole blocks and partitions instead; the cost model learns how
the two relate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np

from profiler.pinning import cfs_settings, full_speed_ms, run_pinned
from profiler.runtime import CPU_PROVIDER, declined_nodes, open_session

# "Latency at rate" is measured (on the agent) and predicted (by the simulator) with frames arriving at this
# share of the throughput measured back to back: at exactly that throughput the queue has no slack, any
# hiccup stays in it for good and the figure is noise (53 and 25 ms in two runs of one plan, 10 ms alone).
AT_RATE_LOAD = 0.9


@dataclass(frozen=True)
class Timing:
    """Latency of repeated runs in milliseconds, and busy CPU core-seconds per run."""

    median_ms: float
    mean_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int
    cpu_s_per_run: float
    energy_mj_per_run: float | None = None
    energy_source: str = ""  # "measured" (a sensor) or "modelled" (power model), "" if not asked
    # nodes the unit's execution provider declined, so onnxruntime ran them on the CPU (``declined_in``)
    declined: tuple[str, ...] = ()

    @staticmethod
    def of(
        samples_ms: Sequence[float], cpu_s_per_run: float = 0.0, energy_mj: float | None = None, energy_source: str = ""
    ) -> Timing:
        ordered = sorted(samples_ms)
        n = len(ordered)
        return Timing(
            median_ms=statistics.median(ordered),
            mean_ms=statistics.fmean(ordered),
            p10_ms=ordered[int(0.1 * (n - 1))],
            p90_ms=ordered[round(0.9 * (n - 1))],
            repeats=n,
            cpu_s_per_run=cpu_s_per_run,
            energy_mj_per_run=energy_mj,
            energy_source=energy_source,
        )


@dataclass(frozen=True)
class PuConfig:
    """Where to run: a PU's name, the cores its worker is pinned to, threads, and any throttle."""

    pu: str
    cores: tuple[int, ...]
    threads: int
    provider: str = "CPUExecutionProvider"
    throttle_percent: float | None = None
    provider_options: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.pu}x{self.threads}"


def _session(model: bytes, cfg: PuConfig, opt_level: str, profile_prefix: str | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = cfg.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Threads are already pinned by the worker; ORT must not spin on cores it was not given.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0" if cfg.throttle_percent else "1")
    options.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[opt_level]
    options.log_severity_level = 3
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return open_session(model, options, cfg.provider, cfg.pu, dict(cfg.provider_options))


class Cancelled(TimeoutError):
    """Timing stopped because ``stop()`` said so: the caller went away or its deadline passed."""


Stop = Callable[[], bool]


def check_stop(stop: Stop | None) -> None:
    """Raise ``Cancelled`` when ``stop`` says so."""
    if stop is not None and stop():
        raise Cancelled("timing stopped: the caller went away or its deadline passed")


def declined_in(model: bytes, feeds: Mapping[str, np.ndarray], cfg: PuConfig) -> tuple[str, ...]:
    """The nodes of ``model`` that ``cfg``'s execution provider declines (its ``GetCapability``), which onnxruntime
    then runs on the CPU: read from one profiled run, where each node's event names the provider that ran it.
    Without graph rewrites, so the names are the model's. () for the CPU provider."""
    if cfg.provider == CPU_PROVIDER:
        return ()
    with tempfile.TemporaryDirectory(prefix="parapipe-declined-") as tmp:
        session = _session(model, dataclasses.replace(cfg, throttle_percent=None), "disable", os.path.join(tmp, "d"))
        session.run(None, dict(feeds))
        with open(session.end_profiling()) as fh:
            events = json.load(fh)
    return tuple(declined_nodes(events, cfg.provider))


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def time_model(
    model: bytes,
    feeds: Mapping[str, np.ndarray],
    cfg: PuConfig,
    warmup: int = 3,
    repeats: int = 10,
    opt_level: str = "all",
    min_seconds: float = 0.0,
    meter: Callable[[], AbstractContextManager] | None = None,
    stop: Stop | None = None,
) -> Timing:
    """Latency of whole-model runs on a worker pinned to cfg.cores (fused execution by default).

    ``meter`` makes an energy meter (``profiler.energy.EnergyMeter``) wrapped around the
    timed runs; its reading, per run, goes into the Timing with its source.

    On a CFS-throttled configuration what is recorded is the work a run did at the core's full speed. On one
    thread that is its CPU time (what it waited for the quota was off the CPU), timed back to back like any
    other configuration: an idle period before each run, for the quota to refill, left the core's caches cold
    and recorded more work than the same run does in a plan (squeezenet1_1's 25 coarse blocks on
    local-biglittle's throttled core summed 7.27 ms so, 4.44 back to back, 3.78 on the core unthrottled; the
    first of them 0.76, 0.42 and 0.29 ms). On several threads each timed run starts after one CFS period idle,
    with the quota refilled, and ``pinning.full_speed_ms`` of its time is recorded. Alone, that work is its
    time up to the quota; back to back the cost model takes it times the PU's sustained factor, and alone too
    where a frame's work there is more than the quota (``CostModel.burst_ms``). ``stop`` is asked before each
    run; when it says so, timing ends with ``Cancelled``.
    """
    gap = cfs_settings(cfg.throttle_percent)[0] / 1e6 if cfg.throttle_percent and cfg.threads > 1 else 0.0

    def work() -> Timing:
        session = _session(model, cfg, opt_level)
        names = [o.name for o in session.get_outputs()]
        for _ in range(warmup):
            check_stop(stop)
            session.run(names, dict(feeds))
        samples: list[float] = []
        energy = meter() if meter is not None else contextlib.nullcontext()
        cpu0 = _cpu_seconds()
        with energy:
            start = time.perf_counter()
            while len(samples) < repeats or time.perf_counter() - start < min_seconds:
                check_stop(stop)
                if gap:
                    time.sleep(gap)
                t0, c0 = time.perf_counter(), time.thread_time()
                session.run(names, dict(feeds))
                took = (time.perf_counter() - t0) * 1e3
                if cfg.throttle_percent and cfg.threads == 1:  # it ran on this thread: its CPU time is its work
                    took = min(took, (time.thread_time() - c0) * 1e3)
                elif cfg.throttle_percent:  # several threads: from its time, as the quota lets a run alone go
                    took = full_speed_ms(took, cfg.throttle_percent)
                samples.append(took)
        cpu = (_cpu_seconds() - cpu0) / len(samples)
        reading = getattr(energy, "reading", None)
        if reading is None:
            return Timing.of(samples, cpu)
        return Timing.of(samples, cpu, reading.joules * 1e3 / len(samples), reading.source)

    timing = run_pinned(work, cfg.cores, cfg.throttle_percent, name=cfg.label)
    return (
        dataclasses.replace(timing, declined=declined_in(model, feeds, cfg)) if cfg.provider != CPU_PROVIDER else timing
    )


def profile_ops(
    model: bytes,
    feeds: Mapping[str, np.ndarray],
    cfg: PuConfig,
    warmup: int = 3,
    repeats: int = 10,
    stop: Stop | None = None,
) -> dict[str, Timing]:
    """Per-node kernel time (ms) from onnxruntime's profiler at ORT_DISABLE_ALL, by ONNX node name."""

    def work() -> dict[str, Timing]:
        with tempfile.TemporaryDirectory(prefix="parapipe-prof-") as tmp:
            session = _session(model, cfg, "disable", os.path.join(tmp, "ort"))
            names = [o.name for o in session.get_outputs()]
            for _ in range(warmup + repeats):
                check_stop(stop)
                session.run(names, dict(feeds))
            path = session.end_profiling()
            with open(path) as fh:
                events = json.load(fh)
        return parse_ort_profile(events, warmup)

    return run_pinned(work, cfg.cores, cfg.throttle_percent, name=cfg.label)


def parse_ort_profile(events: list[dict], skip_runs: int = 0) -> dict[str, Timing]:
    """Group "<node>_kernel_time" events by node, run by run, dropping the first ``skip_runs`` runs."""
    runs: list[dict[str, float]] = []
    current: dict[str, float] = {}
    for ev in events:
        if ev.get("cat") == "Session" and ev.get("name") == "model_run":
            runs.append(current)
            current = {}
        elif ev.get("cat") == "Node" and str(ev.get("name", "")).endswith("_kernel_time"):
            node = ev["name"][: -len("_kernel_time")]
            current[node] = current.get(node, 0.0) + float(ev.get("dur", 0)) / 1e3
    # model_run events are written when a run ends, after its node events
    kept = runs[skip_runs:]
    per_node: dict[str, list[float]] = {}
    for run in kept:
        for node, ms in run.items():
            per_node.setdefault(node, []).append(ms)
    return {node: Timing.of(samples) for node, samples in per_node.items()}
