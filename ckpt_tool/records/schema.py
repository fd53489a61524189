"""Telling ckpt what flows where: exchanges from a schema file (TOML) and Flink's plan JSON.

An *exchange* is one input of a downstream job vertex: the downstream operator (head of its
chain, which holds input-channel state) reads gate ``gate`` from the upstream operator (tail of
its chain, which holds result-subpartition state) through partition ``partition``.

Schema file::

    [[exchange]]
    upstream = "map-main"          # uid, name or 32-hex-digit operator id
    downstream = "slow-count"
    gate = 0                       # default 0, or the plan's input number
    partition = 0                  # default 0
    partitioner = "HASH"           # HASH, FORWARD, REBALANCE, RESCALE, BROADCAST, CUSTOM
    type = "tuple<long,string>"    # the record type (see ckpt_tool.records.types), or "avro"
    key = ["f0"]                   # key fields: one field is the key itself, several a TupleN
    # avro_schema = "event.avsc"    # with type = "avro": the records' Avro schema (relative to this file)
    # name = "sources -> counter"   # optional, for your own reading
    # decoder = "my_module:key_of" # instead of type/key: a function(value: bytes) -> int key hash,
    #                               # or (int key hash, printable key); my_module must be named on
    #                               # the command line (--plugin my_module)

A plan (Flink's REST ``/jobs/<id>/plan``, read by ckpt_tool.flink.plan) gives one exchange per
input of every vertex: the producing vertex's tail operator, the gate and the partitioner.

Trust: a checkpoint, a plan and a schema file are data. A ``decoder`` is code, so a schema may only
name a function of a module the user named on the command line (``--plugin MODULE``), never one of
Python's standard library (``builtins:exec``, ``os:system``): a schema file, which ``ckpt schema``
may have generated from an untrusted checkpoint, can never make ckpt import anything by itself.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from ckpt_tool.errors import CkptError
from ckpt_tool.flink.model import OUTPUT, CheckpointMetadata
from ckpt_tool.flink.plan import JobPlan
from ckpt_tool.flink.uids import refuse_mismatched_uids
from ckpt_tool.input_files import NON_NEGATIVE, STRING, Expected, InputFileError, checked, checked_key
from ckpt_tool.records.keys import binary_row_hash, java_hash, unhashable_key_part
from ckpt_tool.records.types import DataType, decode_value, parse_type, to_json

PARTITIONERS = ("HASH", "FORWARD", "REBALANCE", "RESCALE", "SHUFFLE", "GLOBAL", "BROADCAST", "CUSTOM")


class SchemaError(InputFileError):
    """A schema or plan file that does not fit the checkpoint."""


def _key_field(value: Any) -> bool:
    return (isinstance(value, str) and value != "") or (type(value) is int and value >= 0)


def _plugin_reference(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    module, colon, function = value.partition(":")
    return bool(colon) and function.isidentifier() and all(part.isidentifier() for part in module.split("."))


# What each key of an [[exchange]] entry must be.
ENTRY_KEYS = {
    "name": STRING,
    "upstream": STRING,
    "downstream": STRING,
    "gate": NON_NEGATIVE,
    "partition": NON_NEGATIVE,
    "partitioner": STRING,
    "type": STRING,
    "key": Expected(
        'a field name or position, or a list of them (e.g. ["f0"], [0, "name"])',
        lambda value: _key_field(value) or (isinstance(value, list) and all(map(_key_field, value))),
    ),
    "avro_schema": STRING,
    "decoder": Expected('a "module:function" string', _plugin_reference),
}
EXCHANGES = Expected("an array of tables, [[exchange]]", lambda value: isinstance(value, list))
TABLE = Expected("a table", lambda value: isinstance(value, dict))


@dataclass
class Exchange:
    """One exchange, with what is known about its records. Picklable (it travels to Spark)."""

    upstream_id: Optional[str]
    downstream_id: str
    gate: int = 0
    partition: int = 0
    partitioner: Optional[str] = None  # None: not stated (a keyed exchange is HASH)
    record_type: Optional[str] = None
    key: tuple[Any, ...] = ()
    decoder: Optional[str] = None
    partition_stated: bool = True  # False where the partition is a guess (the plan does not give it)
    avro_schema: Optional[str] = None  # JSON text of the Avro schema of type "avro"

    @property
    def keyed(self) -> bool:
        return self.partitioner in (None, "HASH") and bool(self.key or self.decoder)

    def key_function(self, printable: bool = True) -> Optional[Callable[[bytes, int], tuple[int, Any]]]:
        """A function of (element bytes, value offset) -> (Java hash of the key, printable key);
        without ``printable`` SQL keys leave the printable key None (decoding it costs more than the hash)."""
        if self.decoder:
            return _plugin(self.decoder)
        if not self.record_type or not self.key:
            return None
        if self.record_type == "avro":
            from ckpt_tool.records.avro import avro_key_function

            return avro_key_function(self.avro_schema or "null", self.key)
        return _key_extractor(parse_type(self.record_type), self.key, printable)


def check_plugin_modules(modules: tuple[str, ...]) -> tuple[str, ...]:
    """The modules named with ``--plugin``: importable names, none of the standard library."""
    for module in modules:
        if not module or not all(part.isidentifier() for part in module.split(".")):
            raise SchemaError(f"--plugin {module!r}: not a module name (e.g. my_package.keys)")
        top = module.split(".")[0]
        if top in sys.stdlib_module_names or top in sys.builtin_module_names:
            raise SchemaError(f"--plugin {module}: a module of Python's standard library is never a plug-in")
    return tuple(modules)


def _allowed_decoder(reference: str, plugins: tuple[str, ...]) -> None:
    """A schema's decoder must be a function of a module named with --plugin."""
    module = reference.partition(":")[0]
    if module not in plugins:
        named = f" (named: {', '.join(plugins)})" if plugins else ""
        raise SchemaError(
            f"decoder {reference!r}: module {module} is not a plug-in named on the command line{named}; "
            f"a schema file cannot load code by itself: run ckpt --plugin {module} ... if you trust it"
        )


