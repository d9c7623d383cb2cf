"""Creating the SparkSession an agent or a command runs its tasks on."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Quiet by default: a command's stdout carries results, and Spark's progress bars and INFO
# logs would bury them.
DEFAULT_CONF = {
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "ERROR",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stopTimeout": "60s",
    # Servers of this project bind to loopback addresses only; a real deployment overrides these.
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def make_session(master: str = "local[*]", app_name: str = "bpm", conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession on `master` (`local[*]`, `local[N]`, `spark://host:port`, ...) with the project's defaults."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
