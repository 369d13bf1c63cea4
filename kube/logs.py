"""Structured logs for every long-running component: one JSON object per line on stderr.

Fields passed with `extra=` (`uid`, `pod`, `claim`, `node`, `reason`, ...) become keys of the
object, so a log pipeline can follow one request or object without parsing sentences; an
exception's traceback goes under `stack`, for operators, never into an answer to a user.
This module only formats; each component decides what it logs.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson

# Attributes every LogRecord has; anything else came from `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["stack"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(level: int = logging.INFO) -> None:
    """Route the `dra_gateway` loggers to stderr as JSON lines at `level` (idempotent: a second
    call only sets the level)."""
    logger = logging.getLogger("dra_gateway")
    logger.setLevel(level)
    if any(isinstance(h.formatter, JsonFormatter) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.propagate = False
