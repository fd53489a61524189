"""Stream elements as ``StreamElementSerializer`` writes them (Flink 1.15 to 2.3).

Each record in a network buffer is one element: a tag byte, then the tag's payload.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Optional

from ckpt_tool.records.types import DataType, RecordDecodeError, decode_value

RECORD_WITH_TIMESTAMP = 0
RECORD = 1
WATERMARK = 2
LATENCY_MARKER = 3
WATERMARK_STATUS = 4
RECORD_ATTRIBUTES = 5
INTERNAL_WATERMARK = 6

# tag -> (kind, payload size) for elements that carry no user value
NON_RECORDS = {
    WATERMARK: ("watermark", 8),
    LATENCY_MARKER: ("latency_marker", 8 + 16 + 4),
    WATERMARK_STATUS: ("watermark_status", 4),
    RECORD_ATTRIBUTES: ("record_attributes", 1),
    INTERNAL_WATERMARK: ("internal_watermark", 4 + 8),
}
_LONG = struct.Struct(">q")


@dataclass
class StreamElement:
    kind: str  # "record" or one of the non-record kinds above
    timestamp: Optional[int]  # a record's timestamp, or a watermark's
    value_offset: int  # where the record's value starts in the element's bytes


def element_kind(raw: bytes) -> StreamElement:
    """Classify one element without decoding the user value."""
    if not raw:
        raise RecordDecodeError("empty stream element")
    tag = raw[0]
    if tag == RECORD_WITH_TIMESTAMP:
        if len(raw) < 9:
            raise RecordDecodeError("record too short for its timestamp")
        return StreamElement("record", _LONG.unpack_from(raw, 1)[0], 9)
    if tag == RECORD:
        return StreamElement("record", None, 1)
    if tag in NON_RECORDS:
        kind, size = NON_RECORDS[tag]
        if len(raw) != 1 + size:
            raise RecordDecodeError(f"{kind} element of {len(raw)} bytes, expected {1 + size}")
        timestamp = None
        if tag == WATERMARK:
            timestamp = _LONG.unpack_from(raw, 1)[0]
        elif tag == INTERNAL_WATERMARK:
            timestamp = _LONG.unpack_from(raw, 5)[0]
        return StreamElement(kind, timestamp, len(raw))
    raise RecordDecodeError(f"unknown stream element tag {tag}")


def decode_record_value(raw: bytes, element: StreamElement, value_type: DataType) -> Any:
    """The user value of a record element; the value must fill the element exactly."""
    value, end = decode_value(value_type, raw, element.value_offset)
    if end != len(raw):
        raise RecordDecodeError(f"{len(raw) - end} bytes left after a {value_type} value")
    return value
