"""Java serialization streams built by hand, following the Java Object Serialization
Specification (chapter 6, "Object Serialization Stream Protocol"), for hostile checkpoint
properties. ``checkpoint_properties()`` rebuilds, byte for byte, what Flink writes (the tests
check that against a real fixture), so that a hostile stream differs from a real one only where
it is meant to.

Handles are numbered from 0x7E0000 in the order ``ObjectOutputStream`` assigns them: a class
description's before its field type strings, an object's after its class description and before
its field values, an enum's after its class description and before its constant's name.
"""

from __future__ import annotations

from collections.abc import Callable

BASE_HANDLE = 0x7E0000
SC_SERIALIZABLE, SC_ENUM = 0x02, 0x10
CHECKPOINT_PROPERTIES = "org.apache.flink.runtime.checkpoint.CheckpointProperties"
CHECKPOINT_TYPE = "org.apache.flink.runtime.checkpoint.CheckpointType"
SHARING_FILES_STRATEGY = "org.apache.flink.runtime.checkpoint.SnapshotType$SharingFilesStrategy"
BOOLEANS = ["discardCancelled", "discardFailed", "discardFinished", "discardSubsumed", "discardSuspended", "forced", "unclaimed"]

Writer = Callable[[], object]


class JavaStream:
    """``ObjectOutputStream`` by hand: each method writes one grammar element and returns the
    handle it was given (or None)."""

    def __init__(self) -> None:
        self.out = bytearray(b"\xac\xed\x00\x05")
        self.handles = 0

    def getvalue(self) -> bytes:
        return bytes(self.out)

    def new_handle(self) -> int:
        self.handles += 1
        return BASE_HANDLE + self.handles - 1

    def utf(self, text: str) -> None:
        raw = text.encode()
        self.out += len(raw).to_bytes(2, "big") + raw

    def null(self) -> None:
        self.out.append(0x70)

    def ref(self, handle: int) -> None:
        self.out += b"\x71" + handle.to_bytes(4, "big")

    def string(self, text: str) -> int:
        self.out.append(0x74)
        self.utf(text)
        return self.new_handle()

    def boolean(self, value: bool) -> None:
        self.out.append(1 if value else 0)

    def class_desc(
        self,
        name: str,
        fields: list[tuple[str, str, str | int | None]],
        suid: int = 1,
        flags: int = SC_SERIALIZABLE,
        parent: Writer | None = None,
    ) -> int:
        """TC_CLASSDESC: ``fields`` are (type code, name, type string or the handle of one);
        ``parent`` writes the superclass description (null without)."""
        self.out.append(0x72)
        self.utf(name)
        self.out += suid.to_bytes(8, "big", signed=True)
        handle = self.new_handle()
        self.out.append(flags)
        self.out += len(fields).to_bytes(2, "big")
        for code, field_name, type_name in fields:
            self.out.append(ord(code))
            self.utf(field_name)
            if isinstance(type_name, int):
                self.ref(type_name)
            elif type_name is not None:
                self.string(type_name)
        self.out.append(0x78)  # TC_ENDBLOCKDATA: no class annotation
        if parent is None:
            self.null()
        else:
            parent()
        return handle

    def object(self, desc: Writer, values: Callable[[int], object]) -> int:
        """TC_OBJECT: ``desc()`` writes the class description, ``values(handle)`` the field values."""
        self.out.append(0x73)
        desc()
        handle = self.new_handle()
        values(handle)
        return handle

    def enum(self, desc: Writer, constant: str) -> int:
        self.out.append(0x7E)
        desc()
        handle = self.new_handle()
        self.string(constant)
        return handle


def enum_desc(s: JavaStream, name: str) -> Writer:
    return lambda: s.class_desc(
        name, [], 0, SC_SERIALIZABLE | SC_ENUM, lambda: s.class_desc("java.lang.Enum", [], 0, SC_SERIALIZABLE | SC_ENUM)
    )


def checkpoint_properties(
    checkpoint_type: Callable[[JavaStream], object] | None = None,
    extra_fields: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
    extra_values: Callable[[JavaStream, int], object] | None = None,
) -> bytes:
    """Flink's ``CheckpointProperties`` of a checkpoint, as Flink 1.16 to 2.3 write it, with
    ``checkpoint_type(stream)`` writing the ``checkpointType`` value instead of a CheckpointType,
    and ``extra_fields`` (written by ``extra_values(stream, handle of the properties)``) after it."""
    s = JavaStream()
    booleans = [("Z", name, None) for name in BOOLEANS]
    fields = booleans + [("L", "checkpointType", "Lorg/apache/flink/runtime/checkpoint/SnapshotType;"), *extra_fields]

    def values(handle: int) -> None:
        for name in BOOLEANS:
            s.boolean(name in ("discardFinished", "discardSubsumed"))
        if checkpoint_type is not None:
            checkpoint_type(s)
        else:
            real_checkpoint_type(s)
        if extra_values is not None:
            extra_values(s, handle)

    s.object(lambda: s.class_desc(CHECKPOINT_PROPERTIES, fields, 2), values)
    return s.getvalue()


def real_checkpoint_type(s: JavaStream, name: Writer | None = None) -> int:
    """``CheckpointType{name='Checkpoint', sharingFilesStrategy=FORWARD_BACKWARD}``; ``name()``
    writes the name's value instead of the String."""
    fields = [
        ("L", "name", "Ljava/lang/String;"),
        ("L", "sharingFilesStrategy", "Lorg/apache/flink/runtime/checkpoint/SnapshotType$SharingFilesStrategy;"),
    ]

    def values(_: int) -> None:
        if name is None:
            s.string("Checkpoint")
        else:
            name()
        s.enum(enum_desc(s, SHARING_FILES_STRATEGY), "FORWARD_BACKWARD")

    return s.object(lambda: s.class_desc(CHECKPOINT_TYPE, fields, -2963844630364414662), values)


def billion_laughs(s: JavaStream, levels: int) -> int:
    """An object of ``levels`` nested ``Lol{a, b}`` whose ``b`` is a back-reference to ``a``:
    a few bytes a level, 2**levels objects when expanded."""
    desc_handle: list[int] = []

    def desc() -> None:
        if desc_handle:
            s.ref(desc_handle[0])
        else:
            desc_handle.append(s.class_desc("Lol", [("L", "a", "Ljava/lang/Object;"), ("L", "b", "Ljava/lang/Object;")]))

    def level(n: int) -> int:
        def values(_: int) -> None:
            if n == 0:
                s.string("lol")
                s.null()
            else:
                inner = level(n - 1)
                s.ref(inner)

        return s.object(desc, values)

    return level(levels)
