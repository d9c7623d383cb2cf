"""Fault tests with real processes: the host of a task is killed with SIGKILL mid-stream, the
second participant takes over in the task's HA mode, and the final alerts are compared with
`bpm pipeline run` over exactly what was fed. The benchmark's harness runs them
(`bpm_app.bench.ha.run_mode`), with shorter phases."""

import itertools
from dataclasses import replace

import pytest

from bpm_app.bench.ha import TASK_ID, HASettings, run_mode
from bpm_app.bench.move import traffic
from bpm.ha.decisions import HA_MODES, PRECISE_MODES
from spark_agents.streams import PartitionedStream
from bpm.zeek.results import read_outputs
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


@pytest.mark.parametrize("mode", HA_MODES)
def test_a_killed_host_fails_over_and_the_alerts_match_the_pipeline(mode, failovers, spark, tmp_path):
    root, result = failovers(mode)
    fed = list(itertools.islice(traffic(SETTINGS.profile(), SETTINGS.seed), result["connections_fed"]))
    pipeline = set(run_pipeline(spark, fed, SETTINGS.params, work_dir=tmp_path).rows)
    out = read_outputs(root / mode / "output", [TASK_ID])
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
    output = root / "passive_standby" / "output"
    before = sorted(p.name for p in read_outputs(output, [TASK_ID]).files)
    stream = PartitionedStream(root / "passive_standby" / "stream")
    host = TaskHost(spark, tmp_path, output, interval_s=60)
    try:
        # The old host restarts its task from its own checkpoint, still at epoch 1.
        task = host.start_task(TASK_ID, stream.partition_path(0), root / "passive_standby" / "a" / "checkpoints" / TASK_ID,
                               SETTINGS.params, trigger_s=None, sink=FencedSink(output, TASK_ID, epoch=1))
        with pytest.raises(Exception, match="epoch 1 is fenced"):
            task.query.awaitTermination(120)
        assert task.state == "failed" and "FencedError" in task.error
    finally:
        host.close()
    assert sorted(p.name for p in read_outputs(output, [TASK_ID]).files) == before
