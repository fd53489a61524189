"""Writing a checkpoint for a plan: what ``rescale`` and ``repair`` share.

Keyed and operator state are reassigned as Flink's StateAssignmentOperation would (ckpt_tool.assign),
the in-flight records of the plan's rerouted exchanges are routed on the session's engine
(ckpt_tool.engine.tasks), and before ``_metadata`` is written the output proves itself: every
channel a route task wrote is read back through the handles the new metadata holds, and its
records (count and digest) must equal the records routed into it, every byte of every written
file must be referenced exactly once, and every new subtask that received in-flight data must
hold its handles. Any mismatch stops the run before ``_metadata`` exists (exit code 3).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from itertools import chain
from typing import Optional

import numpy as np

from ckpt_tool.assign.keyed import KeyedStateError, key_group_starts, merge_key_groups, reassign_keyed
from ckpt_tool.assign.operator_state import reassign_operator_state
from ckpt_tool.carried import refuse_unsound_carried
from ckpt_tool.engine import Engine, LocalEngine
from ckpt_tool.engine.channels import narrow, ranges, runs_in_order
from ckpt_tool.engine.tasks import (
    ATTEMPT,
    ROUTED_DIGEST,
    ReadBackTask,
    RoutedFile,
    check_back,
    discard_other_attempts,
    read_back,
    route_batch,
    route_tasks,
    routed_digest,
    short_digests,
)
from ckpt_tool.errors import EXIT_INTERNAL, CkptError
from ckpt_tool.exchanges import ExchangeScan, scan_exchanges
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.key_groups import refuse_misplaced_key_groups
from ckpt_tool.flink.metadata import channel_handle_form
from ckpt_tool.flink.model import (
    INPUT,
    OUTPUT,
    AnyChannelHandle,
    ChannelColumns,
    CheckpointMetadata,
    HandleFiles,
    OperatorState,
    SubtaskState,
    WrittenFileHandle,
    channels_of,
)
from ckpt_tool.flink.operator_state import refuse_unsound_operator_state
from ckpt_tool.flink.plan import refuse_mixed_max_parallelism
from ckpt_tool.flink.uids import refuse_mismatched_uids
from ckpt_tool.memory import release_memory
from ckpt_tool.planning import RescalePlan, gates_in
from ckpt_tool.records.route import RouteSpec
from ckpt_tool.session import Session
from ckpt_tool.storage import join, normalize_uri
from ckpt_tool.writer import check_destination, write_checkpoint
from ckpt_tool.writer.claim import Claim, claimed

CHANGELOG_HANDLE_SINCE = 4  # metadata version (Flink 1.16) that can hold ckpt's changelog handle


class OutputVerificationError(CkptError):
    """The written output does not hold what was routed into it (a bug: nothing is published)."""

    exit_code = EXIT_INTERNAL


# --- the report ---------------------------------------------------------------------------------


def _ratio(out: int, into: int) -> float:
    return round(out / into, 4) if into else 1.0


@dataclass
class OperatorChange:
    id: str
    uid: Optional[str]
    name: Optional[str]
    parallelism: tuple[int, int]


@dataclass
class ExchangeFigures:
    """One rerouted exchange: records read from the old channels and read back from the new."""

    upstream: Optional[str]
    downstream: str
    name: str
    gate: int
    partitioner: str
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    replicas_found: int = 0
    replicas_removed: int = 0
    non_records_dropped: int = 0
    channels_written: int = 0

    @property
    def inflation(self) -> float:
        return _ratio(self.records_out, self.records_in - self.replicas_removed)


@dataclass
class DroppedFigures:
    """Exactly what dropping one exchange's in-flight data removes."""

    upstream: Optional[str]
    downstream: str
    name: str
    gate: int
    buffers: int
    bytes: int
    records: int
    watermarks: int
    other_elements: int


@dataclass
class RescaleReport:
    """What a rewrite did. In a dry run the exchanges' figures come from a scan of the old
    channels, and what would be written out is an estimate (``estimated``)."""

    dry_run: bool
    engine: str = "local"
    operators: list[OperatorChange] = field(default_factory=list)
    exchanges: list[ExchangeFigures] = field(default_factory=list)
    dropped: list[DroppedFigures] = field(default_factory=list)
    carried_buffers: int = 0  # in-flight data kept as it was (exchanges whose parallelism does not change)
    carried_bytes: int = 0
    files_written: int = 0
    leftovers_removed: int = 0  # files an interrupted earlier run left in DST, removed first
    warnings: list[str] = field(default_factory=list)  # about where the work ran (the engine's)

    @property
    def estimated(self) -> bool:
        return self.dry_run

    @property
    def records_in(self) -> int:
        return sum(e.records_in for e in self.exchanges)

    @property
    def records_out(self) -> int:
        return sum(e.records_out for e in self.exchanges)

    @property
    def replicas_removed(self) -> int:
        return sum(e.replicas_removed for e in self.exchanges)

    @property
    def inflation(self) -> float:
        return _ratio(self.records_out, self.records_in - self.replicas_removed)

    def as_dict(self) -> dict:
        return {
            "dry_run": self.dry_run,
            "estimated": self.estimated,
            "engine": self.engine,
            "operators": [{**asdict(o), "parallelism": list(o.parallelism)} for o in self.operators],
            "exchanges": [{**asdict(e), "inflation": e.inflation} for e in self.exchanges],
            "records_in": self.records_in,
            "records_out": self.records_out,
            "replicas_removed": self.replicas_removed,
            "inflation": self.inflation,
            "dropped": [asdict(d) for d in self.dropped],
            "carried": {"buffers": self.carried_buffers, "bytes": self.carried_bytes},
            "files_written": self.files_written,
            "leftovers_removed": self.leftovers_removed,
            "warnings": self.warnings,
        }


