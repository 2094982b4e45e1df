"""An accelerator runtime environment for a test (``parapipe.runtimes``): installed once, outside the repository
(``$PARAPIPE_RUNTIMES``); the test is skipped only when the package index is unreachable."""

from __future__ import annotations

from pathlib import Path

import pytest

from parapipe.local_agent import DeployError
from tests.support.packages import index_unreachable


def runtime_python(name: str) -> Path:
    """The Python of runtime ``name`` (``openvino``, ``gpu``), installed the first time."""
    from parapipe.runtimes import install
    from parapipe.runtimes import runtime_python as installed

    python = installed(name)
    if python is not None:
        return python
    try:
        return install(name)[0]
    except DeployError as exc:
        if index_unreachable(str(exc)):
            pytest.skip(f"the package index is unreachable: {exc}")
        raise
