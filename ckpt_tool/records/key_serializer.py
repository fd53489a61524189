"""The key serializer a checkpoint's keyed state was written with, and the check that a schema's
key type agrees with it.

Keyed state starts with a ``KeyedBackendSerializationProxy`` (the head of a hashmap key-groups
file; RocksDB's meta file): an int version, a compression flag, then the key serializer's
snapshot (``TypeSerializerSnapshotSerializationProxy``: an int version, then the snapshot's class
name, its version and its own bytes). Composite snapshots hold their fields' snapshots in a
``NestedSerializersSnapshotDelegate`` (magic 0x001457FD, version, count, the snapshots);
``RowDataSerializerSnapshot`` first writes its logical types Java-serialized; DECIMAL and
TIMESTAMP snapshots write their precision (and scale). The tree of serializers says the key
type: ``LongSerializer``, ``StringSerializer``, ``TupleSerializer<...>``, ``RowDataSerializer<...>``
of a SQL key's columns ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from ckpt_tool.errors import CheckpointFormatError, CkptError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.javaio import JavaReader
from ckpt_tool.flink.model import (
    ByteStreamHandle,
    ChangelogBackendHandle,
    FileHandle,
    IncrementalKeyedHandle,
    KeyGroupsHandle,
    OperatorState,
    RelativeFileHandle,
    SegmentFileHandle,
)
from ckpt_tool.records.types import DataType, parse_type

NESTED_MAGIC = b"\x00\x14\x57\xfd"
HEADER_BYTES = 64 * 1024  # the proxy's head, where the key serializer is, is far smaller
# Snapshots inside snapshots (a Tuple of Rows of Maps ...): real keys nest a few levels; ckpt
# refuses more than this rather than recursing without bound.
MAX_SNAPSHOT_DEPTH = 32

# serializer (the snapshot's outer class) -> ckpt's key type family
FAMILIES = {
    "LongSerializer": "long",
    "IntSerializer": "int",
    "ShortSerializer": "short",
    "ByteSerializer": "byte",
    "BooleanSerializer": "boolean",
    "DoubleSerializer": "double",
    "FloatSerializer": "float",
    "CharSerializer": "char",
    "StringSerializer": "string",
    "StringDataSerializer": "string",
    "BytePrimitiveArraySerializer": "bytes",
    "InstantSerializer": "instant",
    "LocalDateSerializer": "local_date",
    "LocalTimeSerializer": "local_time",
    "LocalDateTimeSerializer": "local_date_time",
    "EnumSerializer": "enum",
    "TupleSerializer": "tuple",
    "RowSerializer": "row",
    "ListSerializer": "list",
    "MapSerializer": "map",
    "PojoSerializer": "pojo",
    "RowDataSerializer": "binary_row",
    "ArrayDataSerializer": "array",
    "MapDataSerializer": "map",
    "DecimalDataSerializer": "decimal",
    "TimestampDataSerializer": "timestamp",
}
_SIMPLE = {
    name
    for name, family in FAMILIES.items()
    if family not in ("tuple", "row", "list", "map", "pojo", "binary_row", "array", "decimal", "timestamp")
}


class KeyTypeMismatch(CkptError):
    """A schema's key type that the checkpoint's keyed state contradicts."""


class SnapshotTooDeep(CheckpointFormatError):
    """A key serializer snapshot nested beyond ckpt's limit: refused, never skipped."""


@dataclass
class SerializerSnapshot:
    """A serializer as its snapshot names it: ``LongSerializer``, ``DecimalDataSerializer(20,2)``,
    ``TupleSerializer<...>``. ``known``: the whole tree was understood."""

    serializer: str
    params: tuple[int, ...] = ()
    nested: list[SerializerSnapshot] = field(default_factory=list)
    known: bool = True

    def __str__(self) -> str:
        text = self.serializer + (f"({','.join(map(str, self.params))})" if self.params else "")
        return text + (f"<{', '.join(map(str, self.nested))}>" if self.nested else "")

    def family(self) -> Optional[str]:
        """The key type in ckpt's terms, or None where a part is not understood."""
        name = FAMILIES.get(self.serializer)
        if name is None or not self.known:
            return None
        parts = [n.family() for n in self.nested]
        if any(p is None for p in parts):
            return None
        params = f"({','.join(map(str, self.params))})" if self.params else ""
        return name + params + (f"<{','.join(p for p in parts if p)}>" if parts else "")


