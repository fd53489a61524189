"""A logical channel's records as arrays: framing in C, element tags and key groups with NumPy.

The record path handles tens of millions of records; a Python statement per record would cost
more than all the I/O. ``frame_channel`` finds every record with one C loop (the length chain
is sequential), then classifies all elements at once. ``KeyGroups`` computes key groups for a
whole channel: vectorised where the key sits at a fixed place in every record (scalar keys of
tuples, POJOs and plain values, which is most DataStream jobs), and by the per-record key
function otherwise (strings, rows, SQL rows, plug-ins). ``Values`` checks that every record's
value fills exactly its framed length, with NumPy where the type's layout allows it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Optional

import numpy as np

from ckpt_tool.framing import framing as _framing
from ckpt_tool.records.elements import NON_RECORDS, RECORD, RECORD_WITH_TIMESTAMP
from ckpt_tool.records.schema import Exchange
from ckpt_tool.records.types import DataType, RecordDecodeError, decode_value, parse_type
from ckpt_tool.records.types.binary import compact, null_bits_size


@dataclass
class ChannelRecords:
    """The elements of one stitched channel stream. Element i is ``data[starts[i] + 4:ends[i]]``
    (``starts[i]`` is its length field); bytes from ``ends[-1]`` on are trailing."""

    data: bytes
    starts: np.ndarray
    ends: np.ndarray
    tags: np.ndarray
    trailing: int
    _value_starts: Optional[np.ndarray] = field(default=None, init=False, repr=False, compare=False)

    @property
    def is_record(self) -> np.ndarray:
        return self.tags <= RECORD  # RECORD_WITH_TIMESTAMP or RECORD

    def value_starts(self) -> np.ndarray:
        """Where each element's value begins (after its tag and timestamp); computed once (the value
        check and the key fields both need it)."""
        if self._value_starts is None:
            self._value_starts = self.starts + 4 + np.where(self.tags == RECORD_WITH_TIMESTAMP, 9, 1)
        return self._value_starts

    def element(self, index: int) -> bytes:
        return self.data[self.starts[index] + 4 : self.ends[index]]

    def element_bounds(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where elements ``indices`` lie in ``data``, as ``element`` gives them (without their
        length fields): int64 starts and ends, for ``_framing``'s calls over many elements."""
        starts = np.ascontiguousarray(self.starts[indices], dtype=np.int64) + 4
        return starts, np.ascontiguousarray(self.ends[indices], dtype=np.int64)

    def framed(self, selected: np.ndarray) -> bytes:
        """The chosen elements (a boolean mask), each with its length field, concatenated."""
        if selected.all():
            return self.data[: len(self.data) - self.trailing]
        starts, ends = self.starts[selected], self.ends[selected]
        return _framing.gather(self.data, np.ascontiguousarray(starts), np.ascontiguousarray(ends))


def frame_channel(data: bytes) -> ChannelRecords:
    """Split a stitched channel stream into elements and check each element's tag and size.

    Flink's record serializer writes each element as a 4-byte big-endian length and its bytes;
    an element (even its length field) may span buffers. The walk along the lengths is the C
    loop ``_framing.frame``; bytes after the last whole element are ``trailing``."""
    try:
        starts_bytes, end = _framing.frame(data)
    except ValueError as exc:
        raise RecordDecodeError(str(exc)) from None
    starts = np.frombuffer(starts_bytes, dtype=np.int64)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    if len(ends):
        ends[-1] = end
    sizes = ends - starts - 4
    if (sizes == 0).any():
        raise _element_error(starts, _first(sizes == 0), "empty stream element")
    tags = np.frombuffer(data, dtype=np.uint8)[starts + 4] if len(starts) else np.zeros(0, np.uint8)
    _check_elements(starts, tags, sizes)
    return ChannelRecords(data, starts, ends, tags, len(data) - end)