# --- state --------------------------------------------------------------------------------------


def _reassign_operator(
    source: Checkpoint, op: OperatorState, new_parallelism: int, files: dict[str, bytes]
) -> list[SubtaskState]:
    live = [s for s in op.subtasks if not s.finished]
    keyed = {}
    for field_name in ("managed_keyed", "raw_keyed"):
        merge = None
        if source.metadata.version < CHANGELOG_HANDLE_SINCE:
            read = _memo(source.handle_bytes)
            starts = key_group_starts([getattr(s, field_name) for s in live])

            def merge(parts, wanted, index, field_name=field_name, read=read, starts=starts):
                name = f"ckpt-{field_name}-{op.id_hex}-{index}"
                handle, data = merge_key_groups(parts, wanted, read, name, starts)
                files[name] = data
                return handle

        try:
            keyed[field_name] = reassign_keyed(
                [getattr(s, field_name) for s in live],
                op.max_parallelism,
                new_parallelism,
                source.metadata.checkpoint_id,
                merge,
            )
        except KeyedStateError as exc:
            raise KeyedStateError(f"operator {op.label}: {exc}") from None
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


def _memo(read):
    """``read`` of a stream handle, each file read once (key-group files serve several subtasks)."""
    seen: dict[int, bytes] = {}

    def cached(handle) -> bytes:
        if id(handle) not in seen:
            seen[id(handle)] = read(handle)
        return seen[id(handle)]

    return cached


# --- the rewrite --------------------------------------------------------------------------------


def rewrite(session: Session, dst: str, plan: RescalePlan, dry_run: bool = False) -> RescaleReport:
    """Write the checkpoint ``plan`` describes to ``dst`` (nothing, with ``dry_run``). A destination
    ckpt must not write to is refused before the engine starts."""
    dst = normalize_uri(dst).rstrip("/")
    check_destination(dst, session.checkpoint.uri)
    refuse_misplaced_key_groups(session.checkpoint)  # the state it copies would not restore
    refuse_unsound_operator_state(session.checkpoint)
    refuse_mismatched_uids(session.checkpoint.metadata)  # state Flink's restore would not map to its operator
    refuse_mixed_max_parallelism(session.plan, session.checkpoint.metadata)  # nor read at its max parallelism
    refuse_unsound_carried(session.checkpoint, plan)  # nor the in-flight data it keeps as it was
    if dry_run:
        return _rewrite(session, dst, plan, None)
    session.start_engine()  # Spark starts in the background while the driver reassigns state
    with claimed(dst) as claim:
        return _rewrite(session, dst, plan, claim)


@dataclass
class Staged:
    """A rewrite before its proof: the new metadata (routed in-flight data placed in it), the
    rerouted exchanges, the files the route tasks wrote into the destination, and the state
    files still to write."""

    metadata: CheckpointMetadata
    rescaled: list
    task_files: list[str]  # the route tasks' files (their attempts are named after them)
    routed: list[RoutedFile]
    files: dict[str, bytes]
    dropped: list
    form: str  # of the source's channel handles (``channel_handle_form``), taken before it forgot them


def _rewrite(session: Session, dst: str, plan: RescalePlan, claim: Optional[Claim]) -> RescaleReport:
    """The rewrite under ``claim`` on ``dst``; a dry run (no claim) writes nothing."""
    report = RescaleReport(claim is None)
    staged = stage(session, dst, plan, claim, report)
    if staged is None or claim is None:  # a dry run: the figures of a scan
        return report
    source, engine, routed = session.checkpoint, session.engine, staged.routed
    records_out = verify_output(session, staged.metadata, staged.rescaled, routed, dst)
    release_memory()  # the proof's columns, before the metadata's buffer is serialized
    report.exchanges = _routed_figures(staged.rescaled, routed, records_out, staged.metadata)
    report.dropped = _dropped_report(staged.dropped, source, engine)
    report.files_written = len({r.file_name for r in routed}) + len(staged.files)
    report.leftovers_removed = len(claim.leftovers_removed)
    discard_other_attempts(dst, staged.task_files, routed)  # the last sweep: an attempt Spark lost track of may write late
    metadata, files, written = staged.metadata, staged.files, frozenset(r.file_name for r in routed)
    write_checkpoint(source, metadata, dst, files, session.progress, written, claim, source_form=staged.form)
    return report


