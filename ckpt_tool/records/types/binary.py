"""SQL values as Flink's binary formats lay them out: ``BinaryRowData``, ``BinaryArrayData`` and
``BinaryMapData`` (flink-table-runtime), read lazily and written as ``BinaryRowWriter`` and
``BinaryArrayWriter`` write them.

A row is a null bit set (the first byte holds the RowKind; field i is bit i + 8; the set is
``(arity + 63 + 8) / 64`` words), one 8-byte little-endian slot per field, and a variable-length
part of word-aligned pieces whose offsets (relative to the row) and sizes sit in the slots as
``offset << 32 | size``. Strings and binaries of at most 7 bytes sit in the slot itself (size in
the top byte, with bit 7 set). DECIMAL(p,s) with p <= 18 is its unscaled long, otherwise the
unscaled big-endian two's-complement bytes in a 16-byte piece. TIMESTAMP(p) and TIMESTAMP_LTZ(p)
with p <= 3 are epoch milliseconds, otherwise the milliseconds in an 8-byte piece and the
nanoseconds of the millisecond in the slot's size half. An array is its element count, a null
bit set of ``(n + 31) / 32`` ints, elements of 1, 2, 4 or 8 bytes by type, then the variable part;
a map is the byte size of its key array, the key array and the value array; a multiset is a map
of element to count.
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ckpt_tool.errors import CkptError
from ckpt_tool.records.types.syntax import DataType


class RecordDecodeError(CkptError):
    """A record's bytes do not match the declared type."""


class SqlTimestamp(NamedTuple):
    """TimestampData: epoch milliseconds and the nanoseconds within the millisecond."""

    millisecond: int
    nano_of_millisecond: int = 0

    def isoformat(self) -> str:
        moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=self.millisecond)
        nanos = moment.microsecond * 1000 + self.nano_of_millisecond
        return moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{nanos:09d}".rstrip("0") if nanos else "")


_LE = {
    "long": struct.Struct("<q"),
    "int": struct.Struct("<i"),
    "date": struct.Struct("<i"),
    "time": struct.Struct("<i"),
    "short": struct.Struct("<h"),
    "byte": struct.Struct("<b"),
    "double": struct.Struct("<d"),
    "float": struct.Struct("<f"),
}
_WORD = struct.Struct("<Q")
_INT = struct.Struct("<i")
# element sizes in arrays (BinaryArrayData.calculateFixLengthPartSize); every other type takes 8
_ELEMENT_SIZES = {"boolean": 1, "byte": 1, "short": 2, "int": 4, "float": 4, "date": 4, "time": 4}


def compact(t: DataType) -> bool:
    """Whether a DECIMAL or TIMESTAMP fits its slot (``DecimalData``/``TimestampData.isCompact``)."""
    if t.name == "decimal":
        return t.precision <= 18
    return t.name not in ("timestamp", "timestamp_ltz") or t.precision <= 3


def null_bits_size(arity: int) -> int:
    """``BinaryRowData.calculateBitSetWidthInBytes``."""
    return (arity + 63 + 8) // 64 * 8


def array_header_size(count: int) -> int:
    """``BinaryArrayData.calculateHeaderInBytes``: the count and the null bits."""
    return 4 + (count + 31) // 32 * 4


def _round_to_word(size: int) -> int:
    return (size + 7) & ~7


def _decimal(unscaled: int, scale: int) -> decimal.Decimal:
    return decimal.Decimal(unscaled).scaleb(-scale)


def unscaled_of(value: decimal.Decimal, scale: int) -> int:
    with decimal.localcontext() as context:
        context.prec = 80
        return int(value.scaleb(scale).to_integral_value())