@dataclass
class FramedChannels:
    """Several channels' streams framed together, each on its own (records never cross channels):
    ``records`` holds every element of every channel (``records.trailing`` is 0), element i
    belongs to channel ``channel[i]``; channel k is ``records.data[bounds[k]:bounds[k + 1]]``,
    its elements are ``first[k]:first[k + 1]``, and its last ``trailing[k]`` bytes are a cut record."""

    records: ChannelRecords
    bounds: np.ndarray
    first: np.ndarray
    channel: np.ndarray
    trailing: np.ndarray

    @classmethod
    def of(cls, records: ChannelRecords) -> FramedChannels:
        """One channel's records (``frame_channel``), as channels framed together."""
        count = len(records.starts)
        return cls(
            ChannelRecords(records.data, records.starts, records.ends, records.tags, 0),
            np.array([0, len(records.data)], dtype=np.int64),
            np.array([0, count], dtype=np.int64),
            np.zeros(count, dtype=np.int64),
            np.array([records.trailing], dtype=np.int64),
        )

    def part(self, start: int, stop: int) -> FramedChannels:
        """Channels ``start`` to ``stop`` (exclusive), sharing the bytes."""
        first, last = int(self.first[start]), int(self.first[stop])
        records = self.records
        return FramedChannels(
            ChannelRecords(records.data, records.starts[first:last], records.ends[first:last], records.tags[first:last], 0),
            self.bounds[start : stop + 1],
            self.first[start : stop + 1] - first,
            self.channel[first:last] - start,
            self.trailing[start:stop],
        )


def frame_channels(streams: list[bytes]) -> FramedChannels:
    """``frame_channel`` of each stream, in one C pass and one NumPy pass over all of them. Raises a
    RecordDecodeError where some stream does not frame (``frame_channel`` of each, one by one,
    says which element of which)."""
    bounds = np.zeros(len(streams) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, streams), dtype=np.int64, count=len(streams)), out=bounds[1:])
    return frame_joined(b"".join(streams), bounds)


def frame_joined(data: bytes, bounds: np.ndarray) -> FramedChannels:
    """``frame_channels`` of the streams ``data[bounds[k]:bounds[k + 1]]``."""
    try:
        starts_bytes, ends_bytes = _framing.frame_segments(data, bounds)
    except ValueError as exc:
        raise RecordDecodeError(str(exc)) from None
    starts = np.frombuffer(starts_bytes, dtype=np.int64)
    last = np.frombuffer(ends_bytes, dtype=np.int64)
    first = np.searchsorted(starts, bounds)  # elements of channel k: first[k]:first[k + 1]
    counts = np.diff(first)
    channel = np.repeat(np.arange(len(bounds) - 1), counts)
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    closing = first[1:][counts > 0] - 1  # each channel's last element ends where its framing ended
    ends[closing] = last[counts > 0]
    sizes = ends - starts - 4
    if (sizes == 0).any():
        raise _element_error(starts, _first(sizes == 0), "empty stream element")
    tags = np.frombuffer(data, dtype=np.uint8)[starts + 4] if len(starts) else np.zeros(0, np.uint8)
    _check_elements(starts, tags, sizes)
    return FramedChannels(ChannelRecords(data, starts, ends, tags, 0), bounds, first, channel, bounds[1:] - last)


def _element_error(starts: np.ndarray, index: int, problem: str) -> RecordDecodeError:
    """``problem`` of element ``index``, named by its position in the channel."""
    return RecordDecodeError(f"stream element {index} (from byte {starts[index]} of the channel): {problem}")


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def _check_elements(starts: np.ndarray, tags: np.ndarray, sizes: np.ndarray) -> None:
    known = tags <= RECORD
    for tag, (kind, size) in NON_RECORDS.items() if not known.all() else ():  # records only: nothing else to check
        mine = tags == tag
        known |= mine
        wrong = mine & (sizes != 1 + size)
        if wrong.any():
            raise _element_error(starts, _first(wrong), f"{kind} element of {sizes[wrong][0]} bytes, expected {1 + size}")
    if not known.all():
        raise _element_error(starts, _first(~known), f"unknown stream element tag {tags[~known][0]}")
    short = (tags == RECORD_WITH_TIMESTAMP) & (sizes < 9)
    if short.any():
        raise _element_error(starts, _first(short), "record too short for its timestamp")


