"""ckpt's reader against Flink's own classes, on checkpoints real Flink wrote."""

from __future__ import annotations

import pytest

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.channel_state import BufferSource, ChannelStateReader
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.metadata import MERGED, PLAIN, channel_handle_form, read_metadata, set_channel_handle_form, write_metadata
from ckpt_tool.flink.model import INPUT, OUTPUT, MergedChannelStateHandle


def operators_by_id(fixture):
    return {op["id"]: op for op in fixture.expected["operators"]}


def test_header_matches_flink(fixture):
    md = Checkpoint.open(str(fixture.checkpoint)).metadata
    assert md.checkpoint_id == fixture.expected["checkpoint_id"]
    assert md.version == fixture.expected["metadata_version"]
    assert sorted(op.id_hex for op in md.operators) == sorted(operators_by_id(fixture))


def test_operators_match_flink(fixture):
    expected = operators_by_id(fixture)
    for op in Checkpoint.open(str(fixture.checkpoint)).metadata.operators:
        want = expected[op.id_hex]
        live = [s for s in op.subtasks if not s.finished]
        got = {
            "name": op.name,
            "uid": op.uid,
            "parallelism": op.parallelism,
            "max_parallelism": op.max_parallelism,
            "finished": op.finished,
            "subtasks": len(op.subtasks),
            "finished_subtasks": sum(s.finished for s in op.subtasks),
            "handles": {
                "managed_keyed": sum(s.managed_keyed is not None for s in live),
                "raw_keyed": sum(s.raw_keyed is not None for s in live),
                "managed_operator": sum(s.managed_operator is not None for s in live),
                "raw_operator": sum(s.raw_operator is not None for s in live),
                "input_channel": sum(len(s.input_channels) for s in live),
                "result_subpartition": sum(len(s.output_channels) for s in live),
                "input_channel_unmerged": sum(len(s.channel_handles(INPUT)) for s in live),
                "result_subpartition_unmerged": sum(len(s.channel_handles(OUTPUT)) for s in live),
                "upstream_output_buffer": 0,
            },
        }
        assert got == {key: want[key] for key in got}, op.id_hex


def test_round_trip_is_byte_identical(fixture):
    data = fixture.metadata_file.read_bytes()
    assert write_metadata(read_metadata(data)) == data


def test_channel_state_read_from_files_matches_flink(fixture):
    """Buffers and payload bytes read from the channel-state files equal the Java reference."""
    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    expected = operators_by_id(fixture)
    for op in checkpoint.metadata.operators:
        for direction in (INPUT, OUTPUT):
            with ChannelStateReader() as reader:
                buffers = [
                    b
                    for s in op.subtasks
                    for h in s.channel_handles(direction)
                    for b in reader.buffers(BufferSource.of(checkpoint, h))
                ]
            want = expected[op.id_hex]["channel_state"][direction]
            assert (len(buffers), sum(map(len, buffers))) == (want["buffers"], want["bytes"]), (op.id_hex, direction)


def test_merged_handles_reencode_identically(fixture):
    from ckpt_tool.flink.metadata import serialize_merged_offsets

    md = Checkpoint.open(str(fixture.checkpoint)).metadata
    for op in md.operators:
        for s in op.subtasks:
            for handle in s.input_channels + s.output_channels:
                if isinstance(handle, MergedChannelStateHandle):
                    assert serialize_merged_offsets(handle.channels) == handle.serialized_offsets


def test_channel_handles_merge_again_as_flink_merged_them(fixture):
    """Opened up into one handle per channel and merged again, a checkpoint's channel handles are
    byte for byte what Flink wrote (one merged handle per subtask and delegate file, in Flink's
    order); metadata before version 6 holds plain handles only and stays as it is."""
    data = fixture.metadata_file.read_bytes()
    md = read_metadata(data)
    assert channel_handle_form(md) == (MERGED if md.version >= 6 else PLAIN)
    set_channel_handle_form(md, PLAIN)
    handles = [h for op in md.operators for s in op.subtasks for h in s.input_channels + s.output_channels]
    assert not any(isinstance(h, MergedChannelStateHandle) for h in handles)
    if md.version >= 6:
        set_channel_handle_form(md, MERGED)
    else:
        with pytest.raises(CheckpointFormatError, match="cannot hold merged channel state handles"):
            set_channel_handle_form(md, MERGED)
    assert write_metadata(md) == data


def test_merged_handles_know_their_channels_without_decoding(fixture):
    """A merged handle keeps Flink's bytes and decodes its channels where used; its totals, its
    gates and the per-gate views agree with the decoded channels."""
    md = Checkpoint.open(str(fixture.checkpoint)).metadata
    for op in md.operators:
        for s in op.subtasks:
            for direction in (INPUT, OUTPUT):
                handles = s.input_channels if direction == INPUT else s.output_channels
                for handle in handles:
                    if not isinstance(handle, MergedChannelStateHandle):
                        continue
                    channels = handle.channels
                    assert channels and channels == handle.channels and channels[0] is not handle.channels[0]
                    assert {(ch.direction, ch.subtask_index) for ch in channels} == {(direction, handle.subtask_index)}
                    assert all(ch.delegate is handle.delegate for ch in channels)
                    assert handle.channel_count == len(channels)
                    assert handle.buffer_count == sum(ch.buffer_count for ch in channels)
                    assert handle.channel_bytes == sum(ch.state_size for ch in channels) == handle.state_size
                    assert handle.payload_bytes == sum(ch.payload_bytes for ch in channels)
                    assert handle.gates == tuple(dict.fromkeys(ch.info[0] for ch in channels))
                every = s.channel_handles(direction)
                for gate in {h.info[0] for h in every} | {99}:
                    assert s.channels_on(direction, gate) == [h for h in every if h.info[0] == gate]
                    on = s.channel_handles_on(direction, lambda g, gate=gate: g == gate)
                    opened = [c for h in on for c in (h.channels if isinstance(h, MergedChannelStateHandle) else [h])]
                    assert opened == [h for h in every if h.info[0] == gate]
