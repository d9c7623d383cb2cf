import pytest

from spark_agents.checkpoint import hand_over, processed_position


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
