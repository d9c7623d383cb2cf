from bpm.zeek.definitions import ResultRow
from bpm.zeek.results import batch_file, read_outputs, write_batch

A = ResultRow("connections", 0, 60, "10.0.0.1", 101)
B = ResultRow("ports", 0, 60, "10.0.0.2", 11)
C = ResultRow("prefix", 0, 60, "10.0.0.0/24", 1)


def test_rewriting_a_batch_replaces_its_file(tmp_path):
    write_batch(tmp_path, "t1", 3, [A, B])
    write_batch(tmp_path, "t1", 3, [A, B])
    out = read_outputs(tmp_path)
    assert out.rows == {A, B} and out.duplicates == [] and len(out.files) == 1
    assert not [p for p in (tmp_path / "t1").iterdir() if p.name.startswith(".")]


def test_rows_in_two_batch_files_are_duplicates_and_missing_rows_are_lost(tmp_path):
    write_batch(tmp_path, "t1", 0, [A])
    write_batch(tmp_path, "t2", 7, [A, B])
    out = read_outputs(tmp_path)
    assert out.duplicates == [A]
    assert out.lost([A, B, C]) == [C] and out.extra([A]) == [B]
    assert read_outputs(tmp_path, tasks=["t2"]).duplicates == []


def test_json_form_round_trips_and_is_iso_utc(tmp_path):
    assert A.to_json()["window_start"] == "1970-01-01T00:00:00Z"
    assert ResultRow.from_json(A.to_json()) == A
    assert batch_file(tmp_path, "t", 2).name == "batch-2.jsonl"
    assert read_outputs(tmp_path / "absent").rows == set()
