"""``ckpt records``: the Parquet file's rows equal the records Flink's own reader lists for every
fixture (fixtures/java/ReferenceReader.java, in expected.json): per logical channel the same
records in the same order, with the same timestamps, sizes, key hashes, key groups and owners."""

from __future__ import annotations

import json
import struct
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_types import flink_string

from catalog import ALL_FIXTURES
from ckpt_tool.engine import LocalEngine
from ckpt_tool.ops.records import ExportError, export_records
from ckpt_tool.records.batch import frame_channels
from ckpt_tool.records.elements import RECORD
from ckpt_tool.records.export import Decoding, file_schema, record_columns, table
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


def test_columns_read_at_once_equal_records_decoded_one_by_one(inflight, tmp_path, monkeypatch):
    """Every fixture Flink wrote: the file ``ckpt records`` writes, its values of flat types and
    its SQL rows of numbers and strings read a column at a time, holds row for row what decoding
    every record one by one writes."""
    from ckpt_tool.records import export

    session = Session.open(str(inflight.checkpoint), inflight.schema, inflight.plan)
    tables = []
    for flat in (True, False):
        if not flat:
            monkeypatch.setattr(export.FlatValues, "of", classmethod(lambda cls, value_type: None))
            monkeypatch.setattr(export.RowValues, "of", classmethod(lambda cls, value_type, key=(): None))
        out = tmp_path / f"records-{flat}.parquet"
        export_records(session.checkpoint, session.described_exchanges, LocalEngine(), str(out))
        tables.append(pq.read_table(out))
    assert tables[0].equals(tables[1])


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
    assert good["value"].to_pylist() == [1, 2, 3] and good["exchange"] == ["up -> down"] * 3
    assert good["upstream_subtask"].tolist() == [3, 3, 5] and good["downstream_subtask"].tolist() == [0, 0, 2]
    assert good["element_index"].tolist() == [0, 1, 0]
    with pytest.raises(RecordDecodeError, match=r"^up -> down, channel 5 -> 2: stream element 1: record ends after"):
        columns([element(long(1)) * 2, element(long(2)), element(long(3)) + element(b"\0\0\0\1")])


def _java_string(text) -> bytes:
    """StringValue.writeString, null as 0."""
    return b"\0" if text is None else flink_string(text)


TEXTS = ["", "a", "user-7", None, "é", "x" * 300, "😀 x", "y" * 127, "plain"]


def _pojo(i: int) -> bytes:
    # pojo<amount:double,id:long,name:string> (fields by name): flags 0x02, then a null flag and a value per field
    amount = b"\x01" if i % 7 == 3 else b"\x00" + struct.pack(">d", i / 4)
    return b"\x02" + amount + b"\x00" + struct.pack(">q", i * 31) + b"\x00" + _java_string(TEXTS[i % len(TEXTS)])


FLAT_CASES = {
    "tuple<long,string>": (("f0",), lambda i: struct.pack(">q", i - 20) + _java_string(TEXTS[i % len(TEXTS)])),
    "tuple<int,boolean,double,string>": (
        ("f0", "f1"),
        lambda i: struct.pack(">i?d", -i, i % 3 == 0, i * 0.5) + _java_string(TEXTS[i % len(TEXTS)]),
    ),
    "pojo<name:string,id:long,amount:double>": (("id",), _pojo),
    "string": (("value",), lambda i: _java_string(TEXTS[i % len(TEXTS)])),
    "long": (("value",), lambda i: struct.pack(">q", i * 1_000_003)),
    "tuple<double,float>": (("f0",), lambda i: struct.pack(">df", i / 3, -i / 7)),
}


@pytest.mark.parametrize("record_type", sorted(FLAT_CASES))
def test_flat_values_read_as_columns_equal_the_values_decoded_one_by_one(record_type):
    """Values of a flat type are read a column at a time where their bytes allow it (ASCII
    strings, no null fields) and decoded one by one where not (a string of other text, a POJO's
    null field): each row, and its key, timestamp and printed key, is what decoding every record
    one by one gives, also where the file's value holds the fields of several exchanges."""
    key, value = FLAT_CASES[record_type]

    def element(i: int) -> bytes:
        body = (bytes([RECORD]) if i % 4 else b"\0" + struct.pack(">q", 1000 + i)) + value(i)
        return struct.pack(">i", len(body)) + body

    framed = frame_channels([b"".join(element(i) for i in range(60)), b"", b"".join(element(i) for i in range(60, 75))])
    indices = np.flatnonzero(framed.records.is_record)
    channel = framed.channel[indices]
    exchange = Exchange("up", "down", record_type=record_type, key=key)
    other = Exchange("up", "down", gate=1, record_type="tuple<long,long>", key=("f0",))
    for exchanges, place in (([exchange], ""), ([exchange, other], "exchange_0")):
        schema, places = file_schema(exchanges)
        assert places[0] == place
        rows = []
        for flat in (True, False):
            decoding = Decoding(exchange, place)
            assert decoding.flat is not None
            if not flat:
                decoding.flat = decoding.key_fields = None
            where = {
                "exchange": "up -> down",
                "upstream_subtask": np.array([3, 4, 5])[channel],
                "downstream_subtask": np.zeros(len(channel), dtype=np.int64),
            }
            columns = record_columns(framed.records, indices, indices - framed.first[channel], where, decoding, 128, 3)
            rows.append(table(columns, schema).to_pylist())
        assert len(rows[0]) == 75
        assert rows[0] == rows[1]
    flat = Decoding(exchange, "").flat
    assert flat is not None
    decoded = flat.columns(framed.records, indices).decoded
    if "string" in record_type or "pojo" in record_type:
        assert decoded.any() and not decoded.all()  # both paths taken
    else:
        assert decoded.all()


