"""``ckpt records``, the records side: the Parquet file's schema and the records of channels as
an Arrow table.

A row says where the record is (exchange, upstream and downstream subtask, gate and input
channel, its position in the channel), what it is (timestamp, value size, the decoded value
where the record type is known, else its raw bytes) and, on keyed exchanges, its key (printable),
the key's hash, key group and the subtask owning that key group, so that DuckDB, pandas or Spark
SQL can answer "which keys are stuck in flight?". The operation (tasks on the engine, the one
output file) is ckpt_tool.ops.records.

Values of a flat type (``FlatValues``: a scalar, a string, a tuple or POJO of scalars that may
end in a string) are read a column at a time straight into Arrow arrays; the other records are
decoded one at a time from views of their channels' bytes (a record is never copied to be
decoded), each once for its value and its key. The Parquet writers keep no statistics of the value and key
columns: statistics copy each column's largest value, which for a record of hundreds of MiB
cost several times its size in memory.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from ckpt_tool.errors import CkptError
from ckpt_tool.framing import framing as _framing
from ckpt_tool.records.batch import (
    ChannelRecords,
    FlatColumns,
    FlatValues,
    RowColumns,
    RowValues,
    field_hashes,
    murmur_key_groups,
)
from ckpt_tool.records.elements import RECORD_WITH_TIMESTAMP
from ckpt_tool.records.keys import operator_index_for_key_group
from ckpt_tool.records.schema import Exchange, FieldKey
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
    parallelism p has p²). ``flat``: where the values are of a flat type, how to read them a
    column at a time; ``key_fields``: where the key is fields of such values, which ones."""

    __slots__ = ("avro", "decode", "flat", "key_fields", "key_of", "value_field", "value_type")

    def __init__(self, exchange: Exchange, value_field: Optional[str]) -> None:
        self.value_field = value_field
        self.key_of = exchange.key_function() if exchange.keyed else None
        self.decode = _decoder(exchange) if value_field is not None else None
        self.value_type = _value_type(exchange)
        self.avro = self.value_type is not None and self.value_type.name == "avro"
        flat_typed = self.decode is not None and self.value_type is not None and not self.avro
        self.flat: Optional[FlatValues | RowValues] = None
        self.key_fields: Optional[list[tuple[int, str]]] = None
        own_key = self.key_of is not None and not exchange.decoder
        if flat_typed and self.value_type.name == "binary_row":  # type: ignore[union-attr]
            self.flat = RowValues.of(self.value_type, exchange.key if own_key else ())  # type: ignore[arg-type]
            if self.flat is not None and self.flat.key is not None:
                self.key_fields = [(i, self.flat.types[i]) for i in self.flat.key]
        elif flat_typed:
            self.flat = FlatValues.of(self.value_type)  # type: ignore[arg-type]
            if self.flat is not None and own_key:
                self.key_fields = _flat_key_fields(self.value_type, exchange.key, len(self.flat.leading.places))  # type: ignore[arg-type]


def _flat_key_fields(value_type: DataType, key: tuple, leading: int) -> Optional[list[tuple[int, str]]]:
    """The key's fields (index among the value's leading fixed-width fields, type), where it is
    made of them only."""
    if value_type.name not in ("tuple", "pojo"):
        return [(0, value_type.name)] if leading and list(key) in (["value"], ["*"]) else None
    indices = [value_type.field_index(k) for k in key]
    if not indices or max(indices) >= leading:
        return None
    return [(i, value_type.fields[i].name) for i in indices]


_INTEGERS = frozenset(("long", "int", "short", "byte"))


