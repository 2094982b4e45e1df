"""A profiling run on a board this host can reach directly (``local``, ``local-biglittle``).

For each PU configuration (a CPU PU with 1..n threads pinned to its first cores):
  1. per-operator kernel times from onnxruntime's profiler (unfused, ORT_DISABLE_ALL);
  2. every block of the chosen granularity, cut out and timed fused (ORT_ENABLE_ALL);
  3. a handful of whole partitions (runs of consecutive coarse blocks), timed fused,
     so the cost model can learn how a partition relates to the sum of its blocks.
Then, here (not yet through an agent), for each memory the profile says PUs share: the whole model
alone on each of its cores and on all of them at once (``profiler.contention``), which gives the
memory's bandwidth for this model (a ``memory-bandwidth`` calibration value).
Results go into a CostTable; entries already there are skipped, and whatever was
measured is saved even if the run is interrupted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from device_profiles.schema import DeviceProfile, ProcessingUnit, SharedMemory
from models.coarsen import coarsen
from models.errors import ParapipeError
from models.graph import OpGraph
from models.inputs import tensor_values
from models.onnx_io import LoadedModel
from models.partition import GroupExtractor
from profiler.contention import measure_contention
from profiler.costtable import EVERY_UNIT, CalibrationRecord, Conditions, CostEntry, CostTable, entry_key
from profiler.energy import EnergyMeter, PowerModel
from profiler.measure import PuConfig, Timing, profile_ops, time_model
from profiler.roofline import Roofline
from profiler.runtime import ProviderFailed

Progress = Callable[[str, int, int], None]  # (what, done, total)


class Timer(Protocol):
    """Where measurements are taken: here (``LocalTimer``) or on a board through its agent, with the
    onnxruntime version there (a condition of every entry it measures)."""

    @property
    def ort_version(self) -> str: ...

    def op_profile(
        self, model: bytes, feeds: dict[str, np.ndarray], cfg: PuConfig, warmup: int, repeats: int
    ) -> dict[str, Timing]: ...

    def time(
        self, model: bytes, feeds: dict[str, np.ndarray], cfg: PuConfig, warmup: int, repeats: int, pu: ProcessingUnit
    ) -> Timing: ...


class LocalTimer:
    @property
    def ort_version(self) -> str:
        import onnxruntime as ort

        return str(ort.__version__)

    def op_profile(self, model, feeds, cfg, warmup, repeats):  # type: ignore[no-untyped-def]
        return profile_ops(model, feeds, cfg, warmup, repeats)

    def time(self, model, feeds, cfg, warmup, repeats, pu):  # type: ignore[no-untyped-def]
        return time_model(model, feeds, cfg, warmup, repeats, meter=_meter(pu, cfg.threads))


class ProfilingError(ParapipeError):
    """A profiling run cannot start as asked."""


@dataclass(frozen=True)
class ProfileOptions:
    """What a profiling run measures and how often: the CLI's --granularity, --repeats, --warmup and
    --memory-seconds."""

    granularity: str = "coarse"  # the blocks timed: coarse, fine or both
    repeats: int = 10  # timed runs per measurement
    warmup: int = 3  # untimed runs first
    progress: Progress | None = None
    contention_seconds: float = 0.5  # each run of the shared-memory measurement (alone, all at once), 3 rounds


@dataclass(frozen=True)
class ProfileSummary:
    measured: int
    reused: int
    entries: int
    seconds: float
    interrupted: bool
    energy_source: str
    # per shared memory measured (or reused): (memory, bandwidth GB/s, how it was measured)
    memories: tuple[tuple[str, float, str], ...] = ()
    skipped: tuple[str, ...] = ()  # calibration partitions a unit's EP could not load (config: partition (why))


def pu_configs(profile: DeviceProfile, pu_names: Iterable[str] | None = None) -> list[PuConfig]:
    """CPU PUs with 1..n threads on their first cores; PUs this host cannot run are refused."""
    names = list(pu_names or [p.name for p in profile.pus])
    configs = []
    for name in names:
        pu = profile.pu(name)
        if pu.kind == "gpu" and pu.execution_provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
            # one config: the GPU fed by one host thread on the first core of its host's first CPU PU
            feeder = next((p.cores[:1] for p in profile.pus if p.kind == "cpu" and p.host == pu.host), ())
            configs.append(PuConfig(pu.name, tuple(feeder), 1, pu.execution_provider, None, pu.ep_options))
            continue
        if pu.kind != "cpu":
            raise ProfilingError(
                f"PU {name!r} is a {pu.kind} using {pu.execution_provider}; parapipe profiles units on CPU cores "
                "(onnxruntime's CPU EP, OpenVINO's CPU device) and CUDA GPUs, here or on a board through its agent. "
                "Leave it out with --pu for those units; the planner uses the profile's figures for it."
            )
        for threads in range(1, len(pu.cores) + 1):
            throttle = pu.throttle.quota_percent if pu.throttle else None
            configs.append(
                PuConfig(pu.name, pu.cores[:threads], threads, pu.execution_provider, throttle, pu.ep_options)
            )
    return configs


def held_out(table: CostTable, model_sha256: str, board: str) -> list[str]:
    """The calibration partitions kept out of the cost model's fit (every other one, by name), so its
    error is measured on partitions it never saw. The one hold-out rule of profile, demo and bench."""
    labels = sorted({e.name for e in table.select(model_sha256=model_sha256, kind="partition", board=board)})
    return labels[1::2]


def calibration_partitions(coarse: OpGraph, max_parts: int = 4) -> list[tuple[str, tuple[str, ...]]]:
    """Runs of consecutive coarse blocks: the model cut into 1..max_parts equal-FLOP pieces."""
    out: list[tuple[str, tuple[str, ...]]] = []
    total = sum(n.flops for n in coarse.nodes) or 1
    for parts in range(1, max_parts + 1):
        chunks: list[list[str]] = [[] for _ in range(parts)]
        done = 0
        for n in coarse.nodes:
            idx = min(parts - 1, int(done / total * parts))
            chunks[idx].extend(n.members)
            done += n.flops
        for i, chunk in enumerate(chunks):
            if chunk:
                out.append((f"part{parts}of{i}", tuple(chunk)))
    seen: set[tuple[str, ...]] = set()
    return [(label, m) for label, m in out if not (m in seen or seen.add(m))]


def run_profile(
    model: LoadedModel,
    graph: OpGraph,
    profile: DeviceProfile,
    table: CostTable,
    table_path: Path | None,
    configs: list[PuConfig],
    options: ProfileOptions = ProfileOptions(),
    timer: Timer | None = None,
) -> ProfileSummary:
    """Measure ``model``'s operators, blocks and calibration partitions on each of ``configs`` with ``timer``
    (here, by default) into ``table``, skipping what it holds; saved to ``table_path`` even if interrupted."""
    start = time.perf_counter()
    energy_source = EnergyMeter(PowerModel(1, 0), 1).source
    local = timer is None or isinstance(timer, LocalTimer)
    run = _ProfileRun(model, graph, profile, table, options, timer or LocalTimer(), len(configs))
    interrupted = False
    memories: list[tuple[str, float, str]] = []
    try:
        for cfg in configs:
            run.operators(cfg)
            run.fused(cfg)
        if local:
            memories = [run.memory(m) for m in profile.memories if len(contention_configs(profile, m.pus)) > 1]
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if table_path is not None:
            table.save(table_path)
    return ProfileSummary(
        run.measured,
        run.reused,
        len(table),
        time.perf_counter() - start,
        interrupted,
        energy_source,
        tuple(memories),
        tuple(run.skipped),
    )


def contention_configs(profile: DeviceProfile, pus: Iterable[str]) -> list[PuConfig]:
    """One single-threaded configuration per core of each of ``pus`` (CPU PUs of this host, throttled as
    their PU): the most units that can run at once on a memory."""
    out = []
    for name in pus:
        pu = profile.pu(name)
        if pu.kind != "cpu" or pu.execution_provider != "CPUExecutionProvider":
            continue
        throttle = pu.throttle.quota_percent if pu.throttle else None
        out += [PuConfig(pu.name, (core,), 1, pu.execution_provider, throttle) for core in pu.cores]
    return out


def memory_conditions(profile: DeviceProfile, ort_version: str) -> Conditions:
    """The conditions of a shared memory's calibrated bandwidth (board-wide; what it applies to names the memory)."""
    return Conditions(profile.name, EVERY_UNIT, 0, 0, "", ort_version, "all", None)


