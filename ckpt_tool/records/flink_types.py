"""Flink's SQL type strings (``LogicalType#asSerializableString``/``asSummaryString``, as compiled
plans and planners write them) in ckpt's type syntax.

``ROW<`user` VARCHAR(2147483647), `ts` TIMESTAMP(3) WITH LOCAL TIME ZONE NOT NULL>`` becomes
``binary_row<user:string,ts:timestamp_ltz(3)>``. Nullability does not change a type's layout
and is dropped. The JSON form compiled plans use for some types (``{"type": "ROW", "fields": [...]}``,
rowtime timestamps) is read too.
"""

from __future__ import annotations

import re
from typing import Any

from ckpt_tool.errors import CkptError


class FlinkTypeError(CkptError):
    """A Flink SQL type that ckpt does not lay out."""


# ``*Class<...>*`` is the summary form of an inline STRUCTURED type (Flink 1.x), ``*ROWTIME*`` a marker
_TOKEN = re.compile(
    r"\s*(`(?:[^`]|``)*`|[A-Za-z_][A-Za-z0-9_$]*|\d+|\*[A-Z]+\*|\*[A-Za-z_$][A-Za-z0-9_$.]*(?=<)|\*|'(?:[^']|'')*'|[<>(),])"
)
_SIMPLE = {
    "BIGINT": "bigint",
    "INT": "int",
    "INTEGER": "int",
    "SMALLINT": "smallint",
    "TINYINT": "tinyint",
    "BOOLEAN": "boolean",
    "FLOAT": "float",
    "REAL": "float",
    "DOUBLE": "double",
    "DATE": "date",
    "STRING": "string",
    "BYTES": "bytes",
}
_MAX_LENGTH = 2147483647
_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$.]*")


def flink_type(text: str) -> str:
    """A Flink type string in ckpt's syntax; a ROW at the top becomes ``binary_row<...>``."""
    converted = _Parser(text).top()
    return "binary_row" + converted[3:] if converted.startswith("row<") else converted


def flink_type_json(value: Any) -> str:
    """A compiled plan's type: a string, or its JSON form."""
    if isinstance(value, str):
        return flink_type(value)
    converted = _json_type(value)
    return "binary_row" + converted[3:] if converted.startswith("row<") else converted


def _json_type(value: Any) -> str:
    if isinstance(value, str):
        return _Parser(value).top()
    if not isinstance(value, dict) or "type" not in value:
        raise FlinkTypeError(f"cannot read the type {value!r}")
    root = str(value["type"]).upper()
    if root == "ROW":
        fields = [(str(f["name"]), _json_type(f["fieldType"])) for f in value.get("fields", [])]
        return _row(fields)
    if root == "STRUCTURED_TYPE":  # an accumulator class: a RowData of its attributes, as a nested row
        fields = [(str(f["name"]), _json_type(f["attributeType"])) for f in value.get("attributes", [])]
        return _row(fields)
    if root in ("TIMESTAMP_WITHOUT_TIME_ZONE", "TIMESTAMP_WITH_LOCAL_TIME_ZONE"):
        name = "timestamp" if root == "TIMESTAMP_WITHOUT_TIME_ZONE" else "timestamp_ltz"
        return f"{name}({int(value.get('precision', 6))})"
    if root in ("ARRAY", "MULTISET"):
        return f"{root.lower()}<{_json_type(value['elementType'])}>"
    if root == "MAP":
        return f"map<{_json_type(value['keyType'])},{_json_type(value['valueType'])}>"
    raise FlinkTypeError(f"ckpt does not lay out the Flink type {root}")


