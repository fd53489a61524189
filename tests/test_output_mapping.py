"""Which output partition feeds which exchange, proven from the bytes (ckpt_tool.exchanges.check_output_mapping).

On real Flink bytes: the output side of a logical channel must continue its input side's last
record, and every element from there on must be whole with a valid tag. The committed fixtures
have no operator with two outputs, so the tests pair one real sender's output partition with two
real input gates of its consumer, once as the bytes have it and once swapped, as a schema with
its `partition` numbers swapped would.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from catalog import fixture_named
from ckpt_tool.engine import LocalEngine
from ckpt_tool.engine.tasks import channel_tasks, junction
from ckpt_tool.exchanges import MappingError, check_output_mapping
from ckpt_tool.records.schema import Exchange
from ckpt_tool.session import Session

SQL = fixture_named("flink23-sql-p2")
CALC = "ceb97c30baba662117f288004a2d42fc"  # Calc[10]: output partition 0 holds data, into GroupAggregate gate 0
AGGREGATE = "71c48c960b047f446590297b9d8cf0a9"  # GroupAggregate[15]
RECOVERY = fixture_named("flink23-recovery-p3")  # every input side ends on a record boundary
MAP_MAIN, SLOW_COUNT = "5ff73b99d0669153bf2feac805d152ac", "0a6c3d247193df04622ad9b3b66741a5"


def two_exchanges(sender: str, receiver: str, partitions: tuple[int, int]) -> list[Exchange]:
    return [Exchange(sender, receiver, gate, partition, "REBALANCE") for gate, partition in enumerate(partitions)]


def test_the_output_side_must_continue_the_input_sides_last_record():
    """Real channels of flink23-hashmap-p2 end mid-record on the input side: another channel's
    output side does not continue them."""
    fixture = fixture_named("flink23-hashmap-p2")
    session = Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan, "local")
    tasks = [t for t in channel_tasks(session.checkpoint, session.exchanges) if t.inputs and t.outputs]
    assert all(junction(t).problem is None for t in tasks)
    first, other = tasks[0], next(t for t in tasks if t.upstream_subtask != tasks[0].upstream_subtask)
    crossed = junction(dataclasses.replace(first, outputs=other.outputs))
    assert crossed.problem and crossed.both_sides


def test_a_pairing_the_bytes_contradict_is_refused_with_the_one_that_fits():
    session = Session.open(str(SQL.checkpoint))
    check_output_mapping(session.checkpoint, two_exchanges(CALC, AGGREGATE, (0, 1)), LocalEngine())
    with pytest.raises(MappingError) as refused:
        check_output_mapping(session.checkpoint, two_exchanges(CALC, AGGREGATE, (1, 0)), LocalEngine())
    message = str(refused.value)
    assert "does not continue the input side's last record" in message and "cut record" in message
    assert "the bytes fit partition 0 -> GroupAggregate[15] (gate 0), partition 1 -> GroupAggregate[15] (gate 1) only" in message


def test_a_pairing_the_bytes_cannot_tell_is_refused():
    session = Session.open(str(RECOVERY.checkpoint))
    with pytest.raises(MappingError, match="the bytes cannot tell which feeds which"):
        check_output_mapping(session.checkpoint, two_exchanges(MAP_MAIN, SLOW_COUNT, (0, 1)), LocalEngine())
    # typed exchanges are proven record by record instead
    typed = [dataclasses.replace(e, record_type="tuple<long,string>") for e in two_exchanges(MAP_MAIN, SLOW_COUNT, (0, 1))]
    check_output_mapping(session.checkpoint, typed, LocalEngine())


SWAPPED = f"""
[[exchange]]
upstream = "{CALC}"
downstream = "{AGGREGATE}"
gate = 0
partition = 1
partitioner = "REBALANCE"

[[exchange]]
upstream = "{CALC}"
downstream = "{AGGREGATE}"
gate = 1
partition = 0
partitioner = "REBALANCE"

[[exchange]]
upstream = "36f592a04529dc1fbcb791b0d166f9f3"
downstream = "c236b8d78d6f266597f918c317358f20"
gate = 0
partitioner = "REBALANCE"
type = "binary_row<k:string,cnt:bigint,slow_cnt:bigint>"
"""


def test_cli_refuses_swapped_partitions_writing_nothing(ckpt, tmp_path):
    schema = tmp_path / "swapped.toml"
    schema.write_text(SWAPPED)
    destination = tmp_path / "out"
    code, _, err = ckpt("rescale", str(SQL.checkpoint), str(destination), "-p", "3", "--schema", str(schema), "--engine", "local")
    assert code == 2 and "contradicted by the bytes" in err and "Traceback" not in err
    assert not destination.exists()
    code, out, _ = ckpt("verify", str(SQL.checkpoint), "--schema", str(schema), "--engine", "local", "--json")
    framing = [p["message"] for p in json.loads(out)["problems"] if p["check"] == "record-framing"]
    assert code != 0 and any("contradicted by the bytes" in m for m in framing)
