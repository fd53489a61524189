"""Record types, and values decoded the way Flink writes them.

- ``syntax``: type expressions (``tuple<long,string>``, ``binary_row<k:string,d:decimal(10,2)>`` …)
- ``serializers``: DataStream values as Flink's ``TypeSerializer``s write them
- ``binary``: SQL values in ``BinaryRowData``, ``BinaryArrayData`` and ``BinaryMapData``
"""

from ckpt_tool.records.types.binary import (
    BinaryArray,
    BinaryMap,
    BinaryRow,
    RecordDecodeError,
    SqlTimestamp,
    build_binary_array,
    build_binary_map,
    build_binary_row,
)
from ckpt_tool.records.types.serializers import Row, ValueReader, decode_value, to_json
from ckpt_tool.records.types.syntax import (
    JAVA_SCALARS,
    ROW_KINDS,
    SQL_SCALARS,
    SUPPORTED,
    DataType,
    TypeSyntaxError,
    parse_type,
)

__all__ = [
    "JAVA_SCALARS",
    "ROW_KINDS",
    "SQL_SCALARS",
    "SUPPORTED",
    "BinaryArray",
    "BinaryMap",
    "BinaryRow",
    "DataType",
    "RecordDecodeError",
    "Row",
    "SqlTimestamp",
    "TypeSyntaxError",
    "ValueReader",
    "build_binary_array",
    "build_binary_map",
    "build_binary_row",
    "decode_value",
    "parse_type",
    "to_json",
]
