"""Avro records as Flink's AvroSerializer writes them (flink-avro's DataOutputEncoder encoding),
decoded by fastavro's schema walker over ckpt's decoder; keys of record fields hash as Java does.

fixtures/avro/golden.jsonl.gz holds records that Avro's own GenericDatumWriter wrote through that
encoding (fixtures/avro/AvroGolden.java); flink-avro itself cannot be installed here."""

from __future__ import annotations

import datetime
import gzip
import json

import pytest

from catalog import FIXTURES
from ckpt_tool.records.avro import AvroReader, AvroSchemaError, avro_key_function, load_avro_schema
from ckpt_tool.records.types import RecordDecodeError

SCHEMA = FIXTURES / "avro" / "event.avsc"


def golden() -> list[dict]:
    with gzip.open(FIXTURES / "avro" / "golden.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def test_records_decode_and_keys_hash_as_in_java():
    schema = load_avro_schema(str(SCHEMA))
    reader = AvroReader(schema)
    key_of = avro_key_function(schema, ("user",))
    entries = golden()
    assert len(entries) == 400
    for entry in entries:
        data = bytes.fromhex(entry["bytes"])
        record = reader.read(b"\x00" + data, 1)
        assert record["id"] == entry["id"] and record["kind"] in ("VIEW", "CLICK")
        assert isinstance(record["day"], datetime.date) and record["payload"][1:] == b"\x01\x02"
        assert key_of(data, 0) == (entry["key_hash"], record["user"])
    tuple_key = avro_key_function(schema, ("user", "id"))
    assert isinstance(tuple_key(bytes.fromhex(entries[0]["bytes"]), 0)[0], int)


def test_a_schema_that_does_not_match_the_bytes_is_refused(tmp_path):
    document = json.loads(SCHEMA.read_text())
    document["fields"][1]["type"] = "int"  # id is a long in the bytes
    wrong = tmp_path / "wrong.avsc"
    wrong.write_text(json.dumps(document))
    reader = AvroReader(load_avro_schema(str(wrong)))
    with pytest.raises(RecordDecodeError, match="the Avro schema does not match"):
        reader.read(bytes.fromhex(golden()[0]["bytes"]))


def test_unusable_schemas_and_keys(tmp_path):
    bad = tmp_path / "bad.avsc"
    bad.write_text('{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]}')
    with pytest.raises(AvroSchemaError, match="cannot read Avro schema"):
        load_avro_schema(str(bad))
    schema = load_avro_schema(str(SCHEMA))
    with pytest.raises(AvroSchemaError, match="no field 'missing'"):
        avro_key_function(schema, ("missing",))
    with pytest.raises(AvroSchemaError, match="cannot be a key"):
        avro_key_function(schema, ("tags",))