# --- fixed-width fields -------------------------------------------------------------------------

_U32 = np.uint32
# scalar -> (bytes, big-endian dtype) as Flink's serializers write them
_FIXED = {
    "long": (8, ">i8"),
    "int": (4, ">i4"),
    "short": (2, ">i2"),
    "byte": (1, "i1"),
    "double": (8, ">f8"),
    "float": (4, ">f4"),
    "boolean": (1, "u1"),
    "char": (2, ">u2"),
}


@dataclass(frozen=True)
class _FixedKey:
    """Where the key fields are in every record's value, and which bytes must hold which value
    for that to be so (a POJO's flags and null flags)."""

    fields: tuple[tuple[int, str], ...]  # (offset in the value, scalar type)
    expected: tuple[tuple[int, int], ...]  # (offset in the value, byte)


@dataclass(frozen=True)
class _Leading:
    """A value's leading fixed-width fields: where each is, which bytes must hold which value for
    that to be so (a POJO's flags and null flags), where they end, and the fields after them."""

    places: tuple[tuple[int, str], ...]  # (offset in the value, scalar type), by field
    expected: tuple[tuple[int, int], ...]  # (offset in the value, byte)
    end: int
    rest: tuple[DataType, ...]


def _leading(value_type: DataType) -> _Leading:
    if value_type.name in _FIXED:
        return _Leading(((0, value_type.name),), (), _FIXED[value_type.name][0], ())
    if value_type.name not in ("tuple", "pojo"):
        return _Leading((), (), 0, (value_type,))
    pojo = value_type.name == "pojo"
    offset, expected, places = (1, [(0, 0x02)], []) if pojo else (0, [], [])
    for field_type in value_type.fields:
        if field_type.name not in _FIXED:
            break
        if pojo:
            expected.append((offset, 0))  # not null
            offset += 1
        places.append((offset, field_type.name))
        offset += _FIXED[field_type.name][0]
    return _Leading(tuple(places), tuple(expected), offset, tuple(value_type.fields[len(places) :]))


def fixed_key(value_type: DataType, key: tuple) -> Optional[_FixedKey]:
    """Where a key lies in every value of ``value_type`` (``fixed_key_hashes`` reads it), or None
    where a field before or in the key varies in size."""
    leading = _leading(value_type)
    if value_type.name in _FIXED:
        return _FixedKey(leading.places, ()) if list(key) in (["value"], ["*"]) else None
    if value_type.name not in ("tuple", "pojo"):
        return None
    order = [value_type.field_index(k) for k in key]
    if max(order) >= len(leading.places):
        return None
    last = leading.places[max(order)][0]
    return _FixedKey(tuple(leading.places[i] for i in order), tuple(e for e in leading.expected if e[0] < last))


# --- values -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """Values of fixed-width fields, possibly ending in one field of varying size: a string
    (``StringValue``: a varint length + 1, then a varint per UTF-16 unit) or an int length and
    that many bytes (``byte[]``, ``BinaryRowData`` of at least ``minimum`` bytes)."""

    expected: tuple[tuple[int, int], ...]  # (offset in the value, byte)
    width: int  # bytes before the last field of varying size
    tail: Optional[str]  # None, "string" or "sized"
    minimum: int = 0


def _layout(value_type: DataType) -> Optional[_Layout]:
    """The layout of a type's values, or None where it takes decoding value by value."""
    leading = _leading(value_type)
    expected, width = list(leading.expected), leading.end
    if not leading.rest:
        return _Layout(tuple(expected), width, None)
    if len(leading.rest) > 1 or leading.rest[0].name not in ("string", "bytes", "binary_row"):
        return None
    last = leading.rest[0]
    if value_type.name == "pojo":
        expected.append((width, 0))  # not null
        width += 1
    if last.name == "string":
        return _Layout(tuple(expected), width, "string")
    arity = len(last.fields)
    return _Layout(tuple(expected), width, "sized", null_bits_size(arity) + 8 * arity if last.name == "binary_row" else 0)


