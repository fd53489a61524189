"""ckpt's reader against Flink's own classes, on checkpoints real Flink wrote."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.channel_state import BufferSource, ChannelStateReader
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.metadata import (
    MERGED,
    PLAIN,
    channel_handle_form,
    metadata_chunks,
    read_metadata,
    set_channel_handle_form,
    write_metadata,
)
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
    # as the writer writes it: in pieces cut where a subtask ends, once they hold 1000 bytes
    chunks = metadata_chunks(read_metadata(data), 1000)
    assert b"".join(chunks) == data and all(len(chunk) >= 1000 for chunk in chunks[:-1])


def _reachable(value, found: dict[int, object]) -> dict[int, object]:
    """Every object reachable from ``value`` through dataclass fields, lists, tuples and dicts, by id."""
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in found or isinstance(item, (int, float, str, bytes, type(None))):
            continue
        found[id(item)] = item
        if dataclasses.is_dataclass(item):
            stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found


def test_a_copy_of_the_metadata_is_a_deep_copy_with_the_sharing_of_the_original(fixture):
    """A rewrite changes a copy of the source's metadata (``FieldCopy``, field by field): it equals
    the original and writes its bytes, holds no mutable object of the original, and where the
    original refers to one object twice (the channels of one file, one delegate), so does the copy."""
    data = fixture.metadata_file.read_bytes()
    original = read_metadata(data)
    copied = copy.deepcopy(original)
    assert copied == original and write_metadata(copied) == data
    theirs = _reachable(original, {})
    ours = _reachable(copied, {})
    shared = [item for key, item in ours.items() if key in theirs and not isinstance(item, tuple)]
    assert shared == []  # a tuple is shared only where it holds atomic values, as deepcopy shares it
    assert all(not isinstance(item, (list, dict, np.ndarray)) for item in ours.values() if id(item) in theirs)
    # the same number of distinct objects: the original's sharing is kept
    assert len([i for i in ours.values() if not isinstance(i, tuple)]) == len(
        [i for i in theirs.values() if not isinstance(i, tuple)]
    )


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


def _figures_of_channels(channels) -> tuple[int, int, int]:
    highest = max((ch.info[1] for ch in channels), default=-1)
    return sum(ch.buffer_count for ch in channels), sum(ch.payload_bytes for ch in channels), highest


def test_gate_figures_are_those_of_the_gates_channels(fixture):
    """`ckpt schema` sums a gate from the handles (merged ones unopened where all their channels are
    on it: 36 s and 3.3 GB to 2.7 s and 1 GB at p=4,096 dense): the sums of the gate's channels."""
    from ckpt_tool.flink.model import GateFigures, gates_holding, handle_gates

    md = Checkpoint.open(str(fixture.checkpoint)).metadata
    for op in md.operators:
        for s in op.subtasks:
            for direction in (INPUT, OUTPUT):
                handles = s.input_channels if direction == INPUT else s.output_channels
                every = s.channel_handles(direction)
                assert handle_gates(handles) == {h.info[0] for h in every}
                assert gates_holding(handles) == list(dict.fromkeys(h.info[0] for h in every if h.offsets))
                for gate in handle_gates(handles) | {99}:
                    figures = GateFigures().add(handles, gate)
                    expected = _figures_of_channels(s.channels_on(direction, gate))
                    assert (figures.buffers, figures.bytes, figures.highest) == expected


