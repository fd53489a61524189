"""``ckpt schema``: a schema file to fill in, listing every exchange that holds in-flight data.

Each entry names the sending operator (the tail of its chain, which holds result-subpartition
state) and the receiving operator (the head of its chain, which holds input-channel state) by
uid, name and id, with gate, partition, partitioner and what is in flight; the record type and
key are filled in where a compiled SQL plan or a schema says them, else left as placeholders.
Without a plan, exchanges are known by their receiving side only: the senders that could feed
each are listed for the user to choose, each once, with the output buffers and bytes it holds,
without those the parallelisms rule out (a sender's output subpartitions are the receiver's
subtasks, a receiver's input channels the sender's subtasks), and with what the bytes say of
the pairing where the caller can read them (``evidence``).

Everything taken from the checkpoint, a plan or a schema (uids, names, paths, types) is written
as an escaped TOML string, in values and in comments alike (ckpt_tool.text): no name can end its
line or its string, so the file holds exactly the keys written here, and never a ``decoder``
the user did not give.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from ckpt_tool.flink.model import INPUT, OUTPUT, CheckpointMetadata, GateFigures, OperatorState, handle_gates
from ckpt_tool.records.schema import Exchange, SchemaError
from ckpt_tool.text import printable, shown, toml_string

# How the pairing evidence (ckpt_tool.exchanges.pairing_evidence) starts its verdicts
FIT = "the bytes fit"
CONTRADICTED = "the bytes contradict it"


def _figures_of(op: Optional[OperatorState], direction: str, number: int) -> GateFigures:
    """One gate (input) or partition (output) of an operator, summed over its subtasks from the
    handles (a job at parallelism p has p² channels, in a few merged handles per subtask)."""
    figures = GateFigures()
    for s in op.subtasks if op is not None else []:
        figures.add(s.input_channels if direction == INPUT else s.output_channels, number)
    return figures


def _in_flight(op: Optional[OperatorState], direction: str, number: int) -> tuple[int, int]:
    """(buffers, payload bytes) of one gate (input) or partition (output) of an operator."""
    figures = _figures_of(op, direction, number)
    return figures.buffers, figures.bytes


def _gates(op: OperatorState, direction: str) -> set[int]:
    """The gates (input) or partitions (output) the operator's subtasks hold channels of."""
    return {g for s in op.subtasks for g in handle_gates(s.input_channels if direction == INPUT else s.output_channels)}


def _describe(op: OperatorState) -> str:
    parts = [f"uid {shown(op.uid)}" if op.uid else "no uid in the metadata", f"name {shown(op.name)}" if op.name else "no name"]
    return f"{', '.join(parts)}, id {op.id_hex}, parallelism {op.parallelism}"


def _ref(metadata: CheckpointMetadata, op: OperatorState) -> str:
    """The operator as a TOML string: its uid, or its id where it has none, where TOML cannot hold
    it, or where the uid would name another operator first (another's id or name)."""
    uid = toml_string(op.uid) if op.uid else None
    return uid if uid and metadata.operator(op.uid or "") is op else f'"{op.id_hex}"'


