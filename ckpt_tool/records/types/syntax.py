"""Record type expressions: ``long``, ``tuple<long,string>``, ``pojo<id:long,name:string>``,
``binary_row<user:string,amount:decimal(10,2),ts:timestamp(3)>`` …

Two families share one syntax. DataStream types name the Java classes Flink's ``TypeSerializer``s
write; inside ``binary_row<...>`` every type is a SQL type laid out as ``BinaryRowData`` lays it
out (``DataType.sql``). Names are case-insensitive; SQL types carry their precision, scale or
length in parentheses (``decimal(25,4)``, ``timestamp(6)``, ``varchar(20)``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckpt_tool.errors import CkptError

# DataStream scalars: Flink's serializers of String, Long, ..., Character and byte[].
JAVA_SCALARS = ("string", "long", "int", "short", "byte", "double", "float", "boolean", "char", "bytes")
# java.time classes with serializers of their own (InstantSerializer, LocalDate/Time/DateTimeSerializer).
JAVA_TIME = ("instant", "local_date", "local_time", "local_date_time")
# Avro records (AvroSerializer); their schema comes from an .avsc file (ckpt_tool.records.avro).
AVRO = "avro"
# DataStream composites. array<T>: a primitive array (int[] ...) or String[].
JAVA_COMPOSITES = ("tuple", "row", "pojo", "list", "map", "array", "enum", "binary_row")
# SQL scalars inside binary_row, by their SQL names, to the name of their layout.
SQL_SCALARS = {
    "bigint": "long",
    "int": "int",
    "integer": "int",
    "smallint": "short",
    "tinyint": "byte",
    "boolean": "boolean",
    "float": "float",
    "real": "float",
    "double": "double",
    "string": "string",
    "varchar": "string",
    "char": "string",
    "bytes": "bytes",
    "varbinary": "bytes",
    "binary": "bytes",
    "date": "date",
    "time": "time",
}
SQL_PARAMETRIZED = {"decimal": (10, 0), "numeric": (10, 0), "timestamp": (6,), "timestamp_ltz": (6,)}
SQL_COMPOSITES = ("array", "map", "multiset", "row")
ROW_KINDS = ("+I", "-U", "+U", "-D")

SUPPORTED = (
    "DataStream: avro (with avro_schema = FILE.avsc), string, long, int, short, byte, double, float, boolean, char, "
    "bytes, instant, local_date, "
    "local_time, local_date_time, enum<A,B,...>, tuple<T,...>, row<T,...>, pojo<name:T,...>, list<T>, map<K,V>, "
    "array<T> (primitive or string arrays); SQL inside binary_row<name:T,...>: bigint, int, smallint, tinyint, "
    "boolean, float, double, string, char(n), varchar(n), bytes, binary(n), varbinary(n), date, time, "
    "decimal(p,s), timestamp(p), timestamp_ltz(p), array<T>, map<K,V>, multiset<T>, row<name:T,...>"
)


class TypeSyntaxError(CkptError):
    """A record type expression that ckpt cannot read."""


@dataclass(frozen=True)
class DataType:
    name: str
    fields: tuple[DataType, ...] = ()
    field_names: tuple[str, ...] = ()  # field names; for enums the constants, in ordinal order
    params: tuple[int, ...] = ()  # precision (and scale) of decimal and timestamps
    sql: bool = False  # a SQL type inside binary_row (its binary layout), not a Java class

    def __str__(self) -> str:
        name = self.name + (f"({','.join(map(str, self.params))})" if self.params else "")
        if self.name == "enum":
            return f"enum<{','.join(self.field_names)}>"
        if not self.fields:
            return name
        names = self.field_names or ("",) * len(self.fields)
        inner = ",".join(f"{n}:{t}" if n else str(t) for n, t in zip(names, self.fields))
        return f"{name}<{inner}>"

    @property
    def precision(self) -> int:
        return self.params[0]

    @property
    def scale(self) -> int:
        return self.params[1] if len(self.params) > 1 else 0

    def field_index(self, ref: str | int) -> int:
        """A field by position (``0``, ``"f0"``) or, for POJOs and named rows, by name."""
        if isinstance(ref, int) or re.fullmatch(r"[0-9]+", str(ref)):
            index = int(ref)
        elif ref in self.field_names:
            index = self.field_names.index(ref)
        elif re.fullmatch(r"f\d+", str(ref)):
            index = int(str(ref)[1:])
        else:
            raise TypeSyntaxError(f"{self} has no field {ref!r}")
        if not 0 <= index < len(self.fields):
            raise TypeSyntaxError(f"{self} has no field {ref!r}")
        return index


_TOKEN = re.compile(r"\s*([A-Za-z_$][A-Za-z0-9_$.]*(?:\(\s*\d+\s*(?:,\s*\d+\s*)?\))?|[<>,:])")


def parse_type(text: str) -> DataType:
    """Parse a type expression such as ``tuple<long,string>``."""
    tokens = list(_TOKEN.findall(text))
    if "".join(tokens).replace(" ", "") != re.sub(r"\s+", "", text):
        raise TypeSyntaxError(f"cannot read record type {text!r}")
    position = 0

    def take(expected: str | None = None) -> str:
        nonlocal position
        if position >= len(tokens):
            raise TypeSyntaxError(f"record type {text!r} ends too early")
        token = tokens[position]
        if expected is not None and token != expected:
            raise TypeSyntaxError(f"record type {text!r}: expected {expected!r}, found {token!r}")
        position += 1
        return token

    def unknown(name: str) -> TypeSyntaxError:
        return TypeSyntaxError(f"record type {text!r}: unknown type {name!r}; supported: {SUPPORTED}")

    def items(sql: bool) -> tuple[list[DataType], list[str]]:
        take("<")
        fields, names = [], []
        while True:
            if position + 1 < len(tokens) and tokens[position + 1] == ":":
                names.append(take())
                take(":")
            fields.append(parse(sql))
            if take() == ">":
                return fields, names

    def parse(sql: bool) -> DataType:
        token = take()
        match = re.fullmatch(r"([^(]+)(?:\((.*)\))?", token)
        assert match is not None
        name = match.group(1).lower()
        params = tuple(int(p) for p in match.group(2).split(",")) if match.group(2) else ()
        if sql:
            return parse_sql(name, params)
        if name == "enum":
            take("<")
            constants = [take()]
            while take() == ",":
                constants.append(take())
            return DataType("enum", field_names=tuple(constants))
        if name in JAVA_COMPOSITES:
            fields, names = items(name == "binary_row")
            if names and len(names) != len(fields):
                raise TypeSyntaxError(f"record type {text!r}: name all fields of {name} or none")
            arity = {"list": 1, "array": 1, "map": 2}.get(name)
            if arity and len(fields) != arity:
                raise TypeSyntaxError(f"record type {text!r}: {name} takes {arity} type(s)")
            if name == "pojo":
                if not names:
                    raise TypeSyntaxError(f"record type {text!r}: POJO fields need names")
                # PojoTypeInfo orders fields by name; so does its serializer.
                names, fields = map(list, zip(*sorted(zip(names, fields), key=lambda p: p[0])))
            return DataType(name, tuple(fields), tuple(names))
        if name in JAVA_SCALARS or name in JAVA_TIME or name == AVRO:
            return DataType(name)
        if name in SQL_SCALARS:  # SQL names of Java scalars (bigint, varchar ...) outside binary_row
            return DataType(SQL_SCALARS[name] if SQL_SCALARS[name] in JAVA_SCALARS else "int")
        raise unknown(name)

    def parse_sql(name: str, params: tuple[int, ...]) -> DataType:
        if name in SQL_COMPOSITES:
            fields, names = items(True)
            arity = {"array": 1, "multiset": 1, "map": 2}.get(name)
            if arity and len(fields) != arity:
                raise TypeSyntaxError(f"record type {text!r}: {name} takes {arity} type(s)")
            if names and len(names) != len(fields):
                raise TypeSyntaxError(f"record type {text!r}: name all fields of {name} or none")
            return DataType(name, tuple(fields), tuple(names), sql=True)
        if name in SQL_PARAMETRIZED:
            params = params or SQL_PARAMETRIZED[name]
            if name in ("decimal", "numeric"):
                precision, scale = (params + (0,))[:2]
                if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                    raise TypeSyntaxError(f"record type {text!r}: DECIMAL({precision},{scale}) is not a SQL decimal")
                return DataType("decimal", params=(precision, scale), sql=True)
            if not 0 <= params[0] <= 9:
                raise TypeSyntaxError(f"record type {text!r}: {name} precision {params[0]} is not within 0 to 9")
            return DataType(name, params=params[:1], sql=True)
        if name in SQL_SCALARS:
            return DataType(SQL_SCALARS[name], sql=True)
        raise unknown(name)

    try:
        result = parse(False)
    except RecursionError:
        raise TypeSyntaxError(f"record type {text[:60]!r}...: nested too deeply") from None
    if position != len(tokens):
        raise TypeSyntaxError(f"record type {text!r}: unexpected {tokens[position]!r}")
    return result