class Values:
    """Checks a channel's records against the exchange's record type: every value must decode to
    exactly its framed length. Values of a ``_Layout`` are checked with NumPy over the whole
    channel; the others, and those the layout cannot vouch for (a POJO with a null), are decoded
    one by one, and the first that does not fit is the error."""

    def __init__(self, exchange: Exchange):
        self.layout: Optional[_Layout] = None
        self.decode: Optional[Callable[[bytes, int], Any]] = None
        if exchange.record_type == "avro":
            from ckpt_tool.records.avro import AvroReader

            self.decode = AvroReader(exchange.avro_schema or "null", logical=False).read
        elif exchange.record_type:
            value_type = parse_type(exchange.record_type)
            self.layout = _layout(value_type)
            self.decode = partial(decode_value, value_type)

    def check(self, records: ChannelRecords, selected: np.ndarray) -> None:
        """Raise a RecordDecodeError for the first selected record whose value does not fit."""
        if self.decode is None:
            return
        chosen = np.flatnonzero(selected)
        values = records.value_starts()
        if self.layout is not None:
            chosen = chosen[~_fits(self.layout, records.data, values[chosen], records.ends[chosen])]
        for i in chosen.tolist():
            try:
                self.decode(records.element(i), int(values[i] - records.starts[i] - 4))
            except RecordDecodeError as exc:
                raise _element_error(records.starts, i, str(exc)) from None


