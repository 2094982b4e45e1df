"""Shared fixtures: the zoo is exported once per test session and reused by every test."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.zoo import ZOO

USER_MODELS = Path(__file__).parent / "data" / "user_models.py"


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="session")
def exported(zoo_dir: Path):
    """name -> ExportReport, exporting each zoo model the first time a test asks for it."""
    from models.export import export_model

    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = export_model(name, zoo_dir / f"{name}.onnx")
        return cache[name]

    return get


@pytest.fixture(scope="session")
def zoo_names() -> list[str]:
    return list(ZOO)