def _row(fields: list[tuple[str, str]]) -> str:
    named = all(_NAME.fullmatch(n) for n, _ in fields)
    return "row<" + ",".join(f"{n}:{t}" if named else t for n, t in fields) + ">"


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _TOKEN.findall(text)
        if "".join(self.tokens).replace(" ", "") != re.sub(r"\s+", "", text):
            raise FlinkTypeError(f"cannot read the Flink type {text!r}")
        self.position = 0

    def peek(self, offset: int = 0) -> str:
        index = self.position + offset
        return self.tokens[index].upper() if index < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> str:
        if self.position >= len(self.tokens):
            raise FlinkTypeError(f"the Flink type {self.text!r} ends too early")
        token = self.tokens[self.position]
        if expected is not None and token.upper() != expected:
            raise FlinkTypeError(f"the Flink type {self.text!r}: expected {expected!r}, found {token!r}")
        self.position += 1
        return token

    def top(self) -> str:
        result = self.type()
        if self.position != len(self.tokens):
            raise FlinkTypeError(f"the Flink type {self.text!r}: unexpected {self.tokens[self.position]!r}")
        return result

    def params(self) -> list[int]:
        if self.peek() != "(":
            return []
        self.take("(")
        values = [int(self.take())]
        while self.take() == ",":
            values.append(int(self.take()))
        return values

    def type(self) -> str:
        name = self.take().upper()
        result = self.body(name)
        while self.peek() in ("NOT", "NULL", "*ROWTIME*", "*PROCTIME*"):
            self.take()
        return result

    def body(self, name: str) -> str:
        if name in _SIMPLE:
            return _SIMPLE[name]
        if name in ("VARCHAR", "CHAR", "VARBINARY", "BINARY"):
            (length,) = self.params() or [1]
            if name in ("VARCHAR", "VARBINARY") and length == _MAX_LENGTH:
                return "string" if name == "VARCHAR" else "bytes"
            return f"{name.lower()}({length})"
        if name in ("DECIMAL", "DEC", "NUMERIC"):
            params = self.params() or [10, 0]
            return f"decimal({params[0]},{params[1] if len(params) > 1 else 0})"
        if name == "TIME":
            self.params()
            return "time"
        if name in ("TIMESTAMP", "TIMESTAMP_LTZ"):
            (precision,) = self.params() or [6]
            if name == "TIMESTAMP" and self.peek() == "WITH":
                words = [self.take().upper() for _ in range(3 if self.peek(1) == "LOCAL" else 2)]
                words += [self.take().upper()] if words[-1] != "ZONE" else []
                if words[:2] != ["WITH", "LOCAL"]:
                    raise FlinkTypeError(f"ckpt does not lay out {self.text!r} (TIMESTAMP WITH TIME ZONE)")
                return f"timestamp_ltz({precision})"
            if name == "TIMESTAMP" and self.peek() == "WITHOUT":
                for _ in range(3):
                    self.take()
            return f"{'timestamp' if name == 'TIMESTAMP' else 'timestamp_ltz'}({precision})"
        if name in ("ARRAY", "MULTISET"):
            self.take("<")
            element = self.type()
            self.take(">")
            return f"{name.lower()}<{element}>"
        if name == "MAP":
            self.take("<")
            key = self.type()
            self.take(",")
            value = self.type()
            self.take(">")
            return f"map<{key},{value}>"
        if name.startswith("*") and not name.endswith("*"):  # ``*Acc<`count` BIGINT>*``: STRUCTURED's summary
            self.take("<")
            fields = self.fields(">")
            self.take("*")
            return fields
        if name == "STRUCTURED":
            # an aggregate function's accumulator class (``STRUCTURED<'Acc', `count` BIGINT>``): internally a
            # RowData of its attributes (RowData#createFieldGetter reads it as a ROW), laid out as a nested row
            self.take("<")
            if not self.peek().startswith("'"):
                raise FlinkTypeError(f"the Flink type {self.text!r}: expected the class name after STRUCTURED<")
            self.take()
            if self.peek() == ",":
                self.take()
            return self.fields(">")
        if name == "ROW":
            opening = self.take()
            if opening not in ("<", "("):
                raise FlinkTypeError(f"the Flink type {self.text!r}: expected '<' after ROW")
            return self.fields(")" if opening == "(" else ">")
        raise FlinkTypeError(f"ckpt does not lay out the Flink type {name} (in {self.text!r})")

    def fields(self, closing: str) -> str:
        """The fields of a ROW or STRUCTURED type up to its closing bracket, as ckpt's ``row<...>``."""
        fields: list[tuple[str, str]] = []
        while self.peek() not in (">", ")"):
            field_name = self.take().strip("`").replace("``", "`")
            fields.append((field_name, self.type()))
            if self.peek().startswith("'"):  # a field description
                self.take()
            if self.peek() == ",":
                self.take()
        self.take(closing)
        return _row(fields)