def stage(session: Session, dst: str, plan: RescalePlan, claim: Optional[Claim], report: RescaleReport) -> Optional[Staged]:
    """Everything of a rewrite up to its proof: state reassigned, in-flight records routed into
    files under ``dst`` and their handles placed in the new metadata. A dry run (no claim) fills
    the report's figures from a scan and returns None."""
    dry_run = claim is None
    source = session.checkpoint
    rescaled = [plan.exchanges[i] for i in plan.rescaled]
    rescaled_inputs, rescaled_outputs = plan.replaced_gates()
    # The channel handles of the replaced exchanges are not copied (the copy drops them below, and
    # nothing changes them): copying a handle per channel cost more than routing its records. A
    # merged handle is copied whole (its channels are bytes, decoded where they are used).
    not_copied: dict[int, object] = {}
    for op in source.metadata.operators:
        for s in op.subtasks:
            for direction, replaced_here in ((INPUT, rescaled_inputs), (OUTPUT, rescaled_outputs)):
                for h in s.channel_handles_on(direction, gates_in(replaced_here, op.id_hex, True)):
                    not_copied[id(h)] = h
    metadata = copy.deepcopy(source.metadata, not_copied)
    del not_copied

    # state first (the driver's work, while Spark may still be starting), then in-flight records
    files: dict[str, bytes] = {}
    kept: dict[tuple[str, int], tuple[list, list]] = {}
    for op in metadata.operators:
        for s in op.subtasks:
            # merged handles stay whole (undecoded) where none of their channels is replaced
            kept[(op.id_hex, s.index)] = inputs, outputs = (
                s.channel_handles_on(INPUT, gates_in(rescaled_inputs, op.id_hex, False)),
                s.channel_handles_on(OUTPUT, gates_in(rescaled_outputs, op.id_hex, False)),
            )
            # the copy holds no replaced handle (the source's own, not copied) from here on
            s.input_channels, s.output_channels = list(inputs), list(outputs)
        if plan.changes(op.id_hex):
            new_parallelism = plan.new[op.id_hex]
            report.operators.append(OperatorChange(op.id_hex, op.uid, op.name, (op.parallelism, new_parallelism)))
            op.parallelism = new_parallelism
            if not op.fully_finished:
                op.subtasks = _reassign_operator(source, op, new_parallelism, files)

    specs = [
        RouteSpec(
            exchange,
            plan.new_sender_parallelism(exchange),
            plan.new[exchange.downstream_id],
            source.metadata.operator(exchange.downstream_id).max_parallelism,
            f"exchange {metadata.exchange_label(exchange.upstream_id, exchange.downstream_id)} (gate {exchange.gate})",
        )
        for exchange in rescaled
    ]
    carried = [h for s in _live_subtasks(metadata) for side in kept.get(s, ([], [])) for h in side]
    report.carried_buffers = sum(h.buffer_count for h in carried)
    report.carried_bytes = sum(h.payload_bytes for h in carried)
    # a dry run never starts Spark: it scans the old channels in-process and writes nothing
    engine = LocalEngine() if dry_run else session.engine
    report.engine = engine.name
    dropped = [plan.exchanges[i] for i in plan.dropped]
    if claim is None:
        report.exchanges = [_scanned_figures(scan, metadata) for scan in scan_exchanges(source, rescaled, engine)]
        report.dropped = _dropped_report(dropped, source, engine)
        return None
    tasks = route_tasks(source, rescaled, specs)
    # what the source's channel handles say is in the table now: their parsed form is dropped (read
    # again only if asked for, as `--drop`'s report does), not held while the records are routed
    # and proven (at p=4,096 dense, 470 MB of merged handles)
    form = channel_handle_form(source.metadata)
    source.forget_metadata()
    release_memory()
    names = tasks.names
    # journaled before any is created: each task's file, and on Spark each attempt's
    claim.will_create(names, [name + ATTEMPT for name in names])
    routed: list[RoutedFile] = [
        written
        for batch in engine.map_batches(lambda batch: route_batch(batch, specs, dst), tasks, session.progress, tasks.sizes)
        for written in batch
    ]
    del tasks  # their table of old channels is done with
    # files of failed, lost or speculative attempts on Spark (the map returns once none runs any more)
    discard_other_attempts(dst, names, routed)
    report.warnings = list(engine.warnings)
    new_inputs = _placed_columns(rescaled, routed)  # the routed placements keep their figures only
    for op in metadata.operators:
        _give_subtasks_their_inputs(op, new_inputs)
        for s in op.subtasks:
            if s.finished:
                continue
            inputs, outputs = kept.get((op.id_hex, s.index), ([], []))
            arrived = new_inputs.get((op.id_hex, s.index))
            s.input_channels = list[AnyChannelHandle](inputs) + ([arrived] if arrived is not None else [])
            s.output_channels = outputs
    # what gathering the routed placements and building the new columns from them left free on the
    # heap, given back before the proof (about 500 MB at p=4,096 dense, which it would not reuse)
    release_memory()
    return Staged(metadata, rescaled, names, routed, files, dropped, form)


