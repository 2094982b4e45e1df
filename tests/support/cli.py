"""Running the installed ``parapipe`` command as a user would, each test with its own $PARAPIPE_HOME."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

PARAPIPE = shutil.which("parapipe") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "parapipe")
USER_MODELS = Path(__file__).resolve().parents[1] / "data" / "user_models.py"
# ``profile``'s shared-memory measurement in short runs, for tests of what profiling feeds, not of the bandwidth
SHORT_MEMORY = ("--memory-seconds", "0.1")


def run_cli(*args: str, home: Path, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PARAPIPE_HOME=str(home))
    return subprocess.run([PARAPIPE, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
