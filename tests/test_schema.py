"""Schema files, plans and plug-ins."""

from __future__ import annotations

import json

import pytest

from catalog import ALL_FIXTURES, FIXTURES
from ckpt_tool.engine import LocalEngine
from ckpt_tool.exchanges import scan_exchanges
from ckpt_tool.session import Session

FIXTURE = next(f for f in ALL_FIXTURES if f.name == "flink23-hashmap-p2")
MAIN = "5ff73b99d0669153bf2feac805d152ac"
SLOW = "0a6c3d247193df04622ad9b3b66741a5"


def write(tmp_path, text: str) -> str:
    path = tmp_path / "schema.toml"
    path.write_text(text)
    return str(path)


def summary(schema: str, plan: str | None = None) -> list[dict]:
    session = Session.open(str(FIXTURE.checkpoint), schema, plan, plugins=("key_plugins",))
    return [e.as_dict() for e in scan_exchanges(session.checkpoint, session.described_exchanges, LocalEngine())]


def test_plugin_gives_the_same_key_groups_as_the_typed_schema(tmp_path):
    typed = summary(
        write(tmp_path, f'[[exchange]]\nupstream = "{MAIN}"\ndownstream = "{SLOW}"\ntype = "tuple<long,string>"\nkey = ["f0"]\n')
    )
    plugin = summary(
        write(
            tmp_path, '[[exchange]]\nupstream = "map-main"\ndownstream = "slow-count"\ndecoder = "key_plugins:tuple2_long_key"\n'
        )
    )
    for key in ("records", "key_group_histogram", "misplaced_records", "duplicate_records"):
        assert plugin[0][key] == typed[0][key]
    assert typed[0]["records"] > 0


def test_plan_alone_counts_records_without_keys():
    exchanges = summary(None, str(FIXTURE.directory / "plan.json"))
    [main, _, _] = sorted(exchanges, key=lambda e: (e["downstream"], e["gate"]))
    assert main["upstream"] == MAIN and main["partitioner"] == "HASH" and main["records"] > 0
    assert main["key_group_histogram"] is None and main["misplaced_records"] is None


@pytest.mark.parametrize(
    "text, message",
    [
        ('[[exchange]]\nupstream = "x"\n', "'downstream' is required"),
        ('[[exchange]]\ndownstream = "nope"\n', "downstream operator 'nope' is not in the checkpoint"),
        ('[[exchange]]\ndownstream = "slow-count"\ntype = "tuple<long"\n', "ends too early"),
        ('[[exchange]]\ndownstream = "slow-count"\npartitioner = "MAGIC"\n', "unknown partitioner"),
        ("[[exchange\n", "cannot read schema"),
        ('[[exchange]]\ndownstream = "slow-count"\ndecoder = "no_such_module:f"\n', "cannot load decoder"),
        ('[[exchange]]\ndownstream = "slow-count"\ndecoder = "key_plugins:tuple2_long_key"\n', "module key_plugins is not"),
    ],
)
def test_schema_errors_are_clean(ckpt, tmp_path, text, message):
    code, out, err = ckpt("inspect", str(FIXTURE.checkpoint), "--schema", write(tmp_path, text), "--plugin", "no_such_module")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert message in err


