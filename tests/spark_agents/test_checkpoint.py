from spark_agents.checkpoint import committed_watermark_ms, processed_seq


def test_processed_seq_reads_the_source_offset_of_a_batch(tmp_path):
    assert processed_seq(tmp_path) is None
    (tmp_path / "offsets").mkdir()
    for n, seq in enumerate([64, 128]):
        (tmp_path / "offsets" / str(n)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"seq":{seq}}}\n')
    assert processed_seq(tmp_path) == 128 and processed_seq(tmp_path, 0) == 64
    (tmp_path / "offsets" / "2").write_text('v1\n{"batchWatermarkMs":0}\n"{\\"seq\\": 192}"\n')  # logged as a JSON string
    assert processed_seq(tmp_path) == 192
    assert processed_seq(tmp_path, 7) is None


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


def test_a_handover_ships_only_what_a_restart_reads(tmp_path):
    from spark_agents.checkpoint import restart_files

    def touch(*names):
        for name in names:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text("x")

    touch("metadata", ".metadata.crc", "state/0/_metadata/metadata", "state/0/0/_metadata/schema")
    for n in range(24):
        touch(f"offsets/{n}", f"offsets/.{n}.crc")
        touch(*(f"state/0/{p}/{n + 1}.delta" for p in (0, 1)))
    touch(*(f"commits/{n}" for n in range(23)), "commits/.23.0c5e.tmp")  # batch 23 planned, not completed
    touch("state/0/0/10.snapshot", "state/0/0/20.snapshot", "state/0/0/24.snapshot")  # 24: the uncompleted batch's
    kept = {str(p) for p in restart_files(tmp_path)}
    assert {"offsets/22", "offsets/23", "commits/22"} <= kept and not {"offsets/20", "commits/21"} & kept
    assert "offsets/21" in kept, "a copy cut at commit 22 restarts with offsets 22 as the newest: Spark reads 21 too"
    assert {"state/0/0/20.snapshot", "state/0/0/21.delta", "state/0/0/24.delta", "state/0/0/24.snapshot"} <= kept
    assert "state/0/0/19.delta" not in kept, "before the snapshot a restart reads (version 23 after batch 22)"
    assert {f"state/0/1/{v}.delta" for v in range(1, 25)} <= kept, "no snapshot in partition 1: every delta"
    assert {"metadata", "state/0/_metadata/metadata", "state/0/0/_metadata/schema"} <= kept
    assert not [k for k in kept if k.endswith((".crc", ".tmp"))]


def test_a_passive_copy_of_a_handed_over_checkpoint_holds_the_offset_entry_a_restart_reads(tmp_path):
    """The old host stopped with batch 8 planned and batch 7 completed; the new host's first
    delta is cut at batch 7, so a restart from the copy has offset entry 7 as its newest and
    Spark reads entry 6 too: the handover must carry it."""
    from spark_agents.ha.delta import checkpoint_cut
    from spark_agents.handover import pack, unpack

    old = tmp_path / "old"
    for n in range(9):
        (old / "offsets").mkdir(parents=True, exist_ok=True)
        (old / "offsets" / str(n)).write_text(f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":1}}\n{{"logOffset":{n}}}\n')
    for n in range(8):
        (old / "commits").mkdir(parents=True, exist_ok=True)
        (old / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    (old / "metadata").write_text('{"id":"q"}\n')
    new = tmp_path / "new"
    unpack(pack(old), new, epoch=1)
    cut = checkpoint_cut(new)
    assert cut.committed == 7
    assert {"offsets/6", "offsets/7", "commits/7"} <= set(cut.files) and "offsets/8" not in cut.files