def _plugin(reference: str) -> Callable[[bytes, int], tuple[int, Any]]:
    module_name, _, function_name = reference.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except Exception as exc:  # whatever the plug-in's module raises on import
        raise SchemaError(f"cannot load decoder {reference!r}: {type(exc).__name__}: {exc}") from exc
    if not callable(function):
        raise SchemaError(f"cannot load decoder {reference!r}: {function_name} is not a function")

    def extract(raw: bytes, offset: int) -> tuple[int, Any]:
        result = function(bytes(raw[offset:]))
        return (result, result) if isinstance(result, int) else (int(result[0]), result[1])

    return extract


class FieldKey:
    """The key of values of a record type: called with (element bytes, value offset), (Java hash
    of the key, printable key) of the value there; ``of_value`` the same of a value decoded
    already (``ckpt records`` decodes each value once for both)."""

    __slots__ = ("of_value", "value_type")

    def __init__(self, value_type: DataType, of_value: Callable[[Any], tuple[int, Any]]) -> None:
        self.value_type = value_type
        self.of_value = of_value

    def __call__(self, raw: bytes, offset: int) -> tuple[int, Any]:
        value, _ = decode_value(self.value_type, raw, offset)
        return self.of_value(value)


def _key_extractor(value_type: DataType, key: tuple[Any, ...], printable: bool = True) -> FieldKey:
    if value_type.name not in ("tuple", "row", "pojo", "binary_row"):
        if list(key) not in (["value"], ["*"]):
            raise SchemaError(f'records of type {value_type} have no fields; use key = ["value"]')
        _check_hashable(value_type)
        return FieldKey(value_type, lambda value: (java_hash(value_type, value), to_json(value_type, value)))
    indices = [value_type.field_index(k) for k in key]
    types = tuple(value_type.fields[i] for i in indices)
    if value_type.name != "binary_row":
        _check_hashable(DataType("tuple", types))

    def fields_of(value: Any) -> list[Any]:
        if value_type.name == "pojo":
            return [value[value_type.field_names[i]] for i in indices]
        if value_type.name == "row":
            return [value.fields[i] for i in indices]
        return [value[i] for i in indices]

    def of_value(value: Any) -> tuple[int, Any]:
        if value_type.name == "binary_row":  # SQL key selectors project into a new BinaryRowData
            key_row = value.project(indices)
            shown = [to_json(t, f) for t, f in zip(types, key_row.values())] if printable else None
            return binary_row_hash(key_row.data), shown
        fields = fields_of(value)
        if len(fields) == 1:
            return java_hash(types[0], fields[0]), to_json(types[0], fields[0])
        tuple_type = DataType("tuple", types)
        return java_hash(tuple_type, tuple(fields)), to_json(tuple_type, tuple(fields))

    return FieldKey(value_type, of_value)


