"""A reader for the small part of Java object serialization that ``CheckpointProperties`` uses.

Metadata v4+ ends with ``ObjectOutputStream.writeObject(CheckpointProperties)``. ckpt keeps those
bytes verbatim when writing; this reader only decodes them for display: plain serializable
objects (no custom ``writeObject`` data), strings, enums, null and back-references.
"""

from __future__ import annotations

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.javaio import JavaReader

STREAM_MAGIC = 0xACED
TC_NULL, TC_REFERENCE, TC_CLASSDESC, TC_OBJECT, TC_STRING = 0x70, 0x71, 0x72, 0x73, 0x74
TC_ENDBLOCKDATA, TC_ENUM = 0x78, 0x7E
BASE_HANDLE = 0x7E0000
SC_WRITE_METHOD = 0x01
PRIMITIVES = {"B": "i8", "Z": "boolean", "I": "i32", "J": "i64", "S": "short", "C": "short"}


class _ClassDesc:
    def __init__(self, name: str, flags: int, fields: list[tuple[str, str]], parent: _ClassDesc | None):
        self.name, self.flags, self.fields, self.parent = name, flags, fields, parent


class _Reader:
    def __init__(self, data: bytes):
        self.r = JavaReader(data, "checkpoint properties")
        self.handles: list[object] = []

    def short(self, what: str) -> int:
        hi, lo = self.r.raw(2, what)
        return (hi << 8) | lo

    def new_handle(self, value: object) -> int:
        self.handles.append(value)
        return len(self.handles) - 1

    def content(self):
        tag = self.r.u8("type code")
        if tag == TC_NULL:
            return None
        if tag == TC_REFERENCE:
            index = self.r.i32("handle") - BASE_HANDLE
            if not 0 <= index < len(self.handles):
                self.r.fail(f"dangling reference {index}")
            return self.handles[index]
        if tag == TC_STRING:
            value = self.r.utf("string")
            self.new_handle(value)
            return value
        if tag == TC_CLASSDESC:
            return self.class_desc_body()
        if tag == TC_ENUM:
            self.content()  # the enum's class description
            slot = self.new_handle(None)
            constant = self.content()
            self.handles[slot] = constant
            return constant
        if tag == TC_OBJECT:
            return self.object_body()
        self.r.fail(f"unsupported serialization type code 0x{tag:02x}")

    def class_desc_body(self) -> _ClassDesc:
        name = self.r.utf("class name")
        self.r.i64("serialVersionUID")
        slot = self.new_handle(None)
        flags = self.r.u8("class flags")
        fields = []
        for _ in range(self.short("field count")):
            code = chr(self.r.u8("field type"))
            field_name = self.r.utf("field name")
            if code in "L[":
                self.content()  # the field's class name
            fields.append((code, field_name))
        if self.r.u8("end of class annotation") != TC_ENDBLOCKDATA:
            self.r.fail("class annotations are not supported")
        desc = _ClassDesc(name, flags, fields, self.content())
        self.handles[slot] = desc
        return desc

    def object_body(self) -> dict:
        desc = self.content()
        if not isinstance(desc, _ClassDesc):
            self.r.fail("object without a class description")
        value: dict = {"class": desc.name}
        self.new_handle(value)
        chain = []
        while desc is not None:
            chain.append(desc)
            desc = desc.parent
        for cls in reversed(chain):
            if cls.flags & SC_WRITE_METHOD:
                self.r.fail(f"{cls.name} has custom serialization data")
            for code, name in cls.fields:
                if code in PRIMITIVES:
                    kind = PRIMITIVES[code]
                    value[name] = self.short(name) if kind == "short" else getattr(self.r, kind)(name)
                else:
                    value[name] = self.content()
        return value


def read_java_object(data: bytes):
    """Decode one serialized object into dicts, strings and numbers."""
    reader = _Reader(data)
    if reader.short("stream magic") != STREAM_MAGIC:
        raise CheckpointFormatError("checkpoint properties are not a Java serialization stream")
    reader.short("stream version")
    return reader.content()