def _serializer_name(snapshot_class: str) -> str:
    """``...base.LongSerializer$LongSerializerSnapshot`` -> ``LongSerializer``; a top-level
    ``...TupleSerializerSnapshot`` -> ``TupleSerializer``."""
    outer, _, inner = snapshot_class.rpartition(".")[2].partition("$")
    if inner:
        return outer
    return re.sub(r"(ConfigSnapshot|Snapshot)$", "", outer)


class _Parser:
    def __init__(self, data: bytes, where: str):
        self.reader = JavaReader(data, where)
        self.depth = 0

    def versioned(self) -> SerializerSnapshot:
        if self.depth >= MAX_SNAPSHOT_DEPTH:
            raise SnapshotTooDeep(
                f"{self.reader.source}: key serializer snapshots nested more than {MAX_SNAPSHOT_DEPTH} deep "
                f"(ckpt's limit) at byte {self.reader.pos}"
            )
        self.depth += 1
        try:
            return self._versioned()
        finally:
            self.depth -= 1

    def _versioned(self) -> SerializerSnapshot:
        snapshot_class = self.reader.utf("serializer snapshot class")
        self.reader.i32("snapshot version")
        name = _serializer_name(snapshot_class)
        if name in _SIMPLE:
            return SerializerSnapshot(name)
        if name == "DecimalDataSerializer":
            return SerializerSnapshot(name, (self.reader.i32("precision"), self.reader.i32("scale")))
        if name == "TimestampDataSerializer":
            return SerializerSnapshot(name, (self.reader.i32("precision"),))
        if name in ("ArrayDataSerializer", "MapDataSerializer"):  # Java-serialized types, then the snapshots
            count = 1 if name == "ArrayDataSerializer" else 2
            nested = []
            for _ in range(count):
                self._skip_to_snapshot_class()
                nested.append(self.versioned())
            return SerializerSnapshot(name, (), nested)
        if name in FAMILIES:  # composites: their fields' snapshots in a nested delegate
            return SerializerSnapshot(name, (), self._delegate())
        return SerializerSnapshot(name, known=False)

    def _delegate(self) -> list[SerializerSnapshot]:
        start = self.reader.data.find(NESTED_MAGIC, self.reader.pos)
        if start < 0:
            self.reader.fail("no nested serializer snapshots")
        self.reader.pos = start + 4
        self.reader.i32("nested snapshots version")
        return [self.versioned() for _ in range(self.reader.count("nested snapshots", 6))]  # a name's length, a version

    def _skip_to_snapshot_class(self) -> None:
        match = re.compile(rb"[\x00][\x08-\xff][a-zA-Z_$][\w$.]*Snapshot").search(self.reader.data, self.reader.pos)
        if match is None:
            self.reader.fail("no nested serializer snapshot")
        self.reader.pos = match.start()


def parse_key_serializer(data: bytes, where: str) -> SerializerSnapshot:
    """The key serializer of a ``KeyedBackendSerializationProxy`` at the start of ``data``."""
    reader = _Parser(data, where)
    version = reader.reader.i32("keyed state version")
    if version >= 2:
        reader.reader.boolean("compression flag")
    reader.reader.i32("snapshot proxy version")
    return reader.versioned()


