"""Values decoded the way Flink's DataStream ``TypeSerializer``s write them.

``LongSerializer`` … ``StringSerializer`` (``StringValue``'s varint encoding),
``BytePrimitiveArraySerializer``, ``TupleSerializer``, ``RowSerializer`` (row kind and null mask),
``PojoSerializer`` (fields sorted by name, a null flag each) and ``BinaryRowDataSerializer`` /
``RowDataSerializer`` (a length and the row's bytes, see ckpt_tool.records.types.binary).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, ClassVar

from ckpt_tool.records.types.binary import BinaryRow, RecordDecodeError, sql_to_json
from ckpt_tool.records.types.syntax import ROW_KINDS, DataType


@dataclass
class Row:
    kind: int  # RowKind byte value: 0 +I, 1 -U, 2 +U, 3 -D
    fields: list[Any]


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
            return BinaryRow(bytes(self.data[self.pos - length : self.pos]), t.fields, t.field_names)
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
    if t.name == "binary_row" or t.sql:
        return sql_to_json(DataType("row", t.fields, t.field_names, sql=True) if t.name == "binary_row" else t, value)
    if t.name == "bytes":
        return bytes(value).hex()
    return value
