import pytest

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.javaio import JavaReader, JavaWriter, decode_modified_utf8, encode_modified_utf8


@pytest.mark.parametrize("text", ["", "abc", "Source: map -> sink", "\x00nul", "é ü ß", "€", "😀 emoji", "x" * 3000])
def test_modified_utf8_round_trip(text):
    assert decode_modified_utf8(encode_modified_utf8(text)) == text


def test_modified_utf8_matches_java_encoding():
    # Java writes U+0000 as C0 80 and a supplementary character as two 3-byte surrogates.
    assert encode_modified_utf8("\x00") == b"\xc0\x80"
    assert encode_modified_utf8("😀") == b"\xed\xa0\xbd\xed\xb8\x80"
    # ASCII takes a shortcut, except where it holds U+0000
    assert encode_modified_utf8("a\x00\x7f") == b"a\xc0\x80\x7f" and encode_modified_utf8("file:/x") == b"file:/x"


def test_writer_and_reader_agree():
    w = JavaWriter()
    w.i32(-5)
    w.i64(1 << 40)
    w.utf("name")
    w.u8(200)
    r = JavaReader(w.getvalue())
    assert (r.i32(), r.i64(), r.utf(), r.u8()) == (-5, 1 << 40, "name", 200)
    assert r.remaining == 0


def test_truncation_names_position_and_need():
    r = JavaReader(b"\x00\x00\x00\x01\x00", source="x/_metadata")
    r.i32()
    with pytest.raises(CheckpointFormatError, match=r"x/_metadata is truncated: a long needs 8 bytes at byte 4"):
        r.i64("a long")
