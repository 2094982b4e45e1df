"""PartitionBundle on disk: ``manifest.json`` plus one ONNX file per partition, each with its sha256.

Board side, stdlib only. The manifest says, per partition: its file and hash, the PU,
core ids, threads, throttle and execution provider it runs with, its stage, replica
group, unit and segment, and the tensors it reads and writes. The bundle's identity is
the sha256 of its manifest, which names the hash of every file.

A plan over several hosts (edge + cloud) compiles to one bundle per host: each
manifest lists every partition of the plan with its host, but carries files only for
its own host's partitions (``host``); ``hosts`` names the plan's hosts, the entry host
(where frames enter and results leave) first, and ``plan_bundle`` is the same on every
host so agents can tell that handoffs belong to the same plan.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST_VERSION = 1
MANIFEST = "manifest.json"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


_PLAIN = re.compile(r"^[A-Za-z0-9_.+-]{1,128}$")  # a file name, or a unit spanning clusters ("big+little")


def plain_name(name: str) -> bool:
    """Whether ``name`` can become one path component safely: no separator, not ``.`` or ``..``, bounded."""
    return bool(_PLAIN.match(name)) and name not in (".", "..")


# a frame's tensor travels in one gRPC message (``agents.server.MAX_MESSAGE_BYTES``): no input or output may be
# larger, and the board never makes one (generated inputs, profile requests) beyond it
MAX_TENSOR_BYTES = 64 * 1024 * 1024
MAX_PARTITIONS = 1024  # partitions one manifest may list


class BundleError(ValueError):
    """A bundle is malformed, incomplete or does not match its hashes."""


def check_tensor(name: str, shape: tuple[int, ...], dtype: str, where: str) -> None:
    """Refuse (``BundleError``) a tensor whose shape is negative or whose size is over ``MAX_TENSOR_BYTES``, before
    anything is allocated for it."""
    import numpy as np

    if any(d < 0 for d in shape):
        raise BundleError(f"{where}: tensor {name!r} has a negative dimension {list(shape)}")
    size = math.prod(shape) * np.dtype(dtype).itemsize
    if size > MAX_TENSOR_BYTES:
        raise BundleError(
            f"{where}: tensor {name!r} of shape {list(shape)} ({dtype}) is {size / 2**20:.0f} MiB; this agent takes "
            f"tensors up to {MAX_TENSOR_BYTES // 2**20} MiB"
        )


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    high: int | None = None  # integer inputs: exclusive upper bound for generated data
    low: int | None = None  # integer inputs: inclusive lower bound for generated data (default 0)
    values: tuple[float, ...] = ()  # fixed values (flattened) for every generated frame, e.g. a sample rate

    @property
    def nbytes(self) -> int:
        import numpy as np

        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class PartitionSpec:
    name: str
    file: str
    sha256: str
    pu: str
    cores: int
    core_ids: tuple[int, ...]
    threads: int
    throttle_percent: float | None
    throttled_cores: tuple[int, ...]  # cores whose threads get the throttle (all, or some for a spanning unit)
    provider: str
    provider_options: dict[str, str]
    stage: int
    group: int
    unit: int
    segment: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    host: str = ""  # the profile's host this partition runs on ("" = single-host plan)

    @classmethod
    def on_cpu_core(
        cls,
        name: str,
        file: str,
        sha256: str,
        core: int,
        *,
        inputs: tuple[str, ...],
        outputs: tuple[str, ...],
        stage: int = 0,
        group: int = 0,
        unit: int = 0,
        host: str = "",
    ) -> PartitionSpec:
        """A partition of one onnxruntime thread on one CPU core, the only partition of its unit: for bundles
        made by hand (benchmarks, tests)."""
        return cls(
            name=name,
            file=file,
            sha256=sha256,
            pu="cpu",
            cores=1,
            core_ids=(core,),
            threads=1,
            throttle_percent=None,
            throttled_cores=(),
            provider="CPUExecutionProvider",
            provider_options={},
            stage=stage,
            group=group,
            unit=unit,
            segment=0,
            inputs=inputs,
            outputs=outputs,
            host=host,
        )


@dataclass(frozen=True)
class Manifest:
    model_sha256: str
    plan_name: str
    device: str
    pipelined: bool
    max_inflight: int
    replicas: tuple[int, ...]  # per stage
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    partitions: tuple[PartitionSpec, ...]
    # modelled power when the board has no sensor: (active W per busy core, idle W per core, cores)
    power: tuple[float, float, int] = (0.0, 0.0, 1)
    host: str = ""  # the host this bundle is for; "" = every partition runs here
    hosts: tuple[str, ...] = ()  # hosts of a plan over several hosts, the entry host first
    plan_bundle: str = ""  # sha256 of the whole plan's manifest (multi-host bundles only)

    @property
    def entry(self) -> str:
        """The host where frames enter and results are collected ("" for single-host plans)."""
        return self.hosts[0] if self.hosts else ""

    @property
    def is_entry(self) -> bool:
        return not self.host or self.host == self.entry

    def is_local(self, p: PartitionSpec) -> bool:
        return not self.host or p.host == self.host

    def local_partitions(self) -> tuple[PartitionSpec, ...]:
        return tuple(p for p in self.partitions if self.is_local(p))

    def replica_period(self) -> int:
        """Frames after which the replica groups repeat (the LCM of the stages' replica counts)."""
        return math.lcm(*self.replicas) if self.replicas else 1

    def active(self, frame: int) -> list[PartitionSpec]:
        """The partitions frame ``frame`` runs on (replicated stages take frames round-robin)."""
        return [p for p in self.partitions if p.group == frame % self.replicas[p.stage]]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION,
            "model_sha256": self.model_sha256,
            "plan_name": self.plan_name,
            "device": self.device,
            "pipelined": self.pipelined,
            "max_inflight": self.max_inflight,
            "replicas": list(self.replicas),
            "power": list(self.power),
            "host": self.host,
            "hosts": list(self.hosts),
            "plan_bundle": self.plan_bundle,
            "inputs": [_tensor_json(t) for t in self.inputs],
            "outputs": [_tensor_json(t) for t in self.outputs],
            "partitions": [
                {
                    "name": p.name,
                    "file": p.file,
                    "sha256": p.sha256,
                    "pu": p.pu,
                    "cores": p.cores,
                    "core_ids": list(p.core_ids),
                    "threads": p.threads,
                    "throttle_percent": p.throttle_percent,
                    "throttled_cores": list(p.throttled_cores),
                    "provider": p.provider,
                    "provider_options": p.provider_options,
                    "stage": p.stage,
                    "group": p.group,
                    "unit": p.unit,
                    "segment": p.segment,
                    "inputs": list(p.inputs),
                    "outputs": list(p.outputs),
                    "host": p.host,
                }
                for p in self.partitions
            ],
        }

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"

    def sha256(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()


def _tensor_json(t: TensorSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}
    if t.high is not None:
        out["high"] = t.high
    if t.low is not None:
        out["low"] = t.low
    if t.values:
        out["values"] = list(t.values)
    return out


def parse_manifest(text: str) -> Manifest:
    try:
        data = json.loads(text)
        if data.get("version") != MANIFEST_VERSION:
            raise BundleError(f"manifest version {data.get('version')!r}; this agent reads {MANIFEST_VERSION}")

        def tensor(t: dict) -> TensorSpec:
            return TensorSpec(
                str(t["name"]),
                str(t["dtype"]),
                tuple(int(d) for d in t["shape"]),
                None if t.get("high") is None else int(t["high"]),
                None if t.get("low") is None else int(t["low"]),
                tuple(float(v) for v in t.get("values", ())),
            )

        parts = []
        this_host = str(data.get("host", ""))
        for p in data["partitions"]:
            elsewhere = bool(this_host) and str(p.get("host", "")) != this_host
            if not (elsewhere and p["file"] == "") and not _SAFE_NAME.match(str(p["file"])):
                raise BundleError(f"partition file name {p['file']!r} is not a plain file name")
            # names that reach paths on the board (a throttled unit's cgroup is named after them) pass the same check
            for what, name in (("partition name", p["name"]), ("unit name", p["pu"])):
                if not plain_name(str(name)):
                    raise BundleError(f"{what} {name!r} is not a plain name (letters, digits, _ . - +; not . or ..)")
            parts.append(
                PartitionSpec(
                    name=str(p["name"]),
                    file=str(p["file"]),
                    sha256=str(p["sha256"]),
                    pu=str(p["pu"]),
                    cores=int(p["cores"]),
                    core_ids=tuple(int(c) for c in p["core_ids"]),
                    threads=int(p["threads"]),
                    throttle_percent=None if p.get("throttle_percent") is None else float(p["throttle_percent"]),
                    throttled_cores=tuple(int(c) for c in p.get("throttled_cores", [])),
                    provider=str(p.get("provider", "CPUExecutionProvider")),
                    provider_options={str(k): str(v) for k, v in p.get("provider_options", {}).items()},
                    stage=int(p["stage"]),
                    group=int(p["group"]),
                    unit=int(p["unit"]),
                    segment=int(p["segment"]),
                    inputs=tuple(p["inputs"]),
                    outputs=tuple(p["outputs"]),
                    host=str(p.get("host", "")),
                )
            )
        manifest = Manifest(
            model_sha256=str(data["model_sha256"]),
            plan_name=str(data.get("plan_name", "")),
            device=str(data.get("device", "")),
            pipelined=bool(data.get("pipelined", True)),
            max_inflight=int(data.get("max_inflight", 0)),
            replicas=tuple(int(r) for r in data["replicas"]),
            inputs=tuple(tensor(t) for t in data["inputs"]),
            outputs=tuple(tensor(t) for t in data["outputs"]),
            partitions=tuple(parts),
            power=tuple(data.get("power", (0.0, 0.0, 1))),  # type: ignore[arg-type]
            host=this_host,
            hosts=tuple(str(h) for h in data.get("hosts", [])),
            plan_bundle=str(data.get("plan_bundle", "")),
        )
    except BundleError:
        raise
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BundleError(f"malformed manifest: {type(exc).__name__}: {exc}") from None
    if not manifest.partitions:
        raise BundleError("the manifest lists no partitions")
    if len(manifest.partitions) > MAX_PARTITIONS:
        raise BundleError(f"the manifest lists {len(manifest.partitions)} partitions; at most {MAX_PARTITIONS}")
    for t in manifest.inputs:  # outputs may have dimensions the model leaves open (-1)
        check_tensor(t.name, t.shape, t.dtype, "the manifest")
    for p in manifest.partitions:
        if p.stage >= len(manifest.replicas):
            raise BundleError(f"partition {p.name!r} is in stage {p.stage}, the manifest has {len(manifest.replicas)}")
    if manifest.host:
        if manifest.host not in manifest.hosts:
            raise BundleError(
                f"the manifest is for host {manifest.host!r}, which is not among its hosts {manifest.hosts}"
            )
        if len(manifest.plan_bundle) != 64:
            raise BundleError("a bundle for one host of a plan must name the plan's bundle (plan_bundle)")
        unknown = {p.host for p in manifest.partitions} - set(manifest.hosts)
        if unknown:
            raise BundleError(f"partitions run on hosts {sorted(unknown)} the manifest does not list")
        if not manifest.local_partitions():
            raise BundleError(f"no partition of the plan runs on host {manifest.host!r}")
    return manifest


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verify_bundle(folder: Path) -> Manifest:
    """Read a bundle folder and check every file against the manifest's hashes."""
    manifest = parse_manifest((folder / MANIFEST).read_text())
    for p in manifest.local_partitions():
        path = folder / p.file
        if not path.is_file():
            raise BundleError(f"partition file {p.file} is missing from the bundle")
        got = file_sha256(path)
        if got != p.sha256:
            raise BundleError(f"partition file {p.file} has sha256 {got[:12]}…, the manifest says {p.sha256[:12]}…")
    return manifest
