"""The vectorised record path (C framing, NumPy tags and key groups) against the per-record one."""

import math
import struct

import numpy as np
import pytest

from ckpt_tool.records.batch import KeyGroups, frame_channel
from ckpt_tool.records.keys import key_group_for_hash
from ckpt_tool.records.schema import Exchange
from ckpt_tool.records.types import RecordDecodeError

MAX_PARALLELISM = 128


def framed(*elements: bytes) -> bytes:
    return b"".join(struct.pack(">i", len(e)) + e for e in elements)


def record(value: bytes, timestamp: bool = True) -> bytes:
    return (b"\x00" + struct.pack(">q", 7) if timestamp else b"\x01") + value


def flink_string(text: str) -> bytes:
    return bytes([len(text) + 1]) + text.encode("ascii")


SCALARS = {
    "long": (">q", [0, 1, -1, 2**40 + 3, -(2**63), 2**63 - 1]),
    "int": (">i", [0, 5, -5, 2**31 - 1, -(2**31)]),
    "short": (">h", [0, 3, -3, 32767, -32768]),
    "byte": (">b", [0, 9, -9, 127, -128]),
    "double": (">d", [0.0, -0.0, 1.5, -2.25, math.nan, math.inf]),
    "float": (">f", [0.0, -0.0, 1.5, math.nan, -math.inf]),
    "char": (">H", [0, 65, 0xFFFF]),
    "boolean": (">?", [True, False]),
}


def per_record_key_groups(exchange: Exchange, stream: bytes) -> list[int]:
    records = frame_channel(stream)
    key_of = exchange.key_function()
    offsets = records.value_starts() - records.starts - 4
    return [
        key_group_for_hash(key_of(records.element(i), int(offsets[i]))[0], MAX_PARALLELISM)
        for i in np.flatnonzero(records.is_record)
    ]


def vectorised_key_groups(exchange: Exchange, stream: bytes, expect_fixed: bool = True) -> list[int]:
    records = frame_channel(stream)
    keys = KeyGroups(exchange, MAX_PARALLELISM)
    assert (keys.fixed is not None) == expect_fixed
    return keys.of(records, records.is_record).tolist()


@pytest.mark.parametrize("name", sorted(SCALARS))
def test_scalar_keys_match_java_hash_codes(name):
    fmt, values = SCALARS[name]
    stream = framed(*(record(struct.pack(fmt, v), timestamp=i % 2 == 0) for i, v in enumerate(values)))
    exchange = Exchange("u", "d", record_type=name, key=("value",))
    assert vectorised_key_groups(exchange, stream) == per_record_key_groups(exchange, stream)


def test_tuple_fields_after_fixed_fields_and_several_key_fields():
    record_type = "tuple<int,short,byte,boolean,char,double,float,long,string>"
    stream = framed(
        *(
            record(
                struct.pack(">ihb?Hdfq", i * 7919 - 50, -i, i % 100, i % 3 == 0, i, i / 3, -i / 7, i**3) + flink_string(f"k{i}")
            )
            for i in range(300)
        ),
        struct.pack(">bq", 2, 99),
    )  # a watermark in between is no record
    for key in (("f0",), ("f5",), ("f7",), ("f7", "f0"), ("f3", "f4", "f6")):
        exchange = Exchange("u", "d", record_type=record_type, key=key)
        assert vectorised_key_groups(exchange, stream) == per_record_key_groups(exchange, stream), key


def test_string_keys_take_the_per_record_path():
    stream = framed(*(record(struct.pack(">q", i) + flink_string(f"user-{i}")) for i in range(50)))
    exchange = Exchange("u", "d", record_type="tuple<long,string>", key=("f1",))
    assert vectorised_key_groups(exchange, stream, expect_fixed=False) == per_record_key_groups(exchange, stream)


def test_pojo_keys_with_and_without_nulls_before_them():
    # pojo<amount:double,id:long,name:string>: flags 0x02, then a null flag and a value per field
    def pojo(amount, ident):
        first = b"\x01" if amount is None else b"\x00" + struct.pack(">d", amount)
        return b"\x02" + first + b"\x00" + struct.pack(">q", ident) + b"\x00" + flink_string("n")

    exchange = Exchange("u", "d", record_type="pojo<name:string,id:long,amount:double>", key=("id",))
    healthy = framed(*(record(pojo(i / 2, i * 31)) for i in range(100)))
    assert vectorised_key_groups(exchange, healthy) == per_record_key_groups(exchange, healthy)
    with_null = framed(*(record(pojo(None if i == 50 else i / 2, i * 31)) for i in range(100)))
    assert vectorised_key_groups(exchange, with_null) == per_record_key_groups(exchange, with_null)


def test_a_record_ending_inside_its_key_is_an_error():
    exchange = Exchange("u", "d", record_type="tuple<long,long>", key=("f1",))
    with pytest.raises(RecordDecodeError):
        vectorised_key_groups(exchange, framed(record(struct.pack(">qi", 1, 2))))


@pytest.mark.parametrize(
    "stream, error, message",
    [
        (framed(b"\x00" + b"x" * 20) + struct.pack(">i", -5), RecordDecodeError, "negative record length -5 at byte 25"),
        (framed(b""), RecordDecodeError, "empty stream element"),
        (framed(b"\x09abc"), RecordDecodeError, "unknown stream element tag 9"),
        (framed(b"\x02" + b"\x00" * 4), RecordDecodeError, "watermark element of 5 bytes, expected 9"),
        (framed(b"\x00\x00"), RecordDecodeError, "record too short for its timestamp"),
    ],
)
def test_bad_elements(stream, error, message):
    with pytest.raises(error, match=message):
        frame_channel(stream)


def test_elements_classified_and_trailing_bytes_kept():
    stream = framed(record(b"a"), struct.pack(">bq", 2, 5), b"\x04" + b"\x00" * 4, record(b"b", False))
    records = frame_channel(stream + b"\x00\x00\x00\x09abc")
    assert records.tags.tolist() == [0, 2, 4, 1] and records.trailing == 7
    assert records.is_record.tolist() == [True, False, False, True]
    assert records.framed(records.is_record) == framed(record(b"a"), record(b"b", False))
