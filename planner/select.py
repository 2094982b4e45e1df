"""Choosing a plan under the user's constraints, with one tolerance everywhere.

``Constraints`` are the ceilings and floors of ``parapipe select`` and of the Pareto
sweep; ``meets`` allows the same relative slack (``TOLERANCE``) the solver's figures
carry, so a plan the solver made exactly at a bound is not refused for a rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.objective import Objective, key
from planner.plan import Plan, PlanError

TOLERANCE = 1e-4  # relative: the slack the solver's own figures carry


@dataclass(frozen=True)
class Constraints:
    max_latency_ms: float | None = None
    min_fps: float | None = None
    max_mj: float | None = None

    def active(self) -> dict[str, float]:
        flags = {"--max-latency-ms": self.max_latency_ms, "--min-fps": self.min_fps, "--max-mj": self.max_mj}
        return {k: v for k, v in flags.items() if v is not None}


def _check(plan: Plan, flag: str, bound: float) -> bool:
    p = plan.predicted
    if p is None:
        return False
    if flag == "--max-latency-ms":
        return p.latency_ms <= bound * (1 + TOLERANCE)
    if flag == "--min-fps":
        return p.throughput_fps >= bound * (1 - TOLERANCE)
    return p.energy_mj <= bound * (1 + TOLERANCE)


def meets(plan: Plan, constraints: Constraints) -> bool:
    return all(_check(plan, flag, bound) for flag, bound in constraints.active().items())


def select_plan(plans: Sequence[Plan], objective: Objective | str, constraints: Constraints) -> Plan:
    """The best plan for ``objective`` among those meeting ``constraints``; else say which constraint to relax."""
    ok = [p for p in plans if p.predicted is not None and meets(p, constraints)]
    if not ok:
        raise PlanError(relax_message(plans, constraints))
    return min(ok, key=lambda p: (key(p.predicted, objective), p.name))


def relax_message(plans: Sequence[Plan], constraints: Constraints) -> str:
    active = constraints.active()
    hints = []
    for name in active:
        others = {k: v for k, v in active.items() if k != name}
        feasible = [p for p in plans if p.predicted and all(_check(p, k, v) for k, v in others.items())]
        if feasible:
            best = {
                "--max-latency-ms": min(p.predicted.latency_ms for p in feasible if p.predicted),
                "--min-fps": max(p.predicted.throughput_fps for p in feasible if p.predicted),
                "--max-mj": min(p.predicted.energy_mj for p in feasible if p.predicted),
            }[name]
            hints.append(f"relax {name} (the best plan meeting the others reaches {best:.2f})")
    if not hints:
        return (
            "no plan meets these constraints, nor any two of them; relax several, or re-plan with a longer --time-limit"
        )
    return "no plan meets " + ", ".join(f"{k} {v:g}" for k, v in active.items()) + ": " + "; or ".join(hints)


@dataclass(frozen=True)
class Ratios:
    """How much better our plan for each objective is than a baseline (> 1: ours is better)."""

    latency: float  # theirs / ours
    throughput: float  # ours / theirs
    energy: float  # theirs / ours


def ratios(ours: dict[Objective, Plan], baseline: Plan) -> Ratios:
    b = baseline.predicted
    lat, thr, en = (ours[o].predicted for o in (Objective.LATENCY, Objective.THROUGHPUT, Objective.ENERGY))
    if b is None or lat is None or thr is None or en is None:
        raise PlanError("ratios need predicted figures on every plan")
    return Ratios(b.latency_ms / lat.latency_ms, thr.throughput_fps / b.throughput_fps, b.energy_mj / en.energy_mj)
