"""``ckpt records``: every in-flight record of the described exchanges, one Parquet row each.

A row says where the record is (exchange, upstream and downstream subtask, gate and input
channel, its position in the channel), what it is (timestamp, value size, the decoded value
where the record type is known, else its raw bytes) and, on keyed exchanges, its key (printable),
the key's hash, key group and the subtask owning that key group, so that DuckDB, pandas or Spark
SQL can answer "which keys are stuck in flight?".

The work runs on the session's engine, one task per logical channel: a task decodes its channel
and writes its rows to a part file beside the output; the driver then copies the parts, row group
by row group, into one file with one ``ParquetWriter``. Memory stays bounded by a channel.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ckpt_tool.engine import Engine, Progress
from ckpt_tool.engine.tasks import ChannelTask, channel_tasks, naming, read_channel
from ckpt_tool.errors import CkptError
from ckpt_tool.flink.channel_state import ChannelStateReader, pointwise_channels
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.plan import POINTWISE_PARTITIONERS
from ckpt_tool.records.batch import murmur_key_groups
from ckpt_tool.records.elements import RECORD_WITH_TIMESTAMP
from ckpt_tool.records.keys import operator_index_for_key_group
from ckpt_tool.records.schema import Exchange
from ckpt_tool.records.types import BinaryArray, BinaryMap, BinaryRow, DataType, Row, SqlTimestamp, decode_value, parse_type
from ckpt_tool.records.types.serializers import EnumValue

ROWS_PER_GROUP = 64 * 1024


class ExportError(CkptError):
    """The records could not be written."""


# --- value types ----------------------------------------------------------------------------------

_SCALARS = {
    "long": pa.int64(),
    "int": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "boolean": pa.bool_(),
    "double": pa.float64(),
    "float": pa.float32(),
    "char": pa.string(),
    "string": pa.string(),
    "bytes": pa.binary(),
    "instant": pa.string(),
    "local_date": pa.string(),
    "local_time": pa.string(),
    "local_date_time": pa.string(),
    "enum": pa.string(),
    "avro": pa.string(),  # the record as JSON
    "date": pa.date32(),
    "time": pa.time32("ms"),
}


def arrow_type(t: DataType) -> pa.DataType:
    """The Arrow type of a decoded value of ckpt type ``t``."""
    name = t.name
    if name in _SCALARS:
        return _SCALARS[name]
    if name == "decimal":
        return pa.decimal128(t.precision, t.scale)
    if name in ("timestamp", "timestamp_ltz"):
        return pa.timestamp("ns" if t.precision > 6 else "us", tz="UTC" if name == "timestamp_ltz" else None)
    if name in ("array", "list"):
        return pa.list_(arrow_type(t.fields[0]))
    if name in ("map", "multiset"):
        key, value = (t.fields[0], DataType("int")) if name == "multiset" else t.fields
        return pa.list_(pa.struct([("key", arrow_type(key)), ("value", arrow_type(value))]))
    names = list(t.field_names) if t.field_names and name != "enum" else [f"f{i}" for i in range(len(t.fields))]
    fields = [(n, arrow_type(f)) for n, f in zip(names, t.fields)]
    if name == "row" and not t.sql:
        return pa.struct([("kind", pa.string()), *fields])
    return pa.struct(fields)  # tuple, pojo, binary_row, SQL row


def arrow_value(t: DataType, value: Any) -> Any:
    """A decoded value as the Python object pyarrow builds ``arrow_type(t)`` from."""
    if value is None:
        return None
    name = t.name
    if name in ("timestamp", "timestamp_ltz"):
        stamp: SqlTimestamp = value
        if t.precision > 6:
            return stamp.millisecond * 1_000_000 + stamp.nano_of_millisecond
        return stamp.millisecond * 1000 + stamp.nano_of_millisecond // 1000
    if name in ("instant", "local_date", "local_time", "local_date_time"):
        return value.isoformat()
    if name == "enum":
        enum: EnumValue = value
        return enum.name if enum.name is not None else str(enum.ordinal)
    if name == "bytes":
        return bytes(value)
    if name in ("array", "list"):
        items = value.values() if isinstance(value, BinaryArray) else value
        return [arrow_value(t.fields[0], v) for v in items]
    if name in ("map", "multiset"):
        key, val = (t.fields[0], DataType("int")) if name == "multiset" else t.fields
        items = value.items() if isinstance(value, BinaryMap) else value
        return [{"key": arrow_value(key, k), "value": arrow_value(val, v)} for k, v in items]
    if name in ("binary_row",) or (name == "row" and t.sql):
        row: BinaryRow = value
        return _struct(t, row.values())
    if name == "row":
        java_row: Row = value
        return {"kind": ("+I", "-U", "+U", "-D")[java_row.kind], **_struct(t, java_row.fields)}
    if name == "tuple":
        return _struct(t, list(value))
    if name == "pojo":
        return _struct(t, [value[n] for n in t.field_names])
    return value


def _struct(t: DataType, values: list[Any]) -> dict:
    names = list(t.field_names) if t.field_names else [f"f{i}" for i in range(len(t.fields))]
    return {n: arrow_value(f, v) for n, f, v in zip(names, t.fields, values)}


def _value_type(exchange: Exchange) -> Optional[DataType]:
    if not exchange.record_type:
        return None
    return DataType("avro") if exchange.record_type == "avro" else parse_type(exchange.record_type)


# --- the file's schema ----------------------------------------------------------------------------

BASE_FIELDS = [
    ("exchange", pa.string()),
    ("upstream_operator", pa.string()),
    ("downstream_operator", pa.string()),
    ("gate", pa.int32()),
    ("upstream_subtask", pa.int32()),
    ("downstream_subtask", pa.int32()),
    ("input_channel", pa.int32()),
    ("element_index", pa.int64()),
    ("timestamp", pa.int64()),
    ("value_size", pa.int32()),
    ("key", pa.string()),
    ("key_hash", pa.int32()),
    ("key_group", pa.int32()),
    ("owning_subtask", pa.int32()),
]


def file_schema(exchanges: list[Exchange]) -> tuple[pa.Schema, dict[int, str]]:
    """The file's schema and, per typed exchange, the name of its value field. With one record
    type, ``value`` is a struct of it; with several, ``value`` has one field per exchange
    (``exchange_<index>``). ``raw_value`` holds the bytes of records without a type."""
    types = {i: _value_type(e) for i, e in enumerate(exchanges)}
    typed = {i: t for i, t in types.items() if t is not None}
    fields = list(BASE_FIELDS)
    places: dict[int, str] = {}
    if len({str(t) for t in typed.values()}) == 1:
        fields.append(("value", arrow_type(next(iter(typed.values())))))
        places = dict.fromkeys(typed, "")
    elif typed:
        fields.append(("value", pa.struct([(f"exchange_{i}", arrow_type(t)) for i, t in typed.items()])))
        places = {i: f"exchange_{i}" for i in typed}
    fields.append(("raw_value", pa.binary()))
    return pa.schema(fields), places


# --- tasks ------------------------------------------------------------------------------------------


@dataclass
class ExportTask:
    channel: ChannelTask
    exchange: Exchange
    label: str
    input_channel: int
    value_field: Optional[str]  # "" for the value column itself, a field of it, or None (raw bytes)
    part: str


def _decoder(exchange: Exchange):
    """(value bytes, offset) -> decoded value, for the exchange's record type."""
    if exchange.record_type == "avro":
        from ckpt_tool.records.avro import AvroReader

        reader = AvroReader(exchange.avro_schema or "null")
        return lambda raw, offset: json.dumps(reader.read(raw, offset), default=str, ensure_ascii=False)
    t = parse_type(exchange.record_type or "")
    return lambda raw, offset: decode_value(t, raw, offset)[0]


