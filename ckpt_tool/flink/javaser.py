"""A reader for the small part of Java object serialization that ``CheckpointProperties`` uses.

Metadata v4+ ends with ``ObjectOutputStream.writeObject(CheckpointProperties)``. ckpt keeps those
bytes verbatim when writing; this reader decodes them to check them and for display: plain
serializable objects (no custom ``writeObject`` data), strings, enums, null and back-references.

The bytes are untrusted, so the reader is bounded: objects nest at most ``MAX_DEPTH`` deep, at
most ``MAX_HANDLES`` values get a handle, and the graph, with every back-reference expanded, has at
most ``MAX_EXPANDED`` values (a string counts its characters): a few hundred bytes of
back-references that double at each level ("billion laughs") are refused, not expanded. A
back-reference into an object that is still being read (a cycle) is refused too, so the decoded
value is a finite tree whose shared parts are shared Python objects.
"""

from __future__ import annotations

import struct
from typing import NoReturn

from ckpt_tool.flink.javaio import JavaReader

STREAM_MAGIC = 0xACED
STREAM_VERSION = 5
TC_NULL, TC_REFERENCE, TC_CLASSDESC, TC_OBJECT, TC_STRING = 0x70, 0x71, 0x72, 0x73, 0x74
TC_ENDBLOCKDATA, TC_ENUM = 0x78, 0x7E
TYPE_CODES = {
    0x75: "an array",
    0x76: "a class",
    0x77: "block data",
    0x79: "a stream reset",
    0x7A: "long block data",
    0x7B: "an exception",
    0x7C: "a long string",
    0x7D: "a proxy class description",
}
BASE_HANDLE = 0x7E0000
SC_WRITE_METHOD = 0x01
SC_SERIALIZABLE = 0x02
SC_EXTERNALIZABLE = 0x04
SC_ENUM = 0x10
PRIMITIVES = {"B": "i8", "Z": "boolean", "I": "i32", "J": "i64", "S": "short", "C": "char", "F": "float", "D": "double"}
CHECKPOINT_PROPERTIES = "org.apache.flink.runtime.checkpoint.CheckpointProperties"

# The classes Flink 1.16 to 2.3 write in CheckpointProperties, with their serialVersionUIDs (an
# enum's is always 0), and the constants of its enums (Flink's sources; the same in every version)
FLINK_CLASSES = {
    CHECKPOINT_PROPERTIES: 2,
    "org.apache.flink.runtime.checkpoint.CheckpointType": struct.unpack(">q", bytes.fromhex("d6de4f0305ae1d3a"))[0],
    "org.apache.flink.runtime.checkpoint.SavepointType": struct.unpack(">q", bytes.fromhex("a087d308a45814b8"))[0],
    "java.lang.Enum": 0,
    "org.apache.flink.runtime.checkpoint.SnapshotType$SharingFilesStrategy": 0,
    "org.apache.flink.runtime.checkpoint.SavepointType$PostCheckpointAction": 0,
    "org.apache.flink.core.execution.SavepointFormatType": 0,
}
FLINK_ENUMS = {
    "org.apache.flink.runtime.checkpoint.SnapshotType$SharingFilesStrategy": ("FORWARD_BACKWARD", "FORWARD", "NO_SHARING"),
    "org.apache.flink.runtime.checkpoint.SavepointType$PostCheckpointAction": ("NONE", "SUSPEND", "TERMINATE"),
    "org.apache.flink.core.execution.SavepointFormatType": ("CANONICAL", "NATIVE"),
}

# Flink's CheckpointProperties: 3 levels, about 12 handles, about 250 expanded values.
MAX_DEPTH = 32
MAX_HANDLES = 1024
MAX_EXPANDED = 1 << 18

_UNFINISHED = object()  # the value of a handle whose object is still being read


class _ClassDesc:
    def __init__(self, name: str, flags: int, fields: list[tuple[str, str]], parent: _ClassDesc | None):
        self.name, self.flags, self.fields, self.parent = name, flags, fields, parent


