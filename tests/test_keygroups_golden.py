"""Keys hash and fall into key groups exactly as Flink's own KeyGroupRangeAssignment says.

The golden files were written by fixtures/java/KeyGroupGolden.java with Flink's classes (the key
classes' own hashCode, and KeyGroupRangeAssignment) for Flink 2.3 and 1.20.
"""

from __future__ import annotations

import gzip
import json
import struct
from decimal import Decimal

import pytest

from catalog import FIXTURES
from ckpt_tool.records.keys import (
    binary_row_hash,
    java_hash,
    key_group_for_hash,
    key_group_range,
    operator_index_for_key_group,
)
from ckpt_tool.records.types import DataType, Row, SqlTimestamp, build_binary_row, parse_type

GOLDEN = sorted((FIXTURES / "keygroups").glob("golden-*.jsonl.gz"))
ROW_KINDS = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}


def typed(key: dict | None) -> tuple[DataType, object]:
    """The golden file's JSON form of a key -> (ckpt's type, ckpt's value)."""
    if key is None:
        return DataType("string"), None
    kind = key["type"]
    if kind in ("double", "float"):
        fmt = ">d" if kind == "double" else ">f"
        return DataType(kind), struct.unpack(fmt, bytes.fromhex(key["bits"]))[0]
    if kind == "char":
        return DataType("char"), chr(key["code"])
    if kind == "tuple":
        fields = [typed(f) for f in key["fields"]]
        return DataType("tuple", tuple(t for t, _ in fields)), tuple(v for _, v in fields)
    if kind == "row":
        fields = [typed(f) for f in key["fields"]]
        return DataType("row", tuple(t for t, _ in fields)), Row(ROW_KINDS[key["kind"]], [v for _, v in fields])
    return DataType(kind), key["value"]


def sql_value(t: DataType, value):
    """A binary_row field's JSON value (fixtures/README.md, Key JSON) -> ckpt's value."""
    if value is None:
        return None
    if t.name in ("double", "float"):
        return float(value)
    if t.name == "decimal":
        return Decimal(value)
    if t.name in ("timestamp", "timestamp_ltz"):
        return SqlTimestamp(*value)
    if t.name == "bytes" and t.sql:
        return bytes.fromhex(value)
    if t.name == "array":
        return [sql_value(t.fields[0], v) for v in value]
    if t.name in ("map", "multiset"):
        value_type = t.fields[1] if t.name == "map" else DataType("int", sql=True)
        return [(sql_value(t.fields[0], k), sql_value(value_type, v)) for k, v in value]
    if t.name == "row":
        return [sql_value(f, v) for f, v in zip(t.fields, value)]
    return value


def load(path):
    with gzip.open(path, "rt") as f:
        header = json.loads(f.readline())
        return header, [json.loads(line) for line in f]


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_key_groups(path):
    header, entries = load(path)
    assert len(entries) > 20000
    seen = set()
    sql_types: set[str] = set()
    for entry in entries:
        key = entry["key"]
        seen.add(key["type"])
        if key["type"] == "binary_row":
            types = parse_type(f"binary_row<{','.join(f['type'] for f in key['fields'])}>").fields
            values = [sql_value(t, f["value"]) for t, f in zip(types, key["fields"])]
            row = build_binary_row(types, values, ROW_KINDS[key["kind"]])
            sql_types.update(f["type"].split("(")[0].split("<")[0] for f in key["fields"])
            assert row.data.hex() == entry["row_bytes"], key
            key_hash = binary_row_hash(row.data)
        else:
            key_hash = java_hash(*typed(key))
        assert key_hash == entry["hash"], key
        groups = zip(header["max_parallelisms"], entry["key_groups"], entry["operator_indexes"])
        for max_parallelism, key_group, indexes in groups:
            assert key_group_for_hash(key_hash, max_parallelism) == key_group, (key, max_parallelism)
            for parallelism, index in zip(header["parallelisms"], indexes):
                assert operator_index_for_key_group(max_parallelism, parallelism, key_group) == index
                assert key_group in key_group_range(max_parallelism, parallelism, index)
    assert {"string", "long", "int", "short", "byte", "boolean", "double", "float", "char", "tuple", "row", "binary_row"} <= seen
    if header["flink_version"] == "2.3.0":
        families = {"decimal", "timestamp", "timestamp_ltz", "string", "char", "varchar", "bytes", "binary", "varbinary"}
        assert families | {"date", "time", "array", "map", "multiset", "row"} <= sql_types