def _placed_columns(rescaled, routed: list[RoutedFile]) -> dict[tuple[str, int], ChannelColumns]:
    """The new handles of each (downstream operator, subtask): one ``ChannelColumns`` each, its
    rows in (gate, channel) order, over the files in the order routed. A job at parallelism p gets
    p² of them (9.4 million from 4,096 to 3,072), as columns (about 40 bytes a handle) instead of
    objects (about 160). Where each buffer lies is then in the columns only: every routed file's
    placements keep their figures (``figures_only``), as the proof and the report use them.

    Built a column at a time from each routed file's row (its operator, gate and new channel), so
    that at 16.8 million handles (``repair`` at p=4,096 dense) the driver holds no more than a few
    columns besides the routed placements it consumes."""
    counts = np.array([len(r.placed) for r in routed], dtype=np.int64)
    if not counts.sum():  # nothing routed, or only files that place no channel: no new handle
        for r in routed:
            r.placed = r.placed.figures_only()
        return {}
    names, task_file = written_files(routed)
    files = HandleFiles([WrittenFileHandle(name, size) for name, size in names.items()])
    operators = {op_id: i for i, op_id in enumerate(dict.fromkeys(e.downstream_id for e in rescaled))}
    # per routed file: its operator, gate and new channel (the same for all the rows it places)
    operator_of = np.array([operators[rescaled[r.exchange_index].downstream_id] for r in routed], dtype=np.int32)
    gate_of = np.array([rescaled[r.exchange_index].gate for r in routed], dtype=np.int32)
    channel_of = np.array([r.new_channel for r in routed], dtype=np.int32)
    subtask = np.concatenate([r.placed.subtask for r in routed]).astype(np.int32, copy=False)
    routed_row = np.repeat(np.arange(len(routed), dtype=np.int32), counts)  # each row's routed file
    # stable: of equal keys (none, in a sound routing) the one routed first comes first, as sorted() kept them
    order = stable_order(operator_of[routed_row], subtask, gate_of[routed_row], channel_of[routed_row])
    routed_row = routed_row[order]
    subtask = subtask[order]
    size = np.concatenate([r.placed.size for r in routed])[order].astype(np.int64, copy=False)
    buffers = np.concatenate([np.diff(r.placed.bounds) for r in routed])  # each row's buffer count, as routed
    offsets = np.concatenate([r.placed.offsets for r in routed])  # each placement's bounds run from 0 to its offsets
    for r in routed:  # where its buffers lie is in the columns from here on
        r.placed = r.placed.figures_only()
    offsets = runs_in_order(offsets, buffers, order).astype(np.int64, copy=False)
    bounds = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(buffers[order], dtype=np.int64, out=bounds[1:])
    del order, buffers
    file, gate, channel = task_file[routed_row], gate_of[routed_row], channel_of[routed_row]
    operator = operator_of[routed_row]
    del routed_row
    ids = list(operators)
    cuts = np.flatnonzero((np.diff(operator) != 0) | (np.diff(subtask) != 0)) + 1
    result: dict[tuple[str, int], ChannelColumns] = {}
    for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(file)]):
        key = (ids[int(operator[lo])], int(subtask[lo]))
        view = slice(lo, hi)
        result[key] = ChannelColumns(
            INPUT, key[1], gate[view], channel[view], size[view], bounds[lo : hi + 1], offsets, file[view], files
        )
    return result


def stable_order(*columns: np.ndarray) -> np.ndarray:
    """``np.lexsort`` of the columns, the first the primary key (rows by the first, then the next,
    ..., as gathered where all are equal): one stable argsort of a key made of all of them, where
    they are not negative and it fits 62 bits (9.4 million new channels of a rescale from 4,096 to
    3,072: 1.5 s for lexsort's four passes, 0.6 s), else lexsort."""
    key = np.zeros(len(columns[0]), dtype=np.int64)
    width = 1
    for column in columns:
        if len(column) and int(column.min()) < 0:
            return np.lexsort(columns[::-1])
        span = int(column.max(initial=0)) + 1
        width *= span
        if width >= 1 << 62:
            return np.lexsort(columns[::-1])
        key *= span
        key += column
    return np.argsort(key, kind="stable")


