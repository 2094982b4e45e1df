"""Load and validate device profiles from TOML; find shipped ones by name.

``load_profile("khadas-vim3")`` reads the shipped file, ``load_profile("my.toml")``
a user's file in the same schema, and ``local`` / ``local-biglittle`` are built from
this host at run time (``device_profiles.local``).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from device_profiles.schema import (
    OP_CLASSES,
    PRECISIONS,
    PU_KINDS,
    RUNTIMES,
    SCHEMA_VERSION,
    SOURCES,
    DeviceProfile,
    Host,
    Link,
    NetworkLink,
    Precisions,
    ProcessingUnit,
    ProfileError,
    Quantity,
    Runtime,
    SharedMemory,
    Throttle,
    check_number,
)

SHIPPED_DIR = Path(__file__).parent / "boards"
RUNTIME_PROFILES = ("local", "local-biglittle", "local-edge-cloud", "local-openvino", "local-gpu")


def shipped_names() -> list[str]:
    return sorted([*RUNTIME_PROFILES, *(p.stem for p in SHIPPED_DIR.glob("*.toml"))])


def load_profile(name_or_path: str | Path) -> DeviceProfile:
    """A shipped profile by name, a runtime one (local, local-biglittle, local-edge-cloud), or a TOML file by path."""
    text = str(name_or_path)
    if text in RUNTIME_PROFILES:
        from device_profiles.local import build_local_profile

        return build_local_profile(
            biglittle=text == "local-biglittle",
            edge_cloud=text == "local-edge-cloud",
            openvino=text == "local-openvino",
            gpu=text == "local-gpu",
        )
    shipped = SHIPPED_DIR / f"{text}.toml"
    path = shipped if shipped.is_file() else Path(text)
    if not path.is_file():
        raise ProfileError(
            f"no device profile {text!r}: give one of {', '.join(shipped_names())} or the path of a TOML file"
        )
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read: {exc}") from None
    try:
        return parse_profile(data, origin=str(path))
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from None


class _Reader:
    """Pulls typed fields out of a TOML table, naming the field path in every error."""

    def __init__(self, data: Mapping[str, Any], path: str) -> None:
        if not isinstance(data, Mapping):
            raise ProfileError(f"{path}: expected a table, got {type(data).__name__}")
        self.data, self.path, self.used = data, path, set()

    def _at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                raise ProfileError(f"{self._at(key)}: missing field")
            return default
        value = self.data[key]
        if not isinstance(value, kind) or (
            isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
        ):
            raise ProfileError(f"{self._at(key)}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
        return value

    def quantity(self, key: str, *, positive: bool = False, default: Quantity | None = None) -> Quantity:
        self.used.add(key)
        if key not in self.data:
            if default is not None:
                return default
            raise ProfileError(f"{self._at(key)}: missing field")
        return parse_quantity(self.data[key], self._at(key), positive=positive)

    def sub(self, key: str) -> _Reader:
        return _Reader(self.get(key, dict), self._at(key))

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise ProfileError(f"{self._at(unknown[0])}: unknown field (known here: {', '.join(sorted(self.used))})")


def parse_quantity(raw: Any, path: str, *, positive: bool = False) -> Quantity:
    if not isinstance(raw, Mapping):
        raise ProfileError(f'{path}: expected {{ value = ..., source = "measured|spec-sheet|estimate", cite = "..." }}')
    r = _Reader(raw, path)
    value = check_number(f"{path}.value", r.get("value", (int, float)), positive=positive)
    source = r.get("source", str)
    if source not in SOURCES:
        raise ProfileError(f"{path}.source: {source!r} is not one of {', '.join(SOURCES)}")
    cite = r.get("cite", str, "")
    if source != "measured" and not cite.strip():
        raise ProfileError(f"{path}.cite: a {source} number needs a short citation saying where it comes from")
    r.finish()
    return Quantity(value, source, cite)


def _pu(raw: Any, path: str, hosts: list[str]) -> ProcessingUnit:
    r = _Reader(raw, path)
    name = r.get("name", str)
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name) or name in (".", ".."):  # it names partitions and cgroups
        raise ProfileError(f"{path}.name: {name!r} is not a plain unit name (letters, digits, _ . -)")
    kind = r.get("kind", str)
    if kind not in PU_KINDS:
        raise ProfileError(f"{path}.kind: {kind!r} is not one of {', '.join(PU_KINDS)}")
    host = r.get("host", str, hosts[0])
    if host not in hosts:
        raise ProfileError(f"{path}.host: unknown host {host!r}; hosts are {', '.join(hosts)}")
    cores_raw = r.get("cores", list, [])
    cores = []
    for i, c in enumerate(cores_raw):
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise ProfileError(f"{path}.cores[{i}]: expected a non-negative core id, got {c!r}")
        cores.append(c)
    if kind == "cpu" and not cores:
        raise ProfileError(f"{path}.cores: a cpu PU needs its core ids")
    if len(set(cores)) != len(cores):
        raise ProfileError(f"{path}.cores: core ids repeat: {cores}")
    peaks_reader = r.sub("peak_gflops")
    peaks = {}
    for cls in list(peaks_reader.data):
        if cls not in OP_CLASSES:
            raise ProfileError(f"{path}.peak_gflops.{cls}: unknown op class; known: {', '.join(OP_CLASSES)}")
        peaks[cls] = peaks_reader.quantity(cls, positive=True)
    missing = [c for c in OP_CLASSES if c not in peaks]
    if missing:
        raise ProfileError(f"{path}.peak_gflops.{missing[0]}: missing field (every op class needs a peak)")
    ops = r.get("supported_ops", list, [])
    if not all(isinstance(o, str) for o in ops):
        raise ProfileError(f"{path}.supported_ops: expected a list of ONNX op types")
    ep_opts = r.get("ep_options", dict, {})
    throttle = None
    if "throttle" in r.data:
        t = r.sub("throttle")
        pct = check_number(f"{path}.throttle.quota_percent", t.get("quota_percent", (int, float)), positive=True)
        if pct > 100:
            raise ProfileError(f"{path}.throttle.quota_percent: at most 100, got {pct}")
        throttle = Throttle(pct, t.get("method", str, "cgroup-v1-cfs"))
        t.finish()
    precisions = parse_precisions(r.get("precisions", dict), f"{path}.precisions") if "precisions" in r.data else None
    fp16_ratio = r.quantity("fp16_peak_ratio", positive=True) if "fp16_peak_ratio" in r.data else None
    if fp16_ratio is not None and "fp16" not in (precisions or Precisions.default(kind)).values:
        raise ProfileError(
            f"{path}.fp16_peak_ratio: the PU does not compute fp16 (its precisions); add fp16 to them or drop this"
        )
    runtime = parse_runtime(r.get("runtime", dict), f"{path}.runtime") if "runtime" in r.data else None
    unavailable = runtime is not None and not runtime.available
    provider = r.get("execution_provider", str, "" if unavailable else "CPUExecutionProvider")
    if provider or not unavailable:
        check_provider(provider, f"{path}.execution_provider")
    pu = ProcessingUnit(
        name=name,
        kind=kind,
        host=host,
        cores=tuple(cores),
        execution_provider=provider,
        ep_options=tuple(sorted((str(k), str(v)) for k, v in ep_opts.items())),
        peak_gflops=peaks,
        memory_bandwidth_gbps=r.quantity("memory_bandwidth_gbps", positive=True),
        memory_bytes=r.quantity("memory_bytes", positive=True),
        launch_overhead_us=r.quantity("launch_overhead_us"),
        active_power_w=r.quantity("active_power_w"),
        idle_power_w=r.quantity("idle_power_w"),
        supported_ops=tuple(ops),
        host_cpu_us_per_tensor=r.quantity("host_cpu_us_per_tensor") if "host_cpu_us_per_tensor" in r.data else None,
        cluster=r.get("cluster", str, ""),
        throttle=throttle,
        precisions=precisions,
        fp16_peak_ratio=fp16_ratio,
        runtime=runtime,
        shares=r.get("shares", str, ""),
    )
    r.finish()
    return pu


def _check_shares(pus: list[ProcessingUnit], by_name: Mapping[str, ProcessingUnit]) -> None:
    """``shares = "cpu0"``: another runtime on PU cpu0's hardware, which must be a PU of its own (not itself one
    that shares) on the same host, of the same kind, with the same cores."""
    for i, p in enumerate(pus):
        if not p.shares:
            continue
        base = by_name.get(p.shares)
        where = f"pus[{i}].shares"
        if base is None or base is p:
            raise ProfileError(
                f"{where}: {p.shares!r} is no other PU of the profile; name the PU whose hardware {p.name} runs on"
            )
        if base.shares:
            raise ProfileError(f"{where}: {base.name} itself shares {base.shares}'s hardware; name {base.shares}")
        if (base.host, base.kind, base.cores) != (p.host, p.kind, p.cores):
            raise ProfileError(
                f"{where}: {p.name} runs on {base.name}'s hardware, so its host, kind and cores are {base.name}'s "
                f"({base.host}, {base.kind}, cores {list(base.cores)}); it says {p.host}, {p.kind}, cores {list(p.cores)}"
            )


def check_provider(name: str, path: str) -> None:
    """An execution provider name must be one onnxruntime knows (``get_all_providers()``, every build's)."""
    import difflib

    import onnxruntime as ort

    known = list(ort.get_all_providers())
    if name in known:
        return
    lowered = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    hint = f"did you mean {lowered[close[0]]!r}? " if close else ""
    raise ProfileError(
        f"{path}: {name!r} is no onnxruntime execution provider; {hint}onnxruntime {ort.__version__} knows "
        f"{', '.join(known)}. A unit no onnxruntime can drive says runtime = "
        '{ value = "unavailable", source = "...", cite = "why" } and needs no provider'
    )


def parse_runtime(raw: Any, path: str) -> Runtime:
    """``runtime = { value = "unavailable", source = "spec-sheet", cite = "why no onnxruntime drives it" }``."""
    r = _Reader(raw, path)
    value = r.get("value", str)
    if value not in RUNTIMES:
        raise ProfileError(f"{path}.value: {value!r} is not one of {', '.join(RUNTIMES)}")
    source = r.get("source", str)
    if source not in SOURCES:
        raise ProfileError(f"{path}.source: {source!r} is not one of {', '.join(SOURCES)}")
    cite = r.get("cite", str, "")
    if value != "onnxruntime" and not cite.strip():
        raise ProfileError(f"{path}.cite: say why no onnxruntime drives this unit (a short citation)")
    r.finish()
    return Runtime(value, source, cite)


def parse_precisions(raw: Any, path: str) -> Precisions:
    """``precisions = { value = ["fp32", "int8"], source = "spec-sheet", cite = "..." }``."""
    r = _Reader(raw, path)
    values = r.get("value", list)
    if not values or not all(isinstance(v, str) for v in values):
        raise ProfileError(f"{path}.value: expected a non-empty list of {', '.join(PRECISIONS)}")
    unknown = [v for v in values if v not in PRECISIONS]
    if unknown:
        raise ProfileError(f"{path}.value: {unknown[0]!r} is not one of {', '.join(PRECISIONS)}")
    if len(set(values)) != len(values):
        raise ProfileError(f"{path}.value: precisions repeat: {values}")
    source = r.get("source", str)
    if source not in SOURCES:
        raise ProfileError(f"{path}.source: {source!r} is not one of {', '.join(SOURCES)}")
    cite = r.get("cite", str, "")
    if source != "measured" and not cite.strip():
        raise ProfileError(f"{path}.cite: a {source} entry needs a short citation saying where it comes from")
    r.finish()
    return Precisions(tuple(values), source, cite)


def _link(raw: Any, path: str, pus: dict[str, ProcessingUnit] | None) -> Link:
    r = _Reader(raw, path)
    a, b = r.get("a", str), r.get("b", str)
    if pus is not None:
        for end, key in ((a, "a"), (b, "b")):
            if end not in pus:
                raise ProfileError(f"{path}.{key}: link to unknown PU {end!r}; PUs are {', '.join(pus)}")
        if pus[a].host != pus[b].host:
            raise ProfileError(f"{path}: PUs {a!r} and {b!r} are on different hosts; use [[network]] for that")
    zero = Quantity(0.0, "estimate", "none stated")
    link = Link(
        a=a,
        b=b,
        bandwidth_gbps=r.quantity("bandwidth_gbps", positive=True),
        latency_us=r.quantity("latency_us"),
        conversion_us_per_mb=r.quantity("conversion_us_per_mb", default=zero),
    )
    r.finish()
    return link


def _memories(raw: list[Any], pus: dict[str, ProcessingUnit]) -> tuple[SharedMemory, ...]:
    """``[[memories]]``: name, the PUs (of one host) that share it, its sustained bandwidth."""
    out: list[SharedMemory] = []
    member: dict[str, str] = {}
    for i, item in enumerate(raw):
        path = f"memories[{i}]"
        mr = _Reader(item, path)
        name = mr.get("name", str)
        names = mr.get("pus", list)
        if not names or not all(isinstance(p, str) for p in names):
            raise ProfileError(f"{path}.pus: expected a non-empty list of PU names")
        for p in names:
            if p not in pus:
                raise ProfileError(f"{path}.pus: unknown PU {p!r}; PUs are {', '.join(pus)}")
            if p in member:
                raise ProfileError(f"{path}.pus: PU {p!r} is also in memory {member[p]!r}; a PU has one memory")
            member[p] = name
        if len({pus[p].host for p in names}) > 1:
            raise ProfileError(f"{path}.pus: PUs of different hosts share no memory")
        out.append(SharedMemory(name, tuple(names), mr.quantity("bandwidth_gbps", positive=True)))
        mr.finish()
    return tuple(out)


def parse_profile(data: Mapping[str, Any], origin: str = "") -> DeviceProfile:
    r = _Reader(data, "")
    version = r.get("schema_version", int)
    if version != SCHEMA_VERSION:
        raise ProfileError(f"schema_version: {version} is not supported; this parapipe reads version {SCHEMA_VERSION}")
    name = r.get("name", str)
    hosts_raw = r.get("hosts", list, [{"name": name}])
    hosts = []
    for i, h in enumerate(hosts_raw):
        hr = _Reader(h, f"hosts[{i}]")
        hosts.append(Host(hr.get("name", str), hr.get("description", str, "")))
        hr.finish()
    host_names = [h.name for h in hosts]
    if len(set(host_names)) != len(host_names):
        raise ProfileError(f"hosts: names repeat: {host_names}")
    pus_raw = r.get("pus", list)
    if not pus_raw:
        raise ProfileError("pus: a profile needs at least one PU")
    pus = [_pu(p, f"pus[{i}]", host_names) for i, p in enumerate(pus_raw)]
    by_name: dict[str, ProcessingUnit] = {}
    for i, p in enumerate(pus):
        if p.name in by_name:
            raise ProfileError(f"pus[{i}].name: PU name {p.name!r} repeats")
        by_name[p.name] = p
    _check_shares(pus, by_name)
    owner: dict[tuple[str, int], str] = {}
    for i, p in enumerate(pus):
        for c in p.cores:
            if p.kind != "cpu" or p.shares:  # another runtime on its hardware's cores
                continue
            if (p.host, c) in owner:
                raise ProfileError(f"pus[{i}].cores: core {c} on host {p.host!r} is also in PU {owner[(p.host, c)]!r}")
            owner[(p.host, c)] = p.name
    links = [_link(x, f"links[{i}]", by_name) for i, x in enumerate(r.get("links", list, []))]
    default_link = _link(r.get("default_link", dict), "default_link", None) if "default_link" in data else None
    network = []
    for i, raw in enumerate(r.get("network", list, [])):
        nr = _Reader(raw, f"network[{i}]")
        a, b = nr.get("a", str), nr.get("b", str)
        for end, key in ((a, "a"), (b, "b")):
            if end not in host_names:
                raise ProfileError(f"network[{i}].{key}: unknown host {end!r}; hosts are {', '.join(host_names)}")
        network.append(
            NetworkLink(
                a,
                b,
                nr.quantity("bandwidth_gbps", positive=True),
                nr.quantity("latency_us"),
                nr.quantity("energy_nj_per_byte", default=Quantity(0.0, "estimate", "not stated")),
                nr.quantity("cpu_us_per_message") if "cpu_us_per_message" in nr.data else None,
                nr.quantity("cpu_us_per_mb") if "cpu_us_per_mb" in nr.data else None,
            )
        )
        nr.finish()
    memories = _memories(r.get("memories", list, []), by_name)
    profile = DeviceProfile(
        name=name,
        description=r.get("description", str, ""),
        hosts=tuple(hosts),
        pus=tuple(pus),
        links=tuple(links),
        network=tuple(network),
        default_link=default_link,
        origin=origin,
        schema_version=version,
        notes=tuple(r.get("notes", list, [])),
        memories=memories,
    )
    r.finish()
    # every PU pair must have a data path, or planning across them is impossible
    for p in pus:
        for q in pus:
            if p.name < q.name:
                profile.link(p.name, q.name)
    return profile
