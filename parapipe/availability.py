"""Whether a board's onnxruntime offers the execution providers a plan's units need, checked before work starts.

``run``, ``deploy`` and ``tune`` ask this before they compile, upload or start anything: one line naming
the unit, the provider, what the board's onnxruntime offers and what to do. The agent checks again when
a bundle starts (``agents.service.check_manifest_providers``) and every session checks its own provider
(``profiler.runtime.open_session``): nothing silently runs on the CPU in a GPU's place.

What a board offers is read where the agent will run: for the embedded boards, this process's
onnxruntime or the runtime environment their agent runs in (``parapipe.runtimes``); over SSH, the agent's virtual environment if deploy
made one, else the board's Python (what deploy would reuse); for a board reached directly, its agent's
``Status``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from device_profiles.schema import DeviceProfile
from parapipe.local_agent import DeployError
from planner.plan import Plan
from planner.unitname import UnitName
from profiler.runtime import CPU_PROVIDER, install_hint, missing_providers, provider_advice

if TYPE_CHECKING:
    from parapipe.ssh import BoardConnection

# prints {"version": ..., "providers": [...]} of the onnxruntime a Python imports (exit 3 without one)
PROBE = (
    "import json, sys\n"
    "try:\n"
    "    import onnxruntime as ort\n"
    "except Exception:\n"
    "    sys.exit(3)\n"
    "print(json.dumps({'version': ort.__version__, 'providers': ort.get_available_providers()}))\n"
)


@dataclass(frozen=True)
class Runtime:
    """An onnxruntime as a board has it: its version and the providers it offers ("" and () where none)."""

    version: str
    providers: tuple[str, ...]
    where: str  # what was asked: "this machine", "the agent's venv on vim3", ...


def plan_units(plan: Plan, profile: DeviceProfile, host: str | None = None) -> dict[str, str]:
    """unit (PU name) -> the execution provider it runs with, for the plan's units (on ``host`` only if given)."""
    out: dict[str, str] = {}
    for stage in plan.stages:
        for pu in stage.pus():
            for part in UnitName(pu).parts:
                spec = profile.pu(part)
                if host is None or spec.host == host:
                    out.setdefault(part, spec.execution_provider)
    return out


def refuse_missing(needed: Mapping[str, str], runtime: Runtime, board: str) -> None:
    """``DeployError`` (one line) naming the first unit whose provider ``runtime`` lacks."""
    missing = missing_providers(needed, runtime.providers)
    if not missing:
        return
    first = missing[0]
    if not runtime.version:
        raise DeployError(
            f"unit {first.unit} needs {first.provider}, and board {board} has no onnxruntime with it ({runtime.where}); "
            f"install one ({install_hint(first.provider)}), or plan without the unit (--exclude-pus {first.unit})"
        )
    raise DeployError(
        f"board {board}: "
        + provider_advice(
            first.unit, first.provider, runtime.providers, f"onnxruntime {runtime.version}, {runtime.where}"
        )
    )


def accelerated(needed: Mapping[str, str]) -> dict[str, str]:
    """The units that need a provider other than the CPU's."""
    return {u: p for u, p in needed.items() if p != CPU_PROVIDER}


def parse_probe(code: int, out: str, where: str) -> Runtime | None:
    """The ``PROBE``'s answer; None where the Python could not be run at all."""
    if code == 3:
        return Runtime("", (), where)
    if code != 0:
        return None
    try:
        data = json.loads(out.strip().splitlines()[-1])
        return Runtime(str(data["version"]), tuple(str(p) for p in data["providers"]), where)
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def board_runtime(conn: BoardConnection, wd: str) -> Runtime:
    """The onnxruntime the agent runs (or would run) on the board: the agent's venv's, else the board Python's."""
    venv = f"{wd}/venv/bin/python"  # where deploy makes the agent's environment
    py = conn.board.python
    for python, where in ((venv, "the agent's virtual environment"), (py, f"{py} on the board")):
        code, out, _ = conn.run([python, "-c", PROBE], check=False, timeout=120)
        found = parse_probe(code, out, where)
        if found is not None and found.version:
            return found
    return Runtime("", (), f"neither the agent's virtual environment nor {py} imports onnxruntime")


def check_board_runtime(conn: BoardConnection, wd: str, needed: Mapping[str, str]) -> None:
    """Refuse (DeployError, before anything is installed) units whose provider the board's onnxruntime lacks.
    Only plans with accelerator units ask the board: deploy installs a CPU onnxruntime where there is none."""
    if accelerated(needed):
        refuse_missing(needed, board_runtime(conn, wd), conn.board.name)


def bundle_units(bundle: Path) -> dict[str, str]:
    """unit -> execution provider of the partitions a bundle runs on its host."""
    from agents.bundle import MANIFEST, parse_manifest

    manifest = parse_manifest((Path(bundle) / MANIFEST).read_text())
    return {p.pu: p.provider for p in manifest.local_partitions()}


def refuse_cpu_wheel(needed: Mapping[str, str], oldest: tuple[int, ...]) -> None:
    """DeployError: the board's Python lacks a usable onnxruntime, and the index's CPU-only wheel would not run
    ``needed``'s accelerator units; the board's own (JetPack's on a Jetson) must be installed first."""
    unit, provider = next(iter(accelerated(needed).items()))
    version = ".".join(map(str, oldest))
    raise DeployError(
        f"unit {unit} needs {provider}, and the board's Python has no onnxruntime {version} or newer with "
        f"grpcio, numpy and psutil beside it; deploy would install the CPU-only wheel, so install the "
        f"board's own ({install_hint(provider)}; onnxruntime {version} or newer) first"
    )
