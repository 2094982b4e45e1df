"""``CostModel``: how long a block, a partition or a transfer takes on a PU configuration.

Predictions, best first, for a group of ONNX nodes on (PU, cores):
  1. ``measured``   the CostTable has this exact group measured fused;
  2. ``calibrated`` the group is made of measured units (blocks, else single operators
     scaled by a fitted fusion factor, else the roofline scaled per op class by
     factors fitted on this config's operator profile), and a partition is
     ``alpha * sum(units) + beta`` with alpha and beta fitted by least squares on the
     measured partitions of this config (fused execution is not the sum of its ops);
  3. ``roofline``   nothing measured for this config: the profile's peak throughput per
     op class and memory bandwidth, plus its per-launch overhead.
``holdout`` keeps chosen partitions out of every fit so ``evaluate`` can report the
model's error on measurements it has not seen.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from device_profiles.schema import DeviceProfile, Link, NetworkLink, Quantity
from models.graph import OpGraph
from profiler.costtable import CostEntry, CostTable

Config = tuple[str, int]  # (PU name, cores)


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

# Partitions shorter than this stay out of the alpha/beta fit (they are still used as measured
# values): their times are dominated by dispatch and, on a CFS-throttled core, by whether the
# run fits in what is left of the quota, and in a relative fit they would outweigh the rest.
MIN_FIT_MS = 1.0


@dataclass(frozen=True)
class Fit:
    """What calibration learnt for one PU configuration."""

    class_scale: dict[str, float]  # measured / roofline per op class, from the operator profile
    op_overhead_ms: float
    fusion: float  # fused block time / sum of its operators' unfused times
    alpha: float  # partition = alpha * sum(unit predictions) + beta
    beta_ms: float
    partitions_fitted: int


@dataclass(frozen=True)
class Evaluation:
    count: int
    median_abs_pct: float
    rmspe_pct: float
    rows: tuple[tuple[str, float, float], ...]  # (label, measured ms, predicted ms)


class CostModel:
    def __init__(
        self,
        profile: DeviceProfile,
        graph: OpGraph,
        table: CostTable | None = None,
        holdout: Iterable[str] = (),
    ) -> None:
        if graph.granularity != "op":
            raise ValueError("CostModel needs the operator-level graph")
        self.profile, self.graph = profile, graph
        self.holdout = set(holdout)
        self.fused: dict[tuple[Config, frozenset[str]], CostEntry] = {}
        self.ops: dict[tuple[Config, str], float] = {}
        self.partitions: dict[Config, list[CostEntry]] = {}
        # Delay of handing a tensor to a worker on another PU of the same host (waking it, and on a
        # throttled core waiting for its quota): learnt from measured plans by ``parapipe tune``.
        self.handoff_ms = 0.0
        handoff_at = -1.0
        # Measured energy (a board with a power sensor) rescales the profile's busy and idle power.
        self.power_active_scale = self.power_idle_scale = 1.0
        power_at: dict[str, float] = {}
        entries = table.select(model_sha256=graph.model_sha256, board=profile.name) if table else []
        for e in entries:
            cfg = (e.conditions.pu, e.conditions.cores)
            if e.kind == "op":
                self.ops[(cfg, e.members[0])] = e.mean_ms
            elif e.kind == "block":
                self.fused[(cfg, frozenset(e.members))] = e
            elif e.kind == "partition":
                if e.name not in self.holdout:
                    self.fused[(cfg, frozenset(e.members))] = e
                self.partitions.setdefault(cfg, []).append(e)
            elif e.kind == "handoff" and e.measured_at >= handoff_at:
                self.handoff_ms, handoff_at = e.mean_ms, e.measured_at
            elif e.kind == "power" and e.value is not None and e.measured_at >= power_at.get(e.name, -1.0):
                power_at[e.name] = e.measured_at
                if e.name == "active-scale":
                    self.power_active_scale = e.value
                elif e.name == "idle-scale":
                    self.power_idle_scale = e.value
        self.blocks = [frozenset(e.members) for (cfg, _), e in self.fused.items() if e.kind == "block"]
        self.fits: dict[Config, Fit] = {}
        for cfg in sorted({c for c, _ in self.ops} | {c for c, _ in self.fused}):
            self.fits[cfg] = self._fit(cfg)

    # ------------------------------------------------------------------ roofline

    def roofline_ms(self, node: str, pu: str, cores: int) -> float:
        n = self.graph.index[node]
        p = self.profile.pu(pu)
        share = cores / max(1, len(p.cores)) if p.kind == "cpu" else 1.0
        compute = 0.0
        for cls, flops in n.flops_by_class:
            compute += flops / (p.peak_gflops[cls].value * share * 1e9)
        moved = n.param_bytes + sum(
            self.graph.tensors[t].nbytes for t in (*n.inputs, *n.outputs) if t in self.graph.tensors
        )
        memory = moved / (p.memory_bandwidth_gbps.value * 1e9)
        return (max(compute, memory) + p.launch_overhead_us.value / 1e6) * 1e3

    # ------------------------------------------------------------------ calibration

    def _fit(self, cfg: Config) -> Fit:
        pu, cores = cfg
        ratios: dict[str, list[float]] = {}
        overheads: list[float] = []
        for n in self.graph.nodes:
            measured = self.ops.get((cfg, n.name))
            if measured is None:
                continue
            if n.flops == 0:
                overheads.append(measured)
            else:
                ratios.setdefault(n.op_class, []).append(measured / self.roofline_ms(n.name, pu, cores))
        class_scale = {cls: statistics.median(r) for cls, r in ratios.items()}
        op_overhead = statistics.median(overheads) if overheads else 0.0
        fusion_ratios = []
        for (c, members), e in self.fused.items():
            if c == cfg and e.kind == "block" and all((cfg, m) in self.ops for m in members):
                unfused = sum(self.ops[(cfg, m)] for m in members)
                if unfused > 0:
                    fusion_ratios.append(e.mean_ms / unfused)
        fusion = statistics.median(fusion_ratios) if fusion_ratios else 1.0
        partial = Fit(class_scale, op_overhead, fusion, 1.0, 0.0, 0)
        self.fits[cfg] = partial
        xs, ys = [], []
        for e in self.partitions.get(cfg, []):
            if e.name in self.holdout or e.mean_ms < MIN_FIT_MS:
                continue
            xs.append(self._units_ms(frozenset(e.members), cfg, exclude_self=True))
            ys.append(e.mean_ms)
        alpha, beta = 1.0, 0.0
        if len(xs) >= 2:
            # Relative least squares: minimise sum(((alpha*x + beta) - y) / y)^2
            a = np.array([[x / y, 1 / y] for x, y in zip(xs, ys, strict=True)])
            b = np.ones(len(ys))
            (alpha, beta), *_ = np.linalg.lstsq(a, b, rcond=None)
            if alpha <= 0:
                alpha, beta = float(np.median(np.array(ys) / np.array(xs))), 0.0
        elif len(xs) == 1:
            alpha = ys[0] / xs[0]
        return Fit(class_scale, op_overhead, fusion, float(alpha), float(beta), len(xs))

    def _op_ms(self, node: str, cfg: Config) -> tuple[float, str]:
        measured = self.ops.get((cfg, node))
        if measured is not None:
            return measured, "calibrated"
        fit = self.fits.get(cfg)
        n = self.graph.index[node]
        if fit and n.flops == 0 and fit.op_overhead_ms:
            return fit.op_overhead_ms, "calibrated"
        if fit and n.op_class in fit.class_scale:
            return self.roofline_ms(node, *cfg) * fit.class_scale[n.op_class], "calibrated"
        return self.roofline_ms(node, *cfg), "roofline"

    def _units_ms(self, members: frozenset[str], cfg: Config, exclude_self: bool = False) -> float:
        """Sum over the measured blocks inside ``members``, then operators for the rest."""
        # math.fsum: the exact sum, whatever order a set iterates in (the hash seed must not change a plan)
        parts, left = [], set(members)
        for block in self.blocks:
            if block <= left and not (exclude_self and block == members):
                entry = self.fused.get((cfg, block))
                if entry is not None:
                    parts.append(entry.mean_ms)
                    left -= block
        fit = self.fits.get(cfg)
        fusion = fit.fusion if fit else 1.0
        return math.fsum(parts) + fusion * math.fsum(self._op_ms(m, cfg)[0] for m in left)

    # ------------------------------------------------------------------ predictions

    def group_ms(self, members: Iterable[str], pu: str, cores: int) -> Prediction:
        """Latency of running these ONNX nodes as one fused partition on (pu, cores)."""
        key = frozenset(members)
        if "+" in pu:
            return self._spanning_ms(key, pu, cores)
        cfg = (pu, cores)
        entry = self.fused.get((cfg, key))
        if entry is not None:
            return Prediction(entry.mean_ms, "measured")
        fit = self.fits.get(cfg)
        if fit is None:
            return Prediction(math.fsum(self.roofline_ms(m, pu, cores) for m in key), "roofline")
        units = self._units_ms(key, cfg)
        if len(key) > 1 and fit.partitions_fitted:
            return Prediction(max(0.0, fit.alpha * units + fit.beta_ms), "calibrated")
        return Prediction(units, "calibrated")

    def block_ms(self, members: Iterable[str], pu: str, cores: int) -> float:
        """A block's share of a partition: a partition of several blocks takes the sum of their shares plus
        ``partition_overhead_ms`` once. Calibration (alpha) is in the share, the fixed part (beta) is not."""
        key = frozenset(members)
        cfg = (pu, cores)
        fit = self.fits.get(cfg)
        if fit is None or "+" in pu:
            return self.group_ms(key, pu, cores).ms
        units = self._units_ms(key, cfg)
        return fit.alpha * units if fit.partitions_fitted else units

    def partition_overhead_ms(self, pu: str, cores: int) -> float:
        """The fixed cost of one partition (session run) on (pu, cores): the fitted beta, never negative."""
        fit = self.fits.get((pu, cores))
        return max(0.0, fit.beta_ms) if fit and fit.partitions_fitted else 0.0

    def host_cpu_quantity(self, pu: str) -> Quantity | None:
        """The profile's host CPU time per tensor in or out of a GPU/NPU (or the default estimate); None: a CPU."""
        if "+" in pu or self.profile.pu(pu).kind == "cpu":
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
        return ms * (cpu.active_power_w.value - cpu.idle_power_w.value) / n * self.power_active_scale

    def handoff_cpu_ms(self, nbytes: int, src_pu: str, dst_pu: str) -> tuple[float, float]:
        """CPU time a tensor from ``src_pu`` to ``dst_pu`` adds to the unit that sends it and to the unit that
        receives it: gRPC between hosts, on both ends."""
        if src_pu == dst_pu or nbytes == 0:
            return 0.0, 0.0
        net = self.net_cpu_ms(nbytes, src_pu, dst_pu)
        return net, net

    def moved_bytes(self, members: Iterable[str]) -> int:
        """Bytes these nodes move through memory once per frame: weights, inputs and outputs (as the roofline)."""
        total = 0
        for m in sorted(set(members)):
            n = self.graph.index[m]
            total += n.param_bytes + sum(
                self.graph.tensors[t].nbytes for t in (*n.inputs, *n.outputs) if t in self.graph.tensors
            )
        return total

    def shared_memory_of(self, pu: str) -> str | None:
        """The name of the memory ``pu`` shares with other PUs (for a session spanning clusters, its first's)."""
        for part in pu.split("+"):
            m = self.profile.shared_memory(part)
            if m is not None:
                return m.name
        return None

    def traffic_ms(self, members: Iterable[str], pu: str) -> float:
        """Time these nodes' bytes occupy the shared memory of ``pu`` per frame (0 if it shares none)."""
        name = self.shared_memory_of(pu)
        if name is None:
            return 0.0
        memory = next(m for m in self.profile.memories if m.name == name)
        return self.moved_bytes(members) / (memory.bandwidth_gbps.value * 1e9) * 1e3

    def _spanning_ms(self, members: frozenset[str], pu: str, cores: int) -> Prediction:
        """One session whose threads span several clusters (``a+b``): measured as such when the table has
        it; else onnxruntime splits each operator evenly over its threads, so the slowest cluster's
        cores set the pace. A cluster's core time is taken from its run on all its cores (measured
        multi-core times where the table has them, so their parallel efficiency counts), not one core."""
        entry = self.fused.get(((pu, cores), members))
        if entry is not None:
            return Prediction(entry.mean_ms, "measured")
        slowest = 0.0
        for part in pu.split("+"):
            n = max(1, len(self.profile.pu(part).cores))
            slowest = max(slowest, self.group_ms(members, part, n).ms * n)  # core-ms of the work on this cluster
        return Prediction(slowest / max(1, cores), "estimate")

    def transfer_ms(self, nbytes: int, src_pu: str, dst_pu: str) -> float:
        link = self.profile.link(src_pu, dst_pu)
        if link is None or nbytes == 0:
            return 0.0
        ms = link.latency_us.value / 1e3 + nbytes / (link.bandwidth_gbps.value * 1e9) * 1e3
        if isinstance(link, Link):
            ms += link.conversion_us_per_mb.value * nbytes / 1e6 / 1e3
        return ms + self.feed_ms(src_pu) + self.feed_ms(dst_pu)  # the host feeding a GPU/NPU, or reading it back

    def net_cpu_ms(self, nbytes: int, src_pu: str, dst_pu: str) -> float:
        """CPU time one end (each of sender and receiver) spends moving a tensor between hosts: gRPC and
        protobuf copies, on the unit that produces or consumes it. 0 within a host or when not profiled."""
        link = self.profile.link(src_pu, dst_pu)
        if not isinstance(link, NetworkLink) or nbytes == 0:
            return 0.0
        per_message = link.cpu_us_per_message.value if link.cpu_us_per_message else 0.0
        per_mb = link.cpu_us_per_mb.value if link.cpu_us_per_mb else 0.0
        return (per_message + per_mb * nbytes / 1e6) / 1e3

    def handoff_delay_ms(self, src_pu: str, dst_pu: str) -> float:
        """Extra latency (not link occupancy) of a handoff between PUs of one host; 0 until calibrated."""
        if src_pu == dst_pu or not self.handoff_ms:
            return 0.0
        hosts = {self.profile.pu(p).host for part in (src_pu, dst_pu) for p in part.split("+")}
        return self.handoff_ms if len(hosts) == 1 else 0.0

    def transfer_mj(self, nbytes: int, src_pu: str, dst_pu: str) -> float:
        link = self.profile.link(src_pu, dst_pu)
        if link is None or nbytes == 0:
            return 0.0
        feed = self.feed_mj(src_pu) + self.feed_mj(dst_pu)  # the host core feeding a GPU/NPU
        if isinstance(link, NetworkLink):
            return link.energy_nj_per_byte.value * nbytes / 1e6 + feed
        return feed

    def busy_power_w(self, pu: str, cores: int) -> float:
        if "+" in pu:
            return sum(self.busy_power_w(part, len(self.profile.pu(part).cores)) for part in pu.split("+"))
        p = self.profile.pu(pu)
        n = max(1, len(p.cores))
        if p.kind != "cpu":
            return p.active_power_w.value
        return p.active_power_w.value * cores / n + p.idle_power_w.value * (n - cores) / n

    # ------------------------------------------------------------------ self-check

    def evaluate(self, labels: Sequence[str] | None = None) -> Evaluation:
        """Error on measured partitions, by default the held-back ones (never fitted on)."""
        rows = []
        for cfg, entries in sorted(self.partitions.items()):
            for e in entries:
                if (labels is None and e.name not in self.holdout) or (labels is not None and e.name not in labels):
                    continue
                fit = self.fits[cfg]
                units = self._units_ms(frozenset(e.members), cfg, exclude_self=True)
                predicted = fit.alpha * units + fit.beta_ms if fit.partitions_fitted else units
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
