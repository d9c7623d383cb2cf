"""Fault tests with real processes: the host of a task crashes mid-stream (every process in it,
a network namespace of its own where the machine allows it, is killed at once), or is cut off
from every other host and later healed, or only its link to the backup is cut and healed; the
second participant takes over in the task's HA mode (not after a cut of that one link), and the
final alerts are compared with `bpm pipeline run` over exactly what was fed. The benchmark's
harness runs them (`bpm_app.bench.ha.run_mode`), with shorter phases, on the origin's broker;
the tests read the results again from that broker's storage, restarted."""

import contextlib
import itertools
import secrets
from dataclasses import replace

import pytest

from bpm_app.bench.ha import ORIGIN, TASK_ID, HASettings, goals, run_mode
from bpm.ha.decisions import HA_MODES, PRECISE_MODES
from spark_agents.broker.results import BrokerFence, broker_outputs, read_results
from spark_agents.broker.server import NatsServer, User
from spark_agents.broker.source import JetStreamInput
from spark_agents.broker.stream import Broker
from spark_agents.ha.fence import FencedSink
from spark_agents.host import SparkHost
from spark_agents.network import HostNetwork
from spark_agents.pipeline import run_pipeline
from tests.conftest import requires

pytestmark = [pytest.mark.slow, pytest.mark.full, pytest.mark.serial]

SETTINGS = HASettings(rate=60.0, warmup_s=2.0, measure_s=4.0, after_s=4.0, timeout_s=400.0, step_timeout_s=180.0, cut_s=8.0)
NO_HOSTS = HostNetwork.available()
needs_hosts = requires(NO_HOSTS, "network namespaces for a partition (root, iproute2)")


@pytest.fixture(scope="module")
def failovers(tmp_path_factory):
    """Runs one mode's fault scenario once per test module: (its folder, the harness's figures)."""
    done = {}

    def run(mode, fault="crash"):
        if (mode, fault) not in done:
            root = tmp_path_factory.mktemp(f"{mode}-{fault}")
            done[mode, fault] = (root, run_mode(mode, replace(SETTINGS, modes=(mode,), fault=fault), root))
        return done[mode, fault]

    return run


@contextlib.contextmanager
def origin_broker(root):
    """The origin's broker of a finished run, started again on its storage: (its owner's input, a connection)."""
    owner = User(ORIGIN, secrets.token_urlsafe(16))
    with NatsServer.on_free_ports(ORIGIN, root / ORIGIN / "broker", [owner]).start() as server:
        with Broker(server.url, owner.name, owner.password) as broker:
            yield JetStreamInput(server.url, owner.name, owner.password, ORIGIN), broker


def check_results(mode, root, result, spark, tmp_path):
    """The alerts on the origin's broker against the pipeline over what was fed: all of them
    exactly once in a precise mode; in the others, none twice (what was in flight is lost, and counted)."""
    fed = list(itertools.islice(SETTINGS.workload.records(SETTINGS.rate, SETTINGS.seed), result["records_fed"]))
    pipeline = set(run_pipeline(spark, *SETTINGS.workload.load(), fed, work_dir=tmp_path).rows)
    with origin_broker(root / mode) as (_, broker):
        out = broker_outputs(broker, [TASK_ID])
    assert pipeline and result["expected_results"] == len(pipeline), "the harness's reference is the pipeline's"
    lost = pipeline - out.rows
    assert result["lost_results"] == len(lost) and result["duplicate_results"] == len(out.duplicates)
    if mode in PRECISE_MODES:
        assert lost == set() and out.duplicates == [] and out.rows == pipeline
    else:
        assert out.duplicates == []


def check_failover(result):
    """Detected after the fault, by silence past the timeout (how soon is the benchmark's
    figure, not a test's: a busy machine reads beats late)."""
    assert result["detection_s"] > 0 and result["last_beat_s"] is not None
    assert result["detection_s"] - result["last_beat_s"] >= SETTINGS.detect_timeout_s - 0.002  # each rounded to 1 ms
    assert result["recovery_s"] is not None and result["recovery_s"] > result["detection_s"]


# The crash in the mode whose old checkpoint the last test restarts; every mode runs under a
# cut below (the new host's side of a failover is the same: silence cannot tell the two apart).
# Without network namespaces, every mode runs under a crash instead.
CRASHED = HA_MODES if NO_HOSTS is not None else ("passive_standby",)


@pytest.mark.parametrize("mode", CRASHED)
def test_a_killed_host_fails_over_and_the_alerts_match_the_pipeline(mode, failovers, spark, tmp_path):
    root, result = failovers(mode)
    assert result["fault"] == "crash" and result["partition"] is None
    check_failover(result)
    check_results(mode, root, result, spark, tmp_path)


@needs_hosts
@pytest.mark.parametrize("mode", HA_MODES)
def test_a_host_cut_off_is_failed_over_its_late_writes_refused_once_healed_and_the_alerts_match(mode, failovers, spark, tmp_path):
    root, result = failovers(mode, "cut")
    check_failover(result)
    partition = result["partition"]
    assert partition["cut_s"] >= SETTINGS.cut_s
    assert partition["old_host_state"] != "running", f"the cut-off host still ran its task after the heal: {partition}"
    assert partition["refused_by_fence"], f"its first write after the heal was refused by the fence: {partition}"
    assert partition["old_epoch_batches_after_takeover"] == 0, "nothing the old host wrote landed after the new host's first batch"
    assert goals(result)["partition_safe"] is True
    check_results(mode, root, result, spark, tmp_path)


# Passive standby is the one mode whose host talks to the backup; in the others nothing
# crosses that link, and its cut is no fault at all.
@needs_hosts
def test_a_cut_between_host_and_backup_fails_nothing_over_and_deltas_resume_once_healed(failovers, spark, tmp_path):
    mode = "passive_standby"
    root, result = failovers(mode, "link")
    partition = result["partition"]
    assert partition["failed_over"] is False and result["detection_s"] is None, "both still reach the origin and the watcher"
    assert goals(result)["partition_safe"] is True
    assert partition["duty_failures"] > 0, "deltas sent to the backup while the link was cut failed"
    assert partition["deltas_resumed_after_heal_s"] is not None, "the backup applies deltas again after the heal"
    check_results(mode, root, result, spark, tmp_path)


def test_the_failed_host_coming_back_at_its_old_epoch_is_refused(failovers, spark, tmp_path):
    root, result = failovers("passive_standby")
    with origin_broker(root / "passive_standby") as (source, broker):
        before = [b.seq for b in read_results(broker, TASK_ID)]
        host = SparkHost(spark, tmp_path, interval_s=60)
        try:
            # The old host restarts its task from its own checkpoint, still at epoch 1.
            task = host.start_task(TASK_ID, source, root / "passive_standby" / "a" / "checkpoints" / TASK_ID, *SETTINGS.workload.load(),
                                   trigger_s=None, sink=FencedSink(BrokerFence(broker, TASK_ID), epoch=1))
            with pytest.raises(Exception, match="epoch 1 is fenced"):
                task.query.awaitTermination(120)
            assert task.state == "failed" and "FencedError" in task.error
        finally:
            host.close()
        assert before and [b.seq for b in read_results(broker, TASK_ID)] == before
