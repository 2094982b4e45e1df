"""``CostModel``: how long a block, a partition or a transfer takes on a PU configuration.

Predictions, best first, for a group of ONNX nodes on (PU, cores):
  1. ``measured``   the calibration has this exact group measured fused;
  2. ``calibrated`` the group is made of measured units, and a partition is ``alpha * sum(units) + beta``
     (``profiler.calibration`` says how the units and the fit are made);
  3. ``roofline``   nothing measured for this config: the profile's peak throughput per
     op class and memory bandwidth, plus its per-launch overhead (``profiler.roofline``).
A cost model is a device profile, an operator graph and one ``Calibration`` (none: the roofline alone);
it never changes. ``CostModel.from_table`` calibrates on a cost table first; a different calibration
(what ``parapipe tune`` tries) makes a new cost model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from device_profiles.schema import DeviceProfile, Link, NetworkLink, Quantity
from models.graph import OpGraph
from planner.unitname import UnitName
from profiler.calibration import Calibration, Config, Fit, calibrate, is_run_entry
from profiler.costtable import CostTable
from profiler.pinning import cfs_settings
from profiler.roofline import Roofline

__all__ = ["DEFAULT_HOST_CPU_US_PER_TENSOR", "Calibration", "Config", "CostModel", "Evaluation", "Fit", "Prediction"]


@dataclass(frozen=True)
class Prediction:
    ms: float
    source: str  # measured | calibrated | roofline


# Host CPU time of handing one tensor to a GPU/NPU or reading one back (binding, copying it to or from the
# device, waiting on the driver) when the profile does not say: an estimate, charged until calibration
# measures partitions on that PU (their fitted beta then includes it).
DEFAULT_HOST_CPU_US_PER_TENSOR = Quantity(
    80.0, "estimate", "onnxruntime Run() on an accelerator EP: input/output binding and copies, driver sync"
)


@dataclass(frozen=True)
class Evaluation:
    count: int
    median_abs_pct: float
    rmspe_pct: float
    rows: tuple[tuple[str, float, float], ...]  # (label, measured ms, predicted ms)


class CostModel:
    __slots__ = ("_lowest_gbps", "_roofline", "calibration")

    def __init__(self, profile: DeviceProfile, graph: OpGraph, calibration: Calibration | None = None) -> None:
        if graph.granularity != "op":
            raise ValueError("CostModel needs the operator-level graph")
        if calibration is None:
            calibration = Calibration(graph.model_sha256, profile.name)
        elif (calibration.model_sha256, calibration.board) != (graph.model_sha256, profile.name):
            raise ValueError(
                f"calibration of model {calibration.model_sha256[:12]} on {calibration.board!r} given for "
                f"model {graph.model_sha256[:12]} on {profile.name!r}"
            )
        object.__setattr__(self, "_roofline", Roofline(profile, graph))
        object.__setattr__(self, "calibration", calibration)
        object.__setattr__(self, "_lowest_gbps", self._calibrated_memory_floors())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a CostModel does not change ({name}); make a new one from a new Calibration")

    @classmethod
    def from_table(
        cls, profile: DeviceProfile, graph: OpGraph, table: CostTable | None, holdout: Iterable[str] = ()
    ) -> CostModel:
        """The cost model calibrated on what ``table`` measured for this model on this board."""
        return cls(profile, graph, calibrate(Roofline(profile, graph), table, holdout))

    def recalibrated(self, calibration: Calibration) -> CostModel:
        return CostModel(self.profile, self.graph, calibration)

    def restricted(self, pus: Iterable[str]) -> CostModel:
        """This cost model on the profile's PUs ``pus`` only (the same calibration)."""
        return CostModel(self.profile.restricted(pus), self.graph, self.calibration)

    def runtime_choices(self) -> list[CostModel]:
        """One cost model per way to pick a runtime for each unit's hardware (``DeviceProfile.runtime_choices``):
        this one where every unit offers one runtime."""
        choices = self.profile.runtime_choices()
        return [self] if len(choices) == 1 else [self.restricted(c) for c in choices]

    @property
    def profile(self) -> DeviceProfile:
        return self._roofline.profile

    @property
    def graph(self) -> OpGraph:
        return self._roofline.graph

    @property
    def fits(self) -> Mapping[Config, Fit]:
        return self.calibration.fits

    def roofline_ms(self, node: str, pu: str, cores: int) -> float:
        return self._roofline.ms(node, pu, cores)

    def _units_ms(self, members: frozenset[str], cfg: Config) -> float:
        return self.calibration.units_ms(self._roofline, members, cfg)

    # ------------------------------------------------------------------ predictions

    def group_ms(self, members: Iterable[str], pu: str, cores: int) -> Prediction:
        """Latency of running these ONNX nodes as one fused partition on (pu, cores)."""
        key = frozenset(members)
        unit = UnitName(pu)
        if unit.spans:
            return self._spanning_ms(key, unit, cores)
        cfg = (pu, cores)
        run = self.calibration.run_overhead.get(pu, 0.0)  # ``run_overhead_ms``: the unit spans no clusters here
        entry = self.calibration.fused.get((cfg, key))
        if entry is not None:
            if is_run_entry(entry):  # measured in a pipeline: its run overhead is in it
                return Prediction(entry.mean_ms, "measured")
            return Prediction(entry.mean_ms + run, "measured")
        fit = self.fits.get(cfg)
        if fit is None:
            return Prediction(math.fsum(self.roofline_ms(m, pu, cores) for m in key) + run, "roofline")
        units = self._units_ms(key, cfg)
        if len(key) > 1 and fit.partitions_fitted:
            return Prediction(max(0.0, fit.alpha * units + fit.beta_ms) + run, "calibrated")
        return Prediction(units + run, "calibrated")

    def reduced_group_ms(self, members: Iterable[str], pu: str, cores: int, precision: str) -> float | None:
        """A partition of these nodes measured in ``precision`` (int8, fp16 or a mix, as
        ``planner.segments.segment_precision`` names it) on (pu, cores); None where none was."""
        entry = self.calibration.reduced.get(((pu, cores), frozenset(members), precision))
        return entry.mean_ms if entry is not None else None

    def block_ms(self, members: Iterable[str], pu: str, cores: int) -> float:
        """A block's share of a partition: a partition of several blocks takes the sum of their shares plus
        ``partition_overhead_ms`` once. Calibration (alpha) is in the share, the fixed part (beta) is not."""
        key = frozenset(members)
        cfg = (pu, cores)
        fit = self.fits.get(cfg)
        if fit is None or UnitName(pu).spans:
            return self.group_ms(key, pu, cores).ms
        units = self._units_ms(key, cfg)
        return fit.alpha * units if fit.partitions_fitted else units

    def partition_overhead_ms(self, pu: str, cores: int) -> float:
        """The fixed cost of one partition (session run) on (pu, cores): the fitted beta, never negative, plus
        the run overhead in a pipeline (``run_overhead_ms``)."""
        fit = self.fits.get((pu, cores))
        beta = max(0.0, fit.beta_ms) if fit and fit.partitions_fitted else 0.0
        return beta + self.run_overhead_ms(pu)

    def run_overhead_ms(self, pu: str) -> float:
        """What one partition run on ``pu`` costs in an agent's pipeline beyond what the profiler timed of it run
        after run (what ``parapipe tune`` fitted; 0 until it did, and for a session spanning clusters, which is
        looked up as measured)."""
        if UnitName(pu).spans:
            return 0.0
        return self.calibration.run_overhead.get(pu, 0.0)

    def sustained_factor(self, pu: str) -> float:
        """How many times its time alone a partition on ``pu`` takes when the unit runs back to back.

        1 except on a CFS-throttled PU (``Throttle``): alone, a partition runs at the core's full speed on
        the quota its period refilled; back to back it gets the quota's share of the core, so ``100 /
        quota_percent`` (what ``parapipe tune`` fitted, where it did). A session spanning clusters: 1, its
        time (``_spanning_ms``, or what ``tune`` measured) has its throttled parts' share in it already: while
        one waits for its quota the others take the operators' work (local-biglittle, big+little sessions of
        squeezenet1_1 and mobilenet_v2: 0.98-1.02x their time alone back to back, not the 2.5x of LITTLE's
        pace)."""
        unit = UnitName(pu)
        if unit.spans:
            return 1.0
        fitted = self.calibration.sustained.get(pu)
        if fitted is not None:
            return fitted
        throttle = self.profile.pu(pu).throttle
        return 100.0 / throttle.quota_percent if throttle is not None else 1.0

    def alone_factor(self, pu: str) -> float:
        """How many times its time a frame's work past the burst (``burst_ms``) takes on ``pu`` alone: the CFS
        share, 100 / quota, since nothing else runs on the core then; back to back ``sustained_factor`` (what
        ``tune`` fitted: other threads on the core take their part) where that is less. 1 where not throttled,
        and for a session spanning clusters (``sustained_factor``)."""
        unit = UnitName(pu)
        if unit.spans:
            return 1.0
        throttle = self.profile.pu(pu).throttle
        nominal = 100.0 / throttle.quota_percent if throttle is not None else 1.0
        return min(nominal, self.sustained_factor(pu)) if throttle is not None else self.sustained_factor(pu)

    def burst_ms(self, pu: str) -> float | None:
        """On a CFS-throttled PU, the work (ms at full speed) one period's quota runs: a frame whose work on the
        unit is more than this waits for the quota alone too (``Problem.burst``); None where the PU is not
        throttled, and for a session spanning clusters (``sustained_factor``)."""
        unit = UnitName(pu)
        if unit.spans:
            return None
        throttle = self.profile.pu(pu).throttle
        if throttle is None or self.sustained_factor(pu) <= 1.0:
            return None
        return cfs_settings(throttle.quota_percent)[1] / 1000.0

    def host_cpu_quantity(self, pu: str) -> Quantity | None:
        """The profile's host CPU time per tensor in or out of a GPU/NPU (or the default estimate); None: a CPU."""
        if UnitName(pu).spans or self.profile.pu(pu).kind == "cpu":
            return None
        return self.profile.pu(pu).host_cpu_us_per_tensor or DEFAULT_HOST_CPU_US_PER_TENSOR

    def feed_ms(self, pu: str) -> float:
        """Host CPU time of handing one tensor to a GPU/NPU or reading one back (binding, copy, driver sync):
        charged as time of the transfer (like a link's conversion cost), which the consumer waits for. 0 for
        CPUs and for a calibrated accelerator (the fitted per-partition beta, from partitions measured on the
        board, already holds it)."""
        q = self.host_cpu_quantity(pu)
        fit = self.fits.get((pu, 1))
        if q is None or (fit is not None and fit.partitions_fitted):
            return 0.0
        return q.value / 1e3

    def feed_mj(self, pu: str) -> float:
        """Energy of the feeding core during ``feed_ms``: one core of the host's first CPU cluster, busy above
        idle."""
        ms = self.feed_ms(pu)
        if not ms:
            return 0.0
        host = self.profile.pu(pu).host
        cpu = next((p for p in self.profile.pus if p.kind == "cpu" and p.host == host), None)
        if cpu is None:
            return 0.0
        n = max(1, len(cpu.cores))
        return ms * (cpu.active_power_w.value - cpu.idle_power_w.value) / n * self.calibration.power_active_scale

    def handoff_cpu_ms(self, nbytes: int, src_pu: str, dst_pu: str) -> tuple[float, float]:
        """CPU time a tensor from ``src_pu`` to ``dst_pu`` adds to the unit that sends it and to the unit that
        receives it: gRPC between hosts, on both ends."""
        if src_pu == dst_pu or nbytes == 0:
            return 0.0, 0.0
        net = self.net_cpu_ms(nbytes, src_pu, dst_pu)
        return net, net

    def moved_bytes(self, members: Iterable[str]) -> int:
        """Bytes these nodes move through memory once per frame: weights, inputs and outputs (as the roofline)."""
        return self._roofline.moved_bytes(members)

    def shared_memory_of(self, pu: str) -> str | None:
        """The name of the memory ``pu`` shares with other PUs (for a session spanning clusters, its first's)."""
        for part in UnitName(pu).parts:
            m = self.profile.shared_memory(part)
            if m is not None:
                return m.name
        return None

    def memory_gbps(self, name: str) -> float:
        """A shared memory's bandwidth: calibrated for this model (measured with its PUs running it at once,
        or fitted by ``tune``) where the calibration has it, else the profile's. A calibrated bandwidth is
        never so low that the whole model on one unit of the memory alone would wait for it: a frame's bytes
        cross the memory whatever the plan, and one unit alone runs beside nothing, so its time already holds
        its own traffic."""
        calibrated = self.calibration.memory_gbps.get(name)
        if calibrated is not None:
            return max(calibrated, self._lowest_gbps.get(name, 0.0))
        return next(m for m in self.profile.memories if m.name == name).bandwidth_gbps.value

    def _calibrated_memory_floors(self) -> dict[str, float]:
        """Per memory with a calibrated bandwidth: the bandwidth at which a frame's bytes take as long as the
        whole model on the fastest single unit of the memory's CPU PUs: on one core, or on more where that time
        was measured (an estimate that scales with the cores would make the floor as optimistic as it is). One
        core only let a bandwidth fitted to units running at once bind a plan of one unit on all the cores
        alone: ``local``, bert_small's latency plan, one session on both cores, predicted 88.8 fps where its
        own measured time said 96, and it measured 93-106."""
        out: dict[str, float] = {}
        every = [n.name for n in self.graph.nodes]
        for memory in self.profile.memories:
            if memory.name not in self.calibration.memory_gbps:
                continue
            alone = [
                t.ms
                for p in memory.pus
                if self.profile.pu(p).kind == "cpu"
                for k in range(1, len(self.profile.pu(p).cores) + 1)
                if (t := self.group_ms(every, p, k)).source == "measured" or k == 1
            ]
            fastest = min((ms for ms in alone if ms > 0), default=0.0)
            if fastest:
                out[memory.name] = self.moved_bytes(every) / (fastest * 1e6)
        return out

    def traffic_ms(self, members: Iterable[str], pu: str) -> float:
        """Time these nodes' bytes occupy the shared memory of ``pu`` per frame (0 if it shares none)."""
        name = self.shared_memory_of(pu)
        if name is None:
            return 0.0
        return self.moved_bytes(members) / (self.memory_gbps(name) * 1e9) * 1e3

    def _spanning_ms(self, members: frozenset[str], pu: UnitName, cores: int) -> Prediction:
        """One session whose threads span several clusters (``a+b``): measured as such when the table has
        it (``tune`` feeds it back); else onnxruntime splits each operator evenly over its threads, so the
        slowest cluster's cores set the pace. A cluster's core time is taken from its run on all its cores
        (measured multi-core times where the table has them, so their parallel efficiency counts), not one
        core. Where a part is CFS-throttled its threads stop for the rest of a period once the quota is spent,
        and the other parts' threads take the operators' work meanwhile: each part then works at its cores'
        rate, a throttled one at its share of it (1 / its sustained factor), and the session at their sum
        (local-biglittle: squeezenet1_1 on big+little ran at a median 2.9 ms a frame against 3.4 on big alone;
        the slowest part's pace said 4.7 back to back)."""
        entry = self.calibration.fused.get(((pu, cores), members))
        if entry is not None:
            return Prediction(entry.mean_ms, "measured")
        core_ms = {}
        for part in pu.parts:
            n = max(1, len(self.profile.pu(part).cores))
            core_ms[part] = (n, self.group_ms(members, part, n).ms * n)  # core-ms of the work on this cluster
        if any(self.profile.pu(part).throttle is not None for part in pu.parts):
            rate = math.fsum(n / (ms * self.sustained_factor(part)) for part, (n, ms) in core_ms.items() if ms > 0)
            return Prediction(1.0 / rate if rate > 0 else 0.0, "estimate")
        slowest = max(ms for _, ms in core_ms.values())
        return Prediction(slowest / max(1, cores), "estimate")

    def transfer_ms(self, nbytes: int, src_pu: str, dst_pu: str) -> float:
        link = self.profile.link(src_pu, dst_pu)
        if link is None or nbytes == 0:
            return 0.0
        ms = link.latency_us.value / 1e3 + nbytes / (self.link_gbps(link) * 1e9) * 1e3
        if isinstance(link, Link):
            ms += link.conversion_us_per_mb.value * nbytes / 1e6 / 1e3
        return ms + self.feed_ms(src_pu) + self.feed_ms(dst_pu)  # the host feeding a GPU/NPU, or reading it back

    def net_cpu_ms(self, nbytes: int, src_pu: str, dst_pu: str) -> float:
        """CPU time one end (each of sender and receiver) spends moving a tensor between hosts: gRPC and
        protobuf copies, on the unit that produces or consumes it. 0 within a host or when not profiled."""
        link = self.profile.link(src_pu, dst_pu)
        if not isinstance(link, NetworkLink) or nbytes == 0:
            return 0.0
        per_message, per_mb = self.network_cpu_us(link)
        return (per_message + per_mb * nbytes / 1e6) / 1e3

    def network_cpu_us(self, link: NetworkLink) -> tuple[float, float]:
        """(µs per message, µs per MB) each end of ``link`` spends on a tensor: fitted by ``tune`` where the
        calibration has it, else the profile's (0 where it says nothing)."""
        fitted = self.calibration.network.get(link.name)
        if fitted is not None:
            return fitted.cpu_us_per_message, fitted.cpu_us_per_mb
        per_message = link.cpu_us_per_message.value if link.cpu_us_per_message else 0.0
        per_mb = link.cpu_us_per_mb.value if link.cpu_us_per_mb else 0.0
        return per_message, per_mb

    def link_gbps(self, link: Link | NetworkLink) -> float:
        """A link's bandwidth: a network link's as fitted by ``tune`` where the calibration has it, else the
        profile's."""
        fitted = self.calibration.network.get(link.name) if isinstance(link, NetworkLink) else None
        return fitted.gbps if fitted is not None else link.bandwidth_gbps.value

    def handoff_delay_ms(self, src_pu: str, dst_pu: str) -> float:
        """Extra latency (not link occupancy) of a handoff between two units of one host (waking the other
        unit's thread): units on different PUs, or different units (cores) of one PU. 0 until calibrated;
        a partition handing a tensor to a later partition of its own unit pays none (the caller's test)."""
        if not self.calibration.handoff_ms:
            return 0.0
        hosts = {self.profile.pu(p).host for unit in (src_pu, dst_pu) for p in UnitName(unit).parts}
        return self.calibration.handoff_ms if len(hosts) == 1 else 0.0

    def frame_overhead_ms(self, pus: Iterable[str], partitions: int) -> float:
        """What a frame alone spends in a plan of ``partitions`` partitions on these units outside their runs
        (``Calibration.frame_ms``: entering the pipeline, waking its first worker, its result back to the caller;
        latency only). 0 for a plan the executor runs in the caller's thread: one partition, on one host, on
        no CFS-throttled core (``agents.executor.Pipeline.infer_inline``). 0 until ``parapipe tune`` learnt it."""
        if not self.calibration.frame_ms:
            return 0.0
        parts = {part for unit in pus for part in UnitName(unit).parts}
        hosts = {self.profile.pu(p).host for p in parts}
        throttled = any(self.profile.pu(p).throttle is not None for p in parts)
        return 0.0 if partitions <= 1 and len(hosts) <= 1 and not throttled else self.calibration.frame_ms

    def transfer_mj(self, nbytes: int, src_pu: str, dst_pu: str) -> float:
        link = self.profile.link(src_pu, dst_pu)
        if link is None or nbytes == 0:
            return 0.0
        feed = self.feed_mj(src_pu) + self.feed_mj(dst_pu)  # the host core feeding a GPU/NPU
        if isinstance(link, NetworkLink):
            return link.energy_nj_per_byte.value * nbytes / 1e6 + feed
        return feed

    def busy_power_w(self, pu: str, cores: int) -> float:
        unit = UnitName(pu)
        if unit.spans:
            return sum(self.busy_power_w(part, len(self.profile.pu(part).cores)) for part in unit.parts)
        p = self.profile.pu(pu)
        n = max(1, len(p.cores))
        if p.kind != "cpu":
            return p.active_power_w.value
        return p.active_power_w.value * cores / n + p.idle_power_w.value * (n - cores) / n

    # ------------------------------------------------------------------ self-check

    def evaluate(self, labels: Sequence[str] | None = None) -> Evaluation:
        """Error on measured partitions, by default the held-back ones (never fitted on)."""
        rows = []
        for cfg, entries in sorted(self.calibration.partitions.items()):
            for e in entries:
                if (labels is None and e.name not in self.calibration.holdout) or (
                    labels is not None and e.name not in labels
                ):
                    continue
                predicted = self.calibration.partition_ms(self._roofline, e)
                rows.append((f"{e.name}@{cfg[0]}x{cfg[1]}", e.mean_ms, predicted))
        if not rows:
            return Evaluation(0, float("nan"), float("nan"), ())
        errs = [(p - m) / m * 100 for _, m, p in rows]
        return Evaluation(
            len(rows),
            statistics.median(abs(x) for x in errs),
            float(np.sqrt(np.mean(np.square(errs)))),
            tuple(rows),
        )
