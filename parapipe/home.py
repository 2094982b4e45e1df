"""Where parapipe keeps things on the host: ``$PARAPIPE_HOME`` (default ``~/.parapipe``)."""

from __future__ import annotations

import os
from pathlib import Path


def parapipe_home() -> Path:
    return Path(os.environ.get("PARAPIPE_HOME") or Path.home() / ".parapipe")


def default_costs() -> Path:
    return parapipe_home() / "costs.json"
