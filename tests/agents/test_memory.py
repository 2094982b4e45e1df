"""Large frame buffers are reused instead of mapped afresh (glibc mallopt)."""

from __future__ import annotations

import platform

import pytest

from agents.memory import keep_large_buffers


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_accepts_the_thresholds() -> None:
    assert keep_large_buffers() is True
    assert keep_large_buffers() is True  # idempotent
