"""Driver run in its own process by the standalone-cluster test: the task host, unchanged, on a `spark://` master.

Usage: python cluster_driver.py MASTER_URL STREAM_DIR WORK_DIR OUTPUT_DIR
Prints one JSON line with what the host measured.
"""

import json
import sys
from pathlib import Path

from spark_agents.streams import PartitionedStream
from bpm.zeek.definitions import QueryParams
from spark_agents.host import TaskHost
from spark_agents.session import make_session

PARAMS = QueryParams(window_s=30, min_connections=30, min_ports=10, lateness_s=10)


def main(master: str, stream_dir: str, work_dir: str, output_dir: str) -> None:
    spark = make_session(master, "bpm-cluster-test", {"spark.cores.max": "2", "spark.executor.memory": "512m"})
    stream = PartitionedStream(stream_dir)
    host = TaskHost(spark, Path(work_dir), Path(output_dir), cpus=2, interval_s=1.0)
    try:
        for k in range(stream.partitions):
            host.start_task(f"p{k}", stream.partition_path(k), params=PARAMS, trigger_s=0.5)
        for task in host.tasks():
            task.query.processAllAvailable()
        interval = host.sample()
        print(json.dumps({
            "master": spark.sparkContext.master,
            "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size(),
            "batches": {t.task_id: t.batches for t in host.tasks()},
            "utilisation": interval.utilisation,
        }))
    finally:
        host.close()
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