def unscaled_bytes(unscaled: int) -> bytes:
    """``BigInteger.toByteArray``: minimal big-endian two's complement."""
    bit_length = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
    return unscaled.to_bytes(bit_length // 8 + 1, "big", signed=True)


# --- reading ----------------------------------------------------------------------------------------


def _read(data: bytes, slot: int, t: DataType, raw: bool = False) -> Any:
    """The value of type ``t`` whose slot is at ``slot`` of ``data`` (a row's or an array's bytes).
    ``raw``: strings as their UTF-8 bytes and non-compact decimals as their unscaled bytes, so that
    a projection copies them exactly."""
    try:
        return _read_unchecked(data, slot, t, raw)
    except (struct.error, IndexError) as exc:
        raise RecordDecodeError(f"a {t} field runs past its row ({len(data)} bytes)") from exc


def _piece(data: bytes, word: int, t: DataType) -> bytes:
    offset, size = word >> 32, word & 0xFFFFFFFF
    if offset + size > len(data):
        raise RecordDecodeError(f"a {t} field points past its row: bytes {offset} to {offset + size} of {len(data)}")
    return bytes(data[offset : offset + size])


def _read_unchecked(data: bytes, slot: int, t: DataType, raw: bool) -> Any:
    name = t.name
    if name in _LE:
        return _LE[name].unpack_from(data, slot)[0]
    if name == "boolean":
        return data[slot] != 0
    (word,) = _WORD.unpack_from(data, slot)
    if name in ("string", "bytes"):
        if word & (1 << 63):
            value = bytes(data[slot : slot + ((word >> 56) & 0x7F)])
        else:
            value = _piece(data, word, t)
        return value.decode("utf-8", "replace") if name == "string" and not raw else value
    if name == "decimal":
        if compact(t):
            return _LE["long"].unpack_from(data, slot)[0] if raw else _decimal(_LE["long"].unpack_from(data, slot)[0], t.scale)
        unscaled = _piece(data, word, t)
        return unscaled if raw else _decimal(int.from_bytes(unscaled, "big", signed=True), t.scale)
    if name in ("timestamp", "timestamp_ltz"):
        if compact(t):
            return SqlTimestamp(_LE["long"].unpack_from(data, slot)[0])
        (millisecond,) = _LE["long"].unpack_from(_piece(data, (word & ~0xFFFFFFFF) | 8, t))
        return SqlTimestamp(millisecond, word & 0xFFFFFFFF)
    piece = _piece(data, word, t)
    if name == "array":
        return BinaryArray(piece, t.fields[0])
    if name in ("map", "multiset"):
        return BinaryMap(piece, t)
    if name == "row":
        return BinaryRow(piece, t.fields, t.field_names)
    raise RecordDecodeError(f"{t} is not a SQL type")


@dataclass
class BinaryRow:
    """``BinaryRowData``: the row's bytes, read field by field on demand."""

    data: bytes
    types: tuple[DataType, ...] = field(default=())
    names: tuple[str, ...] = field(default=())

    @property
    def kind(self) -> int:
        return self.data[0]

    def is_null(self, index: int) -> bool:
        bit = index + 8
        return bool(self.data[bit >> 3] & (1 << (bit & 7)))

    def _slot(self, index: int) -> int:
        return null_bits_size(len(self.types)) + 8 * index

    def get(self, index: int) -> Any:
        return None if self.is_null(index) else _read(self.data, self._slot(index), self.types[index])

    def values(self) -> list[Any]:
        return [self.get(i) for i in range(len(self.types))]

    def project(self, indices: list[int]) -> BinaryRow:
        """The key row of these fields, as the planner's key selector builds it (a generated
        projection into a fresh BinaryRowWriter; RowKind INSERT); fields are copied exactly."""
        types = tuple(self.types[i] for i in indices)
        values = [None if self.is_null(i) else _read(self.data, self._slot(i), self.types[i], raw=True) for i in indices]
        return build_binary_row(types, values)


@dataclass
class BinaryArray:
    """``BinaryArrayData``."""

    data: bytes
    element: DataType

    def __len__(self) -> int:
        (count,) = _INT.unpack_from(self.data, 0)
        if count < 0 or array_header_size(count) + count * _ELEMENT_SIZES.get(self.element.name, 8) > len(self.data):
            raise RecordDecodeError(f"an array of {count} elements does not fit its {len(self.data)} bytes")
        return count

    def values(self) -> list[Any]:
        count = len(self)
        header, size = array_header_size(count), _ELEMENT_SIZES.get(self.element.name, 8)
        return [
            None if self.data[4 + (i >> 3)] & (1 << (i & 7)) else _read(self.data, header + i * size, self.element)
            for i in range(count)
        ]


@dataclass
class BinaryMap:
    """``BinaryMapData`` (MAP and MULTISET): a key array and a value array."""

    data: bytes
    type: DataType

    def items(self) -> list[tuple[Any, Any]]:
        (key_bytes,) = _INT.unpack_from(self.data, 0)
        if not 0 <= key_bytes <= len(self.data) - 4:
            raise RecordDecodeError(f"a map's key array of {key_bytes} bytes does not fit its {len(self.data)} bytes")
        key_type, value_type = _entry_types(self.type)
        keys = BinaryArray(self.data[4 : 4 + key_bytes], key_type).values()
        values = BinaryArray(self.data[4 + key_bytes :], value_type).values()
        if len(keys) != len(values):
            raise RecordDecodeError(f"a map with {len(keys)} keys and {len(values)} values")
        return list(zip(keys, values))


def _entry_types(t: DataType) -> tuple[DataType, DataType]:
    return (t.fields[0], DataType("int", sql=True)) if t.name == "multiset" else (t.fields[0], t.fields[1])


# --- writing ----------------------------------------------------------------------------------------


class _Writer:
    """``AbstractBinaryWriter``: a fixed part, then word-aligned pieces appended at the cursor."""

    def __init__(self, fixed_size: int):
        self.buffer = bytearray(fixed_size)

    def piece(self, slot: int, raw: bytes, size_field: int | None = None, room: int = 0) -> None:
        offset = len(self.buffer)
        self.buffer += raw + bytes(_round_to_word(max(len(raw), room)) - len(raw))
        _WORD.pack_into(self.buffer, slot, (offset << 32) | (len(raw) if size_field is None else size_field))

    def write(self, slot: int, t: DataType, value: Any) -> None:
        """``BinaryWriter.write`` of a non-null value."""
        name = t.name
        if name in ("float", "double") and math.isnan(value) and self.canonical_nan:
            value = math.nan  # BinaryArrayWriter writes Java's canonical NaN
        if name in _LE:
            _LE[name].pack_into(self.buffer, slot, float(value) if name in ("float", "double") else value)
        elif name == "boolean":
            self.buffer[slot] = 1 if value else 0
        elif name in ("string", "bytes"):
            raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            if len(raw) <= 7:
                self.buffer[slot : slot + len(raw)] = raw
                self.buffer[slot + 7] = 0x80 | len(raw)
            else:
                self.piece(slot, raw)
        elif name == "decimal":
            unscaled = value if isinstance(value, (int, bytes)) else unscaled_of(value, t.scale)
            if compact(t):
                _LE["long"].pack_into(self.buffer, slot, unscaled)
            else:
                self.piece(slot, unscaled if isinstance(unscaled, bytes) else unscaled_bytes(unscaled), room=16)
        elif name in ("timestamp", "timestamp_ltz"):
            stamp = value if isinstance(value, SqlTimestamp) else SqlTimestamp(*value)
            if compact(t):
                _LE["long"].pack_into(self.buffer, slot, stamp.millisecond)
            else:
                self.piece(slot, _LE["long"].pack(stamp.millisecond), size_field=stamp.nano_of_millisecond)
        elif name == "array":
            self.piece(slot, value.data if isinstance(value, BinaryArray) else build_binary_array(t.fields[0], value).data)
        elif name in ("map", "multiset"):
            self.piece(slot, value.data if isinstance(value, BinaryMap) else build_binary_map(t, value).data)
        elif name == "row":
            self.piece(slot, value.data if isinstance(value, BinaryRow) else build_binary_row(t.fields, value).data)
        else:
            raise RecordDecodeError(f"cannot write {t} into a binary row")

    canonical_nan = False


def build_binary_row(types: tuple[DataType, ...], values: list[Any], kind: int = 0) -> BinaryRow:
    """Write a row as the planner's generated code does with a ``BinaryRowWriter``: a null
    non-compact DECIMAL or TIMESTAMP keeps its (zeroed) piece, other nulls a zeroed slot.
    Values: Python scalars, ``str`` or UTF-8 ``bytes`` for strings, ``Decimal`` (or the unscaled
    int or bytes), ``SqlTimestamp``, lists (arrays, rows), lists of pairs (maps, multisets), or
    the Binary* objects read from another row, which are copied as they are."""
    null_bits = null_bits_size(len(types))
    writer = _Writer(null_bits + 8 * len(types))
    writer.buffer[0] = kind
    for index, (t, value) in enumerate(zip(types, values)):
        slot = null_bits + 8 * index
        if value is None:
            bit = index + 8
            writer.buffer[bit >> 3] |= 1 << (bit & 7)
            if not compact(t):
                writer.piece(slot, b"", room=16 if t.name == "decimal" else 8)
        else:
            writer.write(slot, t, value)
    return BinaryRow(bytes(writer.buffer), tuple(types))


def build_binary_array(element: DataType, values: list[Any]) -> BinaryArray:
    """Write an array as ``BinaryArrayWriter`` does (nulls: a set bit and a zeroed element)."""
    header, size = array_header_size(len(values)), _ELEMENT_SIZES.get(element.name, 8)
    writer = _Writer(_round_to_word(header + size * len(values)))
    writer.canonical_nan = True
    _INT.pack_into(writer.buffer, 0, len(values))
    for index, value in enumerate(values):
        if value is None:
            writer.buffer[4 + (index >> 3)] |= 1 << (index & 7)
        else:
            writer.write(header + size * index, element, value)
    return BinaryArray(bytes(writer.buffer), element)


def build_binary_map(t: DataType, entries: list[tuple[Any, Any]]) -> BinaryMap:
    """``BinaryMapData.valueOf(keys, values)``."""
    key_type, value_type = _entry_types(t)
    keys = build_binary_array(key_type, [k for k, _ in entries]).data
    values = build_binary_array(value_type, [v for _, v in entries]).data
    return BinaryMap(_INT.pack(len(keys)) + keys + values, t)


# --- printable form -----------------------------------------------------------------------------


def sql_to_json(t: DataType, value: Any) -> Any:
    """A JSON-friendly form of a SQL value (decimals as strings, timestamps, dates and times ISO)."""
    if value is None:
        return None
    name = t.name
    if name == "decimal":
        return format(value, "f")
    if name in ("timestamp", "timestamp_ltz"):
        return value.isoformat() + ("Z" if name == "timestamp_ltz" else "")
    if name == "date":
        return (datetime.date(1970, 1, 1) + datetime.timedelta(days=value)).isoformat()
    if name == "time":
        return (datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=value)).time().isoformat()
    if name == "bytes":
        return bytes(value).hex()
    if name in ("float", "double") and not math.isfinite(value):
        return str(value)
    if name == "array":
        return [sql_to_json(t.fields[0], v) for v in value.values()]
    if name in ("map", "multiset"):
        key_type, value_type = _entry_types(t)
        return [[sql_to_json(key_type, k), sql_to_json(value_type, v)] for k, v in value.items()]
    if name == "row":
        fields = [sql_to_json(f, v) for f, v in zip(t.fields, value.values())]
        return dict(zip(t.field_names, fields)) if t.field_names else fields
    return value