class _ProfileRun:
    """One profiling run's state: what it times (the blocks of the chosen granularity and the calibration
    partitions), the entries it adds to the table, and its progress."""

    def __init__(
        self,
        model: LoadedModel,
        graph: OpGraph,
        profile: DeviceProfile,
        table: CostTable,
        options: ProfileOptions,
        timer: Timer,
        configs: int,
    ) -> None:
        self.model, self.graph, self.profile, self.table, self.options, self.timer = (
            model,
            graph,
            profile,
            table,
            options,
            timer,
        )
        self.ort_version = timer.ort_version
        self.feeds = model.feeds()
        granularity = options.granularity
        block_sets = [coarsen(graph, g) for g in (["fine", "coarse"] if granularity == "both" else [granularity])]
        coarse = block_sets[-1] if granularity != "fine" else coarsen(graph, "coarse")
        self.work = [
            ("block", b.name, b.members) for b in {b.members: b for bs in block_sets for b in bs.nodes}.values()
        ]
        self.work += [("partition", label, members) for label, members in calibration_partitions(coarse)]
        self.flops = {n.name: n.flops for n in graph.nodes}
        self.measured = self.reused = self.done = 0
        self.skipped: list[str] = []  # what a unit's EP could not load (calibration partitions only)
        self.total = configs * (1 + len(self.work))
        self.full_bytes = model.ort_proto.SerializeToString()
        self._values: dict[str, np.ndarray] | None = None
        self._extractor: GroupExtractor | None = None

    def conditions(self, cfg: PuConfig, opt: str) -> Conditions:
        return Conditions(
            self.profile.name,
            cfg.pu,
            len(cfg.cores),
            cfg.threads,
            cfg.provider,
            self.ort_version,
            opt,
            cfg.throttle_percent,
        )

    def add(self, kind: str, name: str, members: tuple[str, ...], c: Conditions, t: Timing) -> None:
        flops = sum(self.flops[m] for m in members)
        self.table.add(CostEntry.from_timing(self.model.sha256, kind, name, members, c, t, flops))
        self.measured += 1

    def tick(self, what: str) -> None:
        self.done += 1
        if self.options.progress:
            self.options.progress(what, self.done, self.total)

    def submodel(self, members: tuple[str, ...]) -> tuple[bytes, dict[str, np.ndarray]]:
        """The ONNX model of just ``members`` and its inputs' values (from one run of the whole model)."""
        if self._values is None or self._extractor is None:
            self._values = tensor_values(self.model.ort_proto, self.feeds)
            self._extractor = GroupExtractor(self.model.proto, self.graph)
        part = self._extractor.extract("measured", members)
        return part.model.SerializeToString(), {t: self._values[t] for t in part.inputs}

    def operators(self, cfg: PuConfig) -> None:
        """Per-operator times (unfused), unless the table has every operator on ``cfg`` already."""
        c_ops = self.conditions(cfg, "disable")
        keys = {n.name: entry_key(self.model.sha256, "op", (n.name,), c_ops) for n in self.graph.nodes}
        if all(k in self.table for k in keys.values()):
            self.reused += len(keys)
        else:
            o = self.options
            timings = self.timer.op_profile(self.full_bytes, self.feeds, cfg, o.warmup, o.repeats)
            for n in self.graph.nodes:
                if n.name in timings:
                    self.add("op", n.name, (n.name,), c_ops, timings[n.name])
        self.tick(f"{cfg.label}: operators")

    def fused(self, cfg: PuConfig) -> None:
        """Every block and calibration partition on ``cfg`` (fused), but those the table has."""
        c_all = self.conditions(cfg, "all")
        pu = self.profile.pu(cfg.pu)
        for kind, name, members in self.work:
            if entry_key(self.model.sha256, kind, members, c_all) in self.table:
                self.reused += 1
            else:
                sub, sub_feeds = self.submodel(members)
                try:
                    t = self.timer.time(sub, sub_feeds, cfg, self.options.warmup, self.options.repeats, pu)
                except ProviderFailed as exc:
                    if kind != "partition":  # a block the unit cannot run: the plan must not put it there
                        raise ProfilingError(
                            f"block {name}: {exc}; leave the unit out (--pu) or plan without it"
                        ) from None
                    # a calibration partition only calibrates: the unit's EP could not compile this cut
                    self.skipped.append(f"{cfg.label}: partition {name} ({exc})")
                else:
                    self.add(kind, name, members, c_all, t)
            self.tick(f"{cfg.label}: {kind} {name}")

    def memory(self, memory: SharedMemory) -> tuple[str, float, str]:
        """The bandwidth of ``memory`` for this model: the whole model alone on each of its cores and on all of
        them at once (``profiler.contention``), unless the table has it; (memory, GB/s, how measured)."""
        cond = memory_conditions(self.profile, self.ort_version)
        known = [
            r
            for r in self.table.learnt(model_sha256=self.model.sha256, board=self.profile.name)
            if r.kind == "memory-bandwidth" and r.applies_to == memory.name and r.conditions == cond
        ]
        if known:
            self.reused += 1
            return memory.name, known[-1].value, "reused from the cost table"
        if self.options.progress:
            self.options.progress(f"{memory.name}: every core at once", self.done, self.total)
        cfgs = contention_configs(self.profile, memory.pus)
        load = _load_average()
        found = measure_contention(
            self.full_bytes, self.feeds, cfgs, self.options.contention_seconds, warmup=self.options.warmup
        )
        frame_bytes = Roofline(self.profile, self.graph).moved_bytes([n.name for n in self.graph.nodes])
        gbps = found.bandwidth_gbps(frame_bytes)
        self.table.learn(
            CalibrationRecord.learnt(self.model.sha256, "memory-bandwidth", gbps, cond, found.rounds, memory.name)
        )
        self.measured += 1
        how = f"{found.describe(self.graph.name or 'the model')}; {frame_bytes / 1e6:.1f} MB per frame; {load}"
        return memory.name, gbps, how


def _load_average() -> str:
    try:
        return "load average " + " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "load average unknown"


def _meter(pu: ProcessingUnit, threads: int) -> Callable[[], EnergyMeter]:
    """Energy meter for a run on ``threads`` cores of ``pu``: sensors if any, else its power figures."""
    n = max(1, len(pu.cores))
    model = PowerModel(pu.active_power_w.value / n, pu.idle_power_w.value / n)
    return lambda: EnergyMeter(model, threads)
