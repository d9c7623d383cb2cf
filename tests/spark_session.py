"""One small SparkSession shared by every test that needs Spark (`local[2]`, UI off)."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from spark_agents.session import make_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TEST_CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false", "spark.default.parallelism": "2"}


@lru_cache(maxsize=1)
def shared_test_session() -> SparkSession:
    """The test process's SparkSession, created on first use and kept until the process ends.

    Lean, as an agent's (`LEAN_JVM_OPTIONS`): the tests' queries are small and short, and
    the optimising compiler's threads would take CPU that the parallel tests' other JVMs need."""
    return make_session("local[2]", "bpm-tests", TEST_CONF, lean=True)