def _check_hashable(key_type: DataType) -> None:
    """Refuse, as Flink's keyBy does, a key whose hashCode is the object's identity."""
    part = unhashable_key_part(key_type)
    if part:
        raise SchemaError(
            f"a key of type {key_type} cannot be used: it contains {part}, whose hashCode is not deterministic; "
            "Flink refuses such keys too (KeyedStream: 'Type ... cannot be used as key')"
        )


# --- loading ------------------------------------------------------------------------------------


def _resolve(metadata: CheckpointMetadata, ref: Any, what: str) -> str:
    try:
        return metadata.operator(str(ref)).id_hex
    except KeyError:
        refuse_mismatched_uids(metadata)  # not there because its state is under another id than its uid's
        raise SchemaError(f"{what} operator {ref!r} is not in the checkpoint (use its uid, name or id)") from None


def load_schema(path: str, metadata: CheckpointMetadata, plugins: tuple[str, ...] = ()) -> list[Exchange]:
    """The exchanges of a schema file; ``plugins``: the modules its decoders may come from."""
    plugins = check_plugin_modules(plugins)
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except (OSError, ValueError, RecursionError) as exc:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        raise SchemaError(f"cannot read schema {path}: {exc}") from exc
    try:
        _refuse_unknown(document, {"exchange": EXCHANGES}, "top-level key")
        entries = checked_key(document, "exchange", EXCHANGES, SchemaError, [])
    except SchemaError as exc:
        raise SchemaError(f"schema {path}: {exc}") from None
    exchanges: list[Exchange] = []
    first: dict[tuple[str, int], int] = {}  # the entry describing each exchange (downstream, gate)
    for index, entry in enumerate(entries):
        where = f"schema {path}, exchange {index + 1}"
        try:
            exchange = _exchange(checked(entry, TABLE, SchemaError, "an exchange"), path, metadata, plugins)
        except CkptError as exc:
            raise SchemaError(f"{where}: {exc}") from None
        earlier = first.setdefault((exchange.downstream_id, exchange.gate), index)
        if earlier != index:
            raise SchemaError(f"{where}: the same exchange (downstream and gate) as exchange {earlier + 1}")
        exchanges.append(exchange)
    return exchanges


