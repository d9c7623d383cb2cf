"""One clock for what the registry records and what a participant decides: the registry's
UTC timestamps (ISO 8601 strings, or datetimes) as POSIX seconds, so that they compare with
the `now_s` every event of the state machines carries."""

from __future__ import annotations

from datetime import datetime


def seconds(timestamp: str | datetime) -> float:
    moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00")) if isinstance(timestamp, str) else timestamp
    return moment.timestamp()
