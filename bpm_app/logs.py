"""Logs of the long-running commands (`bpm registry serve`, `bpm agent run`, `bpm broker
serve`, `bpm replay`, `bpm demo`): text for a person, or one JSON object per line for a log
collector (`--log-format json`).

A JSON line holds `time` (UTC, ISO 8601), `level`, `logger`, `message`, the `participant`
when the process serves one, and `exception` when a traceback came with the record.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Protocol

FORMATS = ("text", "json")
# Libraries whose routine chatter (each request, each py4j call) drowns what the process says.
QUIET = ("httpx", "py4j", "py4j.clientserver", "uvicorn.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module text)."""

    def __init__(self, participant: str | None = None) -> None:
        super().__init__()
        self.participant = participant

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.participant is not None:
            line["participant"] = self.participant
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def formatter(fmt: str, participant: str | None = None) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}")
    if fmt == "json":
        return JsonFormatter(participant)
    who = f"{participant} " if participant else ""
    return logging.Formatter(f"%(asctime)s {who}%(levelname)s %(name)s: %(message)s")


def configure(fmt: str = "text", participant: str | None = None, level: int = logging.INFO) -> None:
    """Send this process's logs to stderr in `fmt`, replacing any handler set before."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt, participant))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in QUIET:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def uvicorn_config(fmt: str, level: str = "info") -> dict[str, Any]:
    """uvicorn's `log_config` for `fmt`: its own loggers through the same formatter (the
    access log at `level` as uvicorn has it)."""
    factory = {"()": f"{__name__}.formatter", "fmt": fmt}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"bpm": factory},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "bpm", "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
        },
        "root": {"handlers": ["stderr"], "level": "INFO"},
    }


class Say(Protocol):
    def __call__(self, message: str, level: int = logging.INFO) -> None: ...


def teller(fmt: str, logger: str, participant: str | None = None, console=None, markup: bool = True) -> Say:
    """How a command tells what it does: in text, printed on `console` (stderr by default); in
    JSON, each message a record of `logger`. With `markup`, messages are rich markup (printed
    styled, or plain in JSON); without it, plain text as it is."""
    if fmt == "json":
        from rich.text import Text

        configure("json", participant)
        log = logging.getLogger(logger)
        plain = (lambda message: Text.from_markup(message).plain) if markup else str
        return lambda message, level=logging.INFO: log.log(level, plain(message))
    if console is None:
        from rich.console import Console

        console = Console(stderr=True)
    return lambda message, level=logging.INFO: console.print(message, soft_wrap=True, markup=markup, highlight=False)
