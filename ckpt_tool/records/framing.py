"""Split network buffers into length-framed records.

Flink's record serializer writes each record as a 4-byte big-endian length and the record's
bytes; a record (and even its length field) may span buffers. The walk along the lengths is
the C loop ``_framing.frame``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.records import _framing


@dataclass
class FramedRecords:
    records: list[bytes]
    trailing: bytes  # bytes after the last whole record: a partial record, normally empty


def record_starts(data) -> tuple[bytes, int]:
    """Offsets of every whole record's length field (native int64 bytes) and the end of the last."""
    try:
        return _framing.frame(data)
    except ValueError as exc:
        raise CheckpointFormatError(str(exc)) from None


def split_records(chunks: Iterable[bytes]) -> FramedRecords:
    """Concatenate the chunks and split them into records."""
    data = b"".join(chunks)
    starts_bytes, end = record_starts(data)
    starts = memoryview(starts_bytes).cast("q").tolist()
    records = [data[start + 4:stop] for start, stop in zip(starts, starts[1:] + [end])]
    return FramedRecords(records, data[end:])
