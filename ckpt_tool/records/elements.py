"""Stream elements as ``StreamElementSerializer`` writes them (Flink 1.13 to 2.3).

Each record in a network buffer is one element: a tag byte, then the tag's payload.
"""

from __future__ import annotations

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