def export_channel(task: ExportTask, schema: pa.Schema) -> tuple[str, int]:
    """Write one logical channel's records to ``task.part``; returns (part, rows)."""
    channel, exchange = task.channel, task.exchange
    with (
        ChannelStateReader() as reader,
        naming(f"{task.label}, channel {channel.upstream_subtask} -> {channel.downstream_subtask}"),
    ):
        records = read_channel(reader, channel)
        indices = np.flatnonzero(records.is_record)
        value_offsets = (records.value_starts() - records.starts - 4)[indices].tolist()
        elements = [records.element(i) for i in indices.tolist()]
        count = len(elements)
        key_of = exchange.key_function() if exchange.keyed else None
        hashes, printable = [], []
        if key_of is not None:
            for number, (element, offset) in enumerate(zip(elements, value_offsets)):
                with naming(f"stream element {int(indices[number])}"):
                    key_hash, key = key_of(element, offset)
                hashes.append(key_hash)
                printable.append(json.dumps(key, default=str, ensure_ascii=False))
        groups = murmur_key_groups(np.asarray(hashes, dtype=np.int64).astype(np.uint32), channel.max_parallelism)
        owners = operator_index_for_key_group(channel.max_parallelism, channel.parallelism, groups.astype(np.int64))
        columns: dict[str, Any] = {
            "exchange": [task.label] * count,
            "upstream_operator": [exchange.upstream_id] * count,
            "downstream_operator": [exchange.downstream_id] * count,
            "gate": [exchange.gate] * count,
            "upstream_subtask": [channel.upstream_subtask] * count,
            "downstream_subtask": [channel.downstream_subtask] * count,
            "input_channel": [task.input_channel] * count,
            "element_index": indices.tolist(),
            "timestamp": [
                int.from_bytes(e[1:9], "big", signed=True) if e[0] == RECORD_WITH_TIMESTAMP else None for e in elements
            ],
            "value_size": [len(e) - o for e, o in zip(elements, value_offsets)],
            "key": printable if key_of else [None] * count,
            "key_hash": [h - (1 << 32) if h >= 1 << 31 else h for h in (x & 0xFFFFFFFF for x in hashes)]
            if key_of
            else [None] * count,
            "key_group": groups.tolist() if key_of else [None] * count,
            "owning_subtask": owners.tolist() if key_of else [None] * count,
        }
        if task.value_field is None:
            columns["raw_value"] = [e[o:] for e, o in zip(elements, value_offsets)]
        else:
            decode = _decoder(exchange)
            t = _value_type(exchange)
            assert t is not None
            values = []
            for number, (element, offset) in enumerate(zip(elements, value_offsets)):
                with naming(f"stream element {int(indices[number])}"):
                    decoded = decode(element, offset)
                values.append(decoded if t.name == "avro" else arrow_value(t, decoded))
            columns["value"] = values if task.value_field == "" else [{task.value_field: v} for v in values]
        for name in schema.names:
            columns.setdefault(name, [None] * count)
        table = pa.Table.from_pydict({n: columns[n] for n in schema.names}, schema=schema)
    pq.write_table(table, task.part, row_group_size=ROWS_PER_GROUP)
    return task.part, count


