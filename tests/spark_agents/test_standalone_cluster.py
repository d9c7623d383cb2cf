"""The task host against a real Spark standalone cluster (master and one worker on loopback),
its tasks reading a participant's broker stream and writing their results to it."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest

from spark_agents.broker.server import free_port
from bpm.zeek.generator import TrafficProfile, generate
from bpm.zeek.reference import compute
from spark_agents.broker.results import broker_outputs
from spark_agents.broker.stream import BrokerStream
from spark_agents.streams.feed import feed_all

sys.path.insert(0, str(Path(__file__).parent))
from cluster_driver import PARAMS  # noqa: E402

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


def wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "a cluster process exited early"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on port {port}")


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_host_runs_tasks_on_a_standalone_cluster_unchanged(tmp_path, nats_server, broker):
    server, owner = nats_server
    conns = generate(TrafficProfile(duration_s=180, rate=40, sources=80), seed=31)
    feed_all(BrokerStream(broker, "a"), conns, PARAMS, rows_per_flush=1500)

    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp_path / "logs"),
           "SPARK_WORKER_DIR": str(tmp_path / "worker"), "PYSPARK_PYTHON": sys.executable}
    master_port, worker_port = free_port(), free_port()
    logs = (tmp_path / "master.log").open("w"), (tmp_path / "worker.log").open("w")
    procs = []
    try:
        procs.append(subprocess.Popen(
            [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(master_port), "--webui-port", str(free_port())],
            env=env, stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True))
        wait_for_port(master_port, procs[0], 90)
        master = f"spark://127.0.0.1:{master_port}"
        procs.append(subprocess.Popen(
            [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", str(worker_port),
             "--webui-port", str(free_port()), "--cores", "2", "--memory", "1g", master],
            env=env, stdout=logs[1], stderr=subprocess.STDOUT, start_new_session=True))
        wait_for_port(worker_port, procs[1], 90)

        driver = subprocess.run(
            [sys.executable, str(Path(__file__).parent / "cluster_driver.py"), master, server.url, owner.name, str(tmp_path / "work")],
            env={**env, "BPM_NATS_PASSWORD": owner.password}, capture_output=True, text=True, timeout=300)
        assert driver.returncode == 0, driver.stderr[-3000:]
        report = json.loads(driver.stdout.strip().splitlines()[-1])
        assert report["master"] == master and report["executors"] >= 2, "driver plus the worker's executor"
        assert all(n > 0 for n in report["batches"].values())
        output = broker_outputs(broker, report["batches"])
        assert output.rows == set(compute(conns, PARAMS)) and output.duplicates == []
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
        for log in logs:
            log.close()