def _fits(layout: _Layout, data: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each value (``data[starts[i]:ends[i]]``) is one value of the layout, exactly."""
    raw = np.frombuffer(data, dtype=np.uint8)

    def byte(at: np.ndarray) -> np.ndarray:  # where ``at`` is past the value the value does not fit anyway
        return raw[np.minimum(at, len(raw) - 1)].astype(np.int64)

    fits = ends - starts >= layout.width + {None: 0, "string": 1, "sized": 4}[layout.tail]
    for offset, expected in layout.expected:
        fits &= byte(starts + offset) == expected
    tail = starts + layout.width
    if layout.tail is None:
        return fits & (ends == tail)
    if layout.tail == "sized":
        length = (byte(tail) << 24 | byte(tail + 1) << 16 | byte(tail + 2) << 8 | byte(tail + 3)).astype(np.uint32).view(np.int32)
        return fits & (length >= layout.minimum) & (ends == tail + 4 + length)
    # a string: the varint of its length + 1 (at most 5 bytes), then that many - 1 varints, each
    # ending in the one byte of it below 0x80 (one C pass over the values' bytes)
    checked = np.flatnonzero(fits)
    if len(checked):
        tails, last = np.ascontiguousarray(tail[checked], dtype=np.int64), np.ascontiguousarray(ends[checked], dtype=np.int64)
        fits[checked] = np.frombuffer(_framing.string_tails(data, tails, last), dtype=np.uint8).astype(bool)
    return fits


# --- key groups ---------------------------------------------------------------------------------


def _field_hash(values: np.ndarray, name: str) -> np.ndarray:
    """Java ``hashCode`` of boxed scalars, as uint32."""
    if name in ("long", "double"):
        if name == "double":
            values = np.where(np.isnan(values), np.float64("nan"), values)  # Double's canonical NaN
        bits = values.astype(values.dtype.newbyteorder("=")).view(np.uint64)
        return ((bits ^ (bits >> np.uint64(32))) & np.uint64(0xFFFFFFFF)).astype(_U32)
    if name == "float":
        values = np.where(np.isnan(values), np.float32("nan"), values)
        return values.astype(np.float32).view(_U32)
    if name == "boolean":
        return np.where(values != 0, _U32(1231), _U32(1237))
    return values.astype(np.int64).astype(_U32)  # int, short, byte sign-extend; char is unsigned


def murmur_key_groups(hashes: np.ndarray, max_parallelism: int) -> np.ndarray:
    """``KeyGroupRangeAssignment.computeKeyGroupForKeyHash`` for an array of uint32 hash codes (one C loop)."""
    codes = np.ascontiguousarray(hashes, dtype=_U32)
    return np.frombuffer(_framing.key_groups(codes, max_parallelism), dtype=np.int32)


class KeyGroups:
    """Key groups of a keyed exchange's records, a channel at a time; their values are checked
    against the record type on the way (the per-record key function decodes each one whole)."""

    def __init__(self, exchange: Exchange, max_parallelism: int):
        self.max_parallelism = max_parallelism
        self.fixed: Optional[_FixedKey] = None
        if exchange.record_type and not exchange.decoder:
            self.fixed = fixed_key(parse_type(exchange.record_type), exchange.key)
        self.exchange = exchange
        self.values = Values(exchange)
        self._key_of: Optional[Callable[[bytes, int], tuple[int, Any]]] = None  # built on first need

    def of(self, records: ChannelRecords, selected: np.ndarray) -> np.ndarray:
        """The key group of each selected element (records only)."""
        if self.fixed or self.exchange.decoder:  # else the key function decodes every value
            self.values.check(records, selected)
        hashes = fixed_key_hashes(records, selected, self.fixed) if self.fixed else None
        if hashes is None:
            key_of = self._key_of = self._key_of or self.exchange.key_function(printable=False)
            if key_of is None:
                raise RecordDecodeError("the exchange has no key to compute key groups from")
            offsets = (records.value_starts() - records.starts - 4).tolist()

            def key_hash(i: int) -> int:
                try:
                    return key_of(records.element(i), offsets[i])[0]
                except RecordDecodeError as exc:  # the first record that does not fit its type, by position
                    raise _element_error(records.starts, i, str(exc)) from None

            hashes = np.fromiter(
                (key_hash(i) for i in np.flatnonzero(selected).tolist()),
                dtype=np.int64,
                count=int(selected.sum()),
            ).astype(_U32)
        return murmur_key_groups(hashes, self.max_parallelism)


def fixed_key_hashes(records: ChannelRecords, selected: np.ndarray, fixed: _FixedKey) -> Optional[np.ndarray]:
    """The Java hash codes (uint32) of the keys of the selected records (a mask or indices), read
    a field at a time; None where a record's bytes do not say the key is where ``fixed`` has it
    (a null or a subclass: the per-record path decides)."""
    data = np.frombuffer(records.data, dtype=np.uint8)
    values = records.value_starts()[selected]
    ends = records.ends[selected]
    for offset, byte in fixed.expected:
        if ((values + offset >= ends) | (data[np.minimum(values + offset, len(data) - 1)] != byte)).any():
            return None  # a null or a subclass somewhere: leave it to the per-record path
    columns = []
    for offset, name in fixed.fields:
        width, dtype = _FIXED[name]
        if (values + offset + width > ends).any():
            raise RecordDecodeError(f"a record ends inside its {name} key")
        columns.append(np.frombuffer(_framing.gather(records.data, values + offset, values + offset + width), dtype=dtype))
    return field_hashes(columns, [name for _, name in fixed.fields])


def field_hashes(columns: list[np.ndarray], names: list[str]) -> np.ndarray:
    """The Java hash codes (uint32) of keys made of the scalar fields ``columns`` (of the scalar
    types ``names``): a field's own hashCode, or TupleN's (31 * h + field) of several."""
    combined = _field_hash(columns[0], names[0])
    for column, name in zip(columns[1:], names[1:]):
        with np.errstate(over="ignore"):
            combined = combined * _U32(31) + _field_hash(column, name)
    return combined


# --- flat values, a column at a time -------------------------------------------------------------

# the scalars whose bytes NumPy reads as they are (a char is a UTF-16 unit: decoded one by one)
_FLAT_SCALARS = frozenset(_FIXED) - {"char"}


@dataclass(frozen=True)
class FlatColumns:
    """Values of a flat type decoded a column at a time (``FlatValues.columns``): which of the
    records asked for they are (``decoded``, a mask; the others take the per-record path), each
    fixed-width field as a NumPy array (native byte order) and the trailing string, where the type
    ends in one, as its UTF-8 bytes one after another with int64 offsets and a mask of nulls."""

    decoded: np.ndarray
    fields: list[np.ndarray]
    text: Optional[bytes] = None
    text_offsets: Optional[np.ndarray] = None
    text_null: Optional[np.ndarray] = None


class FlatValues:
    """Values of a flat type (a scalar, a string, or a tuple or POJO of scalars possibly ending in
    a string, ``Tuple2<Long,String>`` say) read with NumPy a column at a time rather than decoded
    one by one: the records a ``_Layout`` vouches for, whose string (if any) is ASCII (a byte per
    UTF-16 unit, which is UTF-8 as it is). ``of`` gives None for the other types."""

    def __init__(self, leading: _Leading, layout: _Layout):
        self.leading = leading
        self.layout = layout

    @classmethod
    def of(cls, value_type: DataType) -> Optional[FlatValues]:
        layout = _layout(value_type)
        leading = _leading(value_type)
        if layout is None or layout.tail == "sized" or any(name not in _FLAT_SCALARS for _, name in leading.places):
            return None
        return cls(leading, layout)

    def columns(self, records: ChannelRecords, indices: np.ndarray) -> FlatColumns:
        data = records.data
        values = records.value_starts()[indices]
        ends = records.ends[indices]
        decoded = _fits(self.layout, data, values, ends)
        text = text_offsets = text_null = None
        if self.layout.tail == "string":
            raw = np.frombuffer(data, dtype=np.uint8)
            tail = values + self.layout.width
            # the varint of the length + 1 (at most 5 bytes): its value and where the units begin
            length = np.zeros(len(tail), dtype=np.int64)
            begin = tail.copy()
            going = decoded.copy()
            for i in range(5):
                byte = raw[np.minimum(tail + i, len(raw) - 1)].astype(np.int64)
                length |= np.where(going, (byte & 0x7F) << (7 * i), 0)
                begin += going
                going &= byte >= 0x80
            null = length == 0
            # a byte per unit: every unit is below 0x80, ASCII (a record that fits ends its units at its end)
            decoded &= null | (length - 1 == ends - begin)
            chosen = np.flatnonzero(decoded)
            text, text_offsets = _ranges(data, begin[chosen], ends[chosen])
            text_null = null[chosen]
        chosen_values = values[decoded]
        columns = []
        for offset, name in self.leading.places:
            width, dtype = _FIXED[name]
            at = np.ascontiguousarray(chosen_values + offset, dtype=np.int64)
            column = np.frombuffer(_framing.gather(data, at, at + width), dtype=dtype)
            columns.append(column != 0 if name == "boolean" else column.astype(column.dtype.newbyteorder("=")))
        return FlatColumns(decoded, columns, text, text_offsets, text_null)


# --- SQL rows, a column at a time ----------------------------------------------------------------

# the SQL fields read from their slots as they are: Flink's scalars, little-endian (as
# ``BinaryRowData`` holds them; a SQL row has no char)
_SQL_FIXED = {name: (width, dtype.replace(">", "<")) for name, (width, dtype) in _FIXED.items() if name != "char"}
# the SQL fields read as an int or a long from their slot: days, milliseconds of the day, and (where
# compact) a timestamp's milliseconds and a decimal's unscaled value
_SQL_WORDS = {"date": "<i4", "time": "<i4", "timestamp": "<i8", "timestamp_ltz": "<i8", "decimal": "<i8"}
# key fields a projection copies as they are (a float's NaN aside): their key rows are hashed at once
_SQL_KEY_FIELDS = frozenset(("long", "int", "short", "byte", "boolean"))


@dataclass(frozen=True)
class RowColumns:
    """SQL rows (``BinaryRowData``) read a column at a time (``RowValues.columns``): which of the
    records asked for they are (``decoded``; the others take the per-record path), and per field
    its values (a NumPy array, or a string's UTF-8 bytes one after another with int64 offsets) and
    its nulls, over the decoded rows."""

    decoded: np.ndarray
    fields: list[Any]
    nulls: list[np.ndarray]


class RowValues:
    """SQL rows whose fields are all numbers, booleans, strings, dates, times, and timestamps and
    decimals that fit their slot (``binary_row<id:bigint,name:string>`` say) read with NumPy a
    column at a time: a fixed-width field from its slot, a string
    inline in its slot (up to 7 bytes) or where its slot points, as the UTF-8 it is. Rows that do
    not fit their length, a string that points outside its row or is not whole UTF-8, and (where
    ``key`` is given) a null key field take the per-record path. ``key``: the key fields, read so
    only where each is a number or a boolean (``key_hashes``)."""

    def __init__(self, value_type: DataType, key: Optional[list[int]]):
        self.types = [t.name for t in value_type.fields]
        self.layout = _layout(value_type)
        self.key = key

    @classmethod
    def of(cls, value_type: DataType, key: tuple = ()) -> Optional[RowValues]:
        if value_type.name != "binary_row" or not value_type.fields:
            return None
        if any(
            t.name not in _SQL_FIXED and t.name != "string" and not (t.name in _SQL_WORDS and compact(t))
            for t in value_type.fields
        ):
            return None
        indices = [value_type.field_index(k) for k in key] if key else []
        fixed_key = bool(indices) and all(value_type.fields[i].name in _SQL_KEY_FIELDS for i in indices)
        return cls(value_type, indices if fixed_key else None)

    def columns(self, records: ChannelRecords, indices: np.ndarray) -> RowColumns:
        data = records.data
        raw = np.frombuffer(data, dtype=np.uint8)
        values = records.value_starts()[indices]
        ends = records.ends[indices]
        decoded = _fits(self.layout, data, values, ends)  # type: ignore[arg-type]
        row = values + 4  # after the row's int length
        null_bits = null_bits_size(len(self.types))

        def nulls_of(index: int) -> np.ndarray:
            bit = index + 8
            return (raw[np.minimum(row + (bit >> 3), len(raw) - 1)] >> (bit & 7)) & 1 == 1

        def slots(index: int, width: int, chosen: np.ndarray) -> bytes:
            at = np.ascontiguousarray(row[chosen] + null_bits + 8 * index, dtype=np.int64)
            return _framing.gather(data, at, at + width)

        nulls = [nulls_of(i) for i in range(len(self.types))]
        if self.key is not None:
            for i in self.key:
                decoded &= ~nulls[i]
        # where each string lies: inline in its slot (a set top bit, the length in the top byte's
        # low bits) or at the offset its slot points to, inside its row
        texts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        chosen = np.flatnonzero(decoded)
        for i, name in enumerate(self.types):
            if name != "string":
                continue
            word = np.zeros(len(indices), dtype=np.uint64)
            word[chosen] = np.frombuffer(slots(i, 8, chosen), dtype="<u8")
            inline = (word >> np.uint64(63)) == 1
            size = np.where(inline, (word >> np.uint64(56)) & np.uint64(0x7F), word & np.uint64(0xFFFFFFFF)).astype(np.int64)
            start = np.where(inline, row + null_bits + 8 * i, row + (word >> np.uint64(32)).astype(np.int64))
            size[nulls[i]] = 0
            start[nulls[i]] = row[nulls[i]]
            decoded &= np.where(inline, size <= 7, start + size <= ends)
            texts[i] = (start, size)
        chosen = np.flatnonzero(decoded)
        fields: list[Any] = []
        for i, name in enumerate(self.types):
            if name == "string":
                start, size = texts[i]
                fields.append(_ranges(data, start[chosen], start[chosen] + size[chosen]))
            else:
                width, dtype = _SQL_FIXED[name] if name in _SQL_FIXED else (int(_SQL_WORDS[name][-1]), _SQL_WORDS[name])
                column = np.frombuffer(slots(i, width, chosen), dtype=dtype)
                fields.append(column != 0 if name == "boolean" else column.astype(column.dtype.newbyteorder("=")))
        # a string that is not whole UTF-8 is decoded one by one (with replacement characters)
        other = np.zeros(len(chosen), dtype=bool)
        for values_of in fields:
            if isinstance(values_of, tuple):
                other |= ~_whole_utf8(*values_of)
        if other.any():
            decoded[chosen[other]] = False
            keep = ~other
            fields = [_kept(values_of, keep) for values_of in fields]
            chosen = chosen[keep]
        return RowColumns(decoded, fields, [n[chosen] for n in nulls])

    def key_hashes(self, columns: RowColumns) -> np.ndarray:
        """``BinaryRowData.hashCode`` (uint32) of each decoded row's key row, as the planner's key
        selector projects it (``BinaryRow.project``): no nulls (rows with a null key field are not
        decoded), RowKind INSERT, each field's value in its slot, the rest zero; murmur3 by
        little-endian words, seed 42."""
        key = self.key or []
        count = len(columns.nulls[0]) if columns.nulls else 0
        words = np.zeros((count, (null_bits_size(len(key)) + 8 * len(key)) // 4), dtype=np.uint32)
        for place, index in enumerate(key):
            name = self.types[index]
            slot = np.zeros((count, 8), dtype=np.uint8)
            value = columns.fields[index]
            width = _SQL_FIXED[name][0]
            little = value.astype(np.uint8) if name == "boolean" else value.astype(value.dtype.newbyteorder("<"))
            slot[:, :width] = little.view(np.uint8).reshape(count, width)
            first = null_bits_size(len(key)) // 4 + 2 * place
            words[:, first : first + 2] = slot.view("<u4")
        return _row_hashes(words)


def _whole_utf8(text: bytes, offsets: np.ndarray) -> np.ndarray:
    """Whether each string (``text[offsets[i]:offsets[i + 1]]``) is valid UTF-8 on its own: all
    of them are where their concatenation is and none starts inside a character (with a
    continuation byte); else those of ASCII bytes only."""
    raw = np.frombuffer(text, dtype=np.uint8)
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        wide = np.zeros(len(raw) + 1, dtype=np.int64)
        np.cumsum(raw >= 0x80, out=wide[1:])
        return wide[offsets[1:]] == wide[offsets[:-1]]
    starts = offsets[:-1]
    lead = raw[np.minimum(starts, max(len(raw) - 1, 0))] if len(raw) else np.zeros(len(starts), dtype=np.uint8)
    return ~((offsets[1:] > starts) & (lead >= 0x80) & (lead < 0xC0))


def _kept(field: Any, keep: np.ndarray) -> Any:
    """A field's values (an array, or strings as bytes and offsets) of the rows ``keep`` says."""
    if not isinstance(field, tuple):
        return field[keep]
    text, offsets = field
    return _ranges(text, offsets[:-1][keep], offsets[1:][keep])


def _ranges(data: bytes, first: np.ndarray, last: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The byte ranges ``data[first[i]:last[i]]`` one after another, and the int64 offsets where
    each begins (one more: where the last ends), as an Arrow string array holds them."""
    first = np.ascontiguousarray(first, dtype=np.int64)
    last = np.ascontiguousarray(last, dtype=np.int64)
    offsets = np.zeros(len(first) + 1, dtype=np.int64)
    np.cumsum(last - first, out=offsets[1:])
    return _framing.gather(data, first, last), offsets


def _row_hashes(words: np.ndarray) -> np.ndarray:
    """murmur3 (``MurmurHashUtils.hashBytesByWords``, seed 42) of each row of little-endian words."""
    c1, c2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
    h = np.full(len(words), 42, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):
            k = words[:, j] * c1
            k = ((k << np.uint32(15)) | (k >> np.uint32(17))) * c2
            h ^= k
            h = ((h << np.uint32(13)) | (h >> np.uint32(19))) * np.uint32(5) + np.uint32(0xE6546B64)
        h ^= np.uint32(4 * words.shape[1])
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h
