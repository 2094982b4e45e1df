"""Which blocks the planner places: the user's choice, or the Para-Pipe rule for ``auto``."""

from __future__ import annotations

from models.coarsen import coarsen
from models.graph import OpGraph
from planner.plan import PlanError

CHOICES = ("coarse", "fine", "auto")
FINE_LIMIT = 120  # fine operators the ILP still places in seconds


def choose_granularity(graph: OpGraph, requested: str) -> str:
    """``coarse`` or ``fine``; ``auto``: coarse blocks for branchy graphs (or when fine ones are too many),
    fine operators for irregular, small ones."""
    if requested not in CHOICES:
        raise PlanError(f"--granularity must be coarse, fine or auto, not {requested!r}")
    if requested != "auto":
        return requested
    if coarsen(graph, "coarse").max_parallel_width() >= 2:
        return "coarse"
    return "coarse" if len(coarsen(graph, "fine").nodes) > FINE_LIMIT else "fine"
