"""The task host against a real Spark standalone cluster: master and worker in one host, the
driver (a participant's agent side) in another, its tasks reading a broker stream and writing
their results to it. With network namespaces (root) the hosts are namespaces on a bridge; else
two loopback addresses."""

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest

from bpm.zeek.generator import TrafficProfile, generate
from examples.network_monitoring import expected
from spark_agents.broker.results import broker_outputs
from spark_agents.broker.server import NatsServer, User
from spark_agents.broker.stream import Broker, BrokerStream
from spark_agents.hosts import Hosts
from tests.spark_agents.conns import feed_all

sys.path.insert(0, str(Path(__file__).parent))
from cluster_driver import PARAMS  # noqa: E402

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
MASTER_PORT, WORKER_PORT, MASTER_UI, WORKER_UI = 7077, 7078, 8080, 8081


def wait_for_port(address: str, port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "a cluster process exited early"
        with socket.socket() as s:
            if s.connect_ex((address, port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on {address}:{port}")


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.full
def test_tasks_run_on_a_spark_worker_in_another_host(tmp_path):
    hosts, server = Hosts.open("cluster", tmp_path / "hosts", cpus=False), None
    try:
        agent, cluster = hosts.add("a"), hosts.add("w")
        # The participant's broker, where both hosts reach it: the machine's address on the bridge.
        broker_host = hosts.net.gateway if hosts.net is not None else "127.0.0.1"
        owner = User("a", secrets.token_urlsafe(16))
        server = NatsServer.on_free_ports("a", tmp_path / "nats-a", [owner], host=broker_host).start()
        conns = generate(TrafficProfile(duration_s=180, rate=40, sources=80), seed=31)
        with Broker(server.url, owner.name, owner.password) as broker:
            feed_all(BrokerStream(broker, "a"), conns, PARAMS, rows_per_flush=1500)

        env = {**os.environ, "SPARK_LOCAL_IP": cluster.address, "SPARK_LOG_DIR": str(cluster.folder / "logs"),
               "SPARK_WORKER_DIR": str(cluster.folder / "worker"), "PYSPARK_PYTHON": sys.executable}
        with (cluster.folder / "master.log").open("w") as log:
            master_proc = hosts.popen("w", [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", cluster.address,
                                            "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI)], env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(cluster.address, MASTER_PORT, master_proc, 90)
        master = f"spark://{cluster.address}:{MASTER_PORT}"
        with (cluster.folder / "worker.log").open("w") as log:
            worker_proc = hosts.popen("w", [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", "--host", cluster.address,
                                            "--port", str(WORKER_PORT), "--webui-port", str(WORKER_UI), "--cores", "2", "--memory", "1g", master],
                                      env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(cluster.address, WORKER_PORT, worker_proc, 90)

        driver = hosts.popen("a", [sys.executable, str(Path(__file__).parent / "cluster_driver.py"), master, server.url, owner.name,
                                   str(agent.folder / "work"), agent.address],
                             env={**os.environ, "PYSPARK_PYTHON": sys.executable, "BPM_NATS_PASSWORD": owner.password},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = driver.communicate(timeout=300)
        assert driver.returncode == 0, err[-3000:]
        report = json.loads(out.strip().splitlines()[-1])
        assert report["master"] == master and report["executors"] >= 2, "driver plus the worker's executor"
        assert report["driver_host"] == agent.address and cluster.address in report["hosts"], "the executor runs in the other host"
        assert all(n > 0 for n in report["batches"].values())
        with Broker(server.url, owner.name, owner.password) as broker:
            output = broker_outputs(broker, report["batches"])
        assert output.rows == set(expected(conns, PARAMS)) and output.duplicates == []
    finally:
        hosts.close()
        if server is not None:
            server.stop()
