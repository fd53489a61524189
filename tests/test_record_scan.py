"""Record scans on real fixtures: the figures of Flink's own deserializers, on both engines."""

from __future__ import annotations

from ckpt_tool.engine import LocalEngine
from ckpt_tool.exchanges import scan_exchanges
from ckpt_tool.session import Session


def scan(fixture, engine) -> list[dict]:
    session = Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan)
    return [e.as_dict() for e in scan_exchanges(session.checkpoint, session.described_exchanges, engine)]


def test_records_per_channel_match_flink(fixture):
    expected = {
        (c["upstream"], c["downstream"], c["upstream_subtask"], c["downstream_subtask"]): c
        for c in fixture.expected["logical_channels"]
        if c["input_buffers"] or c["output_buffers"]
    }
    got = {}
    for exchange in scan(fixture, LocalEngine()):
        for ch in exchange["channels"]:
            key = (exchange["upstream"], exchange["downstream"], ch["upstream_subtask"], ch["downstream_subtask"])
            got[key] = ch
            assert ch["partial_bytes"] == 0
    assert set(got) == set(expected)
    for key, want in expected.items():
        figures = {k: got[key][k] for k in ("input_buffers", "output_buffers", "records", "watermarks", "other_elements")}
        assert figures == {k: want[k] for k in figures}, key


def test_keyed_records_sit_in_their_subtasks_key_groups(fixture):
    for exchange in scan(fixture, LocalEngine()):
        if exchange["keyed"] and not fixture.info.get("restored_from") and not fixture.info.get("naive_rescale"):
            assert exchange["misplaced_records"] == 0 and exchange["duplicate_records"] == 0
            assert sum(exchange["key_group_histogram"].values()) == exchange["records"]


def test_spark_and_local_engines_agree(fixture, spark):
    assert scan(fixture, spark) == scan(fixture, LocalEngine())


def test_one_process_per_core_gives_the_same_figures(fixture):
    from ckpt_tool.engine import LocalEngine

    assert scan(fixture, LocalEngine(workers=2)) == scan(fixture, LocalEngine())


def test_blocks_read_together_and_scanned_apart_give_the_same_figures(fixture, monkeypatch):
    """A scan reads rows READ_TOGETHER_BYTES at a time (each file once for them) and scans them
    TOGETHER_BYTES at a time: with both small, so that a read holds many scanned blocks and a
    block many reads, the figures are those of the default sizes; and where a read fails, each
    of its blocks is scanned channel by channel, with the same figures."""
    from ckpt_tool.engine import tasks

    expected = scan(fixture, LocalEngine())
    for read_bytes, block_bytes in ((4096, 512), (512, 4096), (1, 1)):
        monkeypatch.setattr(tasks, "READ_TOGETHER_BYTES", read_bytes)
        monkeypatch.setattr(tasks, "TOGETHER_BYTES", block_bytes)
        assert scan(fixture, LocalEngine()) == expected, (read_bytes, block_bytes)
    monkeypatch.setattr(tasks, "READ_TOGETHER_BYTES", 1 << 20)
    monkeypatch.setattr(tasks, "TOGETHER_BYTES", 4096)

    def unreadable(*_):
        raise tasks.CkptError("not read together")

    monkeypatch.setattr(tasks, "read_rows", unreadable)
    assert scan(fixture, LocalEngine()) == expected