def test_inspect_with_schema_json(ckpt):
    code, out, err = ckpt(
        "inspect",
        "--json",
        str(FIXTURE.checkpoint),
        "--schema",
        str(FIXTURES / "countjob.schema.toml"),
        "--plan",
        str(FIXTURE.directory / "plan.json"),
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["engine"] == "local"
    keyed = [e for e in result["exchanges"] if e["keyed"] and e["records"]]
    assert keyed and all(e["misplaced_records"] == 0 and e["duplicate_records"] == 0 for e in keyed)


def test_inspect_with_schema_tables(ckpt):
    code, out, _ = ckpt("inspect", str(FIXTURE.checkpoint), "--schema", str(FIXTURES / "countjob.schema.toml"))
    assert code == 0 and "Key-group histogram" in out and "misplaced 0, duplicates 0" in out


@pytest.mark.parametrize(
    "text, message",
    [
        (f'[[exchange]]\ndownstream = "{SLOW}"\ngate = 7\n', "(gate 7): the plan has no such input"),
        (f'[[exchange]]\nupstream = "map-small"\ndownstream = "{SLOW}"\ngate = 0\n', "the plan says it comes from map-main"),
        (f'[[exchange]]\ndownstream = "{SLOW}"\npartitioner = "REBALANCE"\n', "partitioner REBALANCE, the plan says HASH"),
    ],
)
def test_schema_that_disagrees_with_the_plan_is_refused(ckpt, tmp_path, text, message):
    for command in (["inspect"], ["rescale", str(tmp_path / "out"), "-p", "3"]):
        code, out, err = ckpt(
            command[0], str(FIXTURE.checkpoint), *command[1:], "--plan", FIXTURE.plan, "--schema", write(tmp_path, text)
        )
        assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_plan_of_another_job_is_exit_2(ckpt, tmp_path):
    other = next(f for f in ALL_FIXTURES if f.name == "flink23-sql-p2")
    code, _, err = ckpt("rescale", str(FIXTURE.checkpoint), str(tmp_path / "out"), "-p", "3", "--plan", other.plan)
    assert code == 2 and "is not the plan of this checkpoint's job" in err


def test_a_sender_of_several_exchanges_needs_their_partitions(ckpt, tmp_path):
    two = (
        f'[[exchange]]\nupstream = "{MAIN}"\ndownstream = "{SLOW}"\ntype = "tuple<long,string>"\nkey = ["f0"]\n'
        f'[[exchange]]\nupstream = "{MAIN}"\ndownstream = "print"\npartitioner = "REBALANCE"\n'
    )
    # unstated: the bytes fit one pairing only (slow-count's input sides end mid-record and only
    # partition 0 continues them), which is taken and said
    code, _, err = ckpt("inspect", str(FIXTURE.checkpoint), "--schema", write(tmp_path, two))
    assert code == 0 and "partition 0 -> slow-count (gate 0), partition 1 -> print (gate 0), the one pairing the bytes fit" in err
    # in flink23-recovery-p3 every input side ends on a record boundary: the bytes cannot tell
    recovery = next(f for f in ALL_FIXTURES if f.name == "flink23-recovery-p3")
    code, _, err = ckpt("inspect", str(recovery.checkpoint), "--schema", write(tmp_path, two))
    assert code == 2 and "which output partition feeds which is not known" in err and "both fit the bytes" in err
    stated = two.replace('downstream = "print"', 'downstream = "print"\npartition = 1').replace(
        f'downstream = "{SLOW}"', f'downstream = "{SLOW}"\npartition = 0'
    )
    assert ckpt("inspect", str(FIXTURE.checkpoint), "--schema", write(tmp_path, stated))[0] == 0
    clash = stated.replace("partition = 1", "partition = 0")
    code, _, err = ckpt("inspect", str(FIXTURE.checkpoint), "--schema", write(tmp_path, clash))
    assert code == 2 and "through one output partition" in err


@pytest.mark.parametrize(
    "record_type, key",
    [
        ("enum<RED,GREEN>", '["value"]'),
        ("tuple<long,enum<A,B>>", '["f0", "f1"]'),
        ("array<int>", '["value"]'),
        ("tuple<bytes,long>", '["f0"]'),
    ],
)
def test_keys_flink_refuses_are_refused(tmp_path, record_type, key):
    from ckpt_tool.records.schema import SchemaError

    schema = write(tmp_path, f'[[exchange]]\nupstream = "{MAIN}"\ndownstream = "{SLOW}"\ntype = "{record_type}"\nkey = {key}\n')
    with pytest.raises(SchemaError, match="hashCode is not deterministic; Flink refuses such keys too"):
        Session.open(str(FIXTURE.checkpoint), schema)


def test_avro_schema_is_read_relative_to_the_schema_file(tmp_path):
    (tmp_path / "event.avsc").write_text((FIXTURES / "avro" / "event.avsc").read_text())
    schema = write(
        tmp_path,
        f'[[exchange]]\nupstream = "{MAIN}"\ndownstream = "{SLOW}"\ntype = "avro"\navro_schema = "event.avsc"\nkey = ["id"]\n',
    )
    (exchange,) = Session.open(str(FIXTURE.checkpoint), schema).described_exchanges
    assert exchange.record_type == "avro" and json.loads(exchange.avro_schema or "")["name"] == "Event"
    missing = write(tmp_path, f'[[exchange]]\nupstream = "{MAIN}"\ndownstream = "{SLOW}"\ntype = "avro"\nkey = ["user"]\n')
    with pytest.raises(Exception, match="needs avro_schema"):
        Session.open(str(FIXTURE.checkpoint), missing)
