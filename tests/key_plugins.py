"""A key plug-in as a user would write one (used by test_schema.py with `--plugin key_plugins`:
a schema names it as decoder = "key_plugins:tuple2_long_key")."""

import struct


def tuple2_long_key(value: bytes) -> tuple[int, int]:
    """Key hash of a Tuple2<Long, ...> keyed by f0: Java's Long.hashCode of the first field."""
    (key,) = struct.unpack_from(">q", value)
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    h = (unsigned ^ (unsigned >> 32)) & 0xFFFFFFFF
    return (h - (1 << 32) if h & 0x80000000 else h), key