def _refuse_unknown(table: dict, allowed: dict[str, Expected], what: str) -> None:
    for name in table:
        if name not in allowed:
            near = difflib.get_close_matches(name, allowed, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise SchemaError(f"unknown {what} {name!r}{hint}; allowed: {', '.join(allowed)}")


def _exchange(entry: dict, path: str, metadata: CheckpointMetadata, plugins: tuple[str, ...] = ()) -> Exchange:
    """One [[exchange]] entry, every key and value checked."""
    _refuse_unknown(entry, ENTRY_KEYS, "key")
    for name, value in entry.items():
        checked(value, ENTRY_KEYS[name], SchemaError, name)
    downstream = checked_key(entry, "downstream", STRING, SchemaError)
    partitioner = entry["partitioner"].upper() if "partitioner" in entry else None
    if partitioner is not None and partitioner not in PARTITIONERS:
        raise SchemaError(f"unknown partitioner {partitioner!r}; known: {', '.join(PARTITIONERS)}")
    record_type, key_fields, decoder = entry.get("type"), entry.get("key", []), entry.get("decoder")
    key = tuple(key_fields if isinstance(key_fields, list) else [key_fields])
    if key and not record_type:
        raise SchemaError('key needs the record type (type = "...") to find its fields')
    if key and decoder:
        raise SchemaError("key and decoder exclude each other: the decoder computes the key")
    if decoder:
        _allowed_decoder(decoder, plugins)
    if "avro_schema" in entry and record_type != "avro":
        raise SchemaError('avro_schema is for records of type = "avro"')
    avro_schema = None
    if record_type == "avro":
        if "avro_schema" not in entry:
            raise SchemaError('type "avro" needs avro_schema = "<file>.avsc"')
        from ckpt_tool.records.avro import load_avro_schema

        avro_schema = load_avro_schema(os.path.join(os.path.dirname(os.path.abspath(path)), entry["avro_schema"]))
    elif record_type is not None:
        parse_type(record_type)  # fail early on a bad expression
    exchange = Exchange(
        upstream_id=_resolve(metadata, entry["upstream"], "upstream") if "upstream" in entry else None,
        downstream_id=_resolve(metadata, downstream, "downstream"),
        gate=entry.get("gate", 0),
        partition=entry.get("partition", 0),
        partition_stated="partition" in entry,
        partitioner=partitioner,
        record_type=record_type,
        key=key,
        decoder=decoder,
        avro_schema=avro_schema,
    )
    exchange.key_function()  # fail early on a key or a plug-in that cannot be used
    return exchange


def plan_exchanges(plan: JobPlan) -> list[Exchange]:
    """One exchange per input of every vertex of the plan. The plan does not say which output
    partition of a vertex feeds which consumer; where a vertex has one consumer it is partition 0."""
    consumers: dict[str, int] = {}
    for vertex in plan.vertices.values():
        for edge in vertex.inputs:
            consumers[edge.upstream] = consumers.get(edge.upstream, 0) + 1
    return [
        Exchange(
            upstream_id=plan.vertices[edge.upstream].tail,
            downstream_id=vertex.id,
            gate=edge.gate,
            partition=0,
            partitioner=edge.partitioner,
            partition_stated=consumers[edge.upstream] == 1,
        )
        for vertex in plan.vertices.values()
        for edge in vertex.inputs
    ]


def merge_exchanges(
    from_plan: list[Exchange], from_schema: list[Exchange], metadata: Optional[CheckpointMetadata] = None
) -> list[Exchange]:
    """Plan exchanges, with the schema's facts laid over the one with the same downstream and gate.
    With a plan, an exchange of the schema must be one of the plan's and agree with it."""
    merged = {(e.downstream_id, e.gate): e for e in from_plan}
    for entry in from_schema:
        key = (entry.downstream_id, entry.gate)
        base = merged.get(key)
        where = f"schema exchange into {metadata.label(entry.downstream_id) if metadata else entry.downstream_id}"
        if from_plan and base is None:
            raise SchemaError(f"{where} (gate {entry.gate}): the plan has no such input")
        if base is not None:
            if entry.upstream_id and base.upstream_id and entry.upstream_id != base.upstream_id:
                upstream = metadata.label(base.upstream_id) if metadata else base.upstream_id
                raise SchemaError(f"{where} (gate {entry.gate}): the plan says it comes from {upstream}")
            if entry.partitioner and base.partitioner and entry.partitioner != base.partitioner:
                raise SchemaError(
                    f"{where} (gate {entry.gate}): partitioner {entry.partitioner}, the plan says {base.partitioner}"
                )
            entry.upstream_id = entry.upstream_id or base.upstream_id
            entry.partitioner = entry.partitioner or base.partitioner
            if not entry.partition_stated and base.partition_stated:
                entry.partition, entry.partition_stated = base.partition, True
        merged[key] = entry
    return list(merged.values())


def check_partitions(exchanges: list[Exchange], metadata: CheckpointMetadata, unstated_ok: bool = False) -> None:
    """An operator that sends to several exchanges sends each through its own output partition:
    where that is not stated and the operator holds output-side in-flight data, the data could be
    paired with the wrong exchange, so it is refused, asking for ``partition`` in the schema
    (``unstated_ok``: the caller proves the pairing from the bytes instead)."""
    by_sender: dict[str, list[Exchange]] = {}
    for exchange in exchanges:
        if exchange.upstream_id:
            by_sender.setdefault(exchange.upstream_id, []).append(exchange)
    for sender, sent in by_sender.items():
        if len(sent) < 2:
            continue
        names = ", ".join(f"{metadata.label(e.downstream_id)} (gate {e.gate})" for e in sent)
        stated = [e.partition for e in sent if e.partition_stated]
        if len(stated) != len(set(stated)):
            raise SchemaError(f"{metadata.label(sender)} sends to {names} through one output partition; give each its own")
        holds_output = any(s.channel_handles(OUTPUT) for s in metadata.operator(sender).subtasks)
        if holds_output and not unstated_ok and not all(e.partition_stated for e in sent):
            raise SchemaError(
                f"{metadata.label(sender)} sends to {names} and holds in-flight output data, but which output partition "
                "feeds which is not known (Flink's plan does not say): give `partition` for each in --schema"
            )
