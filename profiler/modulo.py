"""Which frame a unit works on next: a modulo schedule over the partitions it holds.

A unit (one assignment: a PU, or a set of cores) may hold several partitions of a frame,
and frames overlap in a pipeline. The planner predicts a pipeline's throughput from its
busiest unit, which a unit reaches only if it never idles for want of a frame it could
run. Taking the oldest frame first does not do that: on a balanced plan every unit is
the busiest, and a unit that serves the oldest frame's late partitions starves the
units waiting for a newer frame's early ones (5-14% below the busiest unit's rate on
the zoo's throughput plans, in simulation).

So each partition gets a *lag*: how many frames behind the pipeline's entry it works,
the longest path to it in the partition graph, where a hop to another unit counts one
frame and a hop within a unit, forward in its order, none. A unit runs, among the
partitions whose turn it is in the frame's own order, the one with the smallest
``frame + lag``: partition p of frame f runs in the same round as partition q of frame
f + lag(p) - lag(q). Every cycle of this schedule then holds at least as many frames
as it has units' rounds, so with enough frames in flight no unit waits longer than a
round of the busiest one: throughput is the busiest unit's (the software-pipelining
result). One frame alone runs as before: with nothing to overlap, the order is the
frame's own.

``lags`` and ``pick`` are the rule, used by the planner's simulator and by the executor
alike; in the executor one thread runs all the partitions of such a unit, one after the
other with no handoff between them (``agents.executor._UnitRunner``).
"""

from __future__ import annotations

import graphlib
from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def lags(place: Mapping[K, tuple[Hashable, int]], edges: Iterable[tuple[K, K]]) -> dict[K, int]:
    """Each partition's lag: ``place`` gives each partition's (unit, position in the unit's order),
    ``edges`` are (producer, consumer) pairs. A hop to another unit, or back in a unit's order, adds one."""
    preds: dict[K, set[K]] = {k: set() for k in place}
    for a, b in edges:
        if a != b:
            preds[b].add(a)
    out: dict[K, int] = {}
    for k in graphlib.TopologicalSorter(preds).static_order():
        unit, index = place[k]
        out[k] = max((out[p] + (0 if place[p][0] == unit and place[p][1] < index else 1) for p in preds[k]), default=0)
    return out


def pick(candidates: Iterable[tuple[int, int, int]]) -> tuple[int, int, int] | None:
    """The turn among ``(frame, lag, position)`` of the partitions whose turn it is in their frame and whose
    inputs are there: the smallest ``frame + lag``, then the older frame, then the earlier position."""
    return min(candidates, key=lambda c: (c[0] + c[1], c[0], c[2]), default=None)