def describe(value) -> str:
    """A decoded value's kind in Java's words, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f'a String "{value[:40]}{"..." if len(value) > 40 else ""}"'
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, dict):
        return f"an object of class {value['class']}"
    return "a class description"


class _Reader:
    def __init__(self, reader: JavaReader, what: str):
        self.r = reader
        self.what = what
        self.handles: list[object] = []
        self.sizes: dict[int, int] = {}  # id() of a decoded object -> its expanded size
        self.depth = 0
        # (name, serialVersionUID, at, flags, field count) of each class description
        self.classes: list[tuple[str, int, int, int, int]] = []
        self.constants: list[tuple[str, str, int]] = []  # (enum class, constant, at) of each enum value

    def fail(self, message: str, at: int | None = None) -> NoReturn:
        self.r.fail(f"{self.what}: {message}" if self.what else message, at)

    def short(self, what: str) -> int:
        hi, lo = self.r.raw(2, what)
        return (hi << 8) | lo

    def new_handle(self, value: object) -> int:
        if len(self.handles) >= MAX_HANDLES:
            self.fail(f"more than {MAX_HANDLES} objects (ckpt's limit)")
        self.handles.append(value)
        return len(self.handles) - 1

    def size(self, value) -> int:
        """The number of values ``value`` expands to (a string: 1 plus its characters)."""
        if isinstance(value, str):
            return 1 + len(value)
        if isinstance(value, dict):
            return self.sizes[id(value)]
        return 1

    def content(self):
        """The next value: null, a string, an enum constant (its name), an object (a dict) or a
        class description; shared values are the same Python object."""
        at = self.r.pos
        tag = self.r.u8("type code")
        if tag == TC_NULL:
            return None
        if tag == TC_REFERENCE:
            handle = self.r.i32("handle")
            index = handle - BASE_HANDLE
            if not 0 <= index < len(self.handles):
                self.fail(f"back-reference 0x{handle & 0xFFFFFFFF:x} to no object read before it", at)
            value = self.handles[index]
            if value is _UNFINISHED:
                self.fail(f"back-reference 0x{handle:x} into an object that is still being read (a cycle)", at)
            return value
        if tag == TC_STRING:
            value = self.r.utf("string")
            self.new_handle(value)
            return value
        if tag in (TC_CLASSDESC, TC_ENUM, TC_OBJECT):
            if self.depth >= MAX_DEPTH:
                self.fail(f"objects nested more than {MAX_DEPTH} deep (ckpt's limit)", at)
            self.depth += 1
            try:
                if tag == TC_CLASSDESC:
                    return self.class_desc_body()
                return self.enum_body() if tag == TC_ENUM else self.object_body(at)
            finally:
                self.depth -= 1
        kind = TYPE_CODES.get(tag)
        self.fail(
            f"{kind} (type code 0x{tag:02x}), which CheckpointProperties never holds"
            if kind
            else f"unknown type code 0x{tag:02x}",
            at,
        )

    def class_desc(self, what: str) -> _ClassDesc | None:
        at = self.r.pos
        value = self.content()
        if value is not None and not isinstance(value, _ClassDesc):
            self.fail(f"{what} is {describe(value)}, not a class description", at)
        return value

    def class_desc_body(self) -> _ClassDesc:
        start = at = self.r.pos
        name = self.r.utf("class name")
        uid = self.r.i64("serialVersionUID")
        slot = self.new_handle(_UNFINISHED)
        flags = self.r.u8("class flags")
        fields = []
        at = self.r.pos
        count = self.short("field count")
        if count * 3 > self.r.remaining:  # a type code and a name's length at least
            self.fail(f"field count {count} needs more than the {self.r.remaining} bytes left", at)
        for _ in range(count):
            at = self.r.pos
            code = chr(self.r.u8("field type"))
            field_name = self.r.utf("field name")
            if code in "L[":
                type_at = self.r.pos
                type_name = self.content()
                if not isinstance(type_name, str):
                    self.fail(f"the type of field {field_name} is {describe(type_name)}, not a String", type_at)
            elif code not in PRIMITIVES:
                self.fail(f"unknown field type code {code!r}", at)
            fields.append((code, field_name))
        self.classes.append((name, uid, start, flags, len(fields)))
        if self.r.u8("end of class annotation") != TC_ENDBLOCKDATA:
            self.fail("class annotations are not supported")
        desc = _ClassDesc(name, flags, fields, self.class_desc("a superclass"))
        self.handles[slot] = desc
        return desc

    def enum_body(self) -> str:
        at = self.r.pos
        desc = self.class_desc("an enum's class")
        if desc is None:
            self.fail("an enum without a class description", at)
        slot = self.new_handle(_UNFINISHED)
        at = self.r.pos
        constant = self.content()
        if not isinstance(constant, str):
            self.fail(f"an enum constant's name is {describe(constant)}, not a String", at)
        self.constants.append((desc.name, constant, at))
        self.handles[slot] = constant
        return constant

    def object_body(self, at: int) -> dict:
        desc = self.class_desc("an object's class")
        if desc is None:
            self.fail("an object without a class description", at)
        desc_name = desc.name
        value: dict = {"class": desc_name}
        slot = self.new_handle(_UNFINISHED)
        chain = []
        while desc is not None:
            chain.append(desc)
            desc = desc.parent
        size = 1
        for cls in reversed(chain):
            if cls.flags & SC_WRITE_METHOD:
                self.fail(f"{cls.name} has custom serialization data")
            for code, name in cls.fields:
                kind = PRIMITIVES.get(code)
                if kind is None:
                    field_at = self.r.pos
                    value[name] = self.content()
                    if isinstance(value[name], _ClassDesc):
                        self.fail(f"field {name} holds a class description", field_at)
                elif kind in ("short", "char"):
                    raw = self.short(name)
                    value[name] = raw - 0x10000 if kind == "short" and raw > 0x7FFF else raw
                elif kind in ("float", "double"):
                    value[name] = struct.unpack(">f" if kind == "float" else ">d", self.r.raw(4 if kind == "float" else 8, name))[
                        0
                    ]
                else:
                    value[name] = getattr(self.r, kind)(name)
                size += self.size(value[name])
                if size > MAX_EXPANDED:
                    self.fail(
                        f"an object of class {value['class']} expands to more than {MAX_EXPANDED} values (ckpt's limit)", at
                    )
        value["class"] = desc_name  # a field named "class" cannot pass for the class
        self.sizes[id(value)] = size
        self.handles[slot] = value
        return value


def _header(reader: JavaReader, what: str) -> None:
    at = reader.pos
    magic, version = reader.raw(2, "stream magic"), reader.raw(2, "stream version")
    if int.from_bytes(magic, "big") != STREAM_MAGIC or int.from_bytes(version, "big") != STREAM_VERSION:
        reader.fail(f"{what} are not a Java serialization stream (header {(magic + version).hex()})", at)


def read_java_object(data: bytes):
    """Decode one serialized object (the whole of ``data``) into dicts, strings and numbers."""
    reader = JavaReader(data, "checkpoint properties")
    _header(reader, "checkpoint properties")
    value = _Reader(reader, "").content()
    if isinstance(value, _ClassDesc):
        reader.fail("a class description where an object belongs")
    if reader.remaining:
        reader.fail(f"{reader.remaining} bytes after the serialized object")
    return value


def read_checkpoint_properties(reader: JavaReader) -> dict:
    """Read the Java-serialized ``CheckpointProperties`` at the reader's position, leaving the
    reader at its end. Anything Flink could not cast to a ``CheckpointProperties`` holding a
    ``SnapshotType`` object (a String, null, a String ``checkpointType`` ...) is refused, naming
    what was found; so are streams beyond ckpt's limits."""
    what = "checkpoint properties"
    _header(reader, what)
    at = reader.pos
    decoder = _Reader(reader, what)
    value = decoder.content()
    if not isinstance(value, dict) or value["class"] != CHECKPOINT_PROPERTIES:
        reader.fail(f"{what} are {describe(value)}, not a {CHECKPOINT_PROPERTIES}", at)
    snapshot_type = value.get("checkpointType")
    if not isinstance(snapshot_type, dict):
        reader.fail(f"{what}: checkpointType is {describe(snapshot_type)}, not a SnapshotType object", at)
    for name in ("name", "sharingFilesStrategy", "formatType", "postCheckpointAction"):
        if not isinstance(snapshot_type.get(name), (str, type(None))):
            reader.fail(f"{what}: checkpointType.{name} is {describe(snapshot_type[name])}, not a String", at)
    _check_flink_classes(decoder)
    return value


