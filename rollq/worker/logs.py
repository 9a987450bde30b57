"""Log output for rollq processes: RQ's plain lines, or one JSON object per line (``ROLLQ_LOG_FORMAT=json``)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["text", "json"]

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Attributes every LogRecord has; anything else was passed in ``extra=`` and goes into the JSON as is.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, exception, extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool | None) else repr(value)
        return json.dumps(entry, ensure_ascii=False)


def formatter(log_format: LogFormat) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT)


def configure(level: str | int = "INFO", log_format: LogFormat = "text") -> None:
    """Send the root logger's records to stderr in ``log_format``, replacing handlers set before."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def reformat(log_format: LogFormat, *names: str) -> None:
    """Switch the handlers RQ installed on ``names`` (``rq.worker``, ``rollq``) to ``log_format``."""
    if log_format != "json":
        return
    for name in names:
        for handler in logging.getLogger(name).handlers:
            handler.setFormatter(JsonFormatter())
