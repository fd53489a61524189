"""Record types, and values decoded the way Flink's serializers write them.

A type is written as a small expression, e.g. ``long``, ``string``, ``tuple<long,string>``,
``row<int,string>``, ``pojo<id:long,name:string>`` or, for Table/SQL jobs,
``binary_row<bigint,string>``. The serializers are Flink's: ``LongSerializer`` … ``StringSerializer``
(``StringValue``'s varint encoding), ``BytePrimitiveArraySerializer``, ``TupleSerializer``,
``RowSerializer`` (row kind and null mask), ``PojoSerializer`` (fields sorted by name, a null flag
each) and ``BinaryRowDataSerializer`` (a length and the row's bytes).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ckpt_tool.errors import CkptError

JAVA_SCALARS = ("string", "long", "int", "short", "byte", "double", "float", "boolean", "char", "bytes")
SQL_SCALARS = {
    "bigint": "long",
    "int": "int",
    "integer": "int",
    "smallint": "short",
    "tinyint": "byte",
    "boolean": "boolean",
    "float": "float",
    "double": "double",
    "string": "string",
    "varchar": "string",
    "bytes": "bytes",
    "varbinary": "bytes",
    "date": "int",
    "time": "int",
}
COMPOSITES = ("tuple", "row", "pojo", "binary_row")
ROW_KINDS = ("+I", "-U", "+U", "-D")


class TypeSyntaxError(CkptError):
    """A record type expression that ckpt cannot read."""


@dataclass(frozen=True)
class DataType:
    name: str
    fields: tuple[DataType, ...] = ()
    field_names: tuple[str, ...] = ()

    def __str__(self) -> str:
        if not self.fields:
            return self.name
        names = self.field_names or ("",) * len(self.fields)
        inner = ",".join(f"{n}:{t}" if n else str(t) for n, t in zip(names, self.fields))
        return f"{self.name}<{inner}>"

    def field_index(self, ref: str | int) -> int:
        """A field by position (``0``, ``"f0"``) or, for POJOs and named rows, by name."""
        if isinstance(ref, int) or str(ref).isdigit():
            index = int(ref)
        elif ref in self.field_names:
            index = self.field_names.index(ref)
        elif re.fullmatch(r"f\d+", str(ref)):
            index = int(str(ref)[1:])
        else:
            raise TypeSyntaxError(f"{self} has no field {ref!r}")
        if not 0 <= index < len(self.fields):
            raise TypeSyntaxError(f"{self} has no field {ref!r}")
        return index


_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*(?:\(\d+(?:,\s*\d+)?\))?|[<>,:])")


def parse_type(text: str) -> DataType:
    """Parse a type expression such as ``tuple<long,string>``."""
    tokens = [t for t in _TOKEN.findall(text)]
    if "".join(tokens).replace(" ", "") != re.sub(r"\s+", "", text):
        raise TypeSyntaxError(f"cannot read record type {text!r}")
    position = 0

    def take(expected: str | None = None) -> str:
        nonlocal position
        if position >= len(tokens):
            raise TypeSyntaxError(f"record type {text!r} ends too early")
        token = tokens[position]
        if expected is not None and token != expected:
            raise TypeSyntaxError(f"record type {text!r}: expected {expected!r}, found {token!r}")
        position += 1
        return token

    def parse(sql: bool) -> DataType:
        name = re.sub(r"\(.*\)$", "", take()).lower()
        if name in COMPOSITES:
            take("<")
            fields, names = [], []
            while True:
                if position + 1 < len(tokens) and tokens[position + 1] == ":":
                    names.append(take())
                    take(":")
                fields.append(parse(sql or name == "binary_row"))
                if take() == ">":
                    break
            if names and len(names) != len(fields):
                raise TypeSyntaxError(f"record type {text!r}: name all fields of {name} or none")
            if name == "pojo":
                if not names:
                    raise TypeSyntaxError(f"record type {text!r}: POJO fields need names")
                # PojoTypeInfo orders fields by name; so does its serializer.
                names, fields = map(list, zip(*sorted(zip(names, fields), key=lambda p: p[0])))
            return DataType(name, tuple(fields), tuple(names))
        if sql and name in SQL_SCALARS:
            return DataType(SQL_SCALARS[name])
        if name in JAVA_SCALARS or name in SQL_SCALARS:
            return DataType(SQL_SCALARS.get(name, name) if name not in JAVA_SCALARS else name)
        raise TypeSyntaxError(f"record type {text!r}: unknown type {name!r}")

    result = parse(False)
    if position != len(tokens):
        raise TypeSyntaxError(f"record type {text!r}: unexpected {tokens[position]!r}")
    return result


# --- decoded values ----------------------------------------------------------------------------


@dataclass
class Row:
    kind: int  # RowKind byte value: 0 +I, 1 -U, 2 +U, 3 -D
    fields: list[Any]


@dataclass
class BinaryRow:
    """SQL's ``BinaryRowData``: the row's bytes, read field by field on demand."""

    data: bytes
    types: tuple[DataType, ...] = field(default=())

    @property
    def kind(self) -> int:
        return self.data[0]

    def _null_bits_size(self) -> int:
        return (len(self.types) + 63 + 8) // 64 * 8

    def is_null(self, index: int) -> bool:
        bit = index + 8
        return bool(self.data[bit >> 3] & (1 << (bit & 7)))

    def get(self, index: int) -> Any:
        if self.is_null(index):
            return None
        slot = self._null_bits_size() + 8 * index
        name = self.types[index].name
        if name in _LE_FIXED:
            return _LE_FIXED[name].unpack_from(self.data, slot)[0]
        if name == "boolean":
            return self.data[slot] != 0
        (word,) = struct.unpack_from("<Q", self.data, slot)
        if word & (1 << 63):
            raw = self.data[slot : slot + ((word >> 56) & 0x7F)]
        else:
            offset, length = word >> 32, word & 0xFFFFFFFF
            raw = self.data[offset : offset + length]
        return raw.decode("utf-8", "replace") if name == "string" else bytes(raw)

    def values(self) -> list[Any]:
        return [self.get(i) for i in range(len(self.types))]


_LE_FIXED = {
    "long": struct.Struct("<q"),
    "int": struct.Struct("<i"),
    "short": struct.Struct("<h"),
    "byte": struct.Struct("<b"),
    "double": struct.Struct("<d"),
    "float": struct.Struct("<f"),
}


def build_binary_row(types: tuple[DataType, ...], values: list[Any], kind: int = 0) -> BinaryRow:
    """Write a row like ``BinaryRowWriter``: header, null bits, 8-byte slots, word-aligned variable part."""
    null_bits = (len(types) + 63 + 8) // 64 * 8
    fixed = bytearray(null_bits + 8 * len(types))
    fixed[0] = kind
    variable = bytearray()
    for index, (data_type, value) in enumerate(zip(types, values)):
        slot = null_bits + 8 * index
        name = data_type.name
        if value is None:
            bit = index + 8
            fixed[bit >> 3] |= 1 << (bit & 7)
        elif name in _LE_FIXED:
            _LE_FIXED[name].pack_into(fixed, slot, float(value) if name in ("double", "float") else value)
        elif name == "boolean":
            fixed[slot] = 1 if value else 0
        elif name in ("string", "bytes"):
            raw = value.encode("utf-8") if name == "string" else bytes(value)
            if len(raw) <= 7:
                fixed[slot : slot + len(raw)] = raw
                fixed[slot + 7] = 0x80 | len(raw)
            else:
                offset = len(fixed) + len(variable)
                struct.pack_into("<Q", fixed, slot, (offset << 32) | len(raw))
                variable += raw + bytes(-len(raw) % 8)
        else:
            raise TypeSyntaxError(f"cannot write {name} into a BinaryRowData")
    return BinaryRow(bytes(fixed + variable), tuple(types))


# --- Flink serializers -------------------------------------------------------------------------


class RecordDecodeError(CkptError):
    """A record's bytes do not match the declared type."""


