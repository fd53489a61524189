"""A schema that is not the job's is refused with exit code 2, naming the exchange, before
anything is written: a wrong record type (the records do not decode to their framed length) and
a wrong key (records sit outside their holder's key groups as Flink never leaves them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalog import COUNTJOB_SCHEMA, fixture_named

TUPLE_JOB = fixture_named("flink23-hashmap-p2")  # Tuple2<Long,String> keyed by f0
POJO_JOB = fixture_named("flink23-pojo-p2")  # CountJob.Event keyed by name


def schema_with(tmp_path: Path, source: str, old: str, new: str) -> str:
    text = Path(source).read_text()
    assert old in text
    path = tmp_path / "schema.toml"
    path.write_text(text.replace(old, new))
    return str(path)


def refused(ckpt, tmp_path, fixture, schema: str, command: str = "rescale") -> str:
    destination = tmp_path / "out" / "job" / "chk-3"
    args = [str(fixture.checkpoint), str(destination)] + (["-p", "3"] if command == "rescale" else [])
    code, out, err = ckpt(command, *args, "--plan", fixture.plan, "--schema", schema, "--engine", "local")
    assert code == 2, (out, err)
    assert err.startswith("ckpt: error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not destination.parent.parent.exists(), "a refused rewrite wrote something"
    return err


@pytest.mark.parametrize(
    "record_type, message",
    [
        ("tuple<int,string>", "key serializer LongSerializer"),  # the keyed state's key serializer says so first
        ("tuple<long,long>", "stream element 0 (from byte 0 of the channel): tuple<long,long> reads 16 of the value's"),
        ("tuple<long,string,int>", "stream element 0 (from byte 0 of the channel): record ends after"),
    ],
)
def test_wrong_record_type(ckpt, tmp_path, record_type, message):
    schema = schema_with(tmp_path, str(COUNTJOB_SCHEMA), 'type = "tuple<long,string>"', f'type = "{record_type}"')
    err = refused(ckpt, tmp_path, TUPLE_JOB, schema)
    assert "exchange map-main -> slow-count" in err and message in err, err


def test_wrong_record_type_is_caught_by_the_records_alone(ckpt, tmp_path, monkeypatch):
    """Where the keyed state cannot tell the key type, tuple<int,string> fails on the records:
    the string's length would be read inside the long."""
    monkeypatch.setattr("ckpt_tool.session.check_key_types", lambda checkpoint, exchanges: None)
    schema = schema_with(tmp_path, str(COUNTJOB_SCHEMA), 'type = "tuple<long,string>"', 'type = "tuple<int,string>"')
    err = refused(ckpt, tmp_path, TUPLE_JOB, schema)
    assert "exchange map-main -> slow-count (gate 0): channel 0 -> 0: stream element 0" in err, err
    assert "tuple<int,string> reads" in err, err


def test_wrong_key_of_another_type(ckpt, tmp_path):
    schema = schema_with(tmp_path, str(COUNTJOB_SCHEMA), 'key = ["f0"]', 'key = ["f1"]')
    err = refused(ckpt, tmp_path, TUPLE_JOB, schema)
    assert "exchange map-main -> slow-count" in err and "the schema's key ['f1']" in err, err


@pytest.mark.parametrize("command", ["rescale", "repair"])
def test_wrong_key_of_the_same_type(ckpt, tmp_path, command):
    """``note`` is a string like the real key ``name``: only where the records sit tells them apart."""
    schema = schema_with(tmp_path, POJO_JOB.schema, 'key = ["name"]', 'key = ["note"]')
    err = refused(ckpt, tmp_path, POJO_JOB, schema, command)
    assert "exchange pojo-map-main -> pojo-slow-count (gate 0)" in err and "the schema's key ['note']" in err, err
    assert "sit outside the key groups of the subtask holding them" in err, err


def test_inspect_reports_a_wrong_record_type(ckpt, tmp_path):
    schema = schema_with(tmp_path, str(COUNTJOB_SCHEMA), 'type = "tuple<long,string>"', 'type = "tuple<long,long>"')
    code, out, err = ckpt("inspect", str(TUPLE_JOB.checkpoint), "--plan", TUPLE_JOB.plan, "--schema", schema, "--engine", "local")
    assert code == 2 and "Traceback" not in out + err
    assert "tuple<long,long> reads 16 of the value's" in out + err
