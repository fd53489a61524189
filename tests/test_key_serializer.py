"""The schema's key type is checked against the key serializer the keyed state was written with
(hashmap key-groups files and RocksDB meta files, Flink 1.15 to 2.3): a disagreeing schema is
refused with exit code 2, naming both types, before anything is written."""

from __future__ import annotations

import pytest

from catalog import ALL_FIXTURES, FIXTURES
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.records.key_serializer import key_serializer, schema_key_family

EXPECTED = {
    "tuple": "long",
    "sideout": "long",
    "updates": "long",
    "pojo": "string",
    "javatime": "local_date",
    "sql": "binary_row<string>",
    "sqltypes": "binary_row<string,string,decimal(20,2)>",
    "sqljoin": {"binary_row<int>", "binary_row<string>"},  # the Join by uid, the GlobalGroupAggregate by name
}


def test_key_serializer_of_every_fixture(fixture):
    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    found = {s.family() for op in checkpoint.metadata.operators if (s := key_serializer(checkpoint, op))}
    expected = EXPECTED[fixture.info.get("job_kind", "tuple")]
    assert found == (expected if isinstance(expected, set) else {expected})


def test_schema_families():
    assert schema_key_family("tuple<long,string>", ("f0",)) == "long"
    assert schema_key_family("tuple<long,string,int>", ("f0", "f2")) == "tuple<long,int>"
    assert schema_key_family("binary_row<a:string,b:char(4),c:decimal(20,2),t:timestamp_ltz(6)>", ("a", "b", "c", "t")) == (
        "binary_row<string,string,decimal(20,2),timestamp(6)>"
    )


@pytest.mark.parametrize("command", ["inspect", "rescale"])
def test_a_schema_whose_key_type_disagrees_is_refused(ckpt, tmp_path, command):
    fixture = next(f for f in ALL_FIXTURES if f.name == "flink120-hashmap-p2")
    schema = tmp_path / "wrong.toml"
    schema.write_text((FIXTURES / "countjob.schema.toml").read_text().replace("tuple<long,string>", "tuple<int,string>", 1))
    destination = tmp_path / "out"
    args = ["-p", "3", str(destination)] if command == "rescale" else []
    code, _, err = ckpt(command, str(fixture.checkpoint), *args[2:], *args[:2], "--schema", str(schema), "--engine", "local")
    assert code == 2, err
    assert "is int, but" in err and "key serializer LongSerializer (long)" in err and "Traceback" not in err
    assert not destination.exists()


def test_avro_key_fields_are_checked_too(tmp_path):
    from ckpt_tool.records.key_serializer import KeyTypeMismatch
    from ckpt_tool.session import Session

    fixture = next(f for f in ALL_FIXTURES if f.name == "flink23-hashmap-p2")  # keyed by a Long
    (tmp_path / "event.avsc").write_text((FIXTURES / "avro" / "event.avsc").read_text())
    schema = tmp_path / "schema.toml"
    entry = '[[exchange]]\nupstream = "map-main"\ndownstream = "slow-count"\ntype = "avro"\navro_schema = "event.avsc"\n'
    schema.write_text(entry + 'key = ["id"]\n')  # a long field: agrees
    Session.open(str(fixture.checkpoint), str(schema))
    schema.write_text(entry + 'key = ["user"]\n')  # a string field: refused
    with pytest.raises(KeyTypeMismatch, match=r"key \['user'\] of avro is string, but slow-count's keyed state"):
        Session.open(str(fixture.checkpoint), str(schema))
