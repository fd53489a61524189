import struct

from ckpt_tool.flink.channel_state import HEADER, ChannelStateFileBuilder
from ckpt_tool.records.framing import split_records


def frame(*records: bytes) -> bytes:
    return b"".join(struct.pack(">i", len(r)) + r for r in records)


def test_records_spanning_buffers_and_length_fields():
    stream = frame(b"a" * 10, b"bb", b"", b"c" * 300)
    # cut everywhere, including inside length fields
    for cut in range(len(stream) + 1):
        got = split_records([stream[:cut], stream[cut:]])
        assert got.records == [b"a" * 10, b"bb", b"", b"c" * 300]
        assert got.trailing == b""


def test_partial_record_is_reported_as_trailing():
    stream = frame(b"one", b"two")
    got = split_records([stream[:-1]])
    assert got.records == [b"one"]
    assert got.trailing == stream[7:-1]


def test_channel_state_file_builder_layout():
    builder = ChannelStateFileBuilder()
    offsets, size = builder.add([b"xy", b"z"])
    data = builder.getvalue()
    assert data[:4] == HEADER
    assert offsets == [4, 10]
    assert size == (4 + 2) + (4 + 1)
    assert data[10:15] == b"\x00\x00\x00\x01z"
