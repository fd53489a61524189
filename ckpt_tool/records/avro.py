"""Avro records (GenericRecord, SpecificRecord) as Flink's ``AvroSerializer`` writes them, decoded
with fastavro.

``AvroSerializer`` does not write Avro's binary encoding: it hands Avro's ``DatumWriter`` a
``DataOutputEncoder`` (flink-avro, ``org.apache.flink.formats.avro.utils``) that writes through
Java's ``DataOutput``: ints, longs, floats, doubles, enum ordinals and union branches as
fixed-width big-endian numbers (no zig-zag varints), bytes and strings as an int length and the
bytes, and array and map blocks as unsigned var-length counts (``writeVarLongCount``) closed by a
0 byte. fastavro walks the schema (records, unions, enums, fixed, arrays, maps, named types,
logical types) over a decoder that reads exactly that.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from typing import Any

from fastavro import parse_schema
from fastavro._read_py import read_data  # the schema walker of fastavro's pure-Python reader
from fastavro.io.binary_decoder import BinaryDecoder

from ckpt_tool.errors import CkptError
from ckpt_tool.records.types import DataType, RecordDecodeError

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_FLOAT = struct.Struct(">f")
_DOUBLE = struct.Struct(">d")


class AvroSchemaError(CkptError):
    """An .avsc file that cannot be read."""


class FlinkAvroDecoder(BinaryDecoder):
    """fastavro's decoder interface over ``DataOutputEncoder``'s bytes (flink-avro's ``DataInputDecoder``)."""

    def _exactly(self, count: int) -> bytes:
        data = self.fo.read(count)
        if len(data) != count:
            raise EOFError(f"expected {count} bytes, {len(data)} left")
        return data

    def read_int(self) -> int:
        return _INT.unpack(self._exactly(4))[0]

    def read_long(self) -> int:
        return _LONG.unpack(self._exactly(8))[0]

    def read_float(self) -> float:
        return _FLOAT.unpack(self._exactly(4))[0]

    def read_double(self) -> float:
        return _DOUBLE.unpack(self._exactly(8))[0]

    def read_bytes(self) -> bytes:
        size = self.read_int()
        if size < 0:
            raise EOFError(f"negative length {size}")
        return self._exactly(size)

    def read_enum(self) -> int:
        return self.read_int()

    def read_index(self) -> int:
        return self.read_int()

    def _count(self) -> int:
        """``readVarLongCount``: 7 bits a byte, low bits first, no zig-zag."""
        value, shift = 0, 0
        while True:
            byte = self._exactly(1)[0]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise EOFError("an array or map count longer than a long")

    def read_array_start(self) -> None:
        self._block_count = self._count()

    read_map_start = read_array_start

    def _iter_array_or_map(self):
        while self._block_count != 0:
            for _ in range(self._block_count):
                yield
            self._block_count = self._count()

    iter_array = _iter_array_or_map
    iter_map = _iter_array_or_map


def load_avro_schema(path: str) -> str:
    """The schema of an ``.avsc`` file, checked, as JSON text (it travels to workers with the exchange)."""
    try:
        with open(path) as f:
            document = json.load(f)
        parse_schema(document)
    except (OSError, ValueError) as exc:
        raise AvroSchemaError(f"cannot read Avro schema {path}: {exc}") from exc
    except Exception as exc:  # fastavro's own schema errors
        raise AvroSchemaError(f"cannot read Avro schema {path}: {type(exc).__name__}: {exc}") from exc
    return json.dumps(document)


class AvroReader:
    """Decodes whole records of one schema; ``logical``: with fastavro's logical-type conversions
    (dates, decimals ...), else the primitive values Avro's Java GenericRecord holds."""

    def __init__(self, schema_json: str, logical: bool = True):
        document = json.loads(schema_json)
        if not logical:
            document = _without_logical_types(document)
        self.named: dict[str, dict] = {"writer": {}, "reader": {}}
        self.schema = parse_schema(document, self.named["writer"])

    def read(self, data: bytes, offset: int = 0) -> Any:
        """The record in ``data[offset:]``, which it must fill exactly."""
        stream = io.BytesIO(data)
        stream.seek(offset)
        try:
            value = read_data(FlinkAvroDecoder(stream), self.schema, self.named, None, {})
        except (EOFError, ValueError, IndexError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise RecordDecodeError(f"the Avro schema does not match the record's bytes ({type(exc).__name__}: {exc})") from None
        used, size = stream.tell() - offset, len(data) - offset
        if used != size:
            raise RecordDecodeError(f"the Avro schema does not match the record's bytes: it reads {used} of its {size} bytes")
        return value


def _without_logical_types(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_without_logical_types(s) for s in schema]
    if isinstance(schema, dict):
        return {k: _without_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    return schema


# Java classes a GenericRecord holds for Avro's primitive types, as ckpt types (for hashCode):
# strings are hashed as java.lang.String (a key selector's ``r.get("f").toString()``); an enum
# field of a GenericRecord is a GenericData.EnumSymbol, whose hashCode is its symbol's.
_KEY_TYPES = {"string": "string", "int": "int", "long": "long", "boolean": "boolean", "float": "float", "double": "double"}


def _key_type(field_schema: Any, field: str) -> DataType:
    branches = [b for b in (field_schema if isinstance(field_schema, list) else [field_schema]) if b != "null"]
    if len(branches) == 1:
        branch = branches[0]
        name = branch.get("type") if isinstance(branch, dict) else branch
        if isinstance(branch, dict) and name == "enum":
            return DataType("string")
        if name in _KEY_TYPES and not (isinstance(branch, dict) and "logicalType" in branch):
            return DataType(_KEY_TYPES[name])
    raise AvroSchemaError(
        f"Avro field {field!r} of type {json.dumps(field_schema)} cannot be a key ckpt hashes "
        f"(supported: {', '.join(_KEY_TYPES)}, enum, each optionally nullable); use a decoder plug-in"
    )


def avro_key_types(schema_json: str, key: tuple[Any, ...]) -> tuple[DataType, ...]:
    """The Java types (as ckpt types) of a key of top-level record fields."""
    document = json.loads(schema_json)
    fields = {f["name"]: f["type"] for f in document.get("fields", [])} if isinstance(document, dict) else {}
    missing = [k for k in key if k not in fields]
    if missing or not key:
        raise AvroSchemaError(
            f"the Avro record has no field {missing[0] if missing else '(none given)'!r}; fields: {', '.join(fields)}"
        )
    return tuple(_key_type(fields[k], str(k)) for k in key)


def avro_key_function(schema_json: str, key: tuple[Any, ...]) -> Callable[[bytes, int], tuple[int, Any]]:
    """(record bytes, value offset) -> (Java hashCode of the key, printable key) for a key of
    top-level fields of the record: one field is the key itself, several a TupleN."""
    from ckpt_tool.records.keys import java_hash

    types = avro_key_types(schema_json, key)
    reader = AvroReader(schema_json, logical=False)
    key_type = types[0] if len(types) == 1 else DataType("tuple", types)

    def extract(raw: bytes, offset: int) -> tuple[int, Any]:
        record = reader.read(raw, offset)
        values = [record[k] for k in key]
        value = values[0] if len(values) == 1 else tuple(values)
        return java_hash(key_type, value), value if len(values) == 1 else list(values)

    return extract
