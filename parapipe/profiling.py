"""Profiling on any board: here for the embedded boards, through the board's agent for inventory boards.

Used by ``parapipe profile`` and by ``tune`` (which profiles a model the cost table does
not know yet). The board is reached with ``parapipe.reach.open_board``, so a board reached
directly over TLS is profiled exactly like one behind an SSH tunnel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from device_profiles.loader import load_profile
from device_profiles.schema import DeviceProfile
from models.graph import OpGraph
from models.onnx_io import LoadedModel
from parapipe.reach import LOCAL_BOARDS, board_device, local_runtime_of, open_board
from profiler.costtable import CostTable
from profiler.measure import PuConfig
from profiler.session import ProfileOptions, ProfileSummary, ProfilingError, pu_configs, run_profile


@dataclass(frozen=True)
class BoardProfile:
    summary: ProfileSummary
    profile: DeviceProfile
    configs: list[PuConfig]


def profile_on_board(
    loaded: LoadedModel,
    graph: OpGraph,
    board: str,
    table: CostTable,
    path: Path | None,
    pus: list[str] | None = None,
    options: ProfileOptions | None = None,
) -> BoardProfile:
    """Measure ``loaded`` on ``board`` into ``table`` (saved to ``path`` as it goes)."""
    options = options or ProfileOptions()
    from parapipe.boards import BoardError

    if options.granularity not in ("coarse", "fine", "both"):
        raise ProfilingError(f"--granularity must be coarse, fine or both, not {options.granularity!r}")
    try:
        device = board_device(board)
    except BoardError:
        raise ProfilingError(
            f"board {board!r} is none of {', '.join(LOCAL_BOARDS)} and not in the inventory; "
            "add it with `parapipe boards add` to profile it over SSH or directly over TLS"
        ) from None
    profile = load_profile(device)
    configs = pu_configs(profile, pus)
    if board in LOCAL_BOARDS:
        python, runtime = local_runtime_of(board)
        if not runtime.version:  # a unit needs a runtime environment that is not installed
            raise ProfilingError(f"board {board}: {runtime.where}")
    if board in LOCAL_BOARDS and python is None:  # this process runs its units
        summary = run_profile(loaded, graph, profile, table, path, configs, options)
        return BoardProfile(summary, profile, configs)
    from parapipe.remote_profile import RemoteTimer

    if options.progress:
        options.progress("starting the agent", 0, 0)
    with open_board(board) as session:
        summary = run_profile(loaded, graph, profile, table, path, configs, options, RemoteTimer(session.client))
    return BoardProfile(summary, profile, configs)
