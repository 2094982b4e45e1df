"""The agent's log as JSON lines (``--log-format json`` or ``PARAPIPE_LOG_FORMAT=json``), for log shippers.

One object per line: ``time`` (UTC, ISO 8601), ``level``, ``event`` (the message), ``logger``,
``bundle`` and ``plan`` (what the agent runs when the line is written, "" if nothing), ``peer``
(the other end of the call or link the line is about, "" if none) and, for errors with a
traceback, ``exc``. A record passes its peer as ``extra={"peer": ...}``.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agents.service import AgentState

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"


class JsonLines(logging.Formatter):
    """Formats records as JSON lines; ``state`` (set once the agent has one) says what runs."""

    def __init__(self) -> None:
        super().__init__()
        self.state: AgentState | None = None

    def format(self, record: logging.LogRecord) -> str:
        state = self.state
        pipeline = state.pipeline if state is not None else None
        line = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            "logger": record.name,
            "bundle": state.running if state is not None else "",
            "plan": pipeline.manifest.plan_name if pipeline is not None else "",
            "peer": str(getattr(record, "peer", "") or ""),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(log_format: str) -> JsonLines | None:
    """Set up the root logger for the agent; returns the JSON formatter (to give it the state) if JSON."""
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r}: choose one of {', '.join(FORMATS)}")
    if log_format == "text":
        logging.basicConfig(level=logging.INFO, format=TEXT_FORMAT)
        return None
    handler = logging.StreamHandler()
    formatter = JsonLines()
    handler.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    return formatter
