"""``CostTable``: what was measured, where, and under which conditions.

Each entry is keyed by a content hash of (model, block members, PU config, ORT
version, execution provider, board), so a repeated profiling run finds what is
already there and measures nothing twice. Saving merges with what is on disk under
a file lock and writes through a temporary file and a rename.

Times are ``CostEntry`` records (an operator, a fused block, a partition). What ``parapipe tune``
learns that is not a time of a group of nodes (the handoff delay between PUs, the scales of the
profile's busy and idle power) is a ``CalibrationRecord`` in the table's own ``calibration`` list.
Tables of version 1 held those as ``handoff`` and ``power`` entries; they are moved to that list
when such a table is read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from models.errors import ParapipeError
from models.files import atomic_write, locked
from models.schema import first_problem, load_record, record_schema

if TYPE_CHECKING:
    from profiler.measure import Timing

TABLE_VERSION = 2
READS_VERSIONS = (1, 2)  # version 1: calibration values were entries of kind handoff / power
EntryKind = Literal["op", "block", "partition"]
KINDS: tuple[EntryKind, ...] = ("op", "block", "partition")
# What tune learns besides times: the delay of handing a tensor to a worker on another PU of a host
# (ms), the factors on the profile's busy and idle power (dimensionless), the bandwidth of a shared
# memory (GB/s, applies to the memory named): what running the model on its PUs at once lets through,
# and of a network link (applies to the link named ``a-b``) its bandwidth (GB/s) and the CPU time each end
# spends on a tensor (gRPC and protobuf copies): per message (µs) and per MB (µs/MB); and of a CFS-throttled PU
# (applies to the PU named) how many times longer its partitions take back to back than alone (dimensionless);
# and per PU (applies to the PU named) what one partition run costs in an agent's pipeline beyond what the
# profiler timed of it run after run (ms); and what a frame alone spends in a pipeline of several partitions
# outside their runs (ms: entering the pipeline, waking its first worker, its result back to the caller).
CalibrationKind = Literal[
    "handoff",
    "frame-overhead",
    "power-active-scale",
    "power-idle-scale",
    "memory-bandwidth",
    "network-bandwidth",
    "network-cpu-message",
    "network-cpu-mb",
    "sustained-factor",
    "run-overhead",
]
CALIBRATION_UNITS: dict[str, str] = {
    "handoff": "ms",
    "frame-overhead": "ms",
    "power-active-scale": "x",
    "power-idle-scale": "x",
    "memory-bandwidth": "GB/s",
    "network-bandwidth": "GB/s",
    "network-cpu-message": "us",
    "network-cpu-mb": "us/MB",
    "sustained-factor": "x",
    "run-overhead": "ms",
}
EVERY_UNIT = "*"  # a calibration value learnt for every PU and link of the board


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
    kind: EntryKind
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
    # nodes the PU's execution provider declined, which onnxruntime ran on the CPU in this measurement
    declined: tuple[str, ...] = ()

    @classmethod
    def from_timing(
        cls,
        model_sha256: str,
        kind: EntryKind,
        name: str,
        members: tuple[str, ...],
        cond: Conditions,
        t: Timing,
        flops: int,
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
            declined=t.declined,
        )

    @property
    def config(self) -> tuple[str, int]:
        return (self.conditions.pu, self.conditions.cores)


@dataclass(frozen=True)
class CalibrationRecord:
    """One value ``parapipe tune`` learnt for a model on a board that is not a time of some nodes."""

    key: str
    kind: CalibrationKind
    model_sha256: str
    applies_to: str  # the PU or link it was learnt for; EVERY_UNIT: all of the board's
    value: float  # in ``unit``
    conditions: Conditions
    runs: int  # measured plans it was learnt from
    measured_at: float

    @classmethod
    def learnt(
        cls,
        model_sha256: str,
        kind: CalibrationKind,
        value: float,
        cond: Conditions,
        runs: int,
        applies_to: str = EVERY_UNIT,
    ) -> CalibrationRecord:
        """A value learnt now, keyed by model, kind, what it applies to and conditions."""
        return cls(
            calibration_key(model_sha256, kind, applies_to, cond),
            kind,
            model_sha256,
            applies_to,
            value,
            cond,
            runs,
            time.time(),
        )

    @property
    def unit(self) -> str:
        return CALIBRATION_UNITS[self.kind]


@functools.cache
def _table_schema(version: int) -> type[BaseModel]:
    """A cost table file: its version, its ``CostEntry`` entries and (version 2) its ``CalibrationRecord`` list.

    Version 1 entries may be of any kind and carry a ``value`` (the power scales); ``_migrated`` sorts them."""
    entry = record_schema(CostEntry)
    if version == 1:
        entry = create_model("CostEntryV1File", __base__=entry, kind=(str, ...), value=(float | None, None))
        return create_model(
            "CostTableV1File", __config__=ConfigDict(strict=True), version=(int, ...), entries=(list[entry], ...)
        )
    return create_model(
        "CostTableFile",
        __config__=ConfigDict(strict=True),
        version=(int, ...),
        entries=(list[entry], ...),  # type: ignore[valid-type]
        calibration=(list[record_schema(CalibrationRecord)], []),  # type: ignore[misc]
    )


def entry_key(model_sha256: str, kind: str, members: Iterable[str], cond: Conditions) -> str:
    payload = json.dumps(
        {"model": model_sha256, "kind": kind, "members": sorted(members), "cond": _conditions_json(cond)},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def calibration_key(model_sha256: str, kind: str, applies_to: str, cond: Conditions) -> str:
    payload = json.dumps(
        {"model": model_sha256, "calibration": kind, "applies_to": applies_to, "cond": _conditions_json(cond)},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


_V1_CALIBRATION: dict[tuple[str, str], CalibrationKind] = {
    ("handoff", "handoff"): "handoff",
    ("power", "active-scale"): "power-active-scale",
    ("power", "idle-scale"): "power-idle-scale",
}


def _migrated(entries: list[Any], origin: str) -> tuple[list[CostEntry], list[CalibrationRecord]]:
    """Version 1 entries as times and calibration values: a ``handoff`` entry's time and a ``power`` entry's
    ``value`` become calibration records (a power entry without a value meant nothing and is dropped)."""
    times, learnt = [], []
    for i, raw in enumerate(entries):
        if raw.kind in KINDS:
            times.append(
                load_record(
                    CostEntry, record_schema(CostEntry).model_validate(raw.model_dump(exclude={"value"}, mode="json"))
                )
            )
            continue
        kind = _V1_CALIBRATION.get((raw.kind, raw.name))
        if kind is None:
            raise CostTableError(
                f"{origin} is malformed (entries[{i}]: kind {raw.kind!r} named {raw.name!r} is none of "
                f"{', '.join(KINDS)}, handoff, power active-scale / idle-scale); fix that field or move the file away"
            )
        value = raw.mean_ms if raw.kind == "handoff" else raw.value
        if value is None:
            continue
        cond = load_record(Conditions, raw.conditions)
        learnt.append(
            CalibrationRecord(
                calibration_key(raw.model_sha256, kind, EVERY_UNIT, cond),
                kind,
                raw.model_sha256,
                EVERY_UNIT,
                float(value),
                cond,
                raw.repeats,
                raw.measured_at,
            )
        )
    return times, learnt


@dataclass
class CostTable:
    """Entries and calibration values by key. Mutable while a profiling or tuning run fills it; saved atomically."""

    entries: dict[str, CostEntry] = field(default_factory=dict)
    calibration: dict[str, CalibrationRecord] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def __iter__(self) -> Iterator[CostEntry]:
        return iter(self.entries.values())

    def add(self, entry: CostEntry) -> None:
        self.entries[entry.key] = entry

    def learn(self, record: CalibrationRecord) -> None:
        self.calibration[record.key] = record

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

    def declined(self, model_sha256: str, board: str, pu: str, members: Iterable[str]) -> tuple[str, ...] | None:
        """Of ``members`` (a partition's nodes on ``pu``), those the PU's execution provider declined in any
        measurement of them or of a part of them (onnxruntime ran them on the CPU); None where nothing of them
        was measured on ``pu``."""
        members = list(members)
        mine = set(members)
        seen, out = False, set()
        for e in self.entries.values():
            c = e.conditions
            if e.model_sha256 != model_sha256 or c.board != board or c.pu != pu or not mine.intersection(e.members):
                continue
            seen = True
            out.update(n for n in e.declined if n in mine)
        return tuple(n for n in members if n in out) if seen else None

    def learnt(self, model_sha256: str | None = None, board: str | None = None) -> list[CalibrationRecord]:
        """The calibration values for this model and board (None: any)."""
        return [
            r
            for r in self.calibration.values()
            if (model_sha256 is None or r.model_sha256 == model_sha256)
            and (board is None or r.conditions.board == board)
        ]

    def to_json(self) -> dict[str, object]:
        return {
            "version": TABLE_VERSION,
            "entries": [
                {**asdict(e), "conditions": _conditions_json(e.conditions)}
                for e in sorted(self.entries.values(), key=lambda e: e.key)
            ],
            "calibration": [
                {**asdict(r), "conditions": _conditions_json(r.conditions)}
                for r in sorted(self.calibration.values(), key=lambda r: r.key)
            ],
        }

    @staticmethod
    def from_json(data: object, origin: str = "cost table") -> CostTable:
        if not isinstance(data, dict) or "version" not in data:
            raise CostTableError(f"{origin} is not a parapipe cost table (no version field)")
        version = data["version"]
        if version not in READS_VERSIONS or isinstance(version, bool):
            raise CostTableError(
                f"{origin} has version {version}; this parapipe reads versions {', '.join(map(str, READS_VERSIONS))}"
            )
        try:
            checked = _table_schema(version).model_validate(data)
        except ValidationError as exc:
            raise CostTableError(
                f"{origin} is malformed ({first_problem(exc)}); fix that field or move the file away to start a new table"
            ) from None
        table = CostTable()
        if version == 1:
            times, learnt = _migrated(checked.entries, origin)  # type: ignore[attr-defined]
        else:
            times = [load_record(CostEntry, raw) for raw in checked.entries]  # type: ignore[attr-defined]
            learnt = [load_record(CalibrationRecord, raw) for raw in checked.calibration]  # type: ignore[attr-defined]
        for entry in times:
            table.add(entry)
        for record in learnt:
            table.learn(record)
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
            merged.calibration.update(self.calibration)
            atomic_write(path, json.dumps(merged.to_json(), indent=1) + "\n")
        self.entries = merged.entries
        self.calibration = merged.calibration
        return len(merged)