def written_files(routed: list[RoutedFile]) -> tuple[dict[str, int], np.ndarray]:
    """The files the route tasks wrote (the tasks of an engine task write one together): each
    name with its size, in the order first routed, and the index of each task's file among them."""
    names: dict[str, int] = {}
    for r in routed:
        names.setdefault(r.file_name, r.file_size)
    index = {name: i for i, name in enumerate(names)}
    return names, np.array([index[r.file_name] for r in routed], dtype=np.int32)


def _give_subtasks_their_inputs(op: OperatorState, new_inputs: dict) -> None:
    """A new subtask that receives in-flight data gets a subtask state to hold its handles, even
    where the source metadata had none for it (a stateless operator has no subtask states)."""
    held = {s.index for s in op.subtasks}
    for (op_id, subtask), _ in sorted(new_inputs.items()):
        if op_id == op.id_hex and subtask not in held:
            op.subtasks.append(SubtaskState(subtask))
            held.add(subtask)
    op.subtasks.sort(key=lambda s: s.index)


class _Keys:
    """Channel handles named by one number each: (exchange, subtask, new channel) as
    ``(exchange * subtasks + subtask) * channels + channel``."""

    def __init__(self, subtasks: int, channels: int) -> None:
        self.subtasks, self.channels = subtasks, channels

    def held(self, exchange: np.ndarray, subtask: np.ndarray, lengths: np.ndarray, channel: np.ndarray) -> np.ndarray:
        """The keys of runs of handles as the metadata holds them: run i of ``lengths[i]`` handles
        of exchange ``exchange[i]`` and subtask ``subtask[i]``, each handle with its channel."""
        keys = np.repeat((exchange.astype(np.int64) * self.subtasks + subtask) * self.channels, lengths)
        keys += channel
        return keys

    def routed(self, exchange: np.ndarray, channel: np.ndarray, lengths: np.ndarray, subtask: np.ndarray) -> np.ndarray:
        """The keys of runs of handles as they were routed: run i of ``lengths[i]`` handles of
        exchange ``exchange[i]`` and new channel ``channel[i]``, each handle of its subtask."""
        keys = np.repeat(exchange.astype(np.int64) * (self.subtasks * self.channels) + channel, lengths)
        step = subtask.astype(np.int64)
        step *= self.channels
        keys += step
        return keys

    def named(self, key: int) -> tuple[int, int, int]:
        """(exchange, subtask, channel) of one key."""
        rest, channel = divmod(int(key), self.channels)
        exchange, subtask = divmod(rest, self.subtasks)
        return exchange, subtask, channel


def _handles_on(
    s: SubtaskState, gate: int, file_of: dict[str, int], in_routed: dict, offsets_only: bool = False
) -> list[tuple[np.ndarray, ...]]:
    """The handles of a subtask's input gate that reference a routed file (a ``WrittenFileHandle``
    of one of their names: a source's file of the same name is not one), as columns: the routed
    file, the channel and the buffer count (each handle's in turn); with ``offsets_only``, their
    buffers' offsets instead (each handle's in turn).
    Plain handles first, then each ``ChannelColumns``."""
    result: list[tuple[np.ndarray, ...]] = []
    plain = channels_of([h for h in s.input_channels if not isinstance(h, ChannelColumns)], gate)
    in_file = [file_of.get(h.delegate.relative_path, -1) if isinstance(h.delegate, WrittenFileHandle) else -1 for h in plain]
    ours = [h for h, f in zip(plain, in_file) if f >= 0]
    if ours:
        counts = np.fromiter((len(h.offsets) for h in ours), dtype=np.int32, count=len(ours))
        if offsets_only:
            result.append((np.fromiter(chain.from_iterable(h.offsets for h in ours), dtype=np.int64, count=int(counts.sum())),))
        else:
            channels = np.fromiter((h.info[1] for h in ours), dtype=np.int32, count=len(ours))
            result.append((np.array([f for f in in_file if f >= 0], dtype=np.int32), channels, counts))
    for h in s.input_channels:
        if not isinstance(h, ChannelColumns):
            continue
        known = in_routed.get(id(h.files))
        if known is None or known[0] is not h.files:
            paths = [f.relative_path if isinstance(f, WrittenFileHandle) else "" for f in h.files.handles]
            known = in_routed[id(h.files)] = (h.files, np.array([file_of.get(p, -1) for p in paths], dtype=np.int32))
        rows = h.rows_on(gate)
        file = known[1][h.file[rows]]
        rows = rows[file >= 0]
        counts = (h.bounds[rows + 1] - h.bounds[rows]).astype(np.int32)
        if offsets_only:
            result.append((h.offsets[ranges(h.bounds[rows], counts.astype(np.int64))],))
        else:
            result.append((file[file >= 0], h.channel[rows].astype(np.int32), counts))
    return result


