"""What a partition needs from the device profile to run on its unit, looked up once per unit.

A unit is a non-CPU PU or cores of one or more CPU clusters (a unit spanning clusters,
``"big+little"``, is one session over all of them). The agent needs its execution
provider and options, which of its cores are CFS-throttled (the embedded big.LITTLE
board) and which host of the profile it sits on; the bundle also carries the board's
average per-core power for modelled energy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from device_profiles.schema import DeviceProfile
from planner.plan import PlanError
from planner.unitname import UnitName


@dataclass(frozen=True)
class UnitTarget:
    pu: str
    host: str
    provider: str
    provider_options: Mapping[str, str]
    throttled_cores: tuple[int, ...]
    throttle_percent: float | None


def unit_target(pu: str, core_ids: tuple[int, ...], profile: DeviceProfile) -> UnitTarget:
    """The profile's facts for a unit on ``pu`` (``"a+b"`` for one spanning clusters) using ``core_ids``."""
    parts = [profile.pu(name) for name in UnitName(pu).parts]
    for p in parts:
        if not p.deployable:
            why = p.runtime.cite if p.runtime is not None else ""
            raise PlanError(
                f"the plan puts blocks on unit {p.name}, which no onnxruntime drives ({why}); it is a what-if plan "
                "(--include-unavailable) and cannot be compiled, run or deployed: plan without --include-unavailable"
            )
    throttled: list[int] = []
    percent = None
    for p in parts:
        if p.throttle is not None:
            throttled += [c for c in core_ids if c in p.cores]
            percent = p.throttle.quota_percent
    first = parts[0]
    return UnitTarget(pu, first.host, first.execution_provider, dict(first.ep_options), tuple(throttled), percent)


def board_power(profile: DeviceProfile) -> tuple[float, float, int]:
    """Average per-core (active W, idle W) of the board's CPU PUs and their core count, for modelled energy."""
    # each piece of hardware once (PUs that offer another runtime on the same cores are one)
    cpus = list({p.shares or p.name: p for p in reversed(profile.pus) if p.kind == "cpu" and p.cores}.values())
    cores = sum(len(p.cores) for p in cpus) or 1
    active = sum(p.active_power_w.value for p in cpus) / cores
    idle = sum(p.idle_power_w.value for p in cpus) / cores
    return (active, idle, cores)
