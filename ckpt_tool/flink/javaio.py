"""Java's DataInput/DataOutput encodings (big-endian numbers, modified UTF-8 strings)."""

from __future__ import annotations

import struct
from typing import NoReturn

from ckpt_tool.errors import CheckpointFormatError

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")


def encode_modified_utf8(text: str) -> bytes:
    """Encode like java.io.DataOutput.writeUTF, without the length prefix."""
    if text.isascii() and "\0" not in text:  # chars 1 to 127 are one byte each, as in ASCII
        return text.encode("ascii")
    units = text.encode("utf-16-be", "surrogatepass")
    out = bytearray()
    for i in range(0, len(units), 2):
        c = (units[i] << 8) | units[i + 1]
        if 0x0001 <= c <= 0x007F:
            out.append(c)
        elif c <= 0x07FF:
            out += bytes((0xC0 | (c >> 6), 0x80 | (c & 0x3F)))
        else:
            out += bytes((0xE0 | (c >> 12), 0x80 | ((c >> 6) & 0x3F), 0x80 | (c & 0x3F)))
    return bytes(out)


def decode_modified_utf8(data: bytes) -> str:
    """Decode like java.io.DataInput.readUTF; raises ValueError on malformed input."""
    if data.isascii():  # every byte below 0x80 is the char of the same code, NUL included
        return data.decode("ascii")
    units = bytearray()
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b < 0x80:
            c, i = b, i + 1
        elif b >> 5 == 0b110 and i + 1 < n and data[i + 1] >> 6 == 0b10:
            c, i = ((b & 0x1F) << 6) | (data[i + 1] & 0x3F), i + 2
        elif b >> 4 == 0b1110 and i + 2 < n and data[i + 1] >> 6 == 0b10 and data[i + 2] >> 6 == 0b10:
            c = ((b & 0x0F) << 12) | ((data[i + 1] & 0x3F) << 6) | (data[i + 2] & 0x3F)
            i += 3
        else:
            raise ValueError(f"malformed modified UTF-8 at string byte {i}")
        units += bytes((c >> 8, c & 0xFF))
    return units.decode("utf-16-be", "surrogatepass")


class JavaReader:
    """Reads Java DataInput encodings from bytes, tracking the position for error messages."""

    def __init__(self, data: bytes, source: str = "_metadata"):
        self.data = data
        self.pos = 0
        self.source = source

    def _take(self, count: int, what: str) -> bytes:
        if count < 0:
            self.fail(f"negative length {count} for {what}")
        end = self.pos + count
        if end > len(self.data):
            raise CheckpointFormatError(
                f"{self.source} is truncated: {what} needs {count} bytes at byte {self.pos}, "
                f"but the file ends at byte {len(self.data)}"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def fail(self, message: str, at: int | None = None) -> NoReturn:
        where = self.pos if at is None else at
        raise CheckpointFormatError(f"{self.source}: {message} at byte {where}")

    def u8(self, what: str = "a byte") -> int:
        pos = self.pos
        if pos >= len(self.data):
            self._take(1, what)  # says where the file ends
        self.pos = pos + 1
        return self.data[pos]

    def i8(self, what: str = "a byte") -> int:
        value = self.u8(what)
        return value - 256 if value > 127 else value

    def boolean(self, what: str = "a boolean") -> bool:
        return self.u8(what) != 0

    def i32(self, what: str = "an int") -> int:
        return self._unpack(_INT, what)

    def i64(self, what: str = "a long") -> int:
        return self._unpack(_LONG, what)

    def _unpack(self, field: struct.Struct, what: str) -> int:
        """One fixed-width field, read in place (a ``_metadata`` of a job at parallelism 4,096 holds
        hundreds of thousands: no slice of the bytes each)."""
        pos = self.pos
        if pos + field.size > len(self.data):
            self._take(field.size, what)  # says where the file ends
        self.pos = pos + field.size
        return field.unpack_from(self.data, pos)[0]

    def count(self, what: str, item_bytes: int = 1) -> int:
        """An int that counts following items of at least ``item_bytes`` each; negative counts,
        and counts of more items than the bytes left can hold, are malformed."""
        start = self.pos
        value = self.i32(what)
        if value < 0:
            self.fail(f"negative {what} {value}", at=start)
        if value * item_bytes > len(self.data) - self.pos:
            self.fail(f"{what} {value} needs more than the {len(self.data) - self.pos} bytes left", at=start)
        return value

    def utf(self, what: str = "a string") -> str:
        length = _take_ushort(self, what)
        start = self.pos
        raw = self._take(length, what)
        try:
            return decode_modified_utf8(raw)
        except ValueError as exc:
            self.fail(f"{what}: {exc}", at=start)
            raise  # unreachable, keeps type checkers calm

    def raw(self, count: int, what: str = "bytes") -> bytes:
        return self._take(count, what)

    def rest(self) -> bytes:
        chunk = self.data[self.pos :]
        self.pos = len(self.data)
        return chunk

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos


def _take_ushort(reader: JavaReader, what: str) -> int:
    hi, lo = reader.raw(2, f"length of {what}")
    return (hi << 8) | lo


class JavaWriter:
    """Writes Java DataOutput encodings into a growing buffer."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def u8(self, value: int) -> None:
        self.buffer.append(value & 0xFF)

    def boolean(self, value: bool) -> None:
        self.buffer.append(1 if value else 0)

    def i32(self, value: int) -> None:
        self.buffer += _INT.pack(value)

    def i64(self, value: int) -> None:
        self.buffer += _LONG.pack(value)

    def utf(self, text: str) -> None:
        encoded = encode_modified_utf8(text)
        if len(encoded) > 0xFFFF:
            raise ValueError(f"string too long for writeUTF: {len(encoded)} bytes")
        self.buffer += bytes((len(encoded) >> 8, len(encoded) & 0xFF))
        self.buffer += encoded

    def raw(self, data: bytes) -> None:
        self.buffer += data

    def getvalue(self) -> bytes:
        return bytes(self.buffer)
