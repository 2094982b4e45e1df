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

``lags`` is the rule, used by the planner's simulator and by the executor alike;
``UnitTurns`` enforces it on one unit of a running pipeline.
"""

from __future__ import annotations

import graphlib
import threading
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


class UnitTurns:
    """One unit's turns: its partitions run one at a time, each frame's in the unit's order, and among
    those whose turn it is, the smallest ``frame + lag`` first.

    Every partition of the unit passes every frame of its replica group in order, running it
    (``acquire`` ... ``release``) or giving it up (``skip``): a frame's later partitions wait for its
    earlier ones here, so a skipped frame must still be passed on."""

    def __init__(self, size: int) -> None:
        self.size = size  # partitions on the unit
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._cursor: dict[int, int] = {}  # frame -> position of the partition whose turn it is
        self._passed: dict[int, set[int]] = {}  # frame -> positions skipped before their turn
        self._waiting: list[tuple[int, int, int]] = []  # (frame + lag, frame, position) of each waiter

    def acquire(self, frame: int, position: int, lag: int) -> bool:
        """Wait for this partition's turn on frame ``frame``; False when the unit closes first."""
        entry = (frame + lag, frame, position)
        with self._cond:
            self._waiting.append(entry)
            try:
                while not self._closed and (self._busy or self._first() != entry):
                    self._cond.wait()
            finally:
                self._waiting.remove(entry)
            if self._closed:
                return False
            self._busy = True
            return True

    def release(self, frame: int, position: int) -> None:
        with self._cond:
            self._busy = False
            self._advance(frame, position)
            self._cond.notify_all()

    def skip(self, frame: int, position: int) -> None:
        """This partition gives frame ``frame`` up: the frame's later partitions need not wait for it."""
        with self._cond:
            if self._cursor.get(frame, 0) == position:
                self._advance(frame, position)
            else:
                self._passed.setdefault(frame, set()).add(position)
            self._cond.notify_all()

    def close(self) -> None:
        """The pipeline stops: every waiter returns False."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _first(self) -> tuple[int, int, int] | None:
        """The waiter to run next: the smallest ``frame + lag`` among those whose turn it is."""
        due = [w for w in self._waiting if self._cursor.get(w[1], 0) == w[2]]
        return min(due, default=None)

    def _advance(self, frame: int, position: int) -> None:
        nxt = position + 1
        passed = self._passed.get(frame)
        while passed and nxt in passed:
            passed.discard(nxt)
            nxt += 1
        if nxt >= self.size:
            self._cursor.pop(frame, None)
            self._passed.pop(frame, None)
        else:
            self._cursor[frame] = nxt
