"""``Calibration``: what a cost table's measurements say about one model on one board.

Computed once by ``calibrate`` and never changed afterwards: the measured operators, fused blocks and
partitions of each PU configuration, the per-configuration ``Fit`` learnt from them, and the
board-wide values ``parapipe tune`` learns from measured plans (the handoff delay between PUs of a
host, the scales of the profile's busy and idle power) and the bandwidth of a shared memory. A different calibration (tune's candidates,
a test's) is a new value made with ``with_handoff`` / ``with_power`` / ``with_memory`` / ``with_fit``.

For a group of ONNX nodes on a configuration, the units it is made of are the measured blocks inside
it, then single operators: measured, else the roofline scaled per op class by the factors fitted on
this configuration's operator profile, times the fitted fusion factor. A partition is
``alpha * sum(units) + beta``, with alpha and beta fitted by relative least squares on the measured
partitions of the configuration (fused execution is not the sum of its ops). ``holdout`` keeps chosen
partitions (by label or by entry key) out of every fit, so the model's error on what it has not seen can be
reported.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from profiler.costtable import EVERY_UNIT, CalibrationRecord, CostEntry, CostTable
from profiler.roofline import Roofline

Config = tuple[str, int]  # (PU name, cores)

# Partitions shorter than this stay out of the alpha/beta fit (they are still used as measured
# values): their times are dominated by dispatch and, on a CFS-throttled core, by whether the
# run fits in what is left of the quota, and in a relative fit they would outweigh the rest.
MIN_FIT_MS = 1.0
# partitions of a unit measured in a pipeline that set the scale of its partition fit (``_partition_fit``)
MIN_PIPELINE_PARTITIONS = 2
RUN_PREFIX = "run:"  # the name of a partition entry ``parapipe tune`` measured in a pipeline starts so


@dataclass(frozen=True)
class Fit:
    """What calibration learnt for one PU configuration."""

    class_scale: Mapping[str, float]  # measured / roofline per op class, from the operator profile
    op_overhead_ms: float
    fusion: float  # fused block time / sum of its operators' unfused times
    alpha: float  # partition = alpha * sum(unit predictions) + beta
    beta_ms: float
    partitions_fitted: int


def _frozen(mapping: Mapping) -> Mapping:  # type: ignore[type-arg]
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class NetworkFit:
    """A network link as ``parapipe tune`` fitted it: bandwidth, and the CPU time each end spends on a tensor."""

    gbps: float
    cpu_us_per_message: float
    cpu_us_per_mb: float


@dataclass(frozen=True)
class Calibration:
    """The measurements of one model on one board and what was fitted on them; read-only."""

    model_sha256: str
    board: str
    ops: Mapping[tuple[Config, str], float] = field(default_factory=lambda: _frozen({}))
    fused: Mapping[tuple[Config, frozenset[str]], CostEntry] = field(default_factory=lambda: _frozen({}))
    partitions: Mapping[Config, tuple[CostEntry, ...]] = field(default_factory=lambda: _frozen({}))
    blocks: tuple[frozenset[str], ...] = ()  # the measured blocks, in table order
    # The blocks as the profiler timed them (never a partition of the same nodes measured later): the units a
    # group's time is summed from and the fusion factor is fitted on, whatever ``parapipe tune`` measured since.
    profiled: Mapping[tuple[Config, frozenset[str]], CostEntry] = field(default_factory=lambda: _frozen({}))
    fits: Mapping[Config, Fit] = field(default_factory=lambda: _frozen({}))
    # Delay of handing a tensor to a worker on another PU of the same host (waking it, and on a
    # throttled core waiting for its quota): learnt from measured plans by ``parapipe tune``.
    handoff_ms: float = 0.0
    # What a frame alone spends in a pipeline of several partitions outside their runs (entering it, waking the
    # first worker, its result back to the caller): latency only, learnt from measured plans by ``parapipe tune``.
    # A plan of one partition on one host runs a frame in the caller's thread and pays none (``agents.executor``).
    frame_ms: float = 0.0
    # Measured energy (a board with a power sensor) rescales the profile's busy and idle power.
    power_active_scale: float = 1.0
    power_idle_scale: float = 1.0
    holdout: frozenset[str] = frozenset()  # partition labels or entry keys kept out of every fit
    # A shared memory's bandwidth (GB/s) by memory name, measured for this model (the whole model on the
    # memory's PUs at once, ``profiler.contention``) or fitted by ``parapipe tune``; replaces the profile's.
    memory_gbps: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    # A network link (named ``a-b``) as fitted by ``parapipe tune`` to the plans measured across it; replaces
    # the profile's figures.
    network: Mapping[str, NetworkFit] = field(default_factory=lambda: _frozen({}))
    # A CFS-throttled PU's partitions back to back take this many times their time alone (the quota runs out),
    # by PU name: fitted by ``parapipe tune`` to the measured throughputs; replaces the profile's quota.
    sustained: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    # Partitions measured in a precision other than fp32 (int8, fp16 or a mix: ``planner.segments.
    # segment_precision``), by configuration, members and that precision: what ``parapipe tune`` measured of a
    # precision plan's partitions. Kept apart from the fp32 measurements and out of every fit.
    reduced: Mapping[tuple[Config, frozenset[str], str], CostEntry] = field(default_factory=lambda: _frozen({}))
    # What one partition run costs in an agent's pipeline beyond what the profiler timed of it run after run (the
    # session's code and data cold after the other partitions ran, its inputs from another core), by PU name:
    # fitted by ``parapipe tune`` to the partitions it measured; in every partition's time but those it measured.
    run_overhead: Mapping[str, float] = field(default_factory=lambda: _frozen({}))

    def __post_init__(self) -> None:
        for name in (
            "ops",
            "fused",
            "profiled",
            "partitions",
            "fits",
            "memory_gbps",
            "network",
            "sustained",
            "reduced",
            "run_overhead",
        ):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, _frozen(value))
        object.__setattr__(self, "holdout", frozenset(self.holdout))

    # ------------------------------------------------------------------ new values

    def with_handoff(self, ms: float) -> Calibration:
        return dataclasses.replace(self, handoff_ms=ms)

    def with_frame_overhead(self, ms: float) -> Calibration:
        return dataclasses.replace(self, frame_ms=ms)

    def with_power(self, active_scale: float, idle_scale: float) -> Calibration:
        return dataclasses.replace(self, power_active_scale=active_scale, power_idle_scale=idle_scale)

    def with_memory(self, memory: str, gbps: float) -> Calibration:
        return dataclasses.replace(self, memory_gbps={**self.memory_gbps, memory: gbps})

    def with_sustained(self, pu: str, factor: float) -> Calibration:
        return dataclasses.replace(self, sustained={**self.sustained, pu: factor})

    def with_run_overhead(self, pu: str, ms: float) -> Calibration:
        return dataclasses.replace(self, run_overhead={**self.run_overhead, pu: ms})

    def with_network(self, link: str, fit: NetworkFit) -> Calibration:
        return dataclasses.replace(self, network={**self.network, link: fit})

    def with_fit(self, cfg: Config, fit: Fit) -> Calibration:
        return dataclasses.replace(self, fits={**self.fits, cfg: fit})

    # ------------------------------------------------------------------ unit sums

    def op_ms(self, roofline: Roofline, node: str, cfg: Config) -> tuple[float, str]:
        """One operator on ``cfg``: measured, else the calibrated roofline, else the roofline."""
        measured = self.ops.get((cfg, node))
        if measured is not None:
            return measured, "calibrated"
        fit = self.fits.get(cfg)
        n = roofline.graph.index[node]
        if fit and n.flops == 0 and fit.op_overhead_ms:
            return fit.op_overhead_ms, "calibrated"
        if fit and n.op_class in fit.class_scale:
            return roofline.ms(node, *cfg) * fit.class_scale[n.op_class], "calibrated"
        return roofline.ms(node, *cfg), "roofline"

    def units_ms(self, roofline: Roofline, members: frozenset[str], cfg: Config, exclude_self: bool = False) -> float:
        """Sum over the measured blocks inside ``members``, then operators for the rest (times the fusion)."""
        # math.fsum: the exact sum, whatever order a set iterates in (the hash seed must not change a plan)
        parts, left = [], set(members)
        for block in self.blocks:
            if block <= left and not (exclude_self and block == members):
                entry = self.profiled.get((cfg, block))
                if entry is not None:
                    parts.append(entry.mean_ms)
                    left -= block
        fit = self.fits.get(cfg)
        fusion = fit.fusion if fit else 1.0
        return math.fsum(parts) + fusion * math.fsum(self.op_ms(roofline, m, cfg)[0] for m in left)

    def partition_ms(self, roofline: Roofline, entry: CostEntry) -> float:
        """A measured partition as predicted from its units, not from its own measurement (nor, for one the
        profiler timed, from a block of the same nodes: the same measurement)."""
        cfg = entry.config
        units = self.units_ms(roofline, frozenset(entry.members), cfg, exclude_self=not is_run_entry(entry))
        fit = self.fits[cfg]
        return fit.alpha * units + fit.beta_ms if fit.partitions_fitted else units


def is_run_entry(entry: CostEntry) -> bool:
    """Whether ``entry`` is a partition ``parapipe tune`` measured in a pipeline (named ``run:<partition>``), not
    one the profiler timed run after run."""
    return entry.kind == "partition" and entry.name.startswith(RUN_PREFIX)


def held_out_entry(entry: CostEntry, holdout: frozenset[str]) -> bool:
    """Whether ``holdout`` names this entry, by its label or by its key."""
    return entry.name in holdout or entry.key in holdout


def _measured(
    model_sha256: str,
    board: str,
    entries: Iterable[CostEntry],
    learnt: Iterable[CalibrationRecord],
    holdout: frozenset[str],
) -> Calibration:
    """The table's entries and calibration values for one model and board sorted into a calibration, nothing
    fitted yet.

    Where entries fill one place (a block and a partition of the same nodes), and where calibration values
    do (a handoff, a power scale), the latest measurement wins, whatever order the table holds them in
    (in memory: as measured; loaded: by key)."""
    ops: dict[tuple[Config, str], float] = {}
    fused: dict[tuple[Config, frozenset[str]], CostEntry] = {}
    profiled: dict[tuple[Config, frozenset[str]], CostEntry] = {}
    partitions: dict[Config, list[CostEntry]] = {}
    reduced: dict[tuple[Config, frozenset[str], str], CostEntry] = {}
    for e in sorted(entries, key=lambda e: e.measured_at):  # stable: equal times keep the table's order
        cfg = e.config
        if e.conditions.precision != "fp32":
            if e.kind == "partition":
                reduced[(cfg, frozenset(e.members), e.conditions.precision)] = e
            continue  # block variants are read where precisions are chosen (parapipe.precision_auto)
        if e.kind == "op":
            ops[(cfg, e.members[0])] = e.mean_ms
        elif e.kind == "block":
            fused[(cfg, frozenset(e.members))] = e
            profiled[(cfg, frozenset(e.members))] = e
        elif e.kind == "partition":
            if not held_out_entry(e, holdout):
                fused[(cfg, frozenset(e.members))] = e
            partitions.setdefault(cfg, []).append(e)
    ordered = sorted(learnt, key=lambda r: r.measured_at)
    latest = {r.kind: r.value for r in ordered if r.applies_to == EVERY_UNIT}
    memory = {r.applies_to: r.value for r in ordered if r.kind == "memory-bandwidth"}
    sustained = {r.applies_to: r.value for r in ordered if r.kind == "sustained-factor"}
    run_overhead = {r.applies_to: r.value for r in ordered if r.kind == "run-overhead"}
    links: dict[str, dict[str, float]] = {}
    for r in ordered:
        if r.kind.startswith("network-"):
            links.setdefault(r.applies_to, {})[r.kind] = r.value
    network = {
        link: NetworkFit(v["network-bandwidth"], v["network-cpu-message"], v["network-cpu-mb"])
        for link, v in links.items()
        if len(v) == 3  # tune learns the three together
    }
    return Calibration(
        model_sha256,
        board,
        ops=ops,
        fused=fused,
        partitions={cfg: tuple(es) for cfg, es in partitions.items()},
        # a block on one configuration and a partition of its nodes measured later on it (a pipeline's one-block
        # partition) are two measurements: the group's time is the later, the block stays a unit of the sums and
        # of the fusion fit (else the fusion was fitted on the few blocks no pipeline had measured: bert_small on
        # local, 9 of 98 one-core blocks, 5.3 where all 98 give 0.97, and a 170-operator partition at 2.1 ms)
        blocks=tuple(dict.fromkeys(members for _, members in profiled)),
        profiled=profiled,
        handoff_ms=latest.get("handoff", 0.0),
        frame_ms=latest.get("frame-overhead", 0.0),
        power_active_scale=latest.get("power-active-scale", 1.0),
        power_idle_scale=latest.get("power-idle-scale", 1.0),
        holdout=holdout,
        memory_gbps=memory,
        network=network,
        sustained=sustained,
        reduced=reduced,
        run_overhead=run_overhead,
    )


def _unit_fit(measured: Calibration, roofline: Roofline, cfg: Config) -> Fit:
    """The per-operator part of ``cfg``'s fit: op-class scales, operator overhead, fusion factor."""
    ratios: dict[str, list[float]] = {}
    overheads: list[float] = []
    for n in roofline.graph.nodes:
        ms = measured.ops.get((cfg, n.name))
        if ms is None:
            continue
        if n.flops == 0:
            overheads.append(ms)
        else:
            ratios.setdefault(n.op_class, []).append(ms / roofline.ms(n.name, *cfg))
    fusion_ratios = []
    for (c, members), e in measured.profiled.items():
        if c == cfg and all((cfg, m) in measured.ops for m in members):
            unfused = math.fsum(measured.ops[(cfg, m)] for m in members)  # exact: members is a set
            if unfused > 0:
                fusion_ratios.append(e.mean_ms / unfused)
    return Fit(
        class_scale={cls: statistics.median(r) for cls, r in ratios.items()},
        op_overhead_ms=statistics.median(overheads) if overheads else 0.0,
        fusion=statistics.median(fusion_ratios) if fusion_ratios else 1.0,
        alpha=1.0,
        beta_ms=0.0,
        partitions_fitted=0,
    )


