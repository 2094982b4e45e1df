"""Packages a test needs besides the environment's own, installed once with ``pip install --target``
into a cache folder outside the repository (so another protobuf, or a client library, can be tried
without touching the environment). The test is skipped only when the package index is unreachable."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("PARAPIPE_TEST_PACKAGES", Path.home() / ".cache" / "parapipe-test-packages"))
_OFFLINE = re.compile(
    r"NewConnectionError|Max retries|Temporary failure in name resolution|Network is unreachable|"
    r"Could not fetch URL|ConnectTimeout|ReadTimeout",
)


def index_unreachable(text: str) -> bool:
    """Whether pip's output says the package index could not be reached (the tests skip then)."""
    return bool(_OFFLINE.search(text))


def installed(name: str, *requirements: str, no_deps: bool = False) -> Path:
    """The folder ``requirements`` are installed in (made the first time); put it first on PYTHONPATH."""
    target = CACHE / name
    if (target / ".complete").exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=CACHE))
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(tmp)]
    done = subprocess.run(
        [*argv, *(["--no-deps"] if no_deps else []), *requirements], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        if _OFFLINE.search(done.stderr + done.stdout):
            pytest.skip(f"the package index is unreachable: cannot install {' '.join(requirements)}")
        raise AssertionError(f"pip install {' '.join(requirements)} failed:\n{done.stderr[-2000:]}")
    (tmp / ".complete").write_text(" ".join(requirements) + "\n")
    try:
        tmp.rename(target)
    except OSError:  # another test session installed it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def python_path(*folders: Path) -> str:
    """PYTHONPATH putting ``folders`` before the repository (and so before the environment's packages)."""
    root = Path(__file__).resolve().parents[2]
    return os.pathsep.join([*map(str, folders), str(root)])


def folders_for(module: str, name: str, *requirements: str, no_deps: bool = False) -> list[Path]:
    """``[]`` if a fresh process of this environment imports ``module`` (this process's ``sys.path`` may
    have been extended by another test), else the cache folder holding ``requirements``."""
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, timeout=120)
    return [] if probe.returncode == 0 else [installed(name, *requirements, no_deps=no_deps)]
