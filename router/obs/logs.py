"""Structured logs: one JSON object per line (or plain text), request fields passed as ``extra``."""

from __future__ import annotations

import logging
import sys
import time

import msgspec

# Attributes every LogRecord has; anything else came in through ``extra=`` and is logged as a field.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
_ENCODER = msgspec.json.Encoder()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                plain = isinstance(value, str | int | float | bool | None)
                doc[key] = value if plain else str(value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return _ENCODER.encode(doc).decode()


class PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{k}={v}" for k, v in record.__dict__.items()
            if k not in _STANDARD and not k.startswith("_")
        )
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()} {extras}"
        return line.rstrip()


def configure(level: str, json_lines: bool) -> None:
    """Configure the ``kvroute`` logger tree once, at the entry point."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else PlainFormatter())
    root = logging.getLogger("kvroute")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
