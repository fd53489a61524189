"""Split network buffers into length-framed records.

Flink's record serializer writes each record as a 4-byte big-endian length and the record's
bytes; a record (and even its length field) may span buffers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable

from ckpt_tool.errors import CheckpointFormatError

_LENGTH = struct.Struct(">i")


@dataclass
class FramedRecords:
    records: list[bytes]
    trailing: bytes  # bytes after the last whole record: a partial record, normally empty


def split_records(chunks: Iterable[bytes]) -> FramedRecords:
    """Concatenate the chunks and split them into records."""
    data = b"".join(chunks)
    records = []
    pos, end = 0, len(data)
    while pos + 4 <= end:
        (length,) = _LENGTH.unpack_from(data, pos)
        if length < 0:
            raise CheckpointFormatError(f"negative record length {length} at byte {pos} of a channel")
        if pos + 4 + length > end:
            break
        records.append(data[pos + 4:pos + 4 + length])
        pos += 4 + length
    return FramedRecords(records, data[pos:])
