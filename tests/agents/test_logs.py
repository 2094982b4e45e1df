"""The agent's JSON-lines log (``--log-format json`` / ``PARAPIPE_LOG_FORMAT=json``), read as a log shipper would."""

from __future__ import annotations

import datetime
import json
import logging
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from agents.logs import JsonLines
from tests.support.tiny import frame, start_two_hosts

FIELDS = {"time", "level", "event", "logger", "bundle", "plan", "peer"}


def _lines(path: Path) -> list[dict]:
    text = path.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is JSON
    for line in lines:
        assert FIELDS <= set(line), line
        datetime.datetime.fromisoformat(line["time"])
    return lines


@pytest.mark.agent
def test_an_agent_logs_json_lines_naming_bundle_plan_and_peer(tmp_path: Path) -> None:
    env = {"PARAPIPE_LOG_FORMAT": "json"}
    with ExitStack() as stack:
        a, b = start_two_hosts(stack, tmp_path, stages=2, max_inflight=2, extra_env=env)
        assert a.client.infer(frame(1))
        b_log = _lines(b.log_path)
        a.client.stop()
        logs_a = _lines(a.log_path)
    assert any(line["event"].startswith("agent serving on") and line["level"] == "info" for line in logs_a)
    # the other host logs the entry host's exchange stream with its peer and what it runs
    exchange = [line for line in b_log if line["event"].startswith("exchange stream from")]
    assert exchange, b_log
    assert exchange[0]["peer"].startswith("ipv4:127.0.0.1:")
    assert exchange[0]["bundle"] and exchange[0]["plan"] == "tiny-2"


def test_the_json_formatter_keeps_tracebacks_and_unicode() -> None:
    formatter = JsonLines()
    try:
        raise ValueError("bad frame é")
    except ValueError:
        record = logging.LogRecord(
            "parapipe.agent", logging.ERROR, __file__, 1, "frame %d failed", (7,), sys.exc_info()
        )
    record.peer = "ipv4:127.0.0.1:5"
    line = json.loads(formatter.format(record))
    assert line["event"] == "frame 7 failed" and line["level"] == "error" and line["peer"] == "ipv4:127.0.0.1:5"
    assert line["bundle"] == "" and line["plan"] == ""
    assert "ValueError: bad frame é" in line["exc"]


def test_an_unknown_log_format_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agents.server", "--port", "0", "--workdir", str(tmp_path), "--log-format", "xml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "text, json" in done.stderr and "Traceback" not in done.stderr
