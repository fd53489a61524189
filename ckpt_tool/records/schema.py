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
    #                               # or (int key hash, printable key)

A plan (Flink's REST ``/jobs/<id>/plan``, read by ckpt_tool.flink.plan) gives one exchange per
input of every vertex: the producing vertex's tail operator, the gate and the partitioner.
"""

from __future__ import annotations

import importlib
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from ckpt_tool.errors import CkptError
from ckpt_tool.flink.model import OUTPUT, CheckpointMetadata
from ckpt_tool.flink.plan import JobPlan
from ckpt_tool.records.keys import binary_row_hash, java_hash, unhashable_key_part
from ckpt_tool.records.types import DataType, parse_type, to_json

PARTITIONERS = ("HASH", "FORWARD", "REBALANCE", "RESCALE", "SHUFFLE", "GLOBAL", "BROADCAST", "CUSTOM")


class SchemaError(CkptError):
    """A schema or plan file that does not fit the checkpoint."""


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


def _plugin(reference: str) -> Callable[[bytes, int], tuple[int, Any]]:
    module_name, _, function_name = reference.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise SchemaError(f"cannot load decoder {reference!r}: {exc}") from exc

    def extract(raw: bytes, offset: int) -> tuple[int, Any]:
        result = function(bytes(raw[offset:]))
        return (result, result) if isinstance(result, int) else (int(result[0]), result[1])

    return extract


def _key_extractor(value_type: DataType, key: tuple[Any, ...], printable: bool = True) -> Callable[[bytes, int], tuple[int, Any]]:
    from ckpt_tool.records.types import decode_value

    if value_type.name not in ("tuple", "row", "pojo", "binary_row"):
        if list(key) not in (["value"], ["*"]):
            raise SchemaError(f'records of type {value_type} have no fields; use key = ["value"]')
        _check_hashable(value_type)

        def whole(raw: bytes, offset: int) -> tuple[int, Any]:
            value, _ = decode_value(value_type, raw, offset)
            return java_hash(value_type, value), to_json(value_type, value)

        return whole
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

    def extract(raw: bytes, offset: int) -> tuple[int, Any]:
        value, _ = decode_value(value_type, raw, offset)
        if value_type.name == "binary_row":  # SQL key selectors project into a new BinaryRowData
            key_row = value.project(indices)
            shown = [to_json(t, f) for t, f in zip(types, key_row.values())] if printable else None
            return binary_row_hash(key_row.data), shown
        fields = fields_of(value)
        if len(fields) == 1:
            return java_hash(types[0], fields[0]), to_json(types[0], fields[0])
        tuple_type = DataType("tuple", types)
        return java_hash(tuple_type, tuple(fields)), to_json(tuple_type, tuple(fields))

    return extract


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
        raise SchemaError(f"{what} operator {ref!r} is not in the checkpoint (use its uid, name or id)") from None


def load_schema(path: str, metadata: CheckpointMetadata) -> list[Exchange]:
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SchemaError(f"cannot read schema {path}: {exc}") from exc
    exchanges = []
    for index, entry in enumerate(document.get("exchange", [])):
        where = f"schema {path}, exchange {index + 1}"
        if "downstream" not in entry:
            raise SchemaError(f"{where}: 'downstream' is required")
        partitioner = str(entry["partitioner"]).upper() if "partitioner" in entry else None
        if partitioner is not None and partitioner not in PARTITIONERS:
            raise SchemaError(f"{where}: unknown partitioner {partitioner!r}")
        record_type = entry.get("type")
        avro_schema = None
        if record_type == "avro":
            if "avro_schema" not in entry:
                raise SchemaError(f'{where}: type "avro" needs avro_schema = "<file>.avsc"')
            from ckpt_tool.records.avro import load_avro_schema

            avro_schema = load_avro_schema(os.path.join(os.path.dirname(os.path.abspath(path)), str(entry["avro_schema"])))
        elif record_type:
            parse_type(record_type)  # fail early on a bad expression
        key = entry.get("key", [])
        if entry.get("decoder"):
            _plugin(str(entry["decoder"]))  # fail early on a plug-in that cannot be loaded
        exchanges.append(
            Exchange(
                upstream_id=_resolve(metadata, entry["upstream"], "upstream") if "upstream" in entry else None,
                downstream_id=_resolve(metadata, entry["downstream"], "downstream"),
                gate=int(entry.get("gate", 0)),
                partition=int(entry.get("partition", 0)),
                partition_stated="partition" in entry,
                partitioner=partitioner,
                record_type=record_type,
                key=tuple(key if isinstance(key, list) else [key]),
                decoder=entry.get("decoder"),
                avro_schema=avro_schema,
            )
        )
        if record_type and exchanges[-1].key and not exchanges[-1].decoder:
            try:
                exchanges[-1].key_function()  # fail early on a key that cannot be computed
            except CkptError as exc:
                raise SchemaError(f"{where}: {exc}") from None
    return exchanges


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


def check_partitions(exchanges: list[Exchange], metadata: CheckpointMetadata) -> None:
    """An operator that sends to several exchanges sends each through its own output partition:
    where that is not stated and the operator holds output-side in-flight data, the data could be
    paired with the wrong exchange, so it is refused, asking for ``partition`` in the schema."""
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
        if holds_output and not all(e.partition_stated for e in sent):
            raise SchemaError(
                f"{metadata.label(sender)} sends to {names} and holds in-flight output data, but which output partition "
                "feeds which is not known (Flink's plan does not say): give `partition` for each in --schema"
            )


def load_exchanges(
    metadata: CheckpointMetadata, schema: Optional[str], plan: Optional[JobPlan], sql_plan: Optional[str] = None
) -> list[Exchange]:
    """The exchanges a plan, a compiled SQL plan and/or a schema file describe (schema facts win
    over the compiled plan's, which win over the plan's)."""
    from_plan = plan_exchanges(plan) if plan else []
    if sql_plan:
        from ckpt_tool.records.sql_plan import sql_plan_exchanges

        from_plan = merge_exchanges(from_plan, sql_plan_exchanges(sql_plan, metadata), metadata)
    from_schema = load_schema(schema, metadata) if schema else []
    exchanges = merge_exchanges(from_plan, from_schema, metadata)
    check_partitions(exchanges, metadata)
    return exchanges
