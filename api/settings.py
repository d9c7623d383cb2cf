"""The registry's settings: one typed object read from the environment (prefix `BPM_`)."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Settings read from the environment and an optional `.env` file.

    Attributes:
        mode: `local` generates an operator key when none is set; `production` refuses to start without one.
        database_url: SQLAlchemy URL of the registry database (SQLite file by default).
        admin_key: the operator's key; required in production.
        signing_secret: seals the private halves of the registry's signing keys in the database
            (`api.signing.Sealer`); by default derived from `admin_key`. Every worker and replica
            of one registry needs the same.
        heartbeat_timeout_s: a participant silent for longer is suspected, twice as long is failed.
        feed_interval_s: how often the change feed (`GET /api/v1/changes/stream`) looks for changes.
        feed_lifetime_s: how long one connection to the change feed lasts; the client connects again.
    """

    model_config = SettingsConfigDict(env_prefix="BPM_", env_file=".env", extra="ignore")

    mode: Literal["local", "production"] = "local"
    database_url: str = "sqlite:///./bpm-registry.db"
    admin_key: str | None = None
    signing_secret: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    heartbeat_timeout_s: float = Field(default=3.0, gt=0)
    feed_interval_s: float = Field(default=1.0, gt=0)
    feed_lifetime_s: float = Field(default=300.0, gt=0)


@lru_cache
def get_settings() -> Settings:
    return Settings()
