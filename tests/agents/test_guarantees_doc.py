"""docs/guarantees.md names only tests that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_the_guarantees_table_names_exists() -> None:
    text = (ROOT / "docs" / "guarantees.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)
    assert len(named) >= 20
    missing = [
        f"{path}::{name}"
        for path, name in named
        if not (ROOT / path).is_file() or not re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M)
    ]
    assert not missing, f"docs/guarantees.md names tests that do not exist: {missing}"
