"""The ``parapipe`` command line. Commands turn flags into calls; the work lives in the parts."""

from __future__ import annotations

from parapipe.app import app
from parapipe.commands import agent, boards, devices, models, planning, profiling, runtimes  # noqa: F401  (registers the commands)

__all__ = ["app", "main"]


def main() -> None:
    app()