def _alpha_beta(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Partition = alpha * unit sum + beta, by relative least squares over (unit sum, measured) pairs."""
    if len(xs) >= 2:
        # Relative least squares: minimise sum(((alpha*x + beta) - y) / y)^2
        a = np.array([[x / y, 1 / y] for x, y in zip(xs, ys, strict=True)])
        (alpha, beta), *_ = np.linalg.lstsq(a, np.ones(len(ys)), rcond=None)
        if alpha <= 0:
            return float(np.median(np.array(ys) / np.array(xs))), 0.0
        return float(alpha), float(beta)
    if len(xs) == 1:
        return ys[0] / xs[0], 0.0
    return 1.0, 0.0


def _partition_fit(units: Calibration, roofline: Roofline, cfg: Config) -> Fit:
    """``cfg``'s unit fit completed with alpha and beta, fitted on its measured partitions not held out.

    The profiler times partitions alone, run after run; in a plan they run beside the others (on
    local-biglittle's throttled core googlenet's 118-operator partition took 9.2 ms of CPU a frame in a pipeline,
    where the fit to the profiler's partitions put it at 5.5). So where ``MIN_PIPELINE_PARTITIONS`` or more were
    measured in a pipeline (``run:``, what ``tune`` feeds back), alpha and beta, fitted to all of them, are then
    scaled by the median of the pipeline ones' measured / fitted: the pipeline sets the relation's scale.
    (Fitted to the profiler's partitions alone before the scale, the shape followed their quirks: local-biglittle's
    throttled core has alpha 0.49 and beta 1.57 there, and a replay of recorded rounds predicted worse.)"""
    xs, ys, in_pipeline = [], [], []
    for e in units.partitions.get(cfg, ()):
        if held_out_entry(e, units.holdout) or e.mean_ms < MIN_FIT_MS:
            continue
        # a partition measured in a pipeline is fitted on the units it is predicted from anywhere else, the
        # profiler's block of the same nodes included: how a pipeline run relates to that block is what is fitted
        # (left out, a one-block partition was summed from its operators timed alone: inception_resnet_v2 on
        # local-biglittle's big core, a conv at 5.36 ms alone in a block of 0.81, and alpha fell 0.99 -> 0.63)
        xs.append(units.units_ms(roofline, frozenset(e.members), cfg, exclude_self=not is_run_entry(e)))
        # a partition measured in a pipeline (``run:``) has the run overhead in it, which the cost model adds
        # apart from the fit
        ys.append(e.mean_ms - (units.run_overhead.get(cfg[0], 0.0) if is_run_entry(e) else 0.0))
        in_pipeline.append(is_run_entry(e))
    alpha, beta = _alpha_beta(xs, ys)
    ratios = [
        y / (alpha * x + beta) for x, y, run in zip(xs, ys, in_pipeline, strict=True) if run and alpha * x + beta > 0
    ]
    if len(ratios) >= MIN_PIPELINE_PARTITIONS:
        scale = statistics.median(ratios)
        alpha, beta = alpha * scale, beta * scale
    return dataclasses.replace(units.fits[cfg], alpha=float(alpha), beta_ms=float(beta), partitions_fitted=len(xs))


def calibrate(roofline: Roofline, table: CostTable | None, holdout: Iterable[str] = ()) -> Calibration:
    """What ``table`` measured for ``roofline``'s model on its board, and the fits made from it."""
    graph, board = roofline.graph, roofline.profile.name
    if graph.granularity != "op":
        raise ValueError("calibration needs the operator-level graph")
    held = frozenset(holdout)
    entries = table.select(model_sha256=graph.model_sha256, board=board, precision=None) if table is not None else []
    learnt = table.learnt(model_sha256=graph.model_sha256, board=board) if table is not None else []
    measured = _measured(graph.model_sha256, board, entries, learnt, held)
    # a session spanning clusters (``a+b``, what ``tune`` measured of one) is looked up as measured, never fitted:
    # no operator of it is profiled, and no model of it relates its partitions to their blocks
    pus = {pu.name for pu in roofline.profile.pus}
    measured = dataclasses.replace(measured, partitions={c: es for c, es in measured.partitions.items() if c[0] in pus})
    configs = sorted(c for c in {c for c, _ in measured.ops} | {c for c, _ in measured.fused} if c[0] in pus)
    # Alpha and beta of a configuration are fitted on unit sums made with its unit fit (and no other's).
    units = dataclasses.replace(measured, fits={cfg: _unit_fit(measured, roofline, cfg) for cfg in configs})
    return dataclasses.replace(units, fits={cfg: _partition_fit(units, roofline, cfg) for cfg in configs})