def _held(metadata, index_of: dict, file_of: dict[str, int], offsets_only: bool = False):
    """``_handles_on`` of every rerouted gate of every subtask, in metadata order, with the
    exchange and subtask of each piece."""
    in_routed: dict[int, tuple[HandleFiles, np.ndarray]] = {}  # per columns' files: each one's routed file, or -1
    for op in metadata.operators:
        gates = [(gate, index) for (operator_id, gate), index in index_of.items() if operator_id == op.id_hex]
        for s in op.subtasks:
            for gate, exchange_index in gates:
                for piece in _handles_on(s, gate, file_of, in_routed, offsets_only):
                    yield exchange_index, s.index, piece


@dataclass
class _HeldColumns:
    """The handles into routed files, in metadata order: each one's routed file, channel and buffer
    count; run i of ``lengths[i]`` handles is of exchange ``exchange[i]`` and subtask ``subtask[i]``."""

    file: np.ndarray
    channel: np.ndarray
    buffers: np.ndarray
    exchange: np.ndarray
    subtask: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, metadata, index_of: dict, file_of: dict[str, int]) -> _HeldColumns:
        pieces, owners = [], []
        for exchange_index, subtask, piece in _held(metadata, index_of, file_of):
            pieces.append(piece)
            owners.append((exchange_index, subtask))
        file, channel, buffers = [np.concatenate(c) for c in zip(*pieces)] or [np.zeros(0, dtype=np.int32)] * 3
        return cls(
            file,
            channel,
            buffers,
            np.array([e for e, _ in owners], dtype=np.int64),
            np.array([s for _, s in owners], dtype=np.int64),
            np.array([len(p[0]) for p in pieces], dtype=np.int64),
        )

    def keys(self, keys: _Keys) -> np.ndarray:
        return keys.held(self.exchange, self.subtask, self.lengths, self.channel)


