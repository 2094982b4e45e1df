"""Typed measurement records, from the agent's reply to the reports and the tune loop.

One frame-level figure set (``Figures``) is what a plan predicts and what a board
measures, so the two compare field by field; one ``PartitionMeasurement`` carries a
partition's counters as the agent's ``PartitionStats`` reports them. Both turn into the
JSON that ``run --json`` prints and ``measurements.jsonl`` keeps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

FIGURES = ("latency_ms", "latency_p50_at_rate_ms", "latency_p99_at_rate_ms", "throughput_fps", "energy_mj")


@dataclass(frozen=True)
class Figures:
    """Latency of one frame alone (the mean over the frames run so: what a sum of mean partition times predicts),
    throughput back to back, energy per frame; latency with frames arriving at 90% of that throughput
    (``AT_RATE_LOAD``, median and p99) if known."""

    latency_ms: float
    throughput_fps: float
    energy_mj: float
    latency_p50_at_rate_ms: float | None = None
    latency_p99_at_rate_ms: float | None = None

    def to_json(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in FIGURES if getattr(self, k) is not None}

    def errors_pct(self, measured: Figures) -> dict[str, float]:
        """(predicted - measured) / measured in %, for every figure both have (and measured is non-zero)."""
        out = {}
        for k in FIGURES:
            p, m = getattr(self, k), getattr(measured, k)
            if p is not None and m:
                out[k] = (p - m) / m * 100
        return out


@dataclass(frozen=True)
class PartitionMeasurement:
    """One partition's counters on the board: busy time over all frames and over frames run one at a time."""

    name: str
    pu: str
    busy_ms: float
    queue_wait_ms: float
    frames: int
    alone_busy_ms: float = 0.0
    alone_frames: int = 0
    host: str = ""
    # CPU time of the thread running the session (a one-thread session's work), back to back and one at a time,
    # over the runs it was read for (0: not read, an agent before it or a partition run inline)
    cpu_ms: float = 0.0
    cpu_frames: int = 0
    alone_cpu_ms: float = 0.0
    alone_cpu_frames: int = 0
    provider: str = ""  # the execution provider its session ran on ("" from an agent before it was reported)
    load_s: float = 0.0  # its session's load, EP compilation included: a deploy cost, not a frame cost
    compile_cache_hit: bool = False

    @classmethod
    def from_stats(cls, stats: Any, host: str = "") -> PartitionMeasurement:
        """From the agent's ``PartitionStats`` message."""
        return cls(
            name=stats.name,
            pu=stats.pu,
            busy_ms=stats.busy_ms,
            queue_wait_ms=stats.queue_wait_ms,
            frames=stats.frames,
            alone_busy_ms=stats.alone_busy_ms,
            alone_frames=stats.alone_frames,
            host=host,
            cpu_ms=stats.cpu_ms,
            cpu_frames=stats.cpu_frames,
            alone_cpu_ms=stats.alone_cpu_ms,
            alone_cpu_frames=stats.alone_cpu_frames,
            provider=stats.provider,
            load_s=stats.load_s,
            compile_cache_hit=stats.compile_cache_hit,
        )

    @property
    def busy_per_frame_ms(self) -> float | None:
        return self.busy_ms / self.frames if self.frames else None

    @property
    def alone_per_frame_ms(self) -> float | None:
        return self.alone_busy_ms / self.alone_frames if self.alone_frames else None

    @property
    def alone_cpu_per_frame_ms(self) -> float | None:
        """CPU time per frame of the session's thread over the frames run one at a time (None: not read)."""
        return self.alone_cpu_ms / self.alone_cpu_frames if self.alone_cpu_frames else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.host:
            del data["host"]
        return data


def figures_from_json(data: dict[str, Any]) -> Figures:
    names = {f.name for f in fields(Figures)}
    return Figures(**{k: v for k, v in data.items() if k in names})
