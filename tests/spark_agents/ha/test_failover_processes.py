"""Fault tests with real processes: the host of a task crashes mid-stream (every process in it,
a network namespace of its own where the machine allows it, is killed at once), the
second participant takes over in the task's HA mode, and the final alerts are compared with
`bpm pipeline run` over exactly what was fed. The benchmark's harness runs them
(`bpm_app.bench.ha.run_mode`), with shorter phases, on the origin's broker; the tests read
the results again from that broker's storage, restarted."""

import contextlib
import itertools
import secrets
from dataclasses import replace

import pytest

from bpm_app.bench.ha import ORIGIN, TASK_ID, HASettings, run_mode
from bpm_app.bench.move import traffic
from bpm.ha.decisions import HA_MODES, PRECISE_MODES
from spark_agents.broker.results import BrokerFence, broker_outputs, read_results
from spark_agents.broker.server import NatsServer, User
from spark_agents.broker.source import JetStreamInput
from spark_agents.broker.stream import Broker
from spark_agents.ha.fence import FencedSink
from spark_agents.host import TaskHost
from spark_agents.pipeline import run_pipeline

pytestmark = pytest.mark.slow

SETTINGS = HASettings(rate=60.0, warmup_s=2.0, measure_s=4.0, after_s=4.0, timeout_s=400.0, step_timeout_s=180.0)


@pytest.fixture(scope="module")
def failovers(tmp_path_factory):
    """Runs one mode's fault scenario once per test module: (its folder, the harness's figures)."""
    done = {}

    def run(mode):
        if mode not in done:
            root = tmp_path_factory.mktemp(mode)
            done[mode] = (root, run_mode(mode, replace(SETTINGS, modes=(mode,)), root))
        return done[mode]

    return run


@contextlib.contextmanager
def origin_broker(root):
    """The origin's broker of a finished run, started again on its storage: (its owner's input, a connection)."""
    owner = User(ORIGIN, secrets.token_urlsafe(16))
    with NatsServer.on_free_ports(ORIGIN, root / ORIGIN / "broker", [owner]).start() as server:
        with Broker(server.url, owner.name, owner.password) as broker:
            yield JetStreamInput(server.url, owner.name, owner.password, ORIGIN), broker


@pytest.mark.parametrize("mode", HA_MODES)
def test_a_killed_host_fails_over_and_the_alerts_match_the_pipeline(mode, failovers, spark, tmp_path):
    root, result = failovers(mode)
    fed = list(itertools.islice(traffic(SETTINGS.profile(), SETTINGS.seed), result["connections_fed"]))
    pipeline = set(run_pipeline(spark, fed, SETTINGS.params, work_dir=tmp_path).rows)
    with origin_broker(root / mode) as (_, broker):
        out = broker_outputs(broker, [TASK_ID])
    assert pipeline and result["expected_results"] == len(pipeline), "the harness's reference is the pipeline's"
    lost = pipeline - out.rows
    assert result["lost_results"] == len(lost) and result["duplicate_results"] == len(out.duplicates)
    assert 0 < result["detection_s"] < SETTINGS.detect_timeout_s + 1.0
    assert result["recovery_s"] is not None and result["recovery_s"] > result["detection_s"]
    if mode in PRECISE_MODES:
        assert lost == set() and out.duplicates == [] and out.rows == pipeline
    else:
        # Gap recovery: what was in flight is lost, and counted; nothing is written twice.
        assert isinstance(result["lost_results"], int) and out.duplicates == []


def test_the_failed_host_coming_back_at_its_old_epoch_is_refused(failovers, spark, tmp_path):
    root, result = failovers("passive_standby")
    with origin_broker(root / "passive_standby") as (source, broker):
        before = [b.seq for b in read_results(broker, TASK_ID)]
        host = TaskHost(spark, tmp_path, interval_s=60)
        try:
            # The old host restarts its task from its own checkpoint, still at epoch 1.
            task = host.start_task(TASK_ID, source, root / "passive_standby" / "a" / "checkpoints" / TASK_ID, SETTINGS.params,
                                   trigger_s=None, sink=FencedSink(BrokerFence(broker, TASK_ID), epoch=1))
            with pytest.raises(Exception, match="epoch 1 is fenced"):
                task.query.awaitTermination(120)
            assert task.state == "failed" and "FencedError" in task.error
        finally:
            host.close()
        assert before and [b.seq for b in read_results(broker, TASK_ID)] == before
