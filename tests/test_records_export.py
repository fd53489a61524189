"""``ckpt records``: the Parquet file's rows equal the records Flink's own reader lists for every
fixture (fixtures/java/ReferenceReader.java, in expected.json): per logical channel the same
records in the same order, with the same timestamps, sizes, key hashes, key groups and owners."""

from __future__ import annotations

from collections import defaultdict

import pyarrow.parquet as pq
import pytest

from catalog import ALL_FIXTURES
from ckpt_tool.engine import LocalEngine
from ckpt_tool.ops.records import ExportError, export_records
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
