"""``CostTable``: what was measured, where, and under which conditions.

Each entry is keyed by a content hash of (model, block members, PU config, ORT
version, execution provider, board), so a repeated profiling run finds what is
already there and measures nothing twice. Saving merges with what is on disk under
a file lock and writes through a temporary file and a rename.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from models.errors import ParapipeError
from models.files import atomic_write, locked
from models.schema import first_problem, load_record, record_schema

if TYPE_CHECKING:
    from profiler.measure import Timing

TABLE_VERSION = 1
KINDS = ("op", "block", "partition")


class CostTableError(ParapipeError):
    """A cost table file is unreadable or of an unknown version."""


@dataclass(frozen=True)
class Conditions:
    board: str
    pu: str
    cores: int
    threads: int
    ep: str
    ort_version: str
    opt_level: str  # "disable" for per-op profiles, "all" for fused blocks and partitions
    throttle_percent: float | None = None
    precision: str = "fp32"  # fp32 | fp16 | int8: the variant timed (models.precision)


def _conditions_json(cond: Conditions) -> dict[str, object]:
    """Conditions as stored and hashed: ``precision`` only when not fp32, so tables and keys written
    before precisions existed stay valid and readable both ways."""
    data = asdict(cond)
    if data["precision"] == "fp32":
        del data["precision"]
    return data


@dataclass(frozen=True)
class CostEntry:
    key: str
    kind: str  # op | block | partition, or a calibration: handoff (ms) | power (value)
    model_sha256: str
    name: str  # op or block name, or a partition label
    members: tuple[str, ...]  # ONNX node names
    conditions: Conditions
    median_ms: float
    mean_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int
    energy_mj: float | None = None
    energy_source: str = "modelled"  # measured | modelled
    flops: int = 0
    measured_at: float = 0.0
    value: float | None = None  # calibration values that are not times (kind "power": a scale factor)

    @classmethod
    def from_timing(
        cls, model_sha256: str, kind: str, name: str, members: tuple[str, ...], cond: Conditions, t: Timing, flops: int
    ) -> CostEntry:
        """A measured entry: the timing's figures, keyed by model, kind, members and conditions."""
        return cls(
            key=entry_key(model_sha256, kind, members, cond),
            kind=kind,
            model_sha256=model_sha256,
            name=name,
            members=members,
            conditions=cond,
            median_ms=t.median_ms,
            mean_ms=t.mean_ms,
            p10_ms=t.p10_ms,
            p90_ms=t.p90_ms,
            repeats=t.repeats,
            energy_mj=t.energy_mj_per_run,
            energy_source=t.energy_source or "none",
            flops=flops,
            measured_at=time.time(),
        )

    @property
    def config(self) -> tuple[str, int]:
        return (self.conditions.pu, self.conditions.cores)


@functools.cache
def _table_schema() -> type[BaseModel]:
    """A cost table file: its version and its entries, each a ``CostEntry`` with its ``Conditions``."""
    return create_model(
        "CostTableFile",
        __config__=ConfigDict(strict=True),
        version=(int, ...),
        entries=(list[record_schema(CostEntry)], ...),  # type: ignore[misc]
    )


def entry_key(model_sha256: str, kind: str, members: Iterable[str], cond: Conditions) -> str:
    payload = json.dumps(
        {"model": model_sha256, "kind": kind, "members": sorted(members), "cond": _conditions_json(cond)},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass
class CostTable:
    """Entries by key. Mutable while a profiling run fills it; saved atomically."""

    entries: dict[str, CostEntry] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def __iter__(self) -> Iterator[CostEntry]:
        return iter(self.entries.values())

    def add(self, entry: CostEntry) -> None:
        self.entries[entry.key] = entry

    def select(
        self,
        model_sha256: str | None = None,
        kind: str | None = None,
        board: str | None = None,
        precision: str | None = "fp32",
    ) -> list[CostEntry]:
        """Entries matching every filter given. ``precision`` defaults to fp32 so that callers written
        before precisions existed see the entries they were written for; ``None`` selects every precision."""
        return [
            e
            for e in self.entries.values()
            if (model_sha256 is None or e.model_sha256 == model_sha256)
            and (kind is None or e.kind == kind)
            and (board is None or e.conditions.board == board)
            and (precision is None or e.conditions.precision == precision)
        ]

    def to_json(self) -> dict[str, object]:
        return {
            "version": TABLE_VERSION,
            "entries": [
                {**asdict(e), "conditions": _conditions_json(e.conditions)}
                for e in sorted(self.entries.values(), key=lambda e: e.key)
            ],
        }

    @staticmethod
    def from_json(data: object, origin: str = "cost table") -> CostTable:
        if not isinstance(data, dict) or "version" not in data:
            raise CostTableError(f"{origin} is not a parapipe cost table (no version field)")
        if data["version"] != TABLE_VERSION:
            raise CostTableError(f"{origin} has version {data['version']}; this parapipe reads version {TABLE_VERSION}")
        try:
            checked = _table_schema().model_validate(data)
        except ValidationError as exc:
            raise CostTableError(
                f"{origin} is malformed ({first_problem(exc)}); fix that field or move the file away to start a new table"
            ) from None
        table = CostTable()
        for raw in checked.entries:  # type: ignore[attr-defined]
            table.add(load_record(CostEntry, raw))
        return table

    @staticmethod
    def load(path: Path) -> CostTable:
        if not path.exists():
            return CostTable()
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CostTableError(f"cannot read cost table {path}: {exc}; move it away to start a new one") from None
        return CostTable.from_json(data, str(path))

    def save(self, path: Path) -> int:
        """Merge into what is on disk (ours win on equal keys) and write atomically; returns the entry count."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path):
            merged = CostTable.load(path)
            merged.entries.update(self.entries)
            atomic_write(path, json.dumps(merged.to_json(), indent=1) + "\n")
        self.entries = merged.entries
        return len(merged)
