"""Driver run in its own process by the standalone-cluster test: the task host, unchanged, on a `spark://` master.

Usage: BPM_NATS_PASSWORD=... python cluster_driver.py MASTER_URL NATS_URL USER WORK_DIR DRIVER_HOST
Its driver advertises and binds DRIVER_HOST (the executors connect back to it). Runs one task per half of participant USER's stream, its results through the fence on the
same broker, and prints one JSON line with what the host measured.
"""

import json
import os
import sys
from pathlib import Path

from bpm.keygroups import shares
from bpm.zeek.definitions import QueryParams
from examples.network_monitoring import bind
from examples.network_monitoring import query as MONITORING
from spark_agents.broker.results import broker_sink
from spark_agents.broker.source import JetStreamInput
from spark_agents.host import SparkHost
from spark_agents.session import make_session

PARAMS = QueryParams(window_s=30, min_connections=30, min_ports=10, lateness_s=10)


def main(master: str, url: str, user: str, work_dir: str, driver_host: str) -> None:
    spark = make_session(master, "bpm-cluster-test", {"spark.cores.max": "2", "spark.executor.memory": "512m"}, driver_host=driver_host)
    host = SparkHost(spark, Path(work_dir), cpus=2, interval_s=1.0)
    try:
        for prefix in shares(2):
            source = JetStreamInput(url, user, os.environ["BPM_NATS_PASSWORD"], user, prefix)
            host.start_task(f"{user}.g{prefix}", source, query=MONITORING, params=bind(PARAMS), trigger_s=0.5, sink=broker_sink(source.connection(), f"{user}.g{prefix}", 0))
        for task in host.tasks():
            task.query.processAllAvailable()
        interval = host.sample()
        print(json.dumps({
            "master": spark.sparkContext.master,
            "driver_host": spark.conf.get("spark.driver.host"),
            "hosts": sorted({info.host() for info in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()}),
            "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size(),
            "batches": {t.task_id: t.batches for t in host.tasks()},
            "utilisation": interval.utilisation,
        }))
    finally:
        host.close()
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