@dataclass
class ExportReport:
    path: str
    records: int
    channels: int
    exchanges: int

    def as_dict(self) -> dict:
        return {"file": self.path, "records": self.records, "channels": self.channels, "exchanges": self.exchanges}


def _input_channels(checkpoint: Checkpoint, exchange: Exchange) -> dict[tuple[int, int], int]:
    """(u, d) -> the input channel of d that u feeds, on pointwise edges (else it is u)."""
    if exchange.partitioner not in POINTWISE_PARTITIONERS or not exchange.upstream_id:
        return {}
    up = checkpoint.metadata.operator(exchange.upstream_id).parallelism
    down = checkpoint.metadata.operator(exchange.downstream_id).parallelism
    return {(u, d): c for u, d, c, _ in pointwise_channels(up, down)}


def export_records(
    checkpoint: Checkpoint, exchanges: list[Exchange], engine: Engine, out: str, progress: Progress = None
) -> ExportReport:
    """Write every in-flight record of ``exchanges`` to the Parquet file ``out`` (a local path)."""
    if not exchanges:
        raise ExportError("no exchange to export: give --plan, --sql-plan and/or --schema")
    schema, places = file_schema(exchanges)
    directory = os.path.dirname(os.path.abspath(out)) or "."
    if not os.path.isdir(directory):
        raise ExportError(f"cannot write {out}: {directory} is not a directory")
    parts = tempfile.mkdtemp(prefix=".ckpt-records-", dir=directory)
    try:
        tasks = []
        pointwise = {i: _input_channels(checkpoint, e) for i, e in enumerate(exchanges)}
        for number, channel in enumerate(channel_tasks(checkpoint, exchanges)):
            exchange = exchanges[channel.exchange_index]
            key = (channel.upstream_subtask, channel.downstream_subtask)
            tasks.append(
                ExportTask(
                    channel,
                    exchange,
                    checkpoint.metadata.exchange_label(exchange.upstream_id, exchange.downstream_id),
                    pointwise[channel.exchange_index].get(key, channel.upstream_subtask),
                    places.get(channel.exchange_index),
                    os.path.join(parts, f"part-{number:06d}.parquet"),
                )
            )
        written = engine.map(lambda task: export_channel(task, schema), tasks, progress, [t.channel.size for t in tasks])
        records = 0
        temporary = os.path.join(parts, "all.parquet")
        with pq.ParquetWriter(temporary, schema) as writer:
            for part, count in written:
                records += count
                source = pq.ParquetFile(part)
                for group in range(source.num_row_groups):
                    writer.write_table(source.read_row_group(group))
        os.replace(temporary, out)
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc}") from exc
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    return ExportReport(out, records, len(tasks), len(exchanges))