def _head(checkpoint: Checkpoint, handle) -> Optional[bytes]:
    """The first bytes of a stream handle (its proxy), without reading a whole large file."""
    if isinstance(handle, ByteStreamHandle):
        return handle.data[:HEADER_BYTES]
    if isinstance(handle, (FileHandle, RelativeFileHandle, SegmentFileHandle)):
        location = checkpoint.location(handle)
        if location is None:
            return None
        start = handle.start if isinstance(handle, SegmentFileHandle) else 0
        return checkpoint.io.read_range(location, start, min(handle.size, HEADER_BYTES))
    return None


def _proxy_stream(handle):
    if isinstance(handle, KeyGroupsHandle):
        return handle.delegate
    if isinstance(handle, IncrementalKeyedHandle):
        return handle.meta
    if isinstance(handle, ChangelogBackendHandle):
        return next((_proxy_stream(h) for h in handle.materialized if _proxy_stream(h) is not None), None)
    return None


def key_serializer(checkpoint: Checkpoint, op: OperatorState) -> Optional[SerializerSnapshot]:
    """The key serializer of an operator's keyed state, or None without keyed state."""
    for subtask in op.subtasks:
        stream = _proxy_stream(subtask.managed_keyed)
        try:
            data = _head(checkpoint, stream) if stream is not None else None
            if data:
                return parse_key_serializer(data, checkpoint.location(stream) or f"keyed state of {op.label}")
        except SnapshotTooDeep:
            raise
        except CkptError:
            return None  # keyed state ckpt cannot read (missing, damaged) says nothing against the schema
    return None


def _family(t: DataType) -> str:
    """The family of the serializer Flink uses for a ckpt type (SQL types by their internal serializers)."""
    name = t.name
    if t.sql:
        name = {"date": "int", "time": "int", "timestamp_ltz": "timestamp", "multiset": "map"}.get(name, name)
        if name == "row":
            name = "binary_row"
    params = ""
    if name == "decimal":
        params = f"({t.precision},{t.scale})"
    elif name == "timestamp":
        params = f"({t.precision})"
    fields = t.fields
    if t.name == "multiset":
        fields = (t.fields[0], DataType("int", sql=True))
    inner = ",".join(_family(f) for f in fields) if name not in ("pojo",) else ""
    return name + params + (f"<{inner}>" if inner else "")


def schema_key_family(record_type: str, key: tuple, avro_schema: Optional[str] = None) -> Optional[str]:
    """The key serializer family a schema's key implies, or None where ckpt cannot say."""
    if not key:
        return None
    if record_type == "avro":
        from ckpt_tool.records.avro import avro_key_types

        types = avro_key_types(avro_schema or "null", key)
        return _family(types[0]) if len(types) == 1 else "tuple<" + ",".join(_family(t) for t in types) + ">"
    value_type = parse_type(record_type)
    if value_type.name not in ("tuple", "row", "pojo", "binary_row"):
        return _family(value_type)
    fields = [value_type.fields[value_type.field_index(k)] for k in key]
    if value_type.name == "binary_row":
        return "binary_row<" + ",".join(_family(f) for f in fields) + ">"
    if len(fields) == 1:
        return _family(fields[0])
    return "tuple<" + ",".join(_family(f) for f in fields) + ">"


def check_key_types(checkpoint: Checkpoint, exchanges) -> None:
    """Refuse a schema whose key type disagrees with the key serializer of the keyed state the
    exchange feeds (the downstream operator's), naming both."""
    for exchange in exchanges or []:
        if not exchange.keyed or not exchange.record_type or exchange.decoder:
            continue
        expected = schema_key_family(exchange.record_type, exchange.key, exchange.avro_schema)
        op = checkpoint.metadata.operator(exchange.downstream_id)
        snapshot = key_serializer(checkpoint, op) if expected else None
        found = snapshot.family() if snapshot else None
        if expected and found and expected != found:
            raise KeyTypeMismatch(
                f"exchange {checkpoint.metadata.exchange_label(exchange.upstream_id, exchange.downstream_id)}: the schema's key "
                f"{list(exchange.key)} of {exchange.record_type} is {expected}, but {op.label}'s keyed state was written "
                f"with key serializer {snapshot} ({found})"
            )
