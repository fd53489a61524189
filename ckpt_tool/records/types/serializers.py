"""Values decoded the way Flink's DataStream ``TypeSerializer``s write them.

``LongSerializer`` … ``StringSerializer`` (``StringValue``'s varint encoding),
``BytePrimitiveArraySerializer``, ``TupleSerializer``, ``RowSerializer`` (row kind and null mask),
``PojoSerializer`` (fields sorted by name, a null flag each), ``EnumSerializer`` (the ordinal as an
int), ``InstantSerializer`` (long seconds, int nanos), ``LocalDateSerializer`` (int year, byte
month, byte day), ``LocalTimeSerializer`` (bytes hour, minute, second, int nanos),
``LocalDateTimeSerializer`` (a date, then a time; each has its own null marker),
``ListSerializer`` (int size, the elements), ``MapSerializer`` (int size; per entry the key, a
null flag and the value), the primitive array serializers (int length, the elements),
``StringArraySerializer`` and ``BinaryRowDataSerializer`` / ``RowDataSerializer`` (a length and
the row's bytes, see ckpt_tool.records.types.binary).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from ckpt_tool.records.types.binary import BinaryRow, RecordDecodeError, null_bits_size, sql_to_json
from ckpt_tool.records.types.syntax import ROW_KINDS, DataType

# Strings of at least this many UTF-16 units that are not ASCII are decoded with NumPy, in chunks.
LONG_STRING_UNITS = 4096
STRING_CHUNK_UNITS = 1 << 20


@dataclass
class Row:
    kind: int  # RowKind byte value: 0 +I, 1 -U, 2 +U, 3 -D
    fields: list[Any]


def _civil(epoch_day: int) -> tuple[int, int, int]:
    """(year, month, day) of a day since 1970-01-01, proleptic Gregorian (``LocalDate.ofEpochDay``)."""
    z = epoch_day + 719468
    era = (z if z >= 0 else z - 146096) // 146097
    day_of_era = z - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_index = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * month_index + 2) // 5 + 1
    month = month_index + 3 if month_index < 10 else month_index - 9
    return year_of_era + era * 400 + (month <= 2), month, day


def _year(year: int) -> str:
    """The year as ``LocalDate.toString`` writes it."""
    if abs(year) < 1000:
        return ("-" if year < 0 else "") + f"{abs(year):04d}"
    return ("+" if year > 9999 else "") + str(year)


def _fraction(nano: int) -> str:
    """Nanoseconds as java.time writes them: none, or 3, 6 or 9 digits."""
    if not nano:
        return ""
    if nano % 1_000_000 == 0:
        return f".{nano // 1_000_000:03d}"
    return f".{nano // 1000:06d}" if nano % 1000 == 0 else f".{nano:09d}"


class LocalDate(NamedTuple):
    year: int
    month: int
    day: int

    def isoformat(self) -> str:
        """``LocalDate.toString``."""
        return f"{_year(self.year)}-{self.month:02d}-{self.day:02d}"


class LocalTime(NamedTuple):
    hour: int
    minute: int
    second: int
    nano: int

    def isoformat(self) -> str:
        """``LocalTime.toString`` (seconds only when not zero, or with nanoseconds)."""
        seconds = f":{self.second:02d}{_fraction(self.nano)}" if self.second or self.nano else ""
        return f"{self.hour:02d}:{self.minute:02d}{seconds}"


class LocalDateTime(NamedTuple):
    date: LocalDate
    time: LocalTime

    def isoformat(self) -> str:
        return f"{self.date.isoformat()}T{self.time.isoformat()}"


class Instant(NamedTuple):
    seconds: int
    nanos: int

    def isoformat(self) -> str:
        """``Instant.toString`` (ISO_INSTANT: seconds always, UTC)."""
        days, second_of_day = divmod(self.seconds, 86400)
        date = LocalDate(*_civil(days)).isoformat()
        hours, rest = divmod(second_of_day, 3600)
        return f"{date}T{hours:02d}:{rest // 60:02d}:{rest % 60:02d}{_fraction(self.nanos)}Z"


@dataclass(frozen=True)
class EnumValue:
    ordinal: int
    name: str | None  # None where the type does not name the constants


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
        """``StringValue``: a varint of the length + 1, then one varint per UTF-16 unit. ASCII text
        (one byte per unit) is decoded at once and long strings in chunks with NumPy, so a
        string of hundreds of MiB costs about as much as copying it."""
        length = self.varint()
        if length == 0:
            return None
        count = length - 1
        head = self.data[self.pos : self.pos + count]  # a view where the record is one (no copy)
        if len(head) == count:
            try:
                text = str(head, "ascii")
            except UnicodeDecodeError:
                pass
            else:
                self.pos += count
                return text
        if count >= LONG_STRING_UNITS:
            return self._long_string(count)
        return self._units(count).decode("utf-16-be", "surrogatepass")

    def _units(self, count: int) -> bytes:
        """``count`` UTF-16 units, one varint each, as big-endian bytes (a unit is the varint's
        low 16 bits, as Java's ``(char)`` cast keeps them)."""
        units = bytearray()
        for _ in range(count):
            c = self.varint()
            units += bytes(((c >> 8) & 0xFF, c & 0xFF))
        return bytes(units)

    def _long_string(self, count: int) -> str:
        """``_units`` over NumPy, chunk by chunk: a chunk's units end at its bytes below 0x80, and
        only a unit's first three bytes reach its low 16 bits. A chunk whose units do not all end
        within three bytes each (never so in what Flink writes) is read unit by unit."""
        import numpy as np

        data = np.frombuffer(self.data, dtype=np.uint8)
        text: list[str] = []
        carry = b""  # a high surrogate at the end of a chunk waits for the low one that follows it
        left = count
        while left:
            take = min(left, STRING_CHUNK_UNITS)
            window = data[self.pos : self.pos + 3 * take]
            ends = np.flatnonzero(window < 0x80)[:take]
            if len(ends) < take:
                units = self._units(take)
            else:
                size = int(ends[-1]) + 1
                starts = np.empty(take, dtype=np.int64)
                starts[0] = 0
                starts[1:] = ends[:-1] + 1
                place = np.arange(size, dtype=np.int64) - np.repeat(starts, ends - starts + 1)
                bits = (window[:size] & 0x7F).astype(np.uint32) << (7 * np.minimum(place, 3)).astype(np.uint32)
                bits[place >= 3] = 0
                units = (np.add.reduceat(bits, starts) & 0xFFFF).astype(">u2").tobytes()
                self.pos += size
            units = carry + units
            cut = len(units) - 2 if 0xD8 <= units[-2] <= 0xDB else len(units)
            text.append(units[:cut].decode("utf-16-be", "surrogatepass"))
            carry = units[cut:]
            left -= take
        if carry:
            text.append(carry.decode("utf-16-be", "surrogatepass"))
        return "".join(text)

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
            length = self.size(0)
            return bytes(self.data[self.pos - length : self.pos])
        if name == "tuple":
            return tuple(self.read(f) for f in t.fields)
        if name in _JAVA_TIME:
            return _JAVA_TIME[name](self)
        if name == "enum":
            ordinal = self.fixed("int")
            if t.field_names and not 0 <= ordinal < len(t.field_names):
                raise RecordDecodeError(f"enum ordinal {ordinal} is not one of the {len(t.field_names)} constants of {t}")
            return EnumValue(ordinal, t.field_names[ordinal] if t.field_names else None)
        if name == "list":
            return [self.read(t.fields[0]) for _ in range(self.count())]
        if name == "map":
            return [(self.read(t.fields[0]), None if self.u8() else self.read(t.fields[1])) for _ in range(self.count())]
        if name == "array":
            return [self.read(t.fields[0]) for _ in range(self.count())]
        if name == "row":
            return self.row(t)
        if name == "pojo":
            return self.pojo(t)
        if name == "binary_row":
            length = self.size(null_bits_size(len(t.fields)) + 8 * len(t.fields))
            return BinaryRow(bytes(self.data[self.pos - length : self.pos]), t.fields, t.field_names)
        raise RecordDecodeError(f"cannot decode {t}")

    def size(self, minimum: int) -> int:
        """An int length of at least ``minimum`` and the bytes it covers, skipped."""
        length = self.fixed("int")
        if length < minimum:
            raise RecordDecodeError(f"a length of {length} where at least {minimum} is needed")
        self._need(length)
        self.pos += length
        return length

    def count(self) -> int:
        """A collection's size, checked against the bytes left (each element takes a byte at least)."""
        size = self.fixed("int")
        if size < 0 or size > len(self.data) - self.pos:
            raise RecordDecodeError(f"a collection of {size} elements in a record with {len(self.data) - self.pos} bytes left")
        return size

    def instant(self) -> Instant | None:
        seconds, nanos = self.fixed("long"), self.fixed("int")
        return None if (seconds, nanos) == (-(1 << 63), -(1 << 31)) else Instant(seconds, nanos)

    def local_date(self) -> LocalDate | None:
        year = self.fixed("int")
        if year == -(1 << 31):
            self.fixed("short")
            return None
        return LocalDate(year, self.u8(), self.u8())

    def local_time(self) -> LocalTime | None:
        hour = self.fixed("byte")
        if hour == -128:
            self.fixed("short")
            self.fixed("int")
            return None
        return LocalTime(hour, self.u8(), self.u8(), self.fixed("int"))

    def local_date_time(self) -> LocalDateTime | None:
        date, time = self.local_date(), self.local_time()
        return None if date is None or time is None else LocalDateTime(date, time)

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


_JAVA_TIME = {
    "instant": ValueReader.instant,
    "local_date": ValueReader.local_date,
    "local_time": ValueReader.local_time,
    "local_date_time": ValueReader.local_date_time,
}


def decode_value(t: DataType, data: bytes, pos: int = 0) -> tuple[Any, int]:
    """Decode the one value that fills ``data[pos:]``, exactly (a value that ends sooner is not
    one of this type); returns the value and the position after it."""
    reader = ValueReader(data, pos)
    value = reader.read(t)
    if reader.pos != len(data):
        raise RecordDecodeError(f"{t} reads {reader.pos - pos} of the value's {len(data) - pos} bytes")
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
    if t.name in _JAVA_TIME:
        return value.isoformat()
    if t.name == "enum":
        return value.name if value.name is not None else value.ordinal
    if t.name in ("list", "array"):
        return [to_json(t.fields[0], v) for v in value]
    if t.name == "map":
        return [[to_json(t.fields[0], k), to_json(t.fields[1], v)] for k, v in value]
    return value