def _printable(key: Any) -> str:
    """The key as ``ckpt records`` prints it (JSON), with the common scalars without json.dumps."""
    kind = type(key)
    if kind is int:
        return int.__repr__(key)
    if kind is str:
        return json.encoder.encode_basestring(key)  # json.dumps(key, ensure_ascii=False)
    return json.dumps(key, default=str, ensure_ascii=False)


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
    the caller may drop before ``table``.

    Values of a flat type (``FlatValues``: ``Tuple2<Long,String>`` say) are read a column at a
    time, and their keys, where made of their fixed-width fields, hashed so; the other records
    are decoded one by one, each once."""
    count = len(indices)
    key_of, decode, value_type, avro = decoding.key_of, decoding.decode, decoding.value_type, decoding.avro
    # the key of a value decoded already (the decoder and the key read the same type)
    of_value = key_of.of_value if isinstance(key_of, FieldKey) and not avro else None
    value_field = decoding.value_field
    data = records.data
    element_starts, ends = records.element_bounds(indices)
    value_starts = records.value_starts()[indices]
    flat = decoding.flat.columns(records, indices) if decoding.flat is not None else None
    if flat is not None and _text_bytes(flat) >= 1 << 31:
        flat = None  # more string bytes than an Arrow string array holds: one by one (a row group of huge records)
    by_record = np.flatnonzero(~flat.decoded) if flat is not None else np.arange(count)
    keys_by_record = key_of is not None and (flat is None or decoding.key_fields is None)
    hashes = np.zeros(count, dtype=np.int64)
    printable: list[Any] = [None] * count
    values: list[Any] = []
    raw: list[bytes] = []
    # per record: the keys (where not read as columns), the values (where not flat) or their raw bytes
    looped = np.arange(count) if keys_by_record or decode is None else by_record
    decoding_mask = np.zeros(count, dtype=bool)
    decoding_mask[by_record] = decode is not None
    number = 0
    view = memoryview(data)
    try:
        # ``number``: the element an error stopped at, which the except clause names
        for number, start, value_start, end, decodes in zip(
            looped.tolist(),
            element_starts[looped].tolist(),
            value_starts[looped].tolist(),
            ends[looped].tolist(),
            decoding_mask[looped].tolist(),
        ):
            element = view[start:end]  # the record's bytes where they are, not a copy
            decoded = None
            if decodes:
                decoded = decode(element, value_start - start)  # type: ignore[misc]
                values.append(decoded if avro else arrow_value(value_type, decoded))  # type: ignore[arg-type]
            elif decode is None:
                raw.append(data[value_start:end])
            if key_of is not None:  # every record's here, or only those of a flat type that are not flat
                if decodes and of_value is not None:
                    key_hash, key = of_value(decoded)
                else:
                    key_hash, key = key_of(element, value_start - start)  # type: ignore[arg-type]  # any bytes-like
                hashes[number] = key_hash
                printable[number] = _printable(key)
            del element, decoded
    except CkptError as exc:
        channel = f"channel {int(where['upstream_subtask'][number])} -> {int(where['downstream_subtask'][number])}"
        raise type(exc)(f"{where['exchange']}, {channel}: stream element {int(element_index[number])}: {exc}") from exc
    finally:
        view.release()
    if key_of is not None and not keys_by_record:
        if isinstance(flat, RowColumns):
            read, shown = _row_keys(decoding.flat, flat, decoding.key_fields)  # type: ignore[arg-type]
        else:
            read, shown = _flat_keys(flat, decoding.key_fields)  # type: ignore[arg-type]
        read_at = np.flatnonzero(flat.decoded)  # type: ignore[union-attr]
        hashes[read_at] = read
        for at, text in zip(read_at.tolist(), shown):
            printable[at] = text
    codes = hashes.astype(np.uint32)
    groups = murmur_key_groups(codes, max_parallelism)
    owners = operator_index_for_key_group(max_parallelism, parallelism, groups.astype(np.int64))
    columns: dict[str, Any] = {name: value if isinstance(value, np.ndarray) else [value] * count for name, value in where.items()}
    columns["element_index"] = element_index
    columns["timestamp"] = _timestamps(records, indices, element_starts)
    columns["value_size"] = ends - value_starts
    if key_of is not None:
        columns["key"] = printable
        columns["key_hash"] = codes.view(np.int32)  # Java's int, as the key's hashCode
        columns["key_group"] = groups
        columns["owning_subtask"] = owners
    if value_field is None:
        columns["raw_value"] = raw
    else:
        value_arrow = arrow_type(value_type)  # type: ignore[arg-type]
        one_by_one = pa.array(values, type=value_arrow)
        del values
        if flat is None:
            array = one_by_one
        else:
            if isinstance(flat, RowColumns):
                columnar = _row_array(value_arrow, flat)
            else:
                columnar = _flat_array(value_type, value_arrow, flat)  # type: ignore[arg-type]
            array = _merged(columnar, one_by_one, flat.decoded)
        columns["value"] = array if value_field == "" else pa.StructArray.from_arrays([array], names=[value_field])
    return columns


def _timestamps(records: ChannelRecords, indices: np.ndarray, element_starts: np.ndarray) -> pa.Array:
    """Each record's timestamp (null where it has none), read a column at a time."""
    stamped = records.tags[indices] == RECORD_WITH_TIMESTAMP
    at = np.ascontiguousarray(element_starts[stamped] + 1, dtype=np.int64)
    stamps = np.zeros(len(indices), dtype=np.int64)
    stamps[stamped] = np.frombuffer(_framing.gather(records.data, at, at + 8), dtype=">i8")
    return pa.array(stamps, mask=~stamped)


def _flat_keys(flat: FlatColumns, key_fields: list[tuple[int, str]]) -> tuple[np.ndarray, list[str]]:
    """The keys of the records of a flat type read a column at a time, from their fixed-width
    fields: their Java hashes and their printed keys (those decoded one by one have theirs)."""
    fields = [flat.fields[i] for i, _ in key_fields]
    if len(fields) == 1:
        show = int.__repr__ if key_fields[0][1] in _INTEGERS else _printable
        shown = list(map(show, fields[0].tolist()))
    else:
        shown = [_printable(list(key)) for key in zip(*(f.tolist() for f in fields))]
    return field_hashes(fields, [name for _, name in key_fields]), shown


def _text_bytes(flat: FlatColumns | RowColumns) -> int:
    """The bytes of the strings a column-at-a-time read holds (an Arrow string array holds 2 GiB)."""
    if isinstance(flat, RowColumns):
        return max((int(f[1][-1]) for f in flat.fields if isinstance(f, tuple)), default=0)
    return int(flat.text_offsets[-1]) if flat.text_offsets is not None else 0