def _check_flink_classes(decoder: _Reader) -> None:
    """Each class and enum constant of the properties one Flink has, as its ``ObjectInputStream``
    resolves them: an unknown class fails the restore (``ClassNotFoundException``), so does another
    serialVersionUID (``InvalidClassException``; an enum's is 0) and an unknown constant
    (``Enum.valueOf``)."""
    for name, uid, at, flags, field_count in decoder.classes:
        early = _descriptor_problem(uid, flags, field_count)
        if early:
            decoder.fail(f"class {name}: {early} (Flink: InvalidClassException)", at)
        if name not in FLINK_CLASSES:
            decoder.fail(f"class {name}, which Flink does not have (Flink: ClassNotFoundException)", at)
        if uid != FLINK_CLASSES[name]:
            decoder.fail(
                f"class {name} with serialVersionUID {uid}, not Flink's {FLINK_CLASSES[name]} (Flink: InvalidClassException)", at
            )
        late = _binding_problem(name, flags)
        if late:
            decoder.fail(f"class {name}: {late} (Flink: InvalidClassException)", at)
    for name, constant, at in decoder.constants:
        if constant not in FLINK_ENUMS.get(name, ()):
            decoder.fail(f"No enum constant {name.replace('$', '.')}.{constant} (Flink's words)", at)


