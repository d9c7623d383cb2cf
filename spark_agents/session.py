"""Creating the SparkSession an agent or a command runs its tasks on."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import uuid
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Quiet by default: a command's stdout carries results, and Spark's progress bars and INFO
# logs would bury them.
DEFAULT_CONF = {
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "ERROR",
    "spark.sql.session.timeZone": "UTC",
    # A task's state is small; Spark's default of 200 shuffle partitions would make every
    # micro-batch schedule 200 state-store tasks. Fixed per checkpoint once a task has started.
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.stopTimeout": "60s",
}
LOOPBACK = "127.0.0.1"


def driver_addresses(master: str, host: str | None = None, advertise: str | None = None, bind: str | None = None) -> tuple[str, str]:
    """Where a driver is reached (`spark.driver.host`) and what it binds (`spark.driver.bindAddress`).

    A local master's executors are in the driver's JVM: loopback by default. On a cluster
    (`spark://...`) the executors, in other hosts, connect back to the driver: by default it
    advertises and binds `host`, the address its participant is reached at. `advertise` and
    `bind` override them (bind 0.0.0.0 behind a NAT, advertising the outer address)."""
    default = LOOPBACK if master.startswith("local") or not host else host
    advertise = advertise or default
    return advertise, bind or advertise


_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def log_config() -> Path:
    """A log4j2 configuration that shows only errors (the JVM reads it before any SparkConf applies)."""
    path = Path(tempfile.gettempdir()) / "bpm-spark-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        path.write_text(_LOG4J2)
    return path


# For a small local driver that shares a few cores with other participants' JVMs: the
# C1 compiler alone and the serial collector spend less CPU on compilation and collector
# threads. Measured with two tasks on local[1] (5 s trigger, 40 connections/s): 0.70 -> 0.39
# of a core over the first 30 s and 0.33 -> 0.18 after, for the same batches; that is CPU
# the tasks then have.
LEAN_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _own_pyspark() -> bool:
    """Whether Spark's bundled Python libraries (`$SPARK_HOME/python/lib/*.zip`) are the very
    pyspark this interpreter imports: a pip installation, whose package folder is Spark's home."""
    import pyspark

    package = Path(pyspark.__file__).resolve().parent
    home = os.environ.get("SPARK_HOME")
    return package.is_dir() and (home is None or Path(home).resolve() == package)


def spark_python(folder: Path, python: str = sys.executable, *, cgroup_procs: Path | None = None) -> str:
    """An executable `folder/python-first` that runs `python` for Spark's Python processes (for PYSPARK_PYTHON).

    Spark puts its bundled copies of pyspark and py4j (zip files) first on its Python
    processes' path. Python keeps no compiled bytecode for a module imported from a zip, so
    every Python process Spark starts without forking it from its worker daemon pays about
    a second more to import pyspark: among them the planner of every query over a Python
    data source, started with the query. When the zips are this interpreter's own pyspark,
    the executable leaves them off the path (the installed package, with its bytecode,
    is imported instead). With `cgroup_procs`, it first moves itself into that cgroup
    (`spark_agents.hosts.python_first`).
    """
    import shlex
    import stat

    lines = ["#!/bin/sh"]
    if cgroup_procs is not None:
        lines.append(f"echo $$ > {shlex.quote(str(cgroup_procs))} 2>/dev/null")
    if _own_pyspark():
        lines += ["PYTHONPATH=$(printf '%s' \"$PYTHONPATH\" | tr ':' '\\n' | grep -v '/python/lib/[^/]*\\.zip$' | paste -sd: -)",
                  "export PYTHONPATH"]
    lines.append(f"exec {shlex.quote(python)} \"$@\"")
    wrapper = Path(folder) / "python-first"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text("\n".join(lines) + "\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(wrapper)


def agent_conf(master: str, given: dict[str, str] | None = None) -> dict[str, str]:
    """The Spark settings of an agent's session on `master`, beyond `DEFAULT_CONF`: the
    operator's (`given`, `bpm agent run --spark-conf`) over the agent's own."""
    # A participant may host many moved tasks at once, each with its state store versions
    # cached in the driver; the default 1 GB heap leaves a local driver little room for that.
    own = {"spark.driver.memory": "2g"} if master.startswith("local") else {}
    return {**own, **(given or {})}


def make_session(master: str = "local[*]", app_name: str = "bpm", conf: dict[str, str] | None = None, *, lean: bool = False,
                 driver_host: str = LOOPBACK, bind_address: str | None = None) -> SparkSession:
    """A SparkSession on `master` (`local[*]`, `local[N]`, `spark://host:port`, ...) with the project's defaults;
    `lean` adds LEAN_JVM_OPTIONS to the driver (a local master's driver runs the tasks too). The
    driver advertises `driver_host` and binds `bind_address` (default: the same; see `driver_addresses`)."""
    from pyspark.sql import SparkSession

    bind_address = bind_address or driver_host
    os.environ.setdefault("SPARK_LOCAL_IP", bind_address)
    if "PYSPARK_PYTHON" not in os.environ:
        # Python workers (the JetStream source runs in them) use this interpreter and its
        # packages, through `spark_python` in a folder of this process's own (an agent sets
        # its own, in its work folder, that also joins its participant's `python` cgroup).
        folder = tempfile.mkdtemp(prefix="bpm-python-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        os.environ["PYSPARK_PYTHON"] = spark_python(Path(folder))
    builder = SparkSession.builder.master(master).appName(app_name)
    java = f"-Dlog4j2.configurationFile=file:{log_config()}" + (f" {LEAN_JVM_OPTIONS}" if lean else "")
    defaults = {**DEFAULT_CONF, "spark.driver.extraJavaOptions": java, "spark.driver.host": driver_host, "spark.driver.bindAddress": bind_address}
    for key, value in {**defaults, **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


# Per session made from another: the names its Python data sources are read by there.
_SOURCE_NAMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register_source(spark: SparkSession, source: type) -> str:
    """Make the Python data source `source` known to `spark` (again is harmless); the name to
    read it by there (`spark.readStream.format(name)`).

    A session made from another (`newSession`) refuses a source its first session registered
    (DATA_SOURCE_ALREADY_EXISTS) and does not find it either: there it is registered once
    under a name of its own."""
    from pyspark.errors import AnalysisException

    names = _SOURCE_NAMES.setdefault(spark, {})
    if source.name() in names:  # refused here before: read by its own name
        return names[source.name()]
    try:
        spark.dataSource.register(source)
        return source.name()
    except AnalysisException as exc:
        if exc.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise
    own = f"{source.name()}_{uuid.uuid4().hex[:12]}"
    spark.dataSource.register(type(source.__name__, (source,), {"name": classmethod(lambda cls: own)}))
    names[source.name()] = own
    return own
