"""parapipe: plan and run DNN inference across the processing units of edge boards.

``parapipe.connect(board_or_address)`` gives an application a deployed plan (``parapipe.application``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "connect"]


def __getattr__(name: str) -> Any:
    if name == "connect":  # imported on first use: the CLI does not pay for grpc it may not need
        from parapipe.application import connect

        return connect
    raise AttributeError(f"module 'parapipe' has no attribute {name!r}")