def verify_output(session: Session, metadata, rescaled, routed: list[RoutedFile], dst: str) -> np.ndarray:
    """Read every written channel back through the new metadata's handles; returns the records read
    back per rerouted exchange. Raises OutputVerificationError where the new metadata does not hold
    exactly one handle for each channel routed, into the file it was routed to, or where a handle
    reads back other records (count or digest) than were routed into it, or a file's bytes are not
    each referenced by exactly one handle. Handles are columns, each named by one number (``_Keys``)
    rather than by columns of exchange, subtask and channel: a rescale at parallelism in the
    thousands writes millions of handles (16.8 million for ``repair`` at p=4,096 dense). The
    buffers' offsets are gathered only once every handle is found where it was routed to, and each
    file's handles are compared where the file is read back (``check_back``)."""
    names, routed_file = written_files(routed)
    file_of = {name: i for i, name in enumerate(names)}
    sizes, names_list = list(names.values()), list(names)
    index_of = {(e.downstream_id, e.gate): i for i, e in enumerate(rescaled)}
    held = _HeldColumns.of(metadata, index_of, file_of)
    counts = np.array([len(r.placed) for r in routed], dtype=np.int64)
    wanted_subtask = np.concatenate([r.placed.subtask for r in routed] or [np.zeros(0, dtype=np.int32)])
    routed_channel = np.array([r.new_channel for r in routed], dtype=np.int64)
    keys = _Keys(
        int(max(held.subtask.max(initial=0), wanted_subtask.max(initial=0))) + 1,
        int(max(held.channel.max(initial=0), routed_channel.max(initial=0))) + 1,
    )

    def problem_at(key: int, template: str, **more) -> OutputVerificationError:
        """The mismatch of the handle named ``key``: ``template`` names its subtask {s}, gate {g} and channel {c}."""
        exchange_index, subtask, channel = keys.named(key)
        exchange = rescaled[exchange_index]
        return _mismatch(metadata, exchange, template.format(s=subtask, c=channel, g=exchange.gate, **more))

    if (held.channel < 0).any():
        row = int(np.argmax(held.channel < 0))
        piece = int(np.searchsorted(np.cumsum(held.lengths), row, side="right"))
        exchange = rescaled[int(held.exchange[piece])]
        raise _mismatch(
            metadata,
            exchange,
            f"subtask {int(held.subtask[piece])} references channel {int(held.channel[row])}, which was not routed",
        )
    held_keys = held.keys(keys)
    held_file, held_buffers = narrow(held.file, np.int8), narrow(held.buffers, np.int8)
    del held
    routed_exchange = np.array([r.exchange_index for r in routed], dtype=np.int64)
    wanted_keys = keys.routed(routed_exchange, routed_channel, counts, wanted_subtask)
    del wanted_subtask
    # the metadata lists each subtask's handles in channel order: its keys are then sorted already
    in_order = len(held_keys) < 2 or bool((held_keys[1:] > held_keys[:-1]).all())
    held_order = None if in_order else np.argsort(held_keys, kind="stable")
    held_sorted = held_keys if held_order is None else held_keys[held_order]
    twice = np.flatnonzero(held_sorted[1:] == held_sorted[:-1])
    if len(twice):
        raise problem_at(int(held_sorted[twice[0]]), "two handles for subtask {s} channel ({g}, {c})")
    wanted_order = np.argsort(wanted_keys, kind="stable")
    # the same keys in both orders: each routed channel held once (no set test, whose sorting of
    # both columns again took several times their memory at millions of handles); else which not
    if not _equal_in_order(held_sorted, wanted_keys, wanted_order):
        missing = np.flatnonzero(~np.isin(wanted_keys, held_keys))
        if len(missing):
            raise problem_at(int(wanted_keys[missing[0]]), "subtask {s} holds no handle for new channel {c}")
        unrouted = np.flatnonzero(~np.isin(held_keys, wanted_keys))
        if len(unrouted):
            raise problem_at(int(held_keys[unrouted[0]]), "subtask {s} references channel {c}, which was not routed")
        twice = np.flatnonzero(np.diff(np.sort(wanted_keys)) == 0)  # a channel routed twice
        raise problem_at(int(np.sort(wanted_keys)[twice[0]]), "new channel {c} of subtask {s} was routed twice")
    del held_sorted, wanted_keys
    # now every routed channel has exactly one handle: row wanted_order[i] is held at held_order[i]
    wanted_file = np.repeat(routed_file, counts)[wanted_order]
    elsewhere = np.flatnonzero((held_file if held_order is None else held_file[held_order]) != wanted_file)
    if len(elsewhere):
        row = int(elsewhere[0]) if held_order is None else int(held_order[elsewhere[0]])
        routed_to = names_list[int(wanted_file[elsewhere[0]])]
        held_in = names_list[int(held_file[row])]
        raise problem_at(
            int(held_keys[row]),
            "subtask {s} channel {c} references {held_in}, its records were routed to {routed_to}",
            held_in=held_in,
            routed_to=routed_to,
        )
    del wanted_file
    # each handle's routed row
    if held_order is None:
        paired = wanted_order.astype(np.int32)
    else:
        paired = np.empty(len(held_order), dtype=np.int32)
        paired[held_order] = wanted_order
    del held_order, wanted_order
    # read back each file through its handles (in key order), with the engine
    by_file = (stable_order(held_file) if in_order else stable_order(held_file, held_keys)).astype(np.int32)
    del held_keys
    buffers = held_buffers[by_file]
    # the buffers' offsets, in the same order as the handles above
    offset_pieces = [piece[0] for _, _, piece in _held(metadata, index_of, file_of, offsets_only=True)]
    all_offsets = np.concatenate(offset_pieces) if offset_pieces else np.zeros(0, dtype=np.int64)
    del offset_pieces
    flat = runs_in_order(all_offsets, held_buffers, by_file)
    del all_offsets, held_buffers
    file_starts = np.flatnonzero(np.diff(held_file[by_file], prepend=-1)) if len(by_file) else by_file
    file_stops = np.append(file_starts[1:], len(by_file))
    routed_starts = np.zeros(len(routed) + 1, dtype=np.int64)
    np.cumsum(counts, out=routed_starts[1:])
    tasks = []
    first = 0  # the file's first buffer in flat
    for start, stop in zip(file_starts.tolist(), file_stops.tolist()):
        at = int(held_file[by_file[start]])
        last = first + int(buffers[start:stop].sum(dtype=np.int64))
        mine, first = flat[first:last], last
        routed_here = routed_digest(*_routed_into(routed, routed_starts, paired[by_file[start:stop]]))
        location = join(dst, names_list[at])
        tasks.append(ReadBackTask(names_list[at], location, sizes[at], mine, buffers[start:stop], routed_here))
    del flat, buffers, held_file, by_file  # made again only to name a handle that does not read back
    checked = session.engine.map(check_back, tasks, sizes=[t.size for t in tasks])
    problems = [(start, task, c) for start, task, c in zip(file_starts.tolist(), tasks, checked) if c.problem or c.differs]
    del tasks
    if problems:
        held = _HeldColumns.of(metadata, index_of, file_of)
        held_keys = held.keys(keys)
        by_file = stable_order(held.file, held_keys)
        for start, _, c in problems:  # a file's bytes not referenced once: the first such file
            if c.problem:
                raise problem_at(int(held_keys[by_file[start]]), "{name}: {problem}", name=c.name, problem=c.problem)
        # a file that reads back other than was routed into it: read again here, handle by handle,
        # and named at the first handle in key order that differs
        wrong = []
        for start, task, _ in problems:
            rows = by_file[start : start + len(task.counts)]
            records, digests = _routed_into(routed, routed_starts, paired[rows])
            back = read_back(task)
            found = np.frombuffer(short_digests(back.digests), dtype=np.uint8).reshape(len(rows), ROUTED_DIGEST)
            differ = (back.records != records) | (back.trailing != 0)
            differ |= (found != np.frombuffer(digests, dtype=np.uint8).reshape(len(rows), ROUTED_DIGEST)).any(axis=1)
            for at in np.flatnonzero(differ)[:1].tolist():  # rows of a file are in key order
                wrong.append((int(held_keys[rows[at]]), int(back.records[at]), int(back.trailing[at]), int(records[at])))
        key, back_records, left, expected = min(wrong)
        raise problem_at(
            key,
            "subtask {s} channel {c} reads back {back} records ({left} bytes left over), {expected} were routed{differ}",
            back=back_records,
            left=left,
            expected=expected,
            differ="" if back_records != expected else ", bytes differ",
        )
    # every handle read back what was routed into it: the records read back per exchange are those routed
    out = np.zeros(len(rescaled), dtype=np.int64)
    for r in routed:
        out[r.exchange_index] += int(r.placed.records.sum(dtype=np.int64))
    return out