def _descriptor_problem(uid: int, flags: int, field_count: int) -> str:
    """What ``ObjectStreamClass.readNonProxy`` refuses in a class description as it reads it
    (before it looks the class up), in its words; "" where nothing."""
    if flags & SC_SERIALIZABLE and flags & SC_EXTERNALIZABLE:
        return "serializable and externalizable flags conflict"
    if flags & SC_ENUM and uid != 0:
        return f"enum descriptor has non-zero serialVersionUID: {uid}"
    if flags & SC_ENUM and field_count:
        return f"enum descriptor has non-zero field count: {field_count}"
    return ""


def _binding_problem(name: str, flags: int) -> str:
    """What binding a class description to Flink's class of that name refuses
    (``ObjectStreamClass.initNonProxy``, then ``checkDeserialize`` as an object of it is read), in
    Java's words; "" where nothing. Flink's enums are enums (``java.lang.Enum`` counts as one); its
    other classes here are ``Serializable``, not ``Externalizable``. (Java checks a description's
    serialVersionUID between the enum binding and the rest; a mutation changes one of them.)"""
    local_enum = name in FLINK_ENUMS or name == "java.lang.Enum"
    if bool(flags & SC_ENUM) != local_enum:
        bound = ("enum", "a non-enum") if flags & SC_ENUM else ("non-enum", "an enum")
        return f"cannot bind {bound[0]} descriptor to {bound[1]} class"
    if not local_enum and flags & SC_EXTERNALIZABLE:  # (Serializable in the stream's terms too)
        return "Serializable incompatible with Externalizable"
    if not local_enum and not flags & SC_SERIALIZABLE:
        return "class invalid for deserialization"
    return ""
