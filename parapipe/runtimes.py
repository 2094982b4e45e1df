"""Runtime environments: the onnxruntime builds with accelerator EPs that the agents on this machine run in.

onnxruntime-openvino and onnxruntime-gpu ship the same ``onnxruntime`` module as the CPU wheel parapipe
depends on: installed beside it, one overwrites the other's files (and uninstalling either breaks both).
So each lives in a virtual environment of its own, under ``$PARAPIPE_RUNTIMES`` (default
``~/.cache/parapipe/runtimes``), with what the board-side agent needs (grpcio, numpy, psutil, protobuf).
Planning, compiling and checking stay in parapipe's own environment; an embedded board whose units need
such a provider (``local-openvino``) has its agent started with the runtime's Python, and profiling on it
goes through that agent. On real boards the agent uses the board's own onnxruntime (``parapipe.deploy``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from parapipe.availability import PROBE, Runtime, parse_probe
from parapipe.local_agent import DeployError


@dataclass(frozen=True)
class RuntimeKind:
    name: str
    packages: tuple[str, ...]  # what pip installs for its onnxruntime
    provider: str  # the EP it is installed for
    what: str


KINDS = {
    "openvino": RuntimeKind(
        "openvino", ("onnxruntime-openvino",), "OpenVINOExecutionProvider", "OpenVINO's CPU, GPU and NPU devices"
    ),
    # the extras bring CUDA and cuDNN from PyPI (onnxruntime-gpu 1.19 and newer), as onnxruntime documents
    "gpu": RuntimeKind(
        "gpu", ("onnxruntime-gpu[cuda,cudnn]",), "CUDAExecutionProvider", "CUDA and TensorRT on an NVIDIA GPU"
    ),
}
# what the agent imports besides onnxruntime (pyproject's ranges)
AGENT_PACKAGES = ("grpcio>=1.63.2", "protobuf>=5.26.1,<8", "numpy>=1.26", "psutil>=5.9")


def runtimes_root() -> Path:
    return Path(os.environ.get("PARAPIPE_RUNTIMES", Path.home() / ".cache" / "parapipe" / "runtimes"))


def kind_of(name: str) -> RuntimeKind:
    if name not in KINDS:
        raise DeployError(f"no runtime {name!r}; the runtimes are {', '.join(KINDS)}")
    return KINDS[name]


def runtime_python(name: str) -> Path | None:
    """The Python of runtime ``name`` if it is installed (and complete), else None."""
    folder = runtimes_root() / name
    python = folder / "venv" / "bin" / "python"
    return python if (folder / ".complete").exists() and python.exists() else None


def probe(python: Path | str) -> Runtime | None:
    """The onnxruntime a Python imports (its version and providers), or None if it cannot be run."""
    try:
        done = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=120)
    except OSError:
        return None
    return parse_probe(done.returncode, done.stdout, str(python))


def for_providers(providers: Iterable[str]) -> RuntimeKind | None:
    """The runtime that offers ``providers`` this process's onnxruntime lacks (None: this process has them)."""
    import onnxruntime as ort

    here = set(ort.get_available_providers())
    missing = [p for p in providers if p not in here]
    if not missing:
        return None
    for kind in KINDS.values():
        if kind.provider in missing or (kind.name == "gpu" and "TensorrtExecutionProvider" in missing):
            return kind
    return None


def agent_python(providers: Iterable[str]) -> tuple[list[str] | None, Runtime]:
    """The command that starts an agent whose onnxruntime offers ``providers`` on this machine (None: this
    process's own Python) and that onnxruntime: a runtime environment where this process lacks them."""
    providers = list(providers)
    kind = for_providers(providers)
    if kind is None:
        import onnxruntime as ort

        return None, Runtime(str(ort.__version__), tuple(ort.get_available_providers()), "this machine")
    python = runtime_python(kind.name)
    if python is None:
        return None, Runtime(
            "",
            (),
            f"this machine's onnxruntime lacks {kind.provider} and the {kind.name} runtime is not installed: "
            f"`parapipe runtimes install {kind.name}`",
        )
    found = probe(python) or Runtime("", (), f"the {kind.name} runtime at {python}, which does not run")
    return [str(python), "-m", "agents.server"], Runtime(
        found.version, found.providers, f"the {kind.name} runtime ({python})"
    )


def install(name: str, say: Callable[[str], None] | None = None) -> tuple[Path, Runtime]:
    """Make runtime ``name``'s environment (a venv with its onnxruntime and the agent's packages); checked
    to offer its provider before it counts as installed. Returns its Python and what it offers."""
    kind = kind_of(name)
    say = say or (lambda _m: None)
    root = runtimes_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:  # one install at a time; a second finds it done
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _install(kind, root, say)


def _install(kind: RuntimeKind, root: Path, say: Callable[[str], None]) -> tuple[Path, Runtime]:
    name = kind.name
    target = root / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        say(f"creating the {name} environment")
        subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, capture_output=True)
        pip = [str(tmp / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        say(f"installing {', '.join(kind.packages)} and the agent's packages")
        done = subprocess.run([*pip, *kind.packages, *AGENT_PACKAGES], capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise DeployError(f"pip could not install the {name} runtime: {done.stderr.strip()[-400:]}")
        found = probe(tmp / "venv" / "bin" / "python")
        if found is None or kind.provider not in found.providers:
            offered = ", ".join(found.providers) if found else "nothing (it does not import)"
            raise DeployError(f"the {name} runtime's onnxruntime offers {offered}, not {kind.provider}")
        (tmp / ".complete").write_text(f"{found.version} {' '.join(found.providers)}\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)  # a venv's scripts name its folder: run it through `python -m` only
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    python = target / "venv" / "bin" / "python"
    return python, Runtime(found.version, found.providers, f"the {name} runtime ({python})")


def listing() -> list[dict[str, object]]:
    """Every runtime kind: installed or not, where, its onnxruntime and providers."""
    rows: list[dict[str, object]] = []
    for kind in KINDS.values():
        python = runtime_python(kind.name)
        found = probe(python) if python else None
        rows.append(
            {
                "runtime": kind.name,
                "for": kind.what,
                "installed": python is not None,
                "python": str(python) if python else "",
                "onnxruntime": found.version if found else "",
                "providers": list(found.providers) if found else [],
            }
        )
    return rows
