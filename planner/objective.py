"""What a plan is optimised for, as a type: validated once, where the user names it."""

from __future__ import annotations

from enum import StrEnum

from models.errors import ParapipeError


class Objective(StrEnum):
    LATENCY = "latency"
    THROUGHPUT = "throughput"
    ENERGY = "energy"


PARETO = "pareto"  # not an objective of one plan: the whole front


def parse_objective(text: str, allow_pareto: bool = False) -> Objective | str:
    """``"energy"`` -> ``Objective.ENERGY`` (``"pareto"`` too where the caller plans a front); else a clear error."""
    if allow_pareto and text == PARETO:
        return PARETO
    try:
        return Objective(text)
    except ValueError:
        choices = [o.value for o in Objective] + ([PARETO] if allow_pareto else [])
        raise ObjectiveError(f"--objective must be {', '.join(choices[:-1])} or {choices[-1]}, not {text!r}") from None


class ObjectiveError(ParapipeError, ValueError):
    """An unknown objective."""


def key(figures: object, objective: Objective | str) -> float:
    """Lower is better: latency in ms, 1000/throughput (ms per frame), energy in mJ (``figures`` is a Predicted)."""
    o = Objective(objective)
    if o is Objective.LATENCY:
        return figures.latency_ms  # type: ignore[attr-defined]
    if o is Objective.THROUGHPUT:
        return 1000.0 / figures.throughput_fps  # type: ignore[attr-defined]
    return figures.energy_mj  # type: ignore[attr-defined]
