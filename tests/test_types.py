"""Value decoding as Flink's serializers write, and type expressions."""

from __future__ import annotations

import struct

import pytest

from ckpt_tool.records.types import (
    BinaryRow,
    Row,
    TypeSyntaxError,
    build_binary_row,
    decode_value,
    parse_type,
    to_json,
)


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def flink_string(text: str) -> bytes:
    """StringValue.writeString: length + 1, then each UTF-16 unit as a varint."""
    units = text.encode("utf-16-be", "surrogatepass")
    chars = [(units[i] << 8) | units[i + 1] for i in range(0, len(units), 2)]
    return varint(len(chars) + 1) + b"".join(varint(c) for c in chars)


@pytest.mark.parametrize("text", ["", "a", "rec-42-abc", "é€😀", "x" * 300])
def test_string(text):
    assert decode_value(parse_type("string"), flink_string(text)) == (text, len(flink_string(text)))


def test_null_string():
    assert decode_value(parse_type("string"), b"\x00") == (None, 1)


def test_scalars_and_tuple():
    data = struct.pack(">qihbdf?H", -5, 7, -2, 3, 1.5, 0.25, True, ord("z")) + struct.pack(">i", 2) + b"\x01\x02"
    t = parse_type("tuple<long,int,short,byte,double,float,boolean,char,bytes>")
    value, end = decode_value(t, data)
    assert value == (-5, 7, -2, 3, 1.5, 0.25, True, "z", b"\x01\x02") and end == len(data)


def test_row_kind_and_null_mask():
    # 2 kind bits (+U = 2 -> second bit) then null bits for 3 fields: field 1 is null
    mask = 0b01010000  # bits: kind0=0, kind1=1, f0=0, f1=1, f2=0
    data = bytes([mask]) + struct.pack(">q", 9) + struct.pack(">i", 4)
    value, _ = decode_value(parse_type("row<long,string,int>"), data)
    assert value == Row(2, [9, None, 4])
    assert to_json(parse_type("row<long,string,int>"), value) == {"kind": "+U", "fields": [9, None, 4]}


def test_pojo_fields_are_sorted_by_name():
    t = parse_type("pojo<name:string,id:long,amount:double>")
    assert t.field_names == ("amount", "id", "name")
    data = b"\x02" + b"\x00" + struct.pack(">d", 2.5) + b"\x01" + b"\x00" + flink_string("n")
    value, end = decode_value(t, data)
    assert value == {"amount": 2.5, "id": None, "name": "n"} and end == len(data)
    assert decode_value(t, b"\x01") == (None, 1)


def test_binary_row_round_trip():
    t = parse_type("binary_row<bigint,varchar(20),int,boolean,double,string>")
    values = [123456789012, "a longer string", -7, True, 2.5, "short"]
    row = build_binary_row(t.fields, values)
    assert len(row.data) % 8 == 0
    assert row.values() == values
    serialized = struct.pack(">i", len(row.data)) + row.data
    decoded, end = decode_value(t, serialized)
    assert isinstance(decoded, BinaryRow) and decoded.values() == values and end == len(serialized)
    with_null = build_binary_row(t.fields[:2], [None, "x"])
    assert with_null.values() == [None, "x"] and with_null.is_null(0)


@pytest.mark.parametrize("bad", ["", "tuple<", "tuple<long", "nope", "pojo<long>", "tuple<long,>x"])
def test_bad_type_expressions(bad):
    with pytest.raises(TypeSyntaxError):
        parse_type(bad)


def test_field_references():
    t = parse_type("pojo<name:string,id:long>")
    assert t.field_index("name") == 1 and t.field_index(0) == 0
    assert parse_type("tuple<long,string>").field_index("f1") == 1
    with pytest.raises(TypeSyntaxError):
        t.field_index("missing")
