"""``ckpt records``: the Parquet file's rows equal the records Flink's own reader lists for every
fixture (fixtures/java/ReferenceReader.java, in expected.json): per logical channel the same
records in the same order, with the same timestamps, sizes, key hashes, key groups and owners."""

from __future__ import annotations

import struct
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest

from catalog import ALL_FIXTURES
from ckpt_tool.engine import LocalEngine
from ckpt_tool.ops.records import ExportError, export_records
from ckpt_tool.records.batch import frame_channels
from ckpt_tool.records.elements import RECORD
from ckpt_tool.records.export import Decoding, record_columns
from ckpt_tool.records.schema import Exchange
from ckpt_tool.records.types.binary import RecordDecodeError
from ckpt_tool.session import Session


def test_rows_equal_flinks_records(inflight, tmp_path):
    fixture = inflight
    session = Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan)
    out = tmp_path / "records.parquet"
    report = export_records(session.checkpoint, session.described_exchanges, LocalEngine(), str(out))
    rows = pq.read_table(out).to_pylist()
    assert report.records == len(rows) > 0
    got = defaultdict(list)
    for row in rows:
        channel = (
            row["upstream_operator"],
            row["downstream_operator"],
            row["gate"],
            row["upstream_subtask"],
            row["downstream_subtask"],
        )
        header = 1 + (8 if row["timestamp"] is not None else 0)
        got[channel].append(
            (
                row["element_index"],
                row["timestamp"],
                row["value_size"] + header,
                row["key_hash"],
                row["key_group"],
                row["owning_subtask"],
            )
        )
        assert (row["value"] is None) != (row["raw_value"] is None)  # decoded, or raw where the type is unknown
    want = {}
    for c in fixture.expected["logical_channels"]:
        if "elements" in c:
            records = [
                (i, e["timestamp"], e["size"], e["key_hash"], e["key_group"], e["operator_index"])
                for i, e in enumerate(c["elements"])
                if e["kind"] == "record"
            ]
            if records:
                want[(c["upstream"], c["downstream"], c.get("gate", 0), c["upstream_subtask"], c["downstream_subtask"])] = records
    described = {(e.upstream_id, e.downstream_id) for e in session.described_exchanges}
    assert {k: v for k, v in want.items() if k[:2] in described} == dict(got)


def test_values_are_decoded_structs(tmp_path):
    fixture = next(f for f in ALL_FIXTURES if f.name == "flink23-sqltypes-p2")
    session = Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan)
    out = tmp_path / "records.parquet"
    export_records(session.checkpoint, session.described_exchanges, LocalEngine(), str(out))
    table = pq.read_table(out)
    keyed = [r for r in table.to_pylist() if r["key"] is not None]
    assert keyed
    for row in keyed:
        value = next(v for v in row["value"].values() if v is not None)
        assert row["key"] == f'["{value["user_name"]}", "{value["region"]}", "{value["bucket"]}"]'
        assert value["r"]["EXPR$1"].startswith("n-") and value["m"][0]["key"] == "k" and len(value["arr"]) == 2


def test_cli_writes_the_file(ckpt, tmp_path):
    fixture = next(f for f in ALL_FIXTURES if f.name == "flink23-sqltypes-p2")
    out = tmp_path / "r.parquet"
    code, stdout, err = ckpt("records", str(fixture.checkpoint), "--sql-plan", str(fixture.directory / "compiled-plan.json"),
                             "--engine", "local", "--out", str(out))  # fmt: skip
    assert code == 0, err
    assert "330 records of 2 exchanges" in stdout and pq.read_table(out).num_rows > 0


def test_nothing_to_export(tmp_path):
    fixture = next(f for f in ALL_FIXTURES if f.name == "flink23-hashmap-p2")
    session = Session.open(str(fixture.checkpoint))
    with pytest.raises(ExportError, match="no exchange to export"):
        export_records(session.checkpoint, [], LocalEngine(), str(tmp_path / "x.parquet"))


def test_records_of_channels_framed_together_are_named_by_their_own_channel():
    """``ckpt records`` frames an engine task's channels together and decodes their records in one
    run: each row keeps its own channel's subtasks and position, and a record that does not decode
    is named by its channel and its position there, as when channels were decoded one by one."""

    def element(value: bytes) -> bytes:
        return struct.pack(">i", 1 + len(value)) + bytes([RECORD]) + value

    def long(n: int) -> bytes:
        return struct.pack(">q", n)

    exchange = Exchange("up", "down", record_type="long")
    upstream, downstream = np.array([3, 4, 5]), np.array([0, 1, 2])

    def columns(streams: list[bytes]) -> dict:
        framed = frame_channels(streams)
        indices = np.flatnonzero(framed.records.is_record)
        channel = framed.channel[indices]
        where = {"exchange": "up -> down", "upstream_subtask": upstream[channel], "downstream_subtask": downstream[channel]}
        return record_columns(framed.records, indices, indices - framed.first[channel], where, Decoding(exchange, ""), 128, 3)

    good = columns([element(long(1)) + element(long(2)), b"", element(long(3))])
    assert good["value"] == [1, 2, 3] and good["exchange"] == ["up -> down"] * 3
    assert good["upstream_subtask"].tolist() == [3, 3, 5] and good["downstream_subtask"].tolist() == [0, 0, 2]
    assert good["element_index"].tolist() == [0, 1, 0]
    with pytest.raises(RecordDecodeError, match=r"^up -> down, channel 5 -> 2: stream element 1: record ends after"):
        columns([element(long(1)) * 2, element(long(2)), element(long(3)) + element(b"\0\0\0\1")])
