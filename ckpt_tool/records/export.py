"""``ckpt records``, the records side: the Parquet file's schema and the records of channels as
an Arrow table.

A row says where the record is (exchange, upstream and downstream subtask, gate and input
channel, its position in the channel), what it is (timestamp, value size, the decoded value
where the record type is known, else its raw bytes) and, on keyed exchanges, its key (printable),
the key's hash, key group and the subtask owning that key group, so that DuckDB, pandas or Spark
SQL can answer "which keys are stuck in flight?". The operation (tasks on the engine, the one
output file) is ckpt_tool.ops.records.

Records are decoded one at a time from views of their channels' bytes (a record is never copied
to be decoded), and the Parquet writers keep no statistics of the value and key
columns: statistics copy each column's largest value, which for a record of hundreds of MiB
cost several times its size in memory.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from ckpt_tool.errors import CkptError
from ckpt_tool.records.batch import ChannelRecords, murmur_key_groups
from ckpt_tool.records.elements import RECORD_WITH_TIMESTAMP
from ckpt_tool.records.keys import operator_index_for_key_group
from ckpt_tool.records.schema import Exchange
from ckpt_tool.records.types import BinaryArray, BinaryMap, BinaryRow, DataType, Row, SqlTimestamp, decode_value, parse_type
from ckpt_tool.records.types.serializers import EnumValue

ROWS_PER_GROUP = 64 * 1024


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


# Columns whose values are bounded by the metadata; the others (key, value, raw_value) may hold a
# record's whole bytes and get no statistics.
STATISTICS_COLUMNS = [name for name, _ in BASE_FIELDS if name != "key"]


def writer_options() -> dict[str, Any]:
    """Options of every Parquet writer of ``ckpt records``."""
    return {"write_statistics": STATISTICS_COLUMNS, "use_dictionary": STATISTICS_COLUMNS}


# --- records as columns ----------------------------------------------------------------------------


def _decoder(exchange: Exchange):
    """(value bytes, offset) -> decoded value, for the exchange's record type."""
    if exchange.record_type == "avro":
        from ckpt_tool.records.avro import AvroReader

        reader = AvroReader(exchange.avro_schema or "null")
        return lambda raw, offset: json.dumps(reader.read(raw, offset), default=str, ensure_ascii=False)
    t = parse_type(exchange.record_type or "")
    return lambda raw, offset: decode_value(t, raw, offset)[0]


class Decoding:
    """How an exchange's records are decoded (its key function, value decoder and value type)
    and where their values go (``value_field``: "" for the value column itself, a field of it, or
    None for raw bytes), made once per exchange and engine task, not once per channel (a job at
    parallelism p has p²)."""

    __slots__ = ("avro", "decode", "key_of", "value_field", "value_type")

    def __init__(self, exchange: Exchange, value_field: Optional[str]) -> None:
        self.value_field = value_field
        self.key_of = exchange.key_function() if exchange.keyed else None
        self.decode = _decoder(exchange) if value_field is not None else None
        self.value_type = _value_type(exchange)
        self.avro = self.value_type is not None and self.value_type.name == "avro"


def record_columns(
    records: ChannelRecords,
    indices: np.ndarray,
    element_index: np.ndarray,
    where: dict[str, Any],
    decoding: Decoding,
    max_parallelism: int,
    parallelism: int,
) -> dict[str, Any]:
    """Records ``indices`` of ``records`` (the elements of one or many channels of one exchange)
    as columns (by name; ``table`` makes them rows of the file's schema), decoded as the
    exchange's ``decoding`` says. ``element_index``: each one's position in its channel;
    ``where``: the columns equal for every row (exchange, operators, gate) as values, and those of
    each row's channel (subtasks, input channel) as arrays, one value per row; an error names the
    exchange, the channel and the element. The columns hold no reference to the channels' bytes, which
    the caller may drop before ``table``."""
    starts = (records.starts + 4)[indices].tolist()
    value_starts = records.value_starts()[indices]
    ends = records.ends[indices]
    count = len(indices)
    key_of, decode, value_type, avro = decoding.key_of, decoding.decode, decoding.value_type, decoding.avro
    value_field = decoding.value_field
    hashes, printable, values, raw, timestamps = [], [], [], [], []
    data = records.data
    view = memoryview(data)
    number = 0
    try:
        # ``number``: the element an error stopped at, which the except clause names
        for number, (start, value_start, end) in enumerate(zip(starts, value_starts.tolist(), ends.tolist())):  # noqa: B007
            timestamps.append(
                int.from_bytes(data[start + 1 : start + 9], "big", signed=True) if data[start] == RECORD_WITH_TIMESTAMP else None
            )
            element = view[start:end]  # the record's bytes where they are, not a copy
            if key_of is not None:
                key_hash, key = key_of(element, value_start - start)  # type: ignore[arg-type]  # any bytes-like
                hashes.append(key_hash)
                printable.append(json.dumps(key, default=str, ensure_ascii=False))
            if decode is not None:
                decoded = decode(element, value_start - start)
                values.append(decoded if avro else arrow_value(value_type, decoded))  # type: ignore[arg-type]
                del decoded
            else:
                raw.append(data[value_start:end])
            del element
    except CkptError as exc:
        channel = f"channel {int(where['upstream_subtask'][number])} -> {int(where['downstream_subtask'][number])}"
        raise type(exc)(f"{where['exchange']}, {channel}: stream element {int(element_index[number])}: {exc}") from exc
    finally:
        view.release()
    codes = np.asarray(hashes, dtype=np.int64)
    groups = murmur_key_groups(codes.astype(np.uint32), max_parallelism)
    owners = operator_index_for_key_group(max_parallelism, parallelism, groups.astype(np.int64))
    columns: dict[str, Any] = {name: value if isinstance(value, np.ndarray) else [value] * count for name, value in where.items()}
    columns["element_index"] = element_index
    columns["timestamp"] = timestamps
    columns["value_size"] = ends - value_starts
    if key_of is not None:
        columns["key"] = printable
        columns["key_hash"] = codes.astype(np.uint32).view(np.int32)  # Java's int, as the key's hashCode
        columns["key_group"] = groups
        columns["owning_subtask"] = owners
    if value_field is None:
        columns["raw_value"] = raw
    else:
        columns["value"] = values if value_field == "" else [{value_field: v} for v in values]
    return columns


def joined_columns(many: list[dict[str, Any]]) -> dict[str, Any]:
    """``record_columns`` of several parts of one exchange (the same column names) as the
    columns of all their rows, one after another: ``table`` then converts each column once."""
    if len(many) == 1:
        return many[0]
    result: dict[str, Any] = {}
    for name, first in many[0].items():
        if isinstance(first, np.ndarray):
            result[name] = np.concatenate([columns[name] for columns in many])
        else:
            result[name] = [value for columns in many for value in columns[name]]
    return result


def table(columns: dict[str, Any], schema: pa.Schema) -> pa.Table:
    """``record_columns`` as rows of the file's schema (columns it lacks are null); the columns'
    lists are emptied as they are converted, so a value is never held twice for long."""
    count = len(columns["element_index"])
    arrays = []
    for field in schema:
        values = columns.pop(field.name, None)
        arrays.append(pa.nulls(count, field.type) if values is None else pa.array(values, type=field.type))
        del values
    return pa.Table.from_arrays(arrays, schema=schema)
