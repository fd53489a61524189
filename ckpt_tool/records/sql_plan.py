"""Exchanges of a Table/SQL job, typed and keyed, from Flink's compiled plan (``COMPILE PLAN``).

A compiled plan lists exec nodes (``{"id": 3, "type": "stream-exec-exchange_1", "outputType":
"ROW<...>", "inputProperties": [{"requiredDistribution": {"type": "HASH", "keys": [0, 1]}}]}``) and
edges between them. Each exchange node is one exchange of the job: its output type is the
exchanged row (``binary_row<...>``), a HASH distribution's keys are the key columns, the node
feeding it holds the sending side and the node it feeds the receiving side.

Nodes are matched to the checkpoint's operators by the node ids the planner puts into operator
names (``GroupAggregate[4]``, metadata v5+), or, where the metadata has no names (Flink 1.x), by
the operator ids of the uids the planner gives jobs run from a compiled plan
(``<node id>_<transformation>``, e.g. ``4_group-aggregate``; ``table.exec.uid.format``'s default),
hashed as Flink hashes uids.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from ckpt_tool.errors import CkptError
from ckpt_tool.flink.model import INPUT, OUTPUT, CheckpointMetadata, OperatorState
from ckpt_tool.flink.operator_id import operator_id_of_uid
from ckpt_tool.input_files import LIST, NON_NEGATIVE, OBJECT, STRING, Expected, InputFileError, checked, checked_key, shown
from ckpt_tool.records.flink_types import flink_type_json
from ckpt_tool.records.schema import Exchange
from ckpt_tool.records.types import parse_type


class SqlPlanError(InputFileError):
    """A compiled plan that cannot be read or does not fit the checkpoint."""


# Transformation names the planner gives its operators (the "<transformation>" of their uids).
TRANSFORMATIONS = (
    "source", "watermark-assigner", "calc", "correlate", "group-aggregate", "local-group-aggregate",
    "global-group-aggregate", "incremental-group-aggregate", "window-aggregate", "local-window-aggregate",
    "global-window-aggregate", "group-window-aggregate", "python-group-aggregate", "join", "interval-join",
    "temporal-join", "lookup-join", "window-join", "deduplicate", "window-deduplicate", "rank", "window-rank",
    "limit", "sort-limit", "sort", "over-aggregate", "expand", "changelog-normalize", "drop-update-before",
    "mini-batch-assigner", "match", "window-table-function", "constraint-validator", "partitioner",
    "upsert-materialize", "timestamp-inserter", "sink", "values", "python-calc",
)  # fmt: skip
DISTRIBUTIONS = {"HASH": "HASH", "SINGLETON": "GLOBAL", "BROADCAST": "BROADCAST"}
FLINK_TYPE = Expected("a Flink type (a string or its JSON form)", lambda value: isinstance(value, (str, dict)))


@dataclass
class SqlExchange:
    """An exchange node of a compiled plan."""

    node: int
    upstream_node: int
    downstream_node: int
    gate: int  # the downstream node's input number
    row_type: str  # ckpt's binary_row<...>
    partitioner: Optional[str]
    key: tuple[Any, ...]
    description: str
    node_types: tuple[str, str] = ("", "")  # of the upstream and downstream nodes, e.g. "calc", "groupaggregate"


def read_compiled_plan(path: str) -> list[SqlExchange]:
    try:
        with open(path) as f:
            document = json.load(f)
        checked(document, OBJECT, SqlPlanError, "the document")
        nodes = {_node_id(node, "id", f"nodes[{i}]"): node for i, node in enumerate(_objects(document, "nodes"))}
        edges = [
            (_node_id(edge, "source", f"edges[{i}]"), _node_id(edge, "target", f"edges[{i}]"))
            for i, edge in enumerate(_objects(document, "edges"))
        ]
    except (OSError, ValueError, RecursionError, SqlPlanError) as exc:
        raise SqlPlanError(f"cannot read compiled plan {path}: {exc} (expected the JSON of COMPILE PLAN)") from exc
    exchanges = []
    for node_id, node in nodes.items():
        if str(node.get("type", "")).startswith("stream-exec-sink"):
            exchanges += _sink_exchange(path, node_id, nodes, edges)
        if not str(node.get("type", "")).startswith("stream-exec-exchange"):
            continue
        sources = [s for s, t in edges if t == node_id]
        targets = [t for s, t in edges if s == node_id]
        if len(sources) != 1 or not targets:
            raise SqlPlanError(
                f"compiled plan {path}: exchange node {node_id} has {len(sources)} inputs and {len(targets)} outputs"
            )
        try:
            row_type, partitioner, key = _exchange_node(node)
        except CkptError as exc:
            raise SqlPlanError(f"compiled plan {path}, exchange node {node_id}: {exc}") from None
        description = str(node.get("description", ""))
        for target in targets:
            gate = [s for s, t in edges if t == target].index(node_id)
            types = (_kind(nodes[sources[0]].get("type")), _kind(nodes[target].get("type")) if target in nodes else "")
            exchanges.append(SqlExchange(node_id, sources[0], target, gate, row_type, partitioner, key, description, types))
    return exchanges


def _sink_exchange(path: str, node_id: int, nodes: dict, edges: list) -> list[SqlExchange]:
    """A sink node at a parallelism of its own (``sink.parallelism``) holds an exchange among its
    own operators, which no exchange node shows: from the operator before the sink writer (the
    constraint enforcer) to the writer, REBALANCE as Flink makes an edge without a partitioner
    between two parallelisms. Its rows are the sink's input rows. Marked by ``upstream_node ==
    downstream_node``: the operators are told apart by parallelism when matched."""
    sources = [s for s, t in edges if t == node_id]
    if len(sources) != 1 or sources[0] not in nodes:
        return []
    try:
        row_type = flink_type_json(checked_key(nodes[sources[0]], "outputType", FLINK_TYPE, SqlPlanError))
    except (KeyError, TypeError, ValueError, CkptError):
        return []  # a type ckpt cannot lay out: the exchange stays undescribed (untyped if --plan has it)
    description = f"the rows into {nodes[node_id].get('description', f'sink node {node_id}')}"
    return [SqlExchange(node_id, node_id, node_id, 0, row_type, "REBALANCE", (), description, ("sink", "sink"))]


def _kind(text: Any) -> str:
    """A node's kind as operator names and uids spell it: ``stream-exec-group-aggregate_1`` ->
    ``groupaggregate``, a table source scan -> ``source``."""
    kind = re.sub(r"[^a-z]", "", re.sub(r"^stream-exec-|_\d+$", "", str(text or "").lower()))
    return "source" if kind.startswith("tablesourcescan") else kind


def _kinds_of(ops: list[OperatorState], node: int) -> set[str]:
    """The kinds the operators of a node say they are: by name (``GroupAggregate[4]``, ``Sink: t[5]``)
    or by the transformation of their uid (``4_group-aggregate``)."""
    kinds = set()
    for op in ops:
        if op.name:
            kinds.add(re.sub(r"[^a-z]", "", re.split(r"[:\[]", op.name.lower())[0]))
        for transformation in TRANSFORMATIONS:
            if op.id_hex == operator_id_of_uid(f"{node}_{transformation}"):
                kinds.add(re.sub(r"[^a-z]", "", transformation))
    return kinds


def _objects(document: dict, key: str) -> list[dict]:
    """``document[key]``, a list of objects."""
    items = checked_key(document, key, LIST, SqlPlanError)
    for index, item in enumerate(items):
        checked(item, OBJECT, SqlPlanError, f"{key}[{index}]")
    return items


def _node_id(item: dict, key: str, where: str) -> int:
    return checked_key(item, key, NON_NEGATIVE, SqlPlanError, within=where)


def _exchange_node(node: dict) -> tuple[str, Optional[str], tuple[Any, ...]]:
    """An exchange node's row type (ckpt's), partitioner and key columns."""
    try:
        row_type = flink_type_json(checked_key(node, "outputType", FLINK_TYPE, SqlPlanError))
    except (KeyError, TypeError, ValueError) as exc:  # a malformed JSON type (flink_types reads it unchecked)
        raise SqlPlanError(f"cannot read outputType: {type(exc).__name__}: {exc}") from None
    columns = parse_type(row_type)
    properties = checked_key(node, "inputProperties", LIST, SqlPlanError, [])
    first = checked(properties[0], OBJECT, SqlPlanError, "inputProperties[0]") if properties else {}
    where = "inputProperties[0].requiredDistribution"
    distribution = checked_key(first, "requiredDistribution", OBJECT, SqlPlanError, {}, "inputProperties[0]")
    kind = checked_key(distribution, "type", STRING, SqlPlanError, "UNKNOWN", where).upper()
    keys = checked_key(distribution, "keys", LIST, SqlPlanError, [], where) if kind == "HASH" else []
    for k in keys:
        if not NON_NEGATIVE.test(k) or k >= len(columns.fields):
            raise SqlPlanError(f"key {shown(k)} is not a column of {row_type}")
    names = columns.field_names
    return row_type, DISTRIBUTIONS.get(kind), tuple(names[k] if names else k for k in keys)


def _by_node_id(metadata: CheckpointMetadata) -> dict[int, list[OperatorState]]:
    """The checkpoint's operators of each plan node: by the node id ending their names, else by
    the ids of the planner's uids."""
    found: dict[int, list[OperatorState]] = {}
    for op in metadata.operators:
        match = re.search(r"\[(\d+)\]$", op.name or "")
        if match:
            found.setdefault(int(match.group(1)), []).append(op)
    return found


