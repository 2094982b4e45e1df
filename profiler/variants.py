"""Timing the precision variants of blocks and partitions, into the cost table.

Each group (a block's or a partition's ONNX node names) is cut out, made into its
fp32 / int8 / fp16 variants (``models.precision``), fed the group's boundary values
for the first calibration frame and timed fused (ORT_ENABLE_ALL) like
``profiler.session`` times fp32 blocks, with the same timer. Variants whose precision
the PU does not compute in (``ProcessingUnit.computes``) are not made for it.

Entries are keyed like every other cost-table entry, with the precision in their
``Conditions`` (fp32 entries keep the keys they always had, so an fp32 variant of a
block already profiled is not timed again). The quantise/dequantise or cast at a
variant's boundary is inside the variant, hence inside its time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from device_profiles.schema import DeviceProfile
from models.onnx_io import LoadedModel
from models.precision import Frame, VariantMaker
from profiler.costtable import Conditions, CostEntry, CostTable, EntryKind, entry_key
from profiler.measure import PuConfig
from profiler.session import LocalTimer, Timer


@dataclass(frozen=True)
class VariantTime:
    """One group in one precision on one PU configuration: its cost-table entry and variant's hash."""

    group: str
    precision: str
    config: str  # PuConfig.label
    entry: CostEntry
    variant_sha256: str
    reused: bool


def variant_conditions(board: str, cfg: PuConfig, ort_version: str, precision: str) -> Conditions:
    return Conditions(
        board, cfg.pu, len(cfg.cores), cfg.threads, cfg.provider, ort_version, "all", cfg.throttle_percent, precision
    )


@dataclass(frozen=True)
class VariantOptions:
    """Which variants are timed and how: the precisions, the entries' kind, the runs, the timer."""

    precisions: tuple[str, ...] = ("fp32", "int8")
    kind: EntryKind = "block"  # what the groups are: blocks or partitions
    warmup: int = 3  # untimed runs first
    repeats: int = 10  # timed runs per measurement
    timer: Timer | None = None  # default: a LocalTimer here
    ort_version: str | None = None  # recorded in the entries' conditions; default: the timer's
    progress: Callable[[str], None] | None = None  # told of each group as it is made and timed


def time_variants(
    model: LoadedModel,
    groups: Mapping[str, Sequence[str]],
    calibration: Sequence[Frame],
    profile: DeviceProfile,
    configs: Sequence[PuConfig],
    options: VariantOptions = VariantOptions(),
    table: CostTable | None = None,
    maker: VariantMaker | None = None,
) -> list[VariantTime]:
    """Time each group's variants on each configuration; entries go into ``table`` (when given), and
    entries already there are reused, not measured again."""
    timer = options.timer or LocalTimer()
    ort_version = options.ort_version or timer.ort_version
    maker = maker or VariantMaker(model)
    precisions, kind = options.precisions, options.kind
    flops = {n.name: n.flops for n in maker.graph.nodes}
    # one fp32 run per frame for every group's boundary values, not one per group
    entering = {t for members in groups.values() for t in maker.extractor.boundary(list(members))[0]}
    maker.boundary_values(calibration, entering, "calibration")
    out: list[VariantTime] = []
    for i, (name, members) in enumerate(groups.items()):
        if options.progress:
            options.progress(f"timing {', '.join(precisions)} variants of block {i + 1}/{len(groups)} ({name})")
        members = tuple(members)
        made = maker.variants(members, calibration, precisions, name=name, tag="calibration")
        feeds = maker.boundary_values(calibration[:1], made[precisions[0]].inputs, "calibration")[0]
        for cfg in configs:
            pu = profile.pu(cfg.pu)
            for precision, variant in made.items():
                if not pu.computes(precision):
                    continue
                cond = variant_conditions(profile.name, cfg, ort_version, precision)
                key = entry_key(model.sha256, kind, members, cond)
                if table is not None and key in table:
                    out.append(VariantTime(name, precision, cfg.label, table.entries[key], variant.sha256, True))
                    continue
                t = timer.time(variant.model, feeds, cfg, options.warmup, options.repeats, pu)
                entry = CostEntry.from_timing(
                    model.sha256, kind, name, members, cond, t, sum(flops.get(m, 0) for m in members)
                )
                if table is not None:
                    table.add(entry)
                out.append(VariantTime(name, precision, cfg.label, entry, variant.sha256, False))
    return out


def speedups(times: Iterable[VariantTime], baseline: str = "fp32") -> dict[tuple[str, str, str], float]:
    """(group, config, precision) -> baseline median / variant median, for every non-baseline variant."""
    times = list(times)
    base = {(t.group, t.config): t.entry.median_ms for t in times if t.precision == baseline}
    return {
        (t.group, t.config, t.precision): base[(t.group, t.config)] / max(t.entry.median_ms, 1e-9)
        for t in times
        if t.precision != baseline and (t.group, t.config) in base
    }


def saved_ms(times: Iterable[VariantTime], precision: str = "int8", config: str | None = None) -> dict[str, float]:
    """Per group: fp32 median minus the ``precision`` variant's (what the group gains; may be negative)."""
    times = [t for t in times if config is None or t.config == config]
    fp32 = {t.group: t.entry.median_ms for t in times if t.precision == "fp32"}
    return {t.group: fp32[t.group] - t.entry.median_ms for t in times if t.precision == precision and t.group in fp32}


def time_interleaved(
    models: Mapping[str, bytes],
    feeds: Mapping[str, np.ndarray],
    profile: DeviceProfile,
    configs: Sequence[PuConfig],
    rounds: int = 3,
    options: VariantOptions = VariantOptions(repeats=20),
) -> dict[tuple[str, str], list[float]]:
    """(model name, ``PuConfig.label``) -> the median ms per run of each of ``rounds`` rounds, each round timing
    every model on every configuration in turn: a change of load between rounds touches every model of a round
    alike, so their ratios within a round hold where their times drift."""
    timer = options.timer or LocalTimer()
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for cfg in configs:
            pu = profile.pu(cfg.pu)
            for name, model in models.items():
                t = timer.time(model, dict(feeds), cfg, options.warmup, options.repeats, pu)
                samples.setdefault((name, cfg.label), []).append(t.median_ms)
    return samples
