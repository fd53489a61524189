"""DataStream values decode exactly as Flink's own TypeSerializers write them, and hash as their
Java classes do: java.time (Instant, LocalDate, LocalTime, LocalDateTime, with nulls), enums,
List, Map, primitive and String arrays. The golden file was written by
fixtures/java/SerializerGolden.java with Flink's serializers (see fixtures/README.md)."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from catalog import FIXTURES
from ckpt_tool.records.keys import java_hash, unhashable_key_part
from ckpt_tool.records.types import decode_value, parse_type, to_json

GOLDEN = sorted((FIXTURES / "serializers").glob("golden-*.jsonl.gz"))


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_values_decode_and_hash_as_in_flink(path):
    with gzip.open(path, "rt") as f:
        entries = [json.loads(line) for line in f][1:]
    seen: Counter = Counter()
    for entry in entries:
        t = parse_type(entry["type"])
        data = bytes.fromhex(entry["bytes"])
        value, end = decode_value(t, data)
        assert end == len(data), entry
        assert to_json(t, value) == entry["value"], entry
        if entry["hash"] is not None:
            assert java_hash(t, value) == entry["hash"], entry
        else:
            assert value is None or unhashable_key_part(t), entry  # Flink refuses enums and arrays as keys
        seen[t.name] += 1
    assert set(seen) == {"instant", "local_date", "local_time", "local_date_time", "enum", "list", "map", "array"}
