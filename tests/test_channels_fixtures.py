"""Logical channels stitched by ckpt hold exactly the records Flink's own deserializer finds."""

from __future__ import annotations

from ckpt_tool.flink.channel_state import logical_channels
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.records.framing import split_records


def exchanges(fixture):
    """(upstream id, downstream id, gate, partition) of every exchange the reference decoded."""
    return sorted({(c["upstream"], c["downstream"], c.get("gate", 0), c.get("partition", 0)) for c in fixture.expected["logical_channels"]})


def test_fixture_has_input_and_output_channel_state(fixture):
    channels = fixture.expected["logical_channels"]
    assert any(c["input_buffers"] for c in channels) and any(c["output_buffers"] for c in channels)


def test_records_per_logical_channel_match_flink(fixture):
    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    md = checkpoint.metadata
    expected = {
        (c["upstream"], c["downstream"], c["upstream_subtask"], c["downstream_subtask"]): c
        for c in fixture.expected["logical_channels"]
    }
    seen = set()
    for up, down, gate, partition in exchanges(fixture):
        for channel in logical_channels(md.operator(up), md.operator(down), gate, partition):
            key = (up, down, channel.upstream_subtask, channel.downstream_subtask)
            want = expected[key]
            inputs, outputs = channel.buffers(checkpoint)
            framed = split_records(inputs + outputs)
            assert framed.trailing == b"", key
            elements = want["records"] + want.get("watermarks", 0) + want.get("other_elements", 0)
            assert (len(inputs), len(outputs), len(framed.records)) == (
                want["input_buffers"], want["output_buffers"], elements
            ), key
            seen.add(key)
    assert seen == {k for k, c in expected.items() if c["input_buffers"] or c["output_buffers"]}
