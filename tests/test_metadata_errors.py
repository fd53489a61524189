"""Malformed metadata gives errors that name what is wrong and where."""

from __future__ import annotations

import pytest

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.metadata import read_metadata, write_metadata
from ckpt_tool.flink.model import (
    ByteStreamHandle,
    ChannelStateHandle,
    CheckpointMetadata,
    KeyGroupsHandle,
    OperatorState,
    SubtaskState,
)


def sample(version: int) -> CheckpointMetadata:
    subtask = SubtaskState(
        0,
        managed_keyed=KeyGroupsHandle(12, 0, [1, 2, 3], ByteStreamHandle("kg", b"abc"), "id-1"),
        input_channels=[ChannelStateHandle("input", 0, (0, 1), [4], 9, ByteStreamHandle("cs", b"\0\0\0\0\0\0\0\1x"))],
    )
    op = OperatorState(bytes(range(16)), 2, 128, "op", "uid", subtasks=[subtask, SubtaskState(1, finished=True)])
    return CheckpointMetadata(version, 7, [], [op], b"\xac\xed\x00\x05p" if version >= 4 else None)


def keyed_tag_position(version: int) -> int:
    names = (2 + 2) + (2 + 3) if version >= 5 else 0  # writeUTF("op"), writeUTF("uid")
    return 8 + 8 + 4 + 4 + names + 16 + 4 + 4 + 1 + 4 + 4 + 4 + 4


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_synthetic_round_trip(version):
    data = write_metadata(sample(version))
    assert write_metadata(read_metadata(data)) == data
    assert read_metadata(data).operators[0].subtasks[1].finished


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_unknown_keyed_tag_names_tag_and_position(version):
    data = bytearray(write_metadata(sample(version)))
    position = keyed_tag_position(version)
    assert data[position] == 12
    data[position] = 42
    holder = "operator 000102030405060708090a0b0c0d0e0f" + (' \\(uid "uid", name "op"\\)' if version >= 5 else "")
    with pytest.raises(
        CheckpointFormatError, match=rf"unknown keyed state handle type tag 42 in {holder} subtask 0 at byte {position}$"
    ):
        read_metadata(bytes(data))


def test_unknown_channel_tag_v6():
    data = bytearray(write_metadata(sample(6)))
    position = keyed_tag_position(6) + 1 + 4 + 4 + 3 * 8 + 1 + 2 + 2 + 4 + 3 + 1 + 2 + 4 + 4  # after keyed + raw null
    assert data[position] == 1
    data[position] = 9
    holder = 'operator 000102030405060708090a0b0c0d0e0f \\(uid "uid", name "op"\\) subtask 0'
    message = rf"unknown input channel state handle type tag 9 in {holder} at byte {position}$"
    with pytest.raises(CheckpointFormatError, match=message):
        read_metadata(bytes(data))


def test_every_truncation_is_a_clean_error():
    data = write_metadata(sample(6))
    for cut in range(len(data) - 1):
        with pytest.raises(CheckpointFormatError):
            read_metadata(data[:cut])
