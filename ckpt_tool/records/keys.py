"""Java ``hashCode`` of keys and Flink's key-group assignment (``KeyGroupRangeAssignment``).

key group = murmur(key.hashCode()) % maxParallelism, and the subtask that owns a key group is
keyGroup * parallelism / maxParallelism. Hash codes follow the Java classes a key is made of:
String, boxed numbers, Boolean, Character, Flink's TupleN and Row, and SQL's BinaryRowData.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from ckpt_tool.flink.model import key_group_range as key_group_range  # Flink's format: where callers here take it from
from ckpt_tool.records.types import DataType, Row

MURMUR_C1 = 0xCC9E2D51
MURMUR_C2 = 0x1B873593


def to_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _rotl(value: int, shift: int) -> int:
    value &= 0xFFFFFFFF
    return ((value << shift) | (value >> (32 - shift))) & 0xFFFFFFFF


def _mul(a: int, b: int) -> int:
    return (a * b) & 0xFFFFFFFF


def bit_mix(code: int) -> int:
    """``MathUtils.bitMix`` (murmur3's fmix32), on unsigned 32-bit values."""
    code &= 0xFFFFFFFF
    code ^= code >> 16
    code = _mul(code, 0x85EBCA6B)
    code ^= code >> 13
    code = _mul(code, 0xC2B2AE35)
    code ^= code >> 16
    return code


def murmur_hash(code: int) -> int:
    """``MathUtils.murmurHash(int)``: a non-negative int."""
    code = _mul(code, MURMUR_C1)
    code = _rotl(code, 15)
    code = _mul(code, MURMUR_C2)
    code = _rotl(code, 13)
    code = (code * 5 + 0xE6546B64) & 0xFFFFFFFF
    code ^= 4
    signed = to_int32(bit_mix(code))
    if signed >= 0:
        return signed
    return -signed if signed != -(1 << 31) else 0


def key_group_for_hash(key_hash: int, max_parallelism: int) -> int:
    return murmur_hash(key_hash) % max_parallelism


def operator_index_for_key_group(max_parallelism: int, parallelism: int, key_group: Any) -> Any:
    """The subtask owning a key group; ``key_group`` may be an int or a NumPy array of them."""
    return key_group * parallelism // max_parallelism


# --- Java hashCode -----------------------------------------------------------------------------


def string_hash(text: str) -> int:
    units = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & 0xFFFFFFFF
    return to_int32(h)


def long_hash(value: int) -> int:
    value &= 0xFFFFFFFFFFFFFFFF
    return to_int32(value ^ (value >> 32))


def double_hash(value: float) -> int:
    bits = 0x7FF8000000000000 if math.isnan(value) else struct.unpack(">q", struct.pack(">d", value))[0]
    return long_hash(bits)


def float_hash(value: float) -> int:
    bits = 0x7FC00000 if math.isnan(value) else struct.unpack(">i", struct.pack(">f", value))[0]
    return to_int32(bits)


def java_hash(data_type: DataType, value: Any) -> int:
    """``value.hashCode()`` of the Java object that ``data_type`` deserializes to."""
    if value is None:
        return 0
    name = data_type.name
    if name == "string":
        return string_hash(value)
    if name in ("long", "bigint"):
        return long_hash(value)
    if name in ("int", "short", "byte", "integer", "smallint", "tinyint"):
        return to_int32(value)
    if name == "char":
        return ord(value)
    if name == "boolean":
        return 1231 if value else 1237
    if name == "double":
        return double_hash(value)
    if name == "float":
        return float_hash(value)
    if name == "tuple":
        h = 0
        for field_type, field in zip(data_type.fields, value):
            h = (31 * h + java_hash(field_type, field)) & 0xFFFFFFFF
        return to_int32(h)
    if name == "row":
        return _row_hash(data_type, value)
    if name == "binary_row":
        return binary_row_hash(value.data)
    if name in _JAVA_TIME_HASHES:
        return to_int32(_JAVA_TIME_HASHES[name](value))
    if name == "list":  # AbstractList.hashCode
        h = 1
        for element in value:
            h = (31 * h + java_hash(data_type.fields[0], element)) & 0xFFFFFFFF
        return to_int32(h)
    if name == "map":  # AbstractMap.hashCode: the sum of key.hashCode() ^ value.hashCode()
        key_type, value_type = data_type.fields
        return to_int32(sum(java_hash(key_type, k) ^ java_hash(value_type, v) for k, v in value))
    raise ValueError(f"{data_type} cannot be a key: its Java hashCode is not defined by ckpt")


def _local_date_hash(date) -> int:
    year = to_int32(date.year)
    return (year & 0xFFFFF800) ^ ((year << 11) + (date.month << 6) + date.day)


def _local_time_hash(time) -> int:
    return long_hash(((time.hour * 60 + time.minute) * 60 + time.second) * 1_000_000_000 + time.nano)


_JAVA_TIME_HASHES = {
    "instant": lambda i: long_hash(i.seconds) + 51 * i.nanos,
    "local_date": _local_date_hash,
    "local_time": _local_time_hash,
    "local_date_time": lambda dt: _local_date_hash(dt.date) ^ _local_time_hash(dt.time),
}
# Key types Flink refuses (KeyedStream#validateKeyTypeIsHashable): their hashCode is the object's
# identity (arrays, enums), so a key's key group would change from one JVM to the next.
UNHASHABLE_KEYS = {"enum": "an enum", "array": "an array", "bytes": "an array (byte[])"}


def unhashable_key_part(data_type: DataType) -> str | None:
    """What in a key type Flink refuses as a key, if anything (looking into tuples, lists and maps)."""
    if data_type.name in UNHASHABLE_KEYS:
        return f"{UNHASHABLE_KEYS[data_type.name]} ({data_type})"
    if data_type.name in ("tuple", "row", "list", "map"):
        return next((part for part in map(unhashable_key_part, data_type.fields) if part), None)
    return None


def _row_hash(data_type: DataType, row: Row) -> int:
    """``RowUtils.deepHashCodeRow`` for a position-based Row."""
    fields_hash = 1
    for field_type, field in zip(data_type.fields, row.fields):
        element = 0 if field is None else (31 + java_hash(field_type, field)) & 0xFFFFFFFF
        fields_hash = (31 * fields_hash + element) & 0xFFFFFFFF
    return to_int32(31 * row.kind + fields_hash)


def binary_row_hash(data: bytes) -> int:
    """``BinaryRowData.hashCode``: murmur3 by little-endian words, seed 42 (``MurmurHashUtils``)."""
    if len(data) % 4:
        raise ValueError("a BinaryRowData is a whole number of words")
    h, mask = 42, 0xFFFFFFFF
    for (k,) in struct.iter_unpack("<I", data):  # the per-record SQL key path: no calls in the loop
        k = (k * MURMUR_C1) & mask
        k = (((k << 15) | (k >> 17)) * MURMUR_C2) & mask
        h ^= k
        h = ((((h << 13) | (h >> 19)) & mask) * 5 + 0xE6546B64) & mask
    return to_int32(bit_mix(h ^ len(data)))


def key_group_of(data_type: DataType, key: Any, max_parallelism: int) -> int:
    return key_group_for_hash(java_hash(data_type, key), max_parallelism)