def _value(value: Any) -> str:
    """A string, integer or list of them as TOML; a string TOML cannot hold is refused."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SchemaError(f"not a schema value: {printable(repr(value))}")
    if isinstance(value, int):
        return str(value)
    text = toml_string(value)
    if text is None:
        raise SchemaError(f"a schema file cannot hold {shown(value)} (a lone surrogate)")
    return text


def schema_skeleton(
    metadata: CheckpointMetadata,
    exchanges: Optional[list[Exchange]],
    source: str,
    evidence: Optional[Callable[[Exchange], str]] = None,
) -> str:
    """``evidence``: what the bytes say of a candidate pairing of a sender's output partition with
    an undescribed input gate (``ckpt_tool.exchanges.pairing_evidence``)."""
    lines = [
        f"# Exchanges holding in-flight data in {printable(source)} "
        f"(checkpoint {metadata.checkpoint_id}, metadata v{metadata.version}).",
        "# Fill in each type and key (README: Record types), then: ckpt inspect CHECKPOINT --schema THIS_FILE",
        "",
    ]
    described: set = set()
    sent: set = set()
    count = 0
    typed = 0  # exchanges listed with their type (from a compiled plan or a schema)
    for exchange in exchanges or []:
        downstream = metadata.operator(exchange.downstream_id)
        upstream = metadata.operator(exchange.upstream_id) if exchange.upstream_id else None
        inputs = _in_flight(downstream, INPUT, exchange.gate)
        outputs = _in_flight(upstream, OUTPUT, exchange.partition)
        described.add((downstream.id_hex, exchange.gate))
        if upstream is not None:
            sent.add((upstream.id_hex, exchange.partition))
        if not inputs[0] and not outputs[0]:
            continue
        count += 1
        lines += ["[[exchange]]"]
        if upstream is not None:
            lines += [f"# upstream (tail of its chain): {_describe(upstream)}"]
        lines += [f"# downstream (head of its chain): {_describe(downstream)}"]
        lines += [_figures(inputs, outputs)]
        if upstream is not None:
            lines += [f"upstream = {_ref(metadata, upstream)}"]
        lines += [f"downstream = {_ref(metadata, downstream)}", f"gate = {_value(exchange.gate)}"]
        lines += [f"partition = {_value(exchange.partition)}"]
        if exchange.partitioner:
            lines += [f"partitioner = {_value(exchange.partitioner)}"]
        lines += _type_and_key(exchange)
        typed += bool(exchange.record_type or exchange.decoder)
        lines += [""]
    count += _unplanned(metadata, described, lines, evidence)
    for op in metadata.operators:
        for partition in sorted(_gates(op, OUTPUT) - {p for i, p in sent if i == op.id_hex}):
            buffers, size = _in_flight(op, OUTPUT, partition)
            if buffers:
                count += 1
                lines += [
                    f"# {_describe(op)} holds {buffers} output buffers ({size} bytes) of partition {partition}",
                    "# (its exchange, and so its receiver, only --plan can tell).",
                    "",
                ]
    if not count:
        lines += ["# No exchange holds in-flight data."]
    elif typed == count:  # nothing left to fill in
        lines[1] = "# Every exchange is typed (nothing to fill in); use it as: ckpt inspect CHECKPOINT --schema THIS_FILE"
    return "\n".join(lines).rstrip("\n") + "\n"


def _figures(inputs: tuple[int, int], outputs: tuple[int, int]) -> str:
    return (
        f"# in flight: {inputs[0]} input buffers ({inputs[1]} bytes) at the receiver, "
        f"{outputs[0]} output buffers ({outputs[1]} bytes) at the sender"
    )


def _type_and_key(exchange: Exchange) -> list[str]:
    if exchange.record_type:
        return [f"type = {_value(exchange.record_type)}", f"key = {_value(list(exchange.key))}"]
    if exchange.decoder:
        return [f"decoder = {_value(exchange.decoder)}"]
    return ['# type = "..."        # e.g. "tuple<long,string>", "pojo<id:long,name:string>", "binary_row<k:string,...>"',
            '# key = ["..."]       # the key fields: positions ("f0") or names']  # fmt: skip


def _unplanned(
    metadata: CheckpointMetadata, described: set, lines: list[str], evidence: Optional[Callable[[Exchange], str]]
) -> int:
    """Entries for input gates with data that no plan described: the receiver is known, the
    sender is one of the operators with output state that the parallelisms allow."""
    gates: dict[tuple[str, int], OperatorState] = {}
    for op in metadata.operators:
        for gate in sorted(_gates(op, INPUT)):
            if (op.id_hex, gate) not in described:
                gates[(op.id_hex, gate)] = op
    for (_, gate), downstream in sorted(gates.items(), key=lambda item: (item[1].label, item[0][1])):
        lines += ["[[exchange]]", f"# downstream (head of its chain): {_describe(downstream)}"]
        received = _figures_of(downstream, INPUT, gate)
        lines += [f"# in flight: {received.buffers} input buffers ({received.bytes} bytes) at the receiver; the sender's below"]
        candidates = []
        for op in metadata.operators:
            if op.id_hex == downstream.id_hex or received.highest >= op.parallelism:
                continue  # input channel c is the sender's subtask c (or one of its subtasks, pointwise)
            for partition in sorted(_gates(op, OUTPUT)):
                # subpartition d feeds the receiver's subtask d
                if _figures_of(op, OUTPUT, partition).highest < downstream.parallelism:
                    candidates.append((op, partition))
        fitting = []  # the candidates the bytes fit
        contradicted = 0
        if candidates:
            lines += ["# upstream: the tail of the sending chain; operators with output state the parallelisms allow:"]
            for op, partition in candidates:
                out_buffers, out_bytes = _in_flight(op, OUTPUT, partition)
                said = evidence(Exchange(op.id_hex, downstream.id_hex, gate, partition)) if evidence else ""
                fitting += [(op, partition)] if said.startswith(FIT) else []
                contradicted += said.startswith(CONTRADICTED)
                lines += [
                    f"#   {_ref(metadata, op)}, partition {partition}: {out_buffers} output buffers ({out_bytes} bytes)"
                    + (f"; {printable(said)}" if said else ""),
                    f"#     ({_describe(op)})",
                ]
        else:
            lines += ["# upstream: no operator holds output state for it (the sender sent it all)"]
        if len(fitting) == 1 and len(fitting) + contradicted == len(candidates):  # the one pairing the bytes fit
            op, partition = fitting[0]
            lines += ["# the one pairing the bytes fit (every other candidate contradicts them):"]
            lines += [f"upstream = {_ref(metadata, op)}", f"downstream = {_ref(metadata, downstream)}", f"gate = {gate}"]
            lines += [f"partition = {partition}"]
        else:
            lines += ['# upstream = "..."', f"downstream = {_ref(metadata, downstream)}", f"gate = {gate}", "partition = 0"]
        lines += ['# partitioner = "HASH"']
        lines += _type_and_key(Exchange(None, downstream.id_hex))
        lines += [""]
    return len(gates)
