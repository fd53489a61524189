"""Logical channels stitched by ckpt hold exactly the records Flink's own deserializer finds."""

from __future__ import annotations

from ckpt_tool.engine.tasks import channel_tasks, read_channel
from ckpt_tool.flink.channel_state import ChannelStateReader
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.records.schema import Exchange


def exchanges(fixture):
    """(upstream id, downstream id, gate, partition) of every exchange the reference decoded."""
    channels = fixture.expected["logical_channels"]
    return sorted({(c["upstream"], c["downstream"], c.get("gate", 0), c.get("partition", 0)) for c in channels})


def test_fixture_has_input_and_output_channel_state(inflight):
    fixture = inflight
    channels = fixture.expected["logical_channels"]
    assert any(c["input_buffers"] for c in channels) and any(c["output_buffers"] for c in channels)


def test_records_per_logical_channel_match_flink(fixture):
    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    expected = {
        (c["upstream"], c["downstream"], c.get("gate", 0), c["upstream_subtask"], c["downstream_subtask"]): c
        for c in fixture.expected["logical_channels"]
    }
    seen = set()
    described = exchanges(fixture)
    tasks = channel_tasks(checkpoint, [Exchange(up, down, gate, partition) for up, down, gate, partition in described])
    with ChannelStateReader() as reader:
        for task in tasks:
            up, down, gate, _ = described[task.exchange_index]  # two gates of one receiver may share a sender
            key = (up, down, gate, task.upstream_subtask, task.downstream_subtask)
            want = expected[key]
            records = read_channel(reader, task)
            assert records.trailing == 0, key
            buffers = (sum(len(s.offsets) for s in task.inputs), sum(len(s.offsets) for s in task.outputs))
            elements = want["records"] + want.get("watermarks", 0) + want.get("other_elements", 0)
            assert (*buffers, len(records.tags)) == (want["input_buffers"], want["output_buffers"], elements), key
            seen.add(key)
    assert seen == {k for k, c in expected.items() if c["input_buffers"] or c["output_buffers"]}