def _row_keys(rows: RowValues, flat: RowColumns, key_fields: list[tuple[int, str]]) -> tuple[np.ndarray, list[str]]:
    """The keys of SQL rows read a column at a time: the hash of each one's key row, and the key
    printed (a JSON list, as the planner's key row prints)."""
    fields = [flat.fields[i].tolist() for i, _ in key_fields]
    if len(fields) == 1 and key_fields[0][1] != "boolean":
        shown = [f"[{int.__repr__(v)}]" for v in fields[0]]
    else:
        shown = [json.dumps(list(key)) for key in zip(*fields)]
    return rows.key_hashes(flat), shown


def _validity(null: Optional[np.ndarray]) -> Optional[pa.Buffer]:
    """An Arrow validity bitmap of the rows not ``null`` (None where none is)."""
    return pa.py_buffer(np.packbits(~null, bitorder="little")) if null is not None and null.any() else None


def _string_array(text: bytes, offsets: np.ndarray, null: Optional[np.ndarray]) -> pa.Array:
    """Strings (UTF-8 bytes one after another, int64 offsets) as an Arrow string array."""
    validity = _validity(null)
    nulls = int(null.sum()) if validity is not None else 0  # type: ignore[union-attr]
    return pa.StringArray.from_buffers(
        len(offsets) - 1, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(text), validity, nulls
    )


def _row_array(value_arrow: pa.DataType, flat: RowColumns) -> pa.Array:
    """SQL rows read a column at a time, as an Arrow struct array of the value's type."""
    children = []
    for values, null, place in zip(flat.fields, flat.nulls, value_arrow):
        mask = null if null.any() else None
        if isinstance(values, tuple):
            children.append(_string_array(values[0], values[1], null))
        elif pa.types.is_timestamp(place.type):  # compact: milliseconds, kept as microseconds
            children.append(pa.array(values * 1000, type=place.type, mask=mask))
        elif pa.types.is_decimal(place.type):  # compact: the unscaled long, as 128 bits
            wide = np.column_stack([values, values >> 63]).astype("<i8")
            children.append(pa.Array.from_buffers(place.type, len(values), [_validity(null), pa.py_buffer(wide.tobytes())]))
        else:
            children.append(pa.array(values, type=place.type, mask=mask))
    return pa.StructArray.from_arrays(children, fields=list(value_arrow))


def _flat_array(value_type: DataType, value_arrow: pa.DataType, flat: FlatColumns) -> pa.Array:
    """The values ``FlatValues`` read, as an Arrow array of the value's type."""
    children = [pa.array(column) for column in flat.fields]
    if flat.text is not None:
        children.append(_string_array(flat.text, flat.text_offsets, flat.text_null))  # type: ignore[arg-type]
    if value_type.name not in ("tuple", "pojo"):
        return children[0]
    return pa.StructArray.from_arrays(children, fields=list(value_arrow))


def _merged(columnar: pa.Array, one_by_one: pa.Array, decoded: np.ndarray) -> pa.Array:
    """The rows of ``columnar`` (where ``decoded``) and ``one_by_one`` (the others), in order."""
    if not len(one_by_one):
        return columnar
    if not len(columnar):
        return one_by_one
    position = np.concatenate([np.flatnonzero(decoded), np.flatnonzero(~decoded)])
    return pa.concat_arrays([columnar, one_by_one]).take(pa.array(np.argsort(position, kind="stable")))


def joined_columns(many: list[dict[str, Any]]) -> dict[str, Any]:
    """``record_columns`` of several parts of one exchange (the same column names) as the
    columns of all their rows, one after another: ``table`` then converts each column once."""
    if len(many) == 1:
        return many[0]
    result: dict[str, Any] = {}
    for name, first in many[0].items():
        if isinstance(first, np.ndarray):
            result[name] = np.concatenate([columns[name] for columns in many])
        elif isinstance(first, pa.Array):
            result[name] = pa.concat_arrays([columns[name] for columns in many])
        else:
            result[name] = [value for columns in many for value in columns[name]]
    return result


def _widened(array: pa.Array, wanted: pa.DataType) -> pa.Array:
    """``array`` as the file's type: a ``value`` struct of one exchange's field gets the other
    exchanges' fields too, null."""
    if array.type == wanted:
        return array
    present = {array.type.field(i).name: array.field(i) for i in range(array.type.num_fields)}
    children = [present[f.name] if f.name in present else pa.nulls(len(array), f.type) for f in wanted]
    return pa.StructArray.from_arrays(children, fields=list(wanted))


def table(columns: dict[str, Any], schema: pa.Schema) -> pa.Table:
    """``record_columns`` as rows of the file's schema (columns it lacks are null); the columns'
    lists are emptied as they are converted, so a value is never held twice for long."""
    count = len(columns["element_index"])
    arrays = []
    for field in schema:
        values = columns.pop(field.name, None)
        if values is None:
            arrays.append(pa.nulls(count, field.type))
        elif isinstance(values, pa.Array):
            arrays.append(_widened(values, field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
        del values
    return pa.Table.from_arrays(arrays, schema=schema)