def test_gate_figures_of_merged_handles_of_every_layout():
    """Alike channels on one gate are summed as they are; channels on several gates, of uneven
    buffers, or inline are summed channel by channel, to the same figures."""
    from ckpt_tool.flink.metadata import serialize_merged_offsets
    from ckpt_tool.flink.model import ByteStreamHandle, ChannelStateHandle, GateFigures, gates_holding, handle_gates

    def merged(channels, delegate=None):
        data = serialize_merged_offsets(channels)
        return MergedChannelStateHandle(INPUT, 0, sum(ch.state_size for ch in channels), delegate, data)

    alike = [ChannelStateHandle(INPUT, 0, (1, ch), (5 + 20 * ch,), 24, None) for ch in (3, 9, 4)]
    two_gates = [ChannelStateHandle(INPUT, 0, (ch % 2, ch), (5 + 20 * ch,), 30, None) for ch in range(6)]
    uneven = [ChannelStateHandle(INPUT, 0, (1, ch), tuple(range(5, 5 + 8 * ch, 8)), 12 * ch, None) for ch in range(1, 5)]
    blob = bytes(5) + b"".join((7).to_bytes(4, "big") + bytes(7) for _ in range(3))
    stored = ByteStreamHandle("inline", blob)
    inline = [ChannelStateHandle(INPUT, 0, (1, ch), (5 + 11 * i,), 11, stored) for i, ch in enumerate((2, 7, 5))]
    plain = ChannelStateHandle(INPUT, 0, (1, 11), (5,), 44, None)
    handles = [merged(alike), merged(two_gates), merged(uneven), merged(inline, inline[0].delegate), plain]
    channels = [ch for h in handles for ch in (h.channels if isinstance(h, MergedChannelStateHandle) else [h])]
    assert handle_gates(handles) == {0, 1} and gates_holding(handles) == [1, 0]
    empty_first = [merged([ChannelStateHandle(INPUT, 0, (g, 0), (), 0, None) for g in (0, 2)])]
    assert gates_holding(empty_first + handles) == [1, 0] and gates_holding(handles[1:]) == [0, 1]
    for gate in (0, 1, 2):
        figures = GateFigures().add(handles, gate)
        expected = _figures_of_channels([ch for ch in channels if ch.info[0] == gate])
        assert (figures.buffers, figures.bytes, figures.highest) == expected
    gate_1 = GateFigures().add(handles, 1)
    assert (gate_1.highest, gate_1.bytes) == (11, 3 * 20 + 3 * 26 + 8 * (1 + 2 + 3 + 4) + 3 * 7 + 40)


@pytest.mark.parametrize("buffers", [0, 1, 3])
def test_merged_offsets_of_equal_channels_are_checked_as_one_array_as_channel_by_channel(buffers):
    """Merged offsets whose channels hold the same number of buffers (a job at high parallelism)
    are checked with NumPy; the totals and what is refused are those of the channel-by-channel walk."""
    from ckpt_tool.flink.metadata import _merged_offsets_totals, _uniform_offsets_totals, serialize_merged_offsets
    from ckpt_tool.flink.model import ChannelStateHandle

    def offsets_of(ch):
        return tuple(4 + 100 * ch + 10 * b for b in range(buffers))

    channels = [ChannelStateHandle(INPUT, 0, (ch % 3, ch), offsets_of(ch), 40 * ch, None) for ch in range(7, 0, -1)]
    good = serialize_merged_offsets(channels)
    walked = _merged_offsets_totals(good, check=False)
    assert _uniform_offsets_totals(good) == walked == (7, 7 * buffers, sum(40 * ch for ch in range(1, 8)), (1, 0, 2))
    assert _merged_offsets_totals(good) == walked
    bad = [(0, (-1, 0)), (0, (0, -1))]
    if buffers:
        bad += [(0, "offset 3"), (0, "offset repeats")] if buffers > 1 else [(0, "offset 3")]
    for index, change in bad:
        broken = list(channels)
        ch = broken[index]
        if change == "offset 3":
            broken[index] = ChannelStateHandle(INPUT, 0, ch.info, (3,) + tuple(ch.offsets[1:]), ch.state_size, None)
        elif change == "offset repeats":
            broken[index] = ChannelStateHandle(INPUT, 0, ch.info, (ch.offsets[0],) * buffers, ch.state_size, None)
        else:
            broken[index] = ChannelStateHandle(INPUT, 0, change, ch.offsets, ch.state_size, None)
        data = serialize_merged_offsets(broken)
        assert _uniform_offsets_totals(data) is None and _merged_offsets_totals(data) is None, change
    uneven = list(channels) + [ChannelStateHandle(INPUT, 0, (0, 99), tuple(range(4, 12 + 8 * buffers, 8)), 8, None)]
    data = serialize_merged_offsets(uneven)
    assert _uniform_offsets_totals(data) is None and _merged_offsets_totals(data) == _merged_offsets_totals(data, check=False)
