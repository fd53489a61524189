"""``ckpt rescale``: a checkpoint for a new parallelism, restorable by Flink without replicating
or filtering in-flight data.

1. New parallelism per operator: ``--parallelism N`` for the operators at the job's parallelism
   (the most common one), ``--operator REF=N`` for any operator; N at most the max parallelism.
2. Keyed and operator state are reassigned as Flink's StateAssignmentOperation would.
3. In-flight records of every exchange whose upstream or downstream parallelism changes are
   routed to the new subtasks (ckpt_tool.records.route) on an engine (Spark by default) and
   written as input-channel state of the new downstream subtasks; exchanges whose parallelism
   does not change keep their channel state as it is.
4. What cannot be rescaled is refused: in-flight data on FORWARD, BROADCAST, CUSTOM or unknown
   exchanges whose parallelism changes, partially finished operators, N above max parallelism.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from ckpt_tool.assign.keyed import merge_key_groups, reassign_keyed
from ckpt_tool.assign.operator_state import reassign_operator_state
from ckpt_tool.engine import Progress, duplicates_per_exchange, inflight_file_name
from ckpt_tool.errors import CkptError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import (
    INPUT,
    OUTPUT,
    ChannelStateHandle,
    CheckpointMetadata,
    OperatorState,
    RelativeFileHandle,
    SubtaskState,
)
from ckpt_tool.records.route import RouteSpec, route_tasks
from ckpt_tool.records.scan import channel_tasks
from ckpt_tool.records.schema import Exchange
from ckpt_tool.storage import normalize_uri
from ckpt_tool.writer import check_destination, fresh_destination, write_checkpoint

REDISTRIBUTABLE = ("HASH", "REBALANCE", "RESCALE")
CHANGELOG_HANDLE_SINCE = 4  # metadata version (Flink 1.16) that can hold ckpt's changelog handle


class RescaleError(CkptError):
    """A rescale that would not restore correctly, refused with the reason."""


@dataclass
class RescalePlan:
    old: dict[str, int]
    new: dict[str, int]
    exchanges: list[Exchange]
    rescaled: list[int]  # indexes into exchanges whose in-flight data is rerouted
    dropped: list[int] = field(default_factory=list)  # indexes of exchanges whose in-flight data is dropped

    def changes(self, op_id: str) -> bool:
        return self.old[op_id] != self.new[op_id]


@dataclass
class RescaleReport:
    dry_run: bool
    exchanges: list[dict] = field(default_factory=list)
    operators: list[dict] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)
    files_written: int = 0

    def as_dict(self) -> dict:
        records_in = sum(e["records_in"] for e in self.exchanges)
        records_out = sum(e["records_out"] for e in self.exchanges)
        removed = sum(e["replicas_removed"] for e in self.exchanges)
        return {
            "dry_run": self.dry_run,
            "operators": self.operators,
            "exchanges": self.exchanges,
            "records_in": records_in,
            "records_out": records_out,
            "replicas_removed": removed,
            "inflation": _ratio(records_out, records_in - removed),
            "dropped": self.dropped,
            "files_written": self.files_written,
        }


def _ratio(out: int, into: int) -> float:
    return round(out / into, 4) if into else 1.0


def plan_rescale(
    metadata: CheckpointMetadata, parallelism: Optional[int], overrides: dict[str, int], exchanges: list[Exchange]
) -> RescalePlan:
    old = {op.id_hex: op.parallelism for op in metadata.operators}
    job_parallelism = Counter(old.values()).most_common(1)[0][0] if old else 1
    new = {op_id: (parallelism if parallelism and p == job_parallelism else p) for op_id, p in old.items()}
    for ref, value in overrides.items():
        try:
            new[metadata.operator(ref).id_hex] = value
        except KeyError:
            raise RescaleError(f"--operator {ref}: no such operator (use its uid, name or id)") from None
    for op in metadata.operators:
        label = op.label
        if new[op.id_hex] < 1:
            raise RescaleError(f"operator {label}: parallelism must be at least 1")
        if new[op.id_hex] > op.max_parallelism:
            raise RescaleError(
                f"operator {label}: parallelism {new[op.id_hex]} is above its max parallelism {op.max_parallelism}"
            )
        if new[op.id_hex] != op.parallelism and op.finished == "partial":
            raise RescaleError(f"operator {label} is partially finished (FLIP-147); Flink cannot rescale it")
    plan = RescalePlan(old, new, exchanges, [])
    _check_channel_state(metadata, plan)
    return plan


def plan_repair(metadata: CheckpointMetadata, exchanges: list[Exchange], drop: list[str]) -> RescalePlan:
    """Same parallelism; keyed exchanges rerouted (replicas kept once, misplaced records moved to
    the subtask owning their key group); exchanges into the ``drop`` operators lose their data."""
    same = {op.id_hex: op.parallelism for op in metadata.operators}
    dropped_ids = set()
    for ref in drop:
        try:
            dropped_ids.add(metadata.operator(ref).id_hex)
        except KeyError:
            raise RescaleError(f"--drop-in-flight {ref}: no such operator (use its uid, name or id)") from None
    plan = RescalePlan(same, dict(same), exchanges, [])
    plan.dropped = [i for i, e in enumerate(exchanges) if e.downstream_id in dropped_ids]
    covered = {exchanges[i].downstream_id for i in plan.dropped}
    for op in metadata.operators:
        if op.id_hex in dropped_ids and op.id_hex not in covered and any(
            s.channel_handles(INPUT) for s in op.subtasks
        ):
            raise RescaleError(f"--drop-in-flight {op.label}: no exchange in --plan/--schema leads into it")
    _check_channel_state(metadata, plan, reroute_keyed=True)
    return plan


def _check_channel_state(metadata: CheckpointMetadata, plan: RescalePlan, reroute_keyed: bool = False) -> None:
    """Every in-flight byte must belong to an exchange that can be carried to the new layout."""
    known_inputs = {(e.downstream_id, e.gate): i for i, e in enumerate(plan.exchanges)}
    known_outputs = {(e.upstream_id, e.partition): i for i, e in enumerate(plan.exchanges) if e.upstream_id}
    names = {op.id_hex: op.label for op in metadata.operators}
    holding: set[int] = set()
    for op in metadata.operators:
        for direction, known in ((INPUT, known_inputs), (OUTPUT, known_outputs)):
            for s in op.subtasks:
                for handle in s.channel_handles(direction):
                    if not handle.offsets:
                        continue
                    index = known.get((op.id_hex, handle.info[0]))
                    if index is None:
                        if plan.changes(op.id_hex):
                            side = "input gate" if direction == INPUT else "output partition"
                            raise RescaleError(
                                f"operator {names[op.id_hex]} has in-flight data on {side} {handle.info[0]} "
                                "that no exchange in --plan/--schema describes"
                            )
                        continue
                    holding.add(index)
    for index, exchange in enumerate(plan.exchanges):
        up = exchange.upstream_id
        changes = plan.changes(exchange.downstream_id) or (up is not None and plan.changes(up))
        if index in plan.dropped or index not in holding or not (changes or (reroute_keyed and exchange.keyed)):
            continue
        label = f"{names.get(up, '?')} -> {names[exchange.downstream_id]} (gate {exchange.gate})"
        if up is None:
            raise RescaleError(f"exchange {label}: the sending operator is unknown; name it in --schema")
        partitioner = exchange.partitioner or ("HASH" if exchange.keyed else None)
        if partitioner == "HASH" and not exchange.keyed:
            raise RescaleError(f"exchange {label} is keyed but --schema gives no record type and key for it")
        if partitioner not in REDISTRIBUTABLE:
            reason = {
                "FORWARD": "a forward exchange pairs subtasks one to one",
                "BROADCAST": "a broadcast exchange sends every record to every subtask",
                "CUSTOM": "a custom partitioner's choice cannot be repeated offline",
                None: "its partitioner is unknown (pass --plan or name it in --schema)",
            }.get(partitioner, f"its partitioner {partitioner} keeps no rescalable order")
            raise RescaleError(f"exchange {label} holds in-flight data and its parallelism changes, but {reason}")
        plan.rescaled.append(index)


def _reassign_operator(
    source: Checkpoint, op: OperatorState, new_parallelism: int, files: dict[str, bytes]
) -> list[SubtaskState]:
    live = [s for s in op.subtasks if not s.finished]
    keyed = {}
    for field_name in ("managed_keyed", "raw_keyed"):
        merge = None
        if source.metadata.version < CHANGELOG_HANDLE_SINCE:

            def merge(parts, wanted, index, field_name=field_name):
                name = f"ckpt-{field_name}-{op.id_hex}-{index}"
                handle, data = merge_key_groups(parts, wanted, source.handle_bytes, name)
                files[name] = data
                return handle

        keyed[field_name] = reassign_keyed(
            [getattr(s, field_name) for s in live], op.max_parallelism, new_parallelism,
            source.metadata.checkpoint_id, merge,
        )
    operator = {}
    for field_name in ("managed_operator", "raw_operator"):
        handles, new_files = reassign_operator_state(
            source, [getattr(s, field_name) for s in live], new_parallelism, f"ckpt-{field_name}-{op.id_hex}"
        )
        operator[field_name] = handles
        files.update(new_files)
    return [
        SubtaskState(
            index,
            managed_keyed=keyed["managed_keyed"][index],
            raw_keyed=keyed["raw_keyed"][index],
            managed_operator=operator["managed_operator"][index],
            raw_operator=operator["raw_operator"][index],
        )
        for index in range(new_parallelism)
    ]


def rescale(
    source: Checkpoint,
    dst: str,
    plan: RescalePlan,
    engine,
    dry_run: bool = False,
    progress: Progress = None,
) -> RescaleReport:
    dst = normalize_uri(dst).rstrip("/")
    if dry_run:
        check_destination(dst)
        return _rescale(source, dst, plan, engine, True, progress)
    with fresh_destination(dst):
        return _rescale(source, dst, plan, engine, False, progress)


def _rescale(source: Checkpoint, dst: str, plan: RescalePlan, engine, dry_run: bool, progress: Progress):
    metadata = copy.deepcopy(source.metadata)
    report = RescaleReport(dry_run)
    rescaled = [plan.exchanges[i] for i in plan.rescaled]
    replaced = rescaled + [plan.exchanges[i] for i in plan.dropped]
    rescaled_inputs = {(e.downstream_id, e.gate) for e in replaced}
    rescaled_outputs = {(e.upstream_id, e.partition) for e in replaced}

    # state first (the driver's work, while Spark may still be starting), then in-flight records
    files: dict[str, bytes] = {}
    kept: dict[tuple[str, int], tuple[list, list]] = {}
    for op in metadata.operators:
        for s in op.subtasks:
            kept[(op.id_hex, s.index)] = (
                [h for h in s.channel_handles(INPUT) if (op.id_hex, h.info[0]) not in rescaled_inputs],
                [h for h in s.channel_handles(OUTPUT) if (op.id_hex, h.info[0]) not in rescaled_outputs],
            )
        if plan.changes(op.id_hex):
            new_parallelism = plan.new[op.id_hex]
            report.operators.append(
                {"id": op.id_hex, "uid": op.uid, "name": op.name, "parallelism": [op.parallelism, new_parallelism]}
            )
            op.parallelism = new_parallelism
            if not op.fully_finished:
                op.subtasks = _reassign_operator(source, op, new_parallelism, files)

    channels = channel_tasks(source, rescaled)
    specs = [
        RouteSpec(
            exchange,
            plan.new[exchange.upstream_id],
            plan.new[exchange.downstream_id],
            source.metadata.operator(exchange.downstream_id).max_parallelism,
        )
        for exchange in rescaled
    ]
    if dry_run:  # replicas from a scan; nothing is routed or written
        routed, duplicates = [], duplicates_per_exchange(engine.scan(channels, rescaled)[1] if channels else {})
    else:
        tasks = route_tasks(
            channels, specs, lambda i, c: inflight_file_name(rescaled[i].downstream_id, rescaled[i].gate, c)
        )
        routed, duplicates = engine.route(tasks, specs, dst, progress), {}
    new_inputs: dict[tuple[str, int], list[ChannelStateHandle]] = {}
    for written in routed:
        exchange = rescaled[written.exchange_index]
        delegate = RelativeFileHandle(written.file_name, written.file_size)
        for subtask, (offsets, size, _) in written.placed.items():
            new_inputs.setdefault((exchange.downstream_id, subtask), []).append(
                ChannelStateHandle(INPUT, subtask, (exchange.gate, written.new_channel), offsets, size, delegate)
            )
    for op in metadata.operators:
        for s in op.subtasks:
            if s.finished:
                continue
            inputs, outputs = kept.get((op.id_hex, s.index), ([], []))
            s.input_channels = inputs + sorted(new_inputs.get((op.id_hex, s.index), []), key=lambda h: h.info)
            s.output_channels = outputs

    report.exchanges = _exchange_report(rescaled, routed, duplicates, source)
    report.dropped = _dropped_report([plan.exchanges[i] for i in plan.dropped], source, engine)
    if dry_run:
        return report
    report.files_written = len(routed) + len(files)
    write_checkpoint(source, metadata, dst, files, progress, frozenset(r.file_name for r in routed))
    return report


def _exchange_report(exchanges, routed, duplicates, source: Checkpoint) -> list[dict]:
    """Per rescaled exchange: what was routed (in a dry run, only the replicas a scan found)."""
    names = {op.id_hex: op.label for op in source.metadata.operators}
    result = []
    for index, exchange in enumerate(exchanges):
        mine = [r for r in routed if r.exchange_index == index]
        placed = [figures for r in mine for figures in r.placed.values()]
        records_in = sum(r.records_in for r in mine)
        records_out = sum(records for _, _, records in placed)
        removed = sum(r.replicas_removed for r in mine)
        result.append({
            "upstream": exchange.upstream_id,
            "downstream": exchange.downstream_id,
            "name": f"{names.get(exchange.upstream_id, '?')} -> {names[exchange.downstream_id]}",
            "gate": exchange.gate,
            "partitioner": exchange.partitioner or "HASH",
            "records_in": records_in,
            "records_out": records_out,
            "bytes_in": sum(r.bytes_in for r in mine),
            "bytes_out": sum(size - 4 * len(offsets) for offsets, size, _ in placed),
            "inflation": _ratio(records_out, records_in - removed),
            "replicas_found": sum(r.replicas_found for r in mine) or duplicates.get(index, 0),
            "replicas_removed": removed,
            "non_records_dropped": sum(r.non_records_dropped for r in mine),
            "channels_written": len(placed),
        })
    return result


def _dropped_report(exchanges: list[Exchange], source: Checkpoint, engine) -> list[dict]:
    """Exactly what dropping these exchanges' in-flight data removes."""
    from ckpt_tool.inspect import exchanges_summary

    names = {op.id_hex: op.label for op in source.metadata.operators}
    return [
        {
            "upstream": e["upstream"],
            "downstream": e["downstream"],
            "name": f"{names.get(e['upstream'], '?')} -> {names[e['downstream']]}",
            "gate": e["gate"],
            "buffers": sum(c["input_buffers"] + c["output_buffers"] for c in e["channels"]),
            "bytes": e["bytes"],
            "records": e["records"],
            "watermarks": e["watermarks"],
            "other_elements": e["other_elements"],
        }
        for e in exchanges_summary(source, exchanges, engine)
    ]
