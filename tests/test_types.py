"""Value decoding as Flink's serializers write, and type expressions."""

from __future__ import annotations

import struct
from decimal import Decimal

import pytest

from ckpt_tool.records.types import (
    BinaryRow,
    Row,
    SqlTimestamp,
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


SQL_ROW = (
    "binary_row<user:string,amount:decimal(10,2),big:decimal(25,4),ts:timestamp(3),ts6:timestamp(6),"
    "ltz:timestamp_ltz(3),tags:array<string>,attrs:map<string,int>,seen:multiset<string>,"
    "info:row<a:int,b:varchar(20)>,code:char(3),raw:varbinary(8),day:date,at:time>"
)


def test_sql_types_round_trip_through_the_binary_layout():
    t = parse_type(SQL_ROW)
    assert t.field_names[:3] == ("user", "amount", "big") and str(t.fields[2]) == "decimal(25,4)"
    values = [
        "a longer user name",
        Decimal("-12345678.90"),
        Decimal("123456789012345678901.2345"),
        SqlTimestamp(1_700_000_000_123),
        SqlTimestamp(1_700_000_000_123, 456_000),
        SqlTimestamp(-5),
        ["x", None, "a string longer than seven"],
        [("k", 1), ("longer key", None)],
        [("e", 3)],
        [7, "inner"],
        "abc",
        b"\x00\x01\x02\x03\x04\x05\x06\x07",
        19000,
        3_600_000,
    ]
    row = build_binary_row(t.fields, values)
    assert len(row.data) % 8 == 0
    decoded = BinaryRow(row.data, t.fields, t.field_names)
    got = decoded.values()
    assert got[:6] == values[:6] and got[6].values() == values[6] and got[7].items() == values[7]
    assert got[8].items() == values[8] and got[9].values() == values[9] and got[10:] == values[10:]
    assert to_json(t, decoded)["ts6"] == "2023-11-14T22:13:20.123456" and to_json(t, decoded)["amount"] == "-12345678.90"
    # a projection copies fields exactly, whatever their layout
    assert (
        decoded.project([1, 2, 9]).data
        == build_binary_row((t.fields[1], t.fields[2], t.fields[9]), [values[1], values[2], values[9]]).data
    )


def test_null_non_compact_decimal_and_timestamp_keep_their_piece():
    t = parse_type("binary_row<decimal(20,2),timestamp(9),decimal(5,1)>")
    row = build_binary_row(t.fields, [None, None, None])
    # header word + 3 slots + 16 bytes (decimal piece) + 8 bytes (timestamp piece), all zero
    assert len(row.data) == 8 + 24 + 16 + 8 and row.values() == [None, None, None]
    assert int.from_bytes(row.data[8:16], "little") == 32 << 32 and int.from_bytes(row.data[16:24], "little") == 48 << 32


def test_sql_keys_by_column_name():
    from ckpt_tool.records.keys import binary_row_hash
    from ckpt_tool.records.schema import Exchange

    t = parse_type(SQL_ROW)
    values = [None] * len(t.fields)
    values[0], values[1] = "user-1", Decimal("1.50")
    row = build_binary_row(t.fields, values)
    key_of = Exchange(None, "x", record_type=SQL_ROW, key=("user", "amount")).key_function()
    assert key_of is not None
    key_hash, printable = key_of(struct.pack(">i", len(row.data)) + row.data, 0)
    assert key_hash == binary_row_hash(build_binary_row(t.fields[:2], values[:2]).data)
    assert printable == ["user-1", "1.50"]


def test_unknown_type_lists_the_supported_ones():
    with pytest.raises(TypeSyntaxError, match=r"unknown type 'decimals'; supported: .*decimal\(p,s\).*timestamp_ltz"):
        parse_type("binary_row<decimals(10,2)>")
