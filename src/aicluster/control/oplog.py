"""The operator's log: the control plane's decisions as one structured line each.

`decision(logger, "job_admitted", job=..., placement=[...])` logs
`job_admitted job=train-3fa2c1 placement=n1,n2` and keeps the fields on the record, so
that `JsonFormatter` (`--log-format json`) writes them as keys of one JSON object per
line. `configure_logging` sets the process up for either format; neither writes colour
codes, so the lines can go to a file as they are.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The keys every JSON line has; a decision's fields never replace them.
_BASE_KEYS = ("ts", "time", "level", "logger", "msg")


def _text(value: Any) -> str:
    """A value as key=value writes it: lists comma-joined, anything with a space, a quote,
    an '=' or a control character quoted as a JSON string (so one line stays one line)."""
    if isinstance(value, (list, tuple, set, frozenset)):
        value = ",".join(str(v) for v in value)
    elif value is None:
        return "-"
    text = str(value)
    if text == "" or any(c in text for c in ' "=\\') or not text.isprintable():
        return json.dumps(text)
    return text


def _plain(value: Any) -> Any:
    """A field value as JSON writes it."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def decision(logger: logging.Logger, event: str, level: int = logging.INFO, **fields) -> None:
    """Log one decision: `event key=value ...` (fields in the order given)."""
    line = " ".join([event, *(f"{k}={_text(v)}" for k, v in fields.items())])
    logger.log(level, line, extra={"event": event, "fields": fields})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, time (UTC, ISO 8601), level, logger, msg; a
    decision's event and fields; exc when an exception is logged."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if event is not None:
            out["event"] = event
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                if key not in _BASE_KEYS and key != "event":
                    out[key] = _plain(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, default=str)


def formatter(fmt: str) -> logging.Formatter:
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}")
    return JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)


def configure_logging(fmt: str = "text", level: int = logging.INFO) -> logging.Handler:
    """Send every logger's records to stderr in `fmt` (text or json); return the handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