def _by_uid(metadata: CheckpointMetadata, node: int) -> list[OperatorState]:
    ids = {operator_id_of_uid(f"{node}_{t}"): i for i, t in enumerate(TRANSFORMATIONS)}
    matched = [op for op in metadata.operators if op.id_hex in ids]
    return sorted(matched, key=lambda op: ids[op.id_hex])


def _pick(candidates: list[OperatorState], direction: str) -> Optional[OperatorState]:
    """The operator of a node that holds the exchange's side: the one with channel state of that
    direction, else the chain's head (receiving side) or tail (sending side)."""
    holding = [op for op in candidates if any(s.channel_handles(direction) for s in op.subtasks)]
    chosen = holding or candidates
    if not chosen:
        return None
    return chosen[0] if direction == INPUT else chosen[-1]


def _inner_exchange(ops: list[OperatorState]) -> Optional[tuple[OperatorState, OperatorState]]:
    """The sink writer (the node's operator holding input-channel state, else the last) and the
    operator before it at another parallelism, where the node's operators run at two parallelisms."""
    if len({op.parallelism for op in ops}) != 2:
        return None
    holding = [op for op in ops if any(s.channel_handles(INPUT) for s in op.subtasks)]
    writers = [op for op in ops if (op.name or "").startswith("Sink:") or (op.uid or "").endswith("_sink")]
    downstream = (holding or writers or ops[-1:])[0]
    others = [op for op in ops if op.parallelism != downstream.parallelism]
    return (others[0], downstream) if len(others) == 1 else None


