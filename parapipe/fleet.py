"""Fleets: the boards of an inventory group (``boards add ... --group NAME``), worked on at once.

``on_group(group, action)`` runs ``action(board)`` on every board of the group concurrently
(at most ``MAX_PARALLEL`` at a time), and a board that fails never stops the others: each
gets an ``Outcome`` saying what happened. The CLI prints one row per board and exits with
the number of boards that failed.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from models.errors import ParapipeError
from parapipe.boards import Board, BoardError, load_boards

MAX_PARALLEL = 8


@dataclass(frozen=True)
class Outcome:
    board: str
    ok: bool
    detail: str  # what happened, or why it failed
    result: Any = None


def group_boards(group: str) -> list[Board]:
    """The boards of ``group``, by name; BoardError naming the groups there are if it has none."""
    boards = load_boards()
    members = sorted((b for b in boards.values() if b.group == group), key=lambda b: b.name)
    if not members:
        groups = sorted({b.group for b in boards.values() if b.group})
        raise BoardError(
            f"no board in group {group!r} (groups: {', '.join(groups) or 'none yet'}); "
            "add boards to it with `parapipe boards add NAME ... --group GROUP`"
        )
    return members


def on_group(
    group: str,
    action: Callable[[Board], Any],
    describe: Callable[[Any], str] = str,
    max_parallel: int = MAX_PARALLEL,
) -> list[Outcome]:
    """``action`` on every board of ``group`` at once; one Outcome per board, in name order."""
    boards = group_boards(group)

    def one(board: Board) -> Outcome:
        try:
            result = action(board)
        except ParapipeError as exc:
            return Outcome(board.name, False, str(exc))
        except Exception as exc:  # anything else on one board is that board's failure, not the fleet's
            return Outcome(board.name, False, f"{type(exc).__name__}: {exc}")
        return Outcome(board.name, True, describe(result), result)

    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(boards))), thread_name_prefix="pp-fleet") as pool:
        return list(pool.map(one, boards))


def exit_code(outcomes: list[Outcome]) -> int:
    """How many boards failed (0: all succeeded), capped where shells keep exit codes apart."""
    return min(sum(not o.ok for o in outcomes), 125)