class ValueReader:
    """Reads one value of a DataType from serialized bytes, as Flink's TypeSerializer would."""

    _BE: ClassVar[dict[str, struct.Struct]] = {
        "long": struct.Struct(">q"),
        "int": struct.Struct(">i"),
        "short": struct.Struct(">h"),
        "byte": struct.Struct(">b"),
        "double": struct.Struct(">d"),
        "float": struct.Struct(">f"),
        "char": struct.Struct(">H"),
    }

    def __init__(self, data: bytes, pos: int = 0):
        self.data = data
        self.pos = pos

    def _need(self, count: int) -> None:
        if self.pos + count > len(self.data):
            raise RecordDecodeError(f"record ends after {len(self.data)} bytes, needed {self.pos + count}")

    def u8(self) -> int:
        self._need(1)
        self.pos += 1
        return self.data[self.pos - 1]

    def fixed(self, name: str):
        fmt = self._BE[name]
        self._need(fmt.size)
        (value,) = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return value

    def varint(self) -> int:
        value = self.u8()
        if value >= 128:
            value &= 0x7F
            shift = 7
            while True:
                current = self.u8()
                if current < 128:
                    return value | (current << shift)
                value |= (current & 0x7F) << shift
                shift += 7
        return value

    def string(self) -> str | None:
        length = self.varint()
        if length == 0:
            return None
        units = bytearray()
        for _ in range(length - 1):
            c = self.varint()
            units += bytes(((c >> 8) & 0xFF, c & 0xFF))
        return units.decode("utf-16-be", "surrogatepass")

    def read(self, t: DataType) -> Any:
        name = t.name
        if name in self._BE:
            value = self.fixed(name)
            return chr(value) if name == "char" else value
        if name == "string":
            return self.string()
        if name == "boolean":
            return self.u8() != 0
        if name == "bytes":
            length = self.fixed("int")
            self._need(length)
            self.pos += length
            return self.data[self.pos - length : self.pos]
        if name == "tuple":
            return tuple(self.read(f) for f in t.fields)
        if name == "row":
            return self.row(t)
        if name == "pojo":
            return self.pojo(t)
        if name == "binary_row":
            length = self.fixed("int")
            self._need(length)
            self.pos += length
            return BinaryRow(bytes(self.data[self.pos - length : self.pos]), t.fields)
        raise RecordDecodeError(f"cannot decode {t}")

    def row(self, t: DataType) -> Row:
        bits = 2 + len(t.fields)
        mask: list[bool] = []
        for _ in range((bits + 7) // 8):
            byte = self.u8()
            mask.extend(bool(byte & (0x80 >> i)) for i in range(8))
        kind = (1 if mask[0] else 0) + (2 if mask[1] else 0)
        return Row(kind, [None if mask[2 + i] else self.read(f) for i, f in enumerate(t.fields)])

    def pojo(self, t: DataType) -> dict | None:
        flags = self.u8()
        if flags & 0x01:
            return None
        if not flags & 0x02:
            raise RecordDecodeError(f"POJO subclass flags 0x{flags:02x} are not supported")
        return {name: (None if self.u8() else self.read(f)) for name, f in zip(t.field_names, t.fields)}


def decode_value(t: DataType, data: bytes, pos: int = 0) -> tuple[Any, int]:
    """Decode one value starting at ``pos``; returns the value and the position after it."""
    reader = ValueReader(data, pos)
    value = reader.read(t)
    return value, reader.pos


def to_json(t: DataType, value: Any) -> Any:
    """A JSON-friendly form of a decoded value."""
    if value is None:
        return None
    if t.name == "tuple":
        return [to_json(f, v) for f, v in zip(t.fields, value)]
    if t.name == "row":
        return {"kind": ROW_KINDS[value.kind], "fields": [to_json(f, v) for f, v in zip(t.fields, value.fields)]}
    if t.name == "pojo":
        return {n: to_json(f, value[n]) for n, f in zip(t.field_names, t.fields)}
    if t.name == "binary_row":
        return [to_json(f, v) for f, v in zip(t.fields, value.values())]
    if t.name == "bytes":
        return bytes(value).hex()
    return value