def test_types_that_are_not_flat_are_decoded_one_by_one():
    for record_type in ("tuple<long,char>", "list<long>", "tuple<string,long>", "row<long,string>", "bytes", "char"):
        assert Decoding(Exchange("up", "down", record_type=record_type, key=()), "").flat is None


@pytest.mark.parametrize(
    "record_type, key, value",
    [
        ("tuple<string,long>", ("f0",), lambda i: _java_string(f"k-{i % 5}é") + struct.pack(">q", i)),
        ("tuple<string,long>", ("f1", "f0"), lambda i: _java_string(f"k-{i}") + struct.pack(">q", -i)),
        ("row<long,string>", ("f1",), lambda i: b"\0" + struct.pack(">q", i) + _java_string(TEXTS[i % len(TEXTS)] or "n")),
    ],
)
def test_keys_of_values_decoded_once_equal_the_keys_read_from_their_bytes(record_type, key, value):
    """Where a value is decoded one by one, its key is taken from the decoded value (not decoded a
    second time): the same hash, key group and printed key as the key function on the bytes."""
    framed = frame_channels([b"".join(struct.pack(">i", 1 + len(value(i))) + bytes([RECORD]) + value(i) for i in range(30))])
    indices = np.flatnonzero(framed.records.is_record)
    exchange = Exchange("up", "down", record_type=record_type, key=key)
    decoding = Decoding(exchange, "")
    assert decoding.flat is None
    where = {"exchange": "up -> down", "upstream_subtask": np.zeros(30, np.int64), "downstream_subtask": np.zeros(30, np.int64)}
    columns = record_columns(framed.records, indices, indices, where, decoding, 128, 3)
    key_of = exchange.key_function()
    want = [key_of(framed.records.element(i), 1) for i in indices.tolist()]
    assert columns["key_hash"].tolist() == [h if h < 2**31 else h - 2**32 for h, _ in want]
    assert columns["key"] == [json.dumps(k, ensure_ascii=False) for _, k in want]


SQL_TEXTS = ["", "a", "user-7", None, "üser-15", "x" * 40, "😀 x", "seven77", b"\xff\xfe", b"\x80abc", "naïve"]


@pytest.mark.parametrize(
    "record_type, key",
    [
        ("binary_row<id:bigint,name:string,score:double,ok:boolean>", ("id",)),
        ("binary_row<uid:int,name:string,tag:string>", ("uid", "name")),
        ("binary_row<ok:boolean,n:smallint,t:tinyint,f:float>", ("ok", "n")),
        ("binary_row<name:string,id:bigint>", ()),
        ("binary_row<d:date,t:time,ts:timestamp(3),lt:timestamp_ltz(3),amount:decimal(10,2),id:bigint>", ("id",)),
    ],
)
def test_sql_rows_read_as_columns_equal_the_rows_decoded_one_by_one(record_type, key):
    """SQL rows of numbers and strings are read a column at a time, their keys of numbers hashed
    so, where their bytes allow it (whole UTF-8, no null key field), and decoded one by one where
    not (invalid UTF-8, a null key field): each row, and its key, printed key, hash and key group,
    is what decoding every record one by one gives."""
    from decimal import Decimal

    from ckpt_tool.records.types import SqlTimestamp, parse_type
    from ckpt_tool.records.types.binary import build_binary_row

    value_type = parse_type(record_type)

    def field(t, i: int, place: int):
        if (i + place) % 7 == 3:
            return None
        if t.name == "string":
            text = SQL_TEXTS[(i + place) % len(SQL_TEXTS)]
            return text if isinstance(text, bytes) else text.encode("utf-8") if text is not None else None
        if t.name in ("timestamp", "timestamp_ltz"):
            return SqlTimestamp(1_700_000_000_000 + i * 1_234 - 5_000_000 * (i % 2))
        if t.name == "decimal":
            return Decimal(i * 7 - 30) / 4
        numbers = {"long": i * 1_000_003 - 50, "int": -i, "double": i / 3, "short": i - 9, "byte": i % 100, "float": i / 8}
        numbers |= {"date": 19_000 + i - 40, "time": i * 3_600_123 % 86_400_000}
        return i % 3 == 0 if t.name == "boolean" else numbers[t.name]

    def element(i: int) -> bytes:
        row = build_binary_row(value_type.fields, [field(t, i, p) for p, t in enumerate(value_type.fields)], kind=i % 4).data
        body = bytes([RECORD]) + struct.pack(">i", len(row)) + row
        return struct.pack(">i", len(body)) + body

    framed = frame_channels([b"".join(element(i) for i in range(70))])
    indices = np.flatnonzero(framed.records.is_record)
    exchange = Exchange("up", "down", record_type=record_type, key=key)
    where = {"exchange": "up -> down", "upstream_subtask": np.zeros(70, np.int64), "downstream_subtask": np.zeros(70, np.int64)}
    schema, _ = file_schema([exchange])
    rows = []
    for flat in (True, False):
        decoding = Decoding(exchange, "")
        assert decoding.flat is not None
        if not flat:
            decoding.flat = decoding.key_fields = None
        rows.append(table(record_columns(framed.records, indices, indices, where, decoding, 128, 3), schema).to_pylist())
    assert rows[0] == rows[1]
    decoded = Decoding(exchange, "").flat.columns(framed.records, indices).decoded
    assert decoded.any() and (not decoded.all() or key in (("ok", "n"), ("id",)))
    for wide in ("decimal(20,2)", "timestamp(6)", "array<int>"):  # not in their slot: one by one
        assert Decoding(Exchange("up", "down", record_type=f"binary_row<a:{wide},id:bigint>", key=("id",)), "").flat is None
