import pytest

from spark_agents.checkpoint import committed_watermark_ms, hand_over, processed_position


def write_log(folder, name, positions):
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["v1"] + [f'{{"path":"file:///s/partition=0/{p:012d}.csv","timestamp":1,"batchId":0}}' for p in positions]
    (folder / name).write_text("\n".join(lines) + "\n")


def test_processed_position_reads_the_file_source_log(tmp_path):
    assert processed_position(tmp_path) is None
    log = tmp_path / "sources" / "0"
    write_log(log, "0", [0, 1])
    write_log(log, "1", [2])
    write_log(log, "9.compact", [0, 1, 2, 3, 7])
    assert processed_position(tmp_path) == 7
    assert processed_position(tmp_path, log_offset=1) == 2


def test_hand_over_copies_into_a_new_folder(tmp_path):
    source = tmp_path / "ck"
    write_log(source / "sources" / "0", "0", [4])
    copy = hand_over(source, tmp_path / "elsewhere")
    assert processed_position(copy) == 4
    with pytest.raises(FileExistsError):
        hand_over(source, copy)


def test_committed_watermark_is_that_of_the_newest_completed_batch(tmp_path):
    assert committed_watermark_ms(tmp_path) is None
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for n, watermark in enumerate([0, 5000, 9000]):
        (tmp_path / "offsets" / str(n)).write_text(f'v1\n{{"batchWatermarkMs":{watermark},"batchTimestampMs":1}}\n{{"logOffset":{n}}}\n')
    assert committed_watermark_ms(tmp_path) is None, "no batch has completed"
    for n in (0, 1):
        (tmp_path / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    assert committed_watermark_ms(tmp_path) == 5000, "batch 2 is planned, not completed"
