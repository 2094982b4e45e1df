"""The device-profile schema: boards, their processing units, links and network.

Every number is a ``Quantity`` carrying where it came from (``measured``,
``spec-sheet`` or ``estimate``) and, unless measured, a short citation. Profiles are
TOML files validated on load; errors name the file and the field.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

SCHEMA_VERSION = 1
SOURCES = ("measured", "spec-sheet", "estimate")
PU_KINDS = ("cpu", "gpu", "npu", "dsp")
OP_CLASSES = ("conv", "depthwise", "matmul", "elementwise", "pooling", "other")
PRECISIONS = ("fp32", "fp16", "int8")
# What drives a PU: "onnxruntime" (a released onnxruntime package has its execution provider) or "unavailable"
# (no onnxruntime release can drive it: the profile describes the silicon for what-if planning only).
RUNTIMES = ("onnxruntime", "unavailable")
# What a PU computes in when its profile does not say: CPUs run fp32 and int8 (onnxruntime's QDQ
# kernels), GPUs fp32 and fp16, NPUs and DSPs int8 only (float models fall back to another PU).
DEFAULT_PRECISIONS = {"cpu": ("fp32", "int8"), "gpu": ("fp32", "fp16"), "npu": ("int8",), "dsp": ("int8",)}


class ProfileError(ValueError):
    """A device profile is missing, malformed or contradicts itself. The message names the field."""


@dataclass(frozen=True)
class Quantity:
    value: float
    source: str
    cite: str = ""

    def __float__(self) -> float:
        return self.value


@dataclass(frozen=True)
class Precisions:
    """The number formats a PU computes in (``fp32``, ``fp16``, ``int8``), with where that comes from."""

    values: tuple[str, ...]
    source: str
    cite: str = ""

    @staticmethod
    def default(kind: str) -> Precisions:
        return Precisions(DEFAULT_PRECISIONS[kind], "estimate", f"default for a {kind} PU")


@dataclass(frozen=True)
class Runtime:
    """What drives a PU (``RUNTIMES``), with where that comes from: a unit no onnxruntime can drive says so and why."""

    value: str
    source: str
    cite: str = ""

    @property
    def available(self) -> bool:
        return self.value == "onnxruntime"


@dataclass(frozen=True)
class Throttle:
    """Make a CPU PU slower on purpose: its worker threads get this share of each CFS period."""

    quota_percent: float
    method: str = "cgroup-v1-cfs"


@dataclass(frozen=True)
class ProcessingUnit:
    name: str
    kind: str
    host: str
    cores: tuple[int, ...]
    execution_provider: str
    ep_options: tuple[tuple[str, str], ...]
    peak_gflops: dict[str, Quantity]  # per op class, all cores of the PU together
    memory_bandwidth_gbps: Quantity
    memory_bytes: Quantity
    launch_overhead_us: Quantity
    active_power_w: Quantity  # all cores busy
    idle_power_w: Quantity
    supported_ops: tuple[str, ...] = ()  # empty = every op
    host_cpu_us_per_tensor: Quantity | None = None  # GPU/NPU: host CPU time per tensor in or out; None: default
    cluster: str = ""
    throttle: Throttle | None = None
    precisions: Precisions | None = None  # None: DEFAULT_PRECISIONS of its kind
    # a PU that computes fp16: its fp16 arithmetic peak as a multiple of its fp32 peak (what an fp16 block's
    # time is derived from where none is measured); None: fp16 blocks are not offered without measured times
    fp16_peak_ratio: Quantity | None = None
    runtime: Runtime | None = None  # None: onnxruntime drives it (its execution provider is in a released package)
    # another runtime on PU ``shares``'s hardware (the same cores, or the same device): a plan uses one of the two,
    # never both (``DeviceProfile.runtime_choices``); "": hardware of its own
    shares: str = ""

    @property
    def deployable(self) -> bool:
        """False for a unit no onnxruntime release can drive (plans that use it are what-if only)."""
        return self.runtime is None or self.runtime.available

    def supports(self, op_type: str) -> bool:
        return not self.supported_ops or op_type in self.supported_ops

    @property
    def precision_set(self) -> Precisions:
        """The precisions this PU computes in: the profile's, else its kind's default."""
        return self.precisions if self.precisions is not None else Precisions.default(self.kind)

    def computes(self, precision: str) -> bool:
        """True if a block in ``precision`` may be placed on this PU (an NPU: int8 only)."""
        return precision in self.precision_set.values


@dataclass(frozen=True)
class Link:
    """Data path between two PUs of one host (shared memory, PCIe, ...)."""

    a: str
    b: str
    bandwidth_gbps: Quantity
    latency_us: Quantity
    conversion_us_per_mb: Quantity  # layout/format conversion, e.g. CPU <-> Mali OpenCL images


@dataclass(frozen=True)
class Host:
    name: str
    description: str = ""


@dataclass(frozen=True)
class NetworkLink:
    """Network between two hosts (edge board <-> cloud node)."""

    a: str
    b: str
    bandwidth_gbps: Quantity
    latency_us: Quantity
    energy_nj_per_byte: Quantity
    # CPU time each end spends sending or receiving one tensor (gRPC, protobuf copies), on the unit that
    # produces or consumes it: per message and per MB; None: not modelled
    cpu_us_per_message: Quantity | None = None
    cpu_us_per_mb: Quantity | None = None

    @property
    def name(self) -> str:
        """``a-b``: how calibration values learnt for this link name it."""
        return f"{self.a}-{self.b}"


@dataclass(frozen=True)
class SharedMemory:
    """A memory several PUs of one host read and write through (e.g. the LPDDR of an SoC): what they move
    at the same time divides its bandwidth."""

    name: str
    pus: tuple[str, ...]
    bandwidth_gbps: Quantity  # sustained, all PUs together


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    description: str
    hosts: tuple[Host, ...]
    pus: tuple[ProcessingUnit, ...]
    links: tuple[Link, ...]
    network: tuple[NetworkLink, ...] = ()
    default_link: Link | None = None  # for PU pairs on one host with no link of their own
    origin: str = ""  # file it was loaded from, or "built at run time"
    schema_version: int = SCHEMA_VERSION
    notes: tuple[str, ...] = field(default=())
    memories: tuple[SharedMemory, ...] = ()  # memories PUs share; a PU in none has its bandwidth to itself

    def pu(self, name: str) -> ProcessingUnit:
        for p in self.pus:
            if p.name == name:
                return p
        raise ProfileError(f"profile {self.name!r} has no PU {name!r}; it has {', '.join(p.name for p in self.pus)}")

    def hardware(self, pu: str) -> str:
        """The PU whose hardware ``pu`` runs on: itself, or the PU it offers another runtime for."""
        return self.pu(pu).shares or pu

    def runtime_choices(self) -> list[tuple[str, ...]]:
        """Every way to pick one runtime for each piece of hardware (PUs that share it: ``shares``), as the PU names
        a plan may use together; the first keeps each hardware's own PU. One choice where no PU shares."""
        groups: dict[str, list[str]] = {}
        for p in self.pus:
            groups.setdefault(p.shares or p.name, []).append(p.name)
        for hardware, names in groups.items():  # the hardware's own PU first, so the first choice is the plain one
            names.sort(key=lambda n: n != hardware)
        order = {p.name: i for i, p in enumerate(self.pus)}
        return [tuple(sorted(combo, key=order.__getitem__)) for combo in itertools.product(*groups.values())]

    def idle_w(self) -> float:
        """All PUs idle, each piece of hardware counted once (PUs that share it are one)."""
        first = {p.shares or p.name: p for p in reversed(self.pus)}
        return sum(p.idle_power_w.value for p in first.values())

    def undeployable(self) -> list[ProcessingUnit]:
        """The PUs no onnxruntime release can drive (``runtime = "unavailable"``)."""
        return [p for p in self.pus if not p.deployable]

    def restricted(self, keep: Iterable[str]) -> DeviceProfile:
        """This profile with only the PUs in ``keep`` (their links and shared memories; hosts stay): what plans
        restricted to those units are made on. The name stays: plans for it run on the same boards."""
        names = set(keep)
        unknown = sorted(names - {p.name for p in self.pus})
        if unknown:
            raise ProfileError(
                f"profile {self.name!r} has no PU {unknown[0]!r}; it has {', '.join(p.name for p in self.pus)}"
            )
        if not names:
            raise ProfileError(f"profile {self.name!r}: no PU left to plan on")
        memories = tuple(
            replace(m, pus=tuple(p for p in m.pus if p in names)) for m in self.memories if set(m.pus) & names
        )
        return replace(
            self,
            pus=tuple(p for p in self.pus if p.name in names),
            links=tuple(link for link in self.links if link.a in names and link.b in names),
            memories=memories,
        )

    def shared_memory(self, pu: str) -> SharedMemory | None:
        """The memory PU ``pu`` shares with others, if the profile names one."""
        return next((m for m in self.memories if pu in m.pus), None)

    def link(self, a: str, b: str) -> Link | NetworkLink | None:
        """The data path from PU a to PU b (None when a == b)."""
        if a == b:
            return None
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        ha, hb = self.pu(a).host, self.pu(b).host
        if ha != hb:
            for net in self.network:
                if {net.a, net.b} == {ha, hb}:
                    return net
            raise ProfileError(f"profile {self.name!r}: no network link between hosts {ha!r} and {hb!r}")
        if self.default_link is None:
            raise ProfileError(f"profile {self.name!r}: no link between PUs {a!r} and {b!r} and no default_link")
        return self.default_link

    def content_hash(self) -> str:
        data = asdict(self)
        data.pop("origin")
        for pu in data["pus"]:  # profiles that say nothing of precisions keep the hash they had
            if pu.get("precisions") is None:
                pu.pop("precisions", None)
            if pu.get("fp16_peak_ratio") is None:
                pu.pop("fp16_peak_ratio", None)
            if pu.get("runtime") is None:
                pu.pop("runtime", None)
            if not pu.get("shares"):
                pu.pop("shares", None)
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()

    def quantities(self) -> list[tuple[str, Quantity]]:
        """Every number with its field path, for listing sources."""
        out: list[tuple[str, Quantity]] = []
        for p in self.pus:
            for cls, q in p.peak_gflops.items():
                out.append((f"pus.{p.name}.peak_gflops.{cls}", q))
            for f in ("memory_bandwidth_gbps", "memory_bytes", "launch_overhead_us", "active_power_w", "idle_power_w"):
                out.append((f"pus.{p.name}.{f}", getattr(p, f)))
            if p.host_cpu_us_per_tensor is not None:
                out.append((f"pus.{p.name}.host_cpu_us_per_tensor", p.host_cpu_us_per_tensor))
            if p.fp16_peak_ratio is not None:
                out.append((f"pus.{p.name}.fp16_peak_ratio", p.fp16_peak_ratio))
        for link in (*self.links, *([self.default_link] if self.default_link else [])):
            for f in ("bandwidth_gbps", "latency_us", "conversion_us_per_mb"):
                out.append((f"links.{link.a}-{link.b}.{f}", getattr(link, f)))
        for net in self.network:
            for f in ("bandwidth_gbps", "latency_us", "energy_nj_per_byte"):
                out.append((f"network.{net.a}-{net.b}.{f}", getattr(net, f)))
            for f in ("cpu_us_per_message", "cpu_us_per_mb"):
                if getattr(net, f) is not None:
                    out.append((f"network.{net.a}-{net.b}.{f}", getattr(net, f)))
        for m in self.memories:
            out.append((f"memories.{m.name}.bandwidth_gbps", m.bandwidth_gbps))
        return out


def check_number(path: str, value: object, *, positive: bool = False, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"{path}: expected a number, got {value!r}")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise ProfileError(f"{path}: {value!r} is not a finite number")
    if v < 0 or (positive and v == 0) or (not allow_zero and v == 0):
        raise ProfileError(f"{path}: must be {'positive' if positive else 'non-negative'}, got {value!r}")
    return v