def _matched(sqls: list[SqlExchange], metadata: CheckpointMetadata, shift: int):
    """The exchanges whose nodes (their ids plus ``shift``) match the checkpoint's operators, and
    the nodes that match none."""
    by_name = _by_node_id(metadata)

    def operators(node: int, kind: str = "") -> list[OperatorState]:
        found = by_name.get(node + shift) or _by_uid(metadata, node + shift)
        if shift and kind and kind not in _kinds_of(found, node + shift):
            return []  # shifted onto a node of another kind: no match
        return found

    exchanges, unmatched = [], []
    for sql in sqls:
        if sql.upstream_node == sql.downstream_node:  # within a sink node (``_sink_exchange``)
            inner = _inner_exchange(operators(sql.node, "sink"))
            if inner is not None:
                sender, receiver = inner
                exchanges.append(Exchange(sender.id_hex, receiver.id_hex, 0, 0, sql.partitioner, sql.row_type, ()))
            continue
        ends = []
        for node, direction, kind in zip((sql.upstream_node, sql.downstream_node), (OUTPUT, INPUT), sql.node_types):
            op = _pick(operators(node, kind), direction)
            if op is None:
                unmatched.append(f"node {node}")
            ends.append(op)
        upstream, downstream = ends
        if upstream is None or downstream is None:
            unmatched[-1] += f" (exchange node {sql.node}: {sql.description or sql.row_type})"
            continue
        exchanges.append(Exchange(upstream.id_hex, downstream.id_hex, sql.gate, 0, sql.partitioner, sql.row_type, sql.key))
    return exchanges, unmatched