def _equal_in_order(sorted_keys: np.ndarray, keys: np.ndarray, order: np.ndarray) -> bool:
    """Whether ``keys[order]`` equals ``sorted_keys``, a piece at a time (not a copy of millions)."""
    if len(sorted_keys) != len(keys):
        return False
    step = 1 << 20
    return all(np.array_equal(sorted_keys[at : at + step], keys[order[at : at + step]]) for at in range(0, len(keys), step))


def _routed_into(routed: list[RoutedFile], starts: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, bytes]:
    """What was routed into routed rows ``rows`` (rows of all the routed files' placements one
    after another, routed file i's from ``starts[i]``): their records and digests, gathered from
    the few routed files they lie in (the handles of one written file)."""
    if not len(rows):
        return np.zeros(0, dtype=np.int64), b""
    entry = np.searchsorted(starts, rows, side="right") - 1
    entries = np.unique(entry)
    local_starts = np.zeros(len(entries) + 1, dtype=np.int64)
    np.cumsum(starts[entries + 1] - starts[entries], out=local_starts[1:])
    local = rows - starts[entry] + local_starts[np.searchsorted(entries, entry)]
    records = np.concatenate([routed[e].placed.records for e in entries.tolist()])[local]
    digests = np.concatenate([routed[e].placed.digest_matrix() for e in entries.tolist()])[local]
    return records, digests.tobytes()


def _mismatch(metadata, exchange, problem: str) -> OutputVerificationError:
    label = metadata.exchange_label(exchange.upstream_id, exchange.downstream_id)
    return OutputVerificationError(
        f"exchange {label} (gate {exchange.gate}): the written output does not hold what was routed: {problem}; "
        "no _metadata was written"
    )


def _routed_figures(rescaled, routed: list[RoutedFile], records_out: np.ndarray, metadata) -> list[ExchangeFigures]:
    """Per rerouted exchange: read from the old channels, and read back from the new ones."""
    result = [_figures(exchange, metadata) for exchange in rescaled]
    for figures, records in zip(result, records_out.tolist()):
        figures.records_out = records
    for r in routed:
        figures, counters = result[r.exchange_index], r.counters
        figures.records_in += counters.records_in
        figures.bytes_in += counters.bytes_in
        figures.replicas_found += counters.replicas_found
        figures.replicas_removed += counters.replicas_removed
        figures.non_records_dropped += counters.non_records_dropped
        figures.bytes_out += r.placed.payload_bytes
        figures.channels_written += len(r.placed)
    return result


def _figures(exchange, metadata) -> ExchangeFigures:
    return ExchangeFigures(
        exchange.upstream_id,
        exchange.downstream_id,
        metadata.exchange_label(exchange.upstream_id, exchange.downstream_id),
        exchange.gate,
        exchange.partitioner or "HASH",
    )


def _scanned_figures(scan: ExchangeScan, metadata) -> ExchangeFigures:
    """A dry run's figures: what the old channels hold (nothing is routed)."""
    figures = _figures(scan.exchange, metadata)
    figures.records_in = scan.total("records")
    figures.bytes_in = scan.total("bytes")
    figures.replicas_found = figures.replicas_removed = scan.duplicate_records
    figures.records_out = figures.records_in - scan.duplicate_records  # an estimate: nothing was routed
    return figures


def _live_subtasks(metadata) -> list[tuple[str, int]]:
    """(operator id, subtask) of every running subtask the metadata holds."""
    return [(op.id_hex, s.index) for op in metadata.operators for s in op.subtasks if not s.finished]


def _dropped_report(exchanges, source: Checkpoint, engine: Engine) -> list[DroppedFigures]:
    """Exactly what dropping these exchanges' in-flight data removes."""
    if not exchanges:
        return []
    metadata = source.metadata
    return [
        DroppedFigures(
            scan.exchange.upstream_id,
            scan.exchange.downstream_id,
            metadata.exchange_label(scan.exchange.upstream_id, scan.exchange.downstream_id),
            scan.exchange.gate,
            scan.total("input_buffers") + scan.total("output_buffers"),
            scan.total("bytes"),
            scan.total("records"),
            scan.total("watermarks"),
            scan.total("other_elements"),
        )
        for scan in scan_exchanges(source, exchanges, engine)
    ]
