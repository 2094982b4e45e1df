"""The ``local`` and ``local-biglittle`` profiles, built from this host at run time.

Cores come from the process's affinity mask; clusters from sysfs ``cpu_capacity`` and
``cpufreq/cpuinfo_max_freq`` where present (cores with equal capacity and maximum
frequency form one cluster). Peak throughput and power are estimates derived from
what /proc/cpuinfo says; the profiler's measurements replace them. ``local-biglittle``
splits two cores into a fast PU and a PU throttled to a share of each CFS period.
``local-openvino`` offers two runtimes on two cores, onnxruntime's CPU EP (unit ``cpu``) and OpenVINO's CPU
device (unit ``ov``) (onnxruntime-openvino, in a runtime environment of its own). ``local-edge-cloud`` makes this host two hosts, an ``edge`` (first core) and a ``cloud``
(second core), each served by its own agent process on 127.0.0.1, joined by a network
link that is gRPC over loopback: plans over it exercise agent-to-agent streaming.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from device_profiles.schema import (
    OP_CLASSES,
    DeviceProfile,
    Host,
    Link,
    NetworkLink,
    ProcessingUnit,
    ProfileError,
    Quantity,
    SharedMemory,
    Throttle,
)

SYS_CPU = Path("/sys/devices/system/cpu")
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
LITTLE_QUOTA_PERCENT = 40.0
# Fraction of the FMA peak each op class reaches in onnxruntime's CPU kernels (rough priors).
_CLASS_EFFICIENCY = {"conv": 0.5, "matmul": 0.6, "depthwise": 0.08, "elementwise": 0.03, "pooling": 0.03, "other": 0.02}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpuinfo() -> tuple[float, int, str]:
    """(GHz, FP32 FLOP per cycle per core, how they were found)."""
    text = _read(Path("/proc/cpuinfo")) or ""
    mhz = [float(line.split(":")[1]) for line in text.splitlines() if line.lower().startswith("cpu mhz")]
    flags = next((line.split(":")[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    model = next((line.split(":")[1].strip() for line in text.splitlines() if line.startswith("model name")), "cpu")
    ghz = max(mhz) / 1000 if mhz else 2.0
    if "avx512f" in flags:
        per_cycle, isa = 64, "AVX-512 FMA"
    elif "avx2" in flags and "fma" in flags:
        per_cycle, isa = 32, "AVX2 FMA"
    elif "asimd" in flags or "neon" in flags:
        per_cycle, isa = 16, "NEON FMA"
    else:
        per_cycle, isa = 8, "SSE"
    return ghz, per_cycle, f"{model}: {ghz:.2f} GHz x {per_cycle} FLOP/cycle ({isa})"


def detect_clusters(cores: list[int]) -> dict[str, list[int]]:
    """Group cores by (cpu_capacity, max frequency); name clusters big/little when they differ."""
    keys: dict[tuple[int, int], list[int]] = {}
    for c in cores:
        cap = _read(SYS_CPU / f"cpu{c}" / "cpu_capacity")
        freq = _read(SYS_CPU / f"cpu{c}" / "cpufreq" / "cpuinfo_max_freq")
        keys.setdefault((int(cap) if cap else 1024, int(freq) if freq else 0), []).append(c)
    if len(keys) == 1:
        return {"cpu": cores}
    ranked = sorted(keys, reverse=True)
    names = ["big", "little"] if len(ranked) == 2 else [f"cluster{i}" for i in range(len(ranked))]
    return {names[i]: keys[k] for i, k in enumerate(ranked)}


def throttling_available() -> str | None:
    """None when CFS throttling of single threads works here, else why it does not."""
    if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {CGROUP_CPU}"
    if not os.access(CGROUP_CPU, os.W_OK):
        return f"{CGROUP_CPU} is not writable (run as root)"
    return None


OPENVINO = "OpenVINOExecutionProvider"


NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def cuda_gpu() -> str | None:
    """The model name of this machine's first NVIDIA GPU (the driver's /proc entry), or None without one."""
    entries = sorted(NVIDIA_GPUS.glob("*/information")) if NVIDIA_GPUS.is_dir() else []
    if not entries:
        return None
    text = _read(entries[0]) or ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model")), "NVIDIA GPU")


def _gpu_unit(model: str, host: str) -> ProcessingUnit:
    """This machine's CUDA GPU as a unit: every figure an order-of-magnitude estimate that `parapipe profile`
    replaces with measured times (the GPU is not identified beyond its name)."""
    why = f"{model}: order of magnitude for a recent NVIDIA GPU, not this one's data sheet; profile measures it"
    peaks = {
        "conv": 8000.0,
        "matmul": 10000.0,
        "depthwise": 800.0,
        "elementwise": 300.0,
        "pooling": 300.0,
        "other": 50.0,
    }
    return ProcessingUnit(
        name="gpu",
        kind="gpu",
        host=host,
        cores=(),
        execution_provider="CUDAExecutionProvider",
        ep_options=(("device_id", "0"),),
        peak_gflops={cls: Quantity(v, "estimate", why) for cls, v in peaks.items()},
        memory_bandwidth_gbps=Quantity(500.0, "estimate", why),
        memory_bytes=Quantity(8.0e9, "estimate", why),
        launch_overhead_us=Quantity(20.0, "estimate", "CUDA kernel launch plus onnxruntime's CUDA EP dispatch"),
        active_power_w=Quantity(250.0, "estimate", why),
        idle_power_w=Quantity(30.0, "estimate", why),
    )


def build_local_profile(
    biglittle: bool = False, edge_cloud: bool = False, openvino: bool = False, gpu: bool = False
) -> DeviceProfile:
    cores = sorted(os.sched_getaffinity(0))
    ghz, per_cycle, how = _cpuinfo()
    import psutil

    mem = Quantity(float(psutil.virtual_memory().total), "measured", "psutil.virtual_memory().total")
    bandwidth = Quantity(10.0, "estimate", "typical DDR4 share of one process; replaced by calibration")
    overhead = Quantity(4.0, "estimate", "onnxruntime CPU kernel launch, order of microseconds")
    notes: list[str] = ["energy on this host is modelled: no RAPL or hwmon power sensor is read unless present"]

    def peaks(n_cores: int) -> dict[str, Quantity]:
        return {
            cls: Quantity(
                round(n_cores * ghz * per_cycle * _CLASS_EFFICIENCY[cls], 3),
                "estimate",
                f"{how} x {n_cores} core(s) x efficiency {_CLASS_EFFICIENCY[cls]}",
            )
            for cls in OP_CLASSES
        }

    def pu(
        name: str,
        pu_cores: list[int],
        throttle: Throttle | None = None,
        host: str = "local",
        provider: str = "CPUExecutionProvider",
        options: tuple[tuple[str, str], ...] = (),
    ) -> ProcessingUnit:
        n = len(pu_cores)
        return ProcessingUnit(
            name=name,
            kind="cpu",
            host=host,
            cores=tuple(pu_cores),
            execution_provider=provider,
            ep_options=options,
            peak_gflops=peaks(n),
            memory_bandwidth_gbps=bandwidth,
            memory_bytes=mem,
            launch_overhead_us=overhead,
            active_power_w=Quantity(round(6.0 * n, 2), "estimate", "about 6 W per busy server core (TDP / cores)"),
            idle_power_w=Quantity(round(1.0 * n, 2), "estimate", "about 1 W per idle core"),
            cluster=name,
            throttle=throttle,
        )

    hosts: tuple[Host, ...] = (Host("local", "this machine"),)
    network: tuple[NetworkLink, ...] = ()
    if edge_cloud:
        if len(cores) < 2:
            raise ProfileError(f"local-edge-cloud needs two cores; this process may use {len(cores)}")
        pus = (pu("edge", [cores[0]], host="edge"), pu("cloud", [cores[1]], host="cloud"))
        hosts = (Host("edge", f"core {cores[0]} of this machine"), Host("cloud", f"core {cores[1]} of this machine"))
        network = (
            NetworkLink(
                a="edge",
                b="cloud",
                bandwidth_gbps=Quantity(0.8, "estimate", "protobuf copy + gRPC over loopback; replaced by calibration"),
                latency_us=Quantity(300.0, "estimate", "one gRPC stream message between two local processes"),
                energy_nj_per_byte=Quantity(0.0, "estimate", "loopback: no radio or NIC energy"),
            ),
        )
        notes.append("two agents on one machine: tensors between edge and cloud go agent to agent over gRPC")
        name, desc = "local-edge-cloud", f"this host as an edge (core {cores[0]}) and a cloud node (core {cores[1]})"
    elif biglittle:
        if len(cores) < 2:
            raise ProfileError(f"local-biglittle needs two cores; this process may use {len(cores)}")
        why_not = throttling_available()
        if why_not:
            raise ProfileError(f"local-biglittle is unavailable: {why_not}; use the 'local' profile instead")
        # Its peaks and power are the core's own: a frame alone runs at full speed on the quota the period
        # refilled; back to back it gets the quota's share of each period (CostModel.sustained_factor).
        pus = (pu("big", [cores[0]]), pu("little", [cores[1]], throttle=Throttle(LITTLE_QUOTA_PERCENT)))
        notes.append(
            f"core {cores[1]} is made slow on purpose: threads pinned to it get {LITTLE_QUOTA_PERCENT:.0f}% of each CFS period"
        )
        name, desc = (
            "local-biglittle",
            f"this host as a big.LITTLE board: core {cores[0]} fast, core {cores[1]} throttled",
        )
    elif openvino:
        if len(cores) < 2:
            raise ProfileError(f"local-openvino needs two cores; this process may use {len(cores)}")
        # two runtimes on the same cores: onnxruntime's CPU EP (unit cpu) and OpenVINO's CPU device (unit ov, which
        # shares cpu's cores); a plan uses one of them (planner.search plans each and keeps the better), so the
        # cores are never counted twice and identical units of either can replicate a stage
        ov = (("device_type", "CPU"),)  # its threads: one per core of the unit (``open_session``)
        pus = (
            pu("cpu", cores[:2]),
            dataclasses.replace(pu("ov", cores[:2], provider=OPENVINO, options=ov), shares="cpu"),
        )
        notes.append(
            f"unit ov runs OpenVINO's CPU device through onnxruntime-openvino on cores {cores[0]} and {cores[1]} (its "
            "agent runs in the openvino runtime's environment: `parapipe runtimes install openvino`); unit cpu runs "
            "onnxruntime's CPU EP on the same cores; a plan uses one of the two runtimes"
        )
        name, desc = (
            "local-openvino",
            f"this host's cores {cores[0]} and {cores[1]}, on onnxruntime's CPU EP or on OpenVINO",
        )
    elif gpu:
        model = cuda_gpu()
        if model is None:
            raise ProfileError(f"local-gpu needs a CUDA GPU; none is visible here ({NVIDIA_GPUS} lists none)")
        pus = (*(pu(cname, ccores) for cname, ccores in detect_clusters(cores).items()), _gpu_unit(model, "local"))
        notes.append(
            "unit gpu runs onnxruntime's CUDA EP (its agent runs in the gpu runtime's environment: `parapipe runtimes "
            "install gpu`); tensors between it and the cores cross PCIe, priced by the cpu-gpu link"
        )
        name, desc = "local-gpu", f"this host: {len(cores)} core(s) and {model}"
    else:
        pus = tuple(pu(cname, ccores) for cname, ccores in detect_clusters(cores).items())
        name, desc = "local", f"this host: {len(cores)} core(s), clusters {', '.join(p.name for p in pus)}"
    shared_memory = Link(
        a="*",
        b="*",
        bandwidth_gbps=Quantity(10.0, "estimate", "in-process handoff through shared DRAM"),
        latency_us=Quantity(2.0, "estimate", "queue handoff between worker threads"),
        conversion_us_per_mb=Quantity(0.0, "estimate", "same memory layout on every CPU core"),
    )
    links: tuple[Link, ...] = ()
    if gpu:
        pcie = "PCIe 4.0 x16 host<->device copy, order of magnitude (pinned memory ~25 GB/s; pageable less)"
        links = tuple(
            Link(
                a=p.name,
                b="gpu",
                bandwidth_gbps=Quantity(12.0, "estimate", pcie),
                latency_us=Quantity(15.0, "estimate", "cudaMemcpy launch and synchronisation"),
                conversion_us_per_mb=Quantity(0.0, "estimate", "same NCHW layout on both sides"),
            )
            for p in pus
            if p.kind == "cpu"
        )
    memories: tuple[SharedMemory, ...] = ()
    if not edge_cloud:
        # Units running at once slow each other (DRAM, caches and, on a virtual machine, the host's cores):
        # one memory for the CPU cores, its bandwidth measured per model by `parapipe profile`.
        memories = (
            SharedMemory(
                "dram",
                tuple(p.name for p in pus if p.kind == "cpu"),
                Quantity(
                    100.0,
                    "estimate",
                    "a server socket's DRAM, order of magnitude (no contention assumed); `parapipe profile` measures "
                    "it per model (the whole model on every core at once vs alone, profiler.contention), which "
                    "replaces this",
                ),
            ),
        )
    return DeviceProfile(
        name=name,
        description=desc,
        hosts=hosts,
        pus=pus,
        links=links,
        network=network,
        default_link=shared_memory,
        origin="built at run time",
        notes=tuple(notes),
        memories=memories,
    )