def _checkpoint_node_ids(metadata: CheckpointMetadata) -> set[int]:
    found = set(_by_node_id(metadata))
    common = ("source", "calc", "group-aggregate", "join", "constraint-validator", "sink")
    uids = {operator_id_of_uid(f"{n}_{t}"): n for n in range(1, 1000) for t in common}
    found |= {uids[op.id_hex] for op in metadata.operators if op.id_hex in uids}
    return found


def sql_plan_exchanges(path: str, metadata: CheckpointMetadata, notes: Optional[list[str]] = None):
    """The exchanges of a compiled plan as ckpt's exchanges; every exchange node must match.

    A plan compiled anew (another TableEnvironment, another SQL client run) numbers its nodes
    otherwise (16..30 for 1..15): where its own ids do not match, the one shift of every node id
    under which every exchange matches is taken, and said in ``notes``."""
    sqls = read_compiled_plan(path)
    shift = 0
    exchanges, unmatched = _matched(sqls, metadata, 0)
    if unmatched:
        plan_nodes = {n for sql in sqls for n in (sql.upstream_node, sql.downstream_node)}
        shifts = sorted({c - n for c in _checkpoint_node_ids(metadata) for n in plan_nodes} - {0})
        fitting = [(shift, found) for shift in shifts for found, missing in [_matched(sqls, metadata, shift)] if not missing]
        if len(fitting) == 1:
            shift, exchanges = fitting[0]
            unmatched = []
            if notes is not None:
                nodes = sorted({n for sql in sqls for n in (sql.upstream_node, sql.node, sql.downstream_node)})
                notes.append(
                    f"compiled plan {path}: its node ids differ from the job's by {shift:+d} (compiled in another "
                    "TableEnvironment); matched by the structure of its nodes (plan node -> the job's: "
                    + ", ".join(f"{n} -> {n + shift}" for n in nodes)
                    + ")"
                )
    if unmatched:
        raise SqlPlanError(
            f"compiled plan {path} does not fit this checkpoint: no operator of {', '.join(dict.fromkeys(unmatched))} "
            "(operators are matched by the node ids in their names, e.g. GroupAggregate[4], or by the planner's "
            "uids <node id>_<transformation>, also with every node id shifted by one amount); is it the plan of this job?"
        )
    if not exchanges:
        raise SqlPlanError(f"compiled plan {path} has no exchange nodes")
    _name_uids(metadata, _node_ids(path), shift)
    return exchanges


def _node_ids(path: str) -> set[int]:
    """The ids of every node of a compiled plan (one ``read_compiled_plan`` has read already)."""
    with open(path) as f:
        return {node["id"] for node in json.load(f)["nodes"]}


def _name_uids(metadata: CheckpointMetadata, nodes: set[int], shift: int) -> None:
    """Where the metadata holds no uids (before v5), give the operators whose ids are those of the
    planner's uids of the plan's nodes (``8_join``) these uids: the id is the hash of the uid, so the
    job set it, and its id stays the same in any job graph (the topology check relies on that)."""
    for node in nodes:
        uids = {operator_id_of_uid(f"{node + shift}_{t}"): f"{node + shift}_{t}" for t in TRANSFORMATIONS}
        for op in _by_uid(metadata, node + shift):
            if op.uid is None:
                op.uid = uids[op.id_hex]
