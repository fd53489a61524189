"""``ckpt inspect``: what a checkpoint holds, as a typed report (``as_dict`` is the stable ``--json``).

Without a schema or plan only ``_metadata`` is read. Channel-state ``bytes`` are buffer payloads
without their 4-byte length fields. With a schema and/or plan, the records of every described
exchange are scanned on the session's engine.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.javaser import read_java_object
from ckpt_tool.flink.metadata import SAVEPOINT_KEY_GROUPS, iter_stream_handles
from ckpt_tool.flink.model import (
    INPUT,
    OUTPUT,
    ByteStreamHandle,
    ChangelogBackendHandle,
    ChangelogStreamHandle,
    ChannelColumns,
    ChannelStateHandle,
    IncrementalKeyedHandle,
    InMemoryChangelogHandle,
    KeyGroupsHandle,
    MergedChannelStateHandle,
    OperatorState,
    SubtaskState,
    columns_opened,
)
from ckpt_tool.framing import framing as _framing
from ckpt_tool.session import Session

if TYPE_CHECKING:
    from ckpt_tool.exchanges import ExchangeScan

# Metadata v3-v6 store no upstream output-buffer state of their own: Flink 2.3 builds it at
# restore time from the upstream's output state (recover-output-on-downstream), so on disk it is
# always empty. The key stays in the output so that readers can rely on all three directions.
UPSTREAM_OUTPUT = "upstream_output"
SMALL_FILE_BYTES = 128 * 1024
# The Flink classes of the keyed handles, as inspect names them.
FLINK_CLASSES = {
    KeyGroupsHandle: "KeyGroupsStateHandle",
    IncrementalKeyedHandle: "IncrementalRemoteKeyedStateHandle",
    ChangelogStreamHandle: "ChangelogStateHandleStreamImpl",
    InMemoryChangelogHandle: "InMemoryChangelogStateHandle",
}


@dataclass
class BufferTotals:
    buffers: int = 0
    bytes: int = 0


class Encoded(str):
    """An item of a ``Streamed`` list already encoded: the text ``json.dumps`` gives the value it
    stands for (made without the dicts, for the p² channel rows of a job at parallelism p)."""


class Streamed:
    """A list in ``InspectReport.as_dict(streamed=True)`` whose items are made one at a time as
    they are written (``write_json``): a job at parallelism p lists up to p² channels. Its items
    are dicts, or ``Encoded`` text."""

    __slots__ = ("items",)

    def __init__(self, items: Callable[[], Iterator[dict | Encoded]] | Callable[[], Iterator[dict]]):
        self.items = items

    def __iter__(self) -> Iterator[dict | Encoded]:
        return self.items()


def write_json(value: Any, write: Callable[[str], object]) -> None:
    """``write(json.dumps(value))`` in pieces, with every ``Streamed`` list made item by item (the
    same text: Python's encoder with its default separators)."""
    if isinstance(value, Streamed):
        write("[")
        pieces: list[str] = []
        held = 0
        for number, item in enumerate(value):
            text = item if isinstance(item, Encoded) else json.dumps(item)
            pieces.append(", " + text if number else text)
            held += len(text)
            if held >= 1 << 20:  # written a MiB at a time (millions of small channel rows, or large subtasks)
                write("".join(pieces))
                pieces.clear()
                held = 0
        write("".join(pieces) + "]")
    elif isinstance(value, dict) and value:
        for number, (key, item) in enumerate(value.items()):
            write(("{" if number == 0 else ", ") + json.dumps(key) + ": ")
            write_json(item, write)
        write("}")
    elif isinstance(value, list) and value and any(isinstance(item, dict) and _streams(item) for item in value):
        for number, item in enumerate(value):
            write("[" if number == 0 else ", ")
            write_json(item, write)
        write("]")
    else:
        write(json.dumps(value, default=list))  # a Streamed list deeper down is made whole


def _streams(value: dict) -> bool:
    return any(isinstance(item, Streamed) for item in value.values())


@dataclass(slots=True)
class ChannelSummary:
    """One channel handle: input (gate, channel) or output (partition, subpartition)."""

    direction: str
    info: tuple[int, int]
    buffers: int
    bytes: int
    file: Optional[str]  # None for inline data

    def as_dict(self) -> dict:
        first, second = ("gate", "channel") if self.direction == INPUT else ("partition", "subpartition")
        return {
            "direction": self.direction,
            first: self.info[0],
            second: self.info[1],
            "buffers": self.buffers,
            "bytes": self.bytes,
            "file": self.file,
        }


@dataclass(slots=True)
class ChannelTotals:
    """The channel handles of one subtask and direction, summed."""

    channels: int = 0
    buffers: int = 0
    bytes: int = 0
    files: set[Optional[str]] = field(default_factory=set)  # where they are (None: inline)


@dataclass
class StateSizes:
    keyed: int
    operator: int
    channel: int


@dataclass
class KeyedPart:
    """One handle inside a changelog state backend handle, named by its Flink class."""

    kind: str
    key_groups: tuple[int, int]  # inclusive
    bytes: int  # Flink's getStateSize
    files: list[dict]  # {"file": where it is now (None: inline), "offset": where its part starts, "bytes": recorded size}
    checkpointed_bytes: Optional[int] = None  # changelog handles only


@dataclass
class ChangelogSummary:
    """A subtask's ``ChangelogStateBackendHandle``: materialized state plus the changelog since."""

    key_groups: tuple[int, int]  # inclusive
    materialization_id: int
    checkpoint_id: int
    checkpointed_size: int
    materialized: list[KeyedPart]
    non_materialized: list[KeyedPart]

    def as_dict(self) -> dict:
        result = asdict(self)
        for part in result["materialized"]:
            del part["checkpointed_bytes"]
        return result


@dataclass
class SubtaskSummary:
    index: int
    finished: bool
    state_size: StateSizes
    changelog: Optional[ChangelogSummary] = None
    summarize_channels: Callable[[], list[ChannelSummary]] = field(default=list, repr=False, compare=False)
    encode_channels: Optional[Callable[[], str]] = field(default=None, repr=False, compare=False)
    total_channels: Callable[[], dict[str, ChannelTotals]] = field(default=dict, repr=False, compare=False)
    array_channels: Callable[[], dict[str, tuple[np.ndarray, ...]]] = field(default=dict, repr=False, compare=False)

    @property
    def channels(self) -> list[ChannelSummary]:
        """Its channel handles, summarized when asked: a job at parallelism p has p² of them, which
        ``inspect --json`` writes subtask by subtask."""
        return self.summarize_channels()

    def channel_totals(self) -> dict[str, ChannelTotals]:
        """Its channels summed by direction (only directions with channels), from its handles
        without opening merged ones: what ``inspect`` shows per subtask past a thousand channels."""
        return self.total_channels()

    def channel_arrays(self) -> dict[str, tuple[np.ndarray, ...]]:
        """Its channels by direction as arrays: the first and second of ``info`` and the payload
        bytes, in the order ``channels`` lists them (a merged handle read in one piece where its
        channels are alike): what the HTML heatmaps sum at p² channels."""
        return self.array_channels()

    def channels_json(self) -> str:
        """``json.dumps`` of its channels' dicts, encoded straight from its handles where it can be."""
        return self.encode_channels() if self.encode_channels else json.dumps([c.as_dict() for c in self.channels])


@dataclass
class OperatorSummary:
    id: str
    uid: Optional[str]
    name: Optional[str]
    parallelism: int
    max_parallelism: int
    finished: str
    channel_state: dict[str, BufferTotals]  # input, output, upstream_output
    state_size: StateSizes
    subtasks: list[SubtaskSummary]

    @property
    def label(self) -> str:
        return self.name or self.uid or self.id[:8]

    def as_dict(self, streamed: bool = False, channel_rows: bool = True) -> dict:
        """Its JSON layout; ``streamed``: the subtasks as a ``Streamed`` list; without
        ``channel_rows``, each subtask's ``channels`` is null (``inspect --json --summary``)."""
        if not channel_rows:
            subtasks: Any = list(self._subtask_dicts(channel_rows=False))
        else:
            subtasks = Streamed(self._subtask_texts) if streamed else list(self._subtask_dicts())
        return {
            "id": self.id,
            "uid": self.uid,
            "name": self.name,
            "parallelism": self.parallelism,
            "max_parallelism": self.max_parallelism,
            "finished": self.finished,
            "channel_state": {k: asdict(v) for k, v in self.channel_state.items()},
            "state_size": asdict(self.state_size),
            "subtasks": subtasks,
        }

    def _subtask_texts(self) -> Iterator[Encoded]:
        """``json.dumps`` of each of ``_subtask_dicts``, without making the channel dicts."""
        for s in self.subtasks:
            changelog = json.dumps(s.changelog.as_dict()) if s.changelog else "null"
            state_size = json.dumps(asdict(s.state_size))
            yield Encoded(
                f'{{"index": {s.index}, "finished": {json.dumps(s.finished)}, "state_size": {state_size}, '
                f'"channels": {s.channels_json()}, "changelog": {changelog}}}'
            )

    def _subtask_dicts(self, channel_rows: bool = True) -> Iterator[dict]:
        for s in self.subtasks:
            yield {
                "index": s.index,
                "finished": s.finished,
                "state_size": asdict(s.state_size),
                "channels": [c.as_dict() for c in s.channels] if channel_rows else None,
                "changelog": s.changelog.as_dict() if s.changelog else None,
            }


@dataclass
class FilesSummary:
    """Files the metadata references (sizes as recorded), inline state, and shared channel files."""

    count: int
    bytes: int
    min_bytes: int
    median_bytes: int
    max_bytes: int
    small_files: int
    small_file_limit_bytes: int
    inline_bytes: int
    channel_state_files: int
    shared_channel_state_files: list[tuple[str, int]]  # (file, subtasks holding data in it)

    def as_dict(self) -> dict:
        result = asdict(self)
        result["shared_channel_state_files"] = [{"file": f, "subtasks": n} for f, n in self.shared_channel_state_files]
        return result


@dataclass
class MasterStateSummary:
    name: str
    version: int
    bytes: int


@dataclass
class InspectReport:
    checkpoint_id: int
    metadata_version: int
    properties: Optional[dict]
    master_states: list[MasterStateSummary]
    operators: list[OperatorSummary]
    files: FilesSummary
    engine: Optional[str] = None  # set when records were scanned
    exchanges: Optional[list[ExchangeScan]] = field(default=None)
    problems: list[str] = field(default_factory=list)  # missing or truncated files, unreadable exchanges

    def as_dict(self, streamed: bool = False, channel_rows: bool = True) -> dict:
        """The documented JSON layout; ``streamed``: each operator's subtasks a ``Streamed`` list
        (for ``write_json``); without ``channel_rows``, every ``channels`` list (a subtask's, an
        exchange's) is null and the rest is the same (``--summary``: a job at parallelism p has up
        to p² rows in each)."""
        result: dict[str, Any] = {
            "checkpoint_id": self.checkpoint_id,
            "metadata_version": self.metadata_version,
            "properties": self.properties,
            "master_states": [asdict(m) for m in self.master_states],
            "operators": [o.as_dict(streamed, channel_rows) for o in self.operators],
            "files": self.files.as_dict(),
            "problems": self.problems,
        }
        if self.exchanges is not None:
            result["engine"] = self.engine
            result["exchanges"] = [_exchange_dict(e, streamed, channel_rows) for e in self.exchanges]
        return result


def _exchange_dict(scan: ExchangeScan, streamed: bool, channel_rows: bool) -> dict:
    """The exchange's dict: its channels listed (a ``Streamed`` list where ``streamed``), or null."""
    if not channel_rows:
        return {**scan.as_dict(channels=False), "channels": None}
    return _streamed_channels(scan) if streamed else scan.as_dict()


def _streamed_channels(scan: ExchangeScan) -> dict:
    """The exchange's dict, its channels a ``Streamed`` list of their encoded rows."""
    return {**scan.as_dict(channels=False), "channels": Streamed(lambda: map(Encoded, scan.channels_json()))}


def _channel_totals(op: OperatorState, direction: str) -> BufferTotals:
    totals = BufferTotals()
    for s in op.subtasks:
        for h in s.input_channels if direction == INPUT else s.output_channels:  # merged handles sum their channels
            totals.buffers += h.buffer_count
            totals.bytes += h.payload_bytes
    return totals


def _channel_summaries(checkpoint: Checkpoint, subtask: SubtaskState) -> Callable[[], list[ChannelSummary]]:
    def summarize() -> list[ChannelSummary]:
        return [
            ChannelSummary(direction, h.info, h.buffer_count, h.payload_bytes, checkpoint.location(h.delegate))
            for direction in (INPUT, OUTPUT)
            for h in subtask.channel_handles(direction)
        ]

    return summarize


def _subtask_channel_totals(checkpoint: Checkpoint, subtask: SubtaskState) -> Callable[[], dict[str, ChannelTotals]]:
    def total() -> dict[str, ChannelTotals]:
        result = {}
        for direction in (INPUT, OUTPUT):
            totals = ChannelTotals()
            for h in subtask.input_channels if direction == INPUT else subtask.output_channels:
                count = 1 if isinstance(h, ChannelStateHandle) else h.channel_count
                if not count:
                    continue
                totals.channels += count
                totals.buffers += h.buffer_count
                totals.bytes += h.payload_bytes
                if isinstance(h, ChannelColumns):
                    totals.files.update(checkpoint.location(h.files.handles[i]) for i in np.unique(h.file).tolist())
                else:
                    totals.files.add(checkpoint.location(h.delegate))
            if totals.channels:
                result[direction] = totals
        return result

    return total


def _channel_arrays(checkpoint: Checkpoint, subtask: SubtaskState) -> Callable[[], dict[str, tuple[np.ndarray, ...]]]:
    def arrays() -> dict[str, tuple[np.ndarray, ...]]:
        result = {}
        for direction in (INPUT, OUTPUT):
            pieces: list[tuple[np.ndarray, ...]] = []
            one_by_one: list[ChannelStateHandle] = []
            for handle in columns_opened(subtask.input_channels if direction == INPUT else subtask.output_channels):
                alike = handle.alike_channels() if isinstance(handle, MergedChannelStateHandle) else None
                if alike is None:
                    one_by_one += handle.channels if isinstance(handle, MergedChannelStateHandle) else [handle]
                    continue
                if one_by_one:
                    pieces.append(_channel_columns(one_by_one))
                    one_by_one = []
                pieces.append((alike["gate"].astype(np.int64), alike["channel"].astype(np.int64), _alike_payloads(alike)))
            pieces.append(_channel_columns(one_by_one))
            result[direction] = tuple(np.concatenate(column) for column in zip(*pieces))
        return result

    return arrays


def _alike_payloads(alike: np.ndarray) -> np.ndarray:
    """Each channel's ``payload_bytes`` of ``MergedChannelStateHandle.alike_channels``: its state
    size without the buffers' 4-byte lengths."""
    return alike["size"].astype(np.int64) - 4 * alike["buffers"].astype(np.int64)


def _channel_columns(handles: list[ChannelStateHandle]) -> tuple[np.ndarray, ...]:
    firsts = np.array([h.info[0] for h in handles], dtype=np.int64).reshape(-1)
    seconds = np.array([h.info[1] for h in handles], dtype=np.int64).reshape(-1)
    return firsts, seconds, np.array([h.payload_bytes for h in handles], dtype=np.int64).reshape(-1)


# a channel row of ``inspect --json`` (``ChannelSummary.as_dict``), by direction: info, buffers, bytes, file
_CHANNEL_ROWS = {
    direction: f'{{"direction": {json.dumps(direction)}, "{first}": %d, "{second}": %d, "buffers": %d, "bytes": %d, "file": %s}}'
    for direction, first, second in ((INPUT, "gate", "channel"), (OUTPUT, "partition", "subpartition"))
}
# the same rows as the literal text around their four numbers (``int_rows``), the file in the last
_CHANNEL_PARTS = {
    direction: (tuple(part.encode() for part in row.split("%d")[:-1]), row.split("%d")[-1])
    for direction, row in _CHANNEL_ROWS.items()
}


def _channels_json(checkpoint: Checkpoint, subtask: SubtaskState) -> Callable[[], str]:
    def encode() -> str:
        files: dict[int, tuple[object, str]] = {}  # by delegate: the channels of one file share it
        rows = []
        for direction in (INPUT, OUTPUT):
            row = _CHANNEL_ROWS[direction]
            for handle in columns_opened(subtask.input_channels if direction == INPUT else subtask.output_channels):
                delegate = handle.delegate
                known = files.get(id(delegate))
                if known is None or known[0] is not delegate:
                    known = files[id(delegate)] = (delegate, json.dumps(checkpoint.location(delegate)))
                file = known[1]
                if not isinstance(handle, MergedChannelStateHandle):
                    rows.append(row % (handle.info[0], handle.info[1], len(handle.offsets), handle.payload_bytes, file))
                    continue
                alike = handle.alike_channels()
                if alike is None:  # channel by channel
                    rows += [row % (h.info[0], h.info[1], len(h.offsets), h.payload_bytes, file) for h in handle.channels]
                    continue
                if not len(alike):
                    continue
                values = np.empty((len(alike), 4), dtype=np.int64)  # their rows in one piece (p of them at parallelism p)
                values[:, 0], values[:, 1], values[:, 2] = alike["gate"], alike["channel"], alike["buffers"]
                values[:, 3] = _alike_payloads(alike)
                head, last = _CHANNEL_PARTS[direction]
                rows.append(_framing.int_rows((*head, last.replace("%s", file, 1).encode()), values, b", ").decode())
        return "[" + ", ".join(rows) + "]"

    return encode


def _keyed_size(handle) -> int:
    if handle is None:
        return 0
    if isinstance(handle, KeyGroupsHandle):
        return handle.delegate.size if handle.delegate else 0
    if isinstance(handle, IncrementalKeyedHandle):
        parts = [handle.meta] + [p.handle for p in handle.shared + handle.private]
        return sum(p.size for p in parts if p is not None)
    if isinstance(handle, ChangelogBackendHandle):
        return sum(_keyed_size(h) for h in handle.materialized + handle.non_materialized)
    return getattr(handle, "state_size", 0)


def _key_groups(handle) -> tuple[int, int]:
    """A handle's key groups, first and last."""
    return handle.key_groups.start, handle.key_groups.stop - 1


def _keyed_part(checkpoint: Checkpoint, handle) -> KeyedPart:
    """A materialized or changelog handle with where its bytes are."""
    if isinstance(handle, ChangelogStreamHandle):
        files = [
            {"file": checkpoint.location(f), "offset": offset, "bytes": f.size if f else 0}
            for f, offset in handle.handles_and_offsets
        ]
        return KeyedPart(FLINK_CLASSES[type(handle)], _key_groups(handle), handle.state_size, files, handle.checkpointed_size)
    if isinstance(handle, InMemoryChangelogHandle):
        size = sum(len(c.change) for c in handle.changes)
        return KeyedPart(FLINK_CLASSES[type(handle)], _key_groups(handle), size, [], size)
    if isinstance(handle, KeyGroupsHandle):
        streams = [handle.delegate]
    else:
        streams = [handle.meta] + [p.handle for p in handle.shared + handle.private]
    located = [{"file": checkpoint.location(f), "offset": 0, "bytes": f.size} for f in streams if f]
    savepoint = getattr(handle, "tag", None) == SAVEPOINT_KEY_GROUPS
    kind = "SavepointKeyGroupsStateHandle" if savepoint else FLINK_CLASSES[type(handle)]
    return KeyedPart(kind, _key_groups(handle), _keyed_size(handle), located)


def changelog_summary(checkpoint: Checkpoint, subtask: SubtaskState) -> Optional[ChangelogSummary]:
    """The subtask's changelog state backend handle (managed keyed state), or None."""
    handle = subtask.managed_keyed
    if not isinstance(handle, ChangelogBackendHandle):
        return None
    return ChangelogSummary(
        _key_groups(handle),
        handle.materialization_id,
        handle.checkpoint_id,
        handle.checkpointed_size,
        [_keyed_part(checkpoint, h) for h in handle.materialized],
        [_keyed_part(checkpoint, h) for h in handle.non_materialized],
    )


def _state_sizes(subtasks: list[SubtaskState]) -> StateSizes:
    """Bytes of keyed, operator and channel state of the running subtasks among ``subtasks``."""
    live = [s for s in subtasks if not s.finished]
    return StateSizes(
        sum(_keyed_size(s.managed_keyed) + _keyed_size(s.raw_keyed) for s in live),
        sum(h.delegate.size for s in live for h in (s.managed_operator, s.raw_operator) if h and h.delegate),
        sum(h.state_size for s in live for h in s.input_channels + s.output_channels),
    )


def operator_summary(checkpoint: Checkpoint, op: OperatorState) -> OperatorSummary:
    subtasks = [
        SubtaskSummary(
            s.index,
            s.finished,
            _state_sizes([s]),
            changelog_summary(checkpoint, s),
            _channel_summaries(checkpoint, s),
            _channels_json(checkpoint, s),
            _subtask_channel_totals(checkpoint, s),
            _channel_arrays(checkpoint, s),
        )
        for s in op.subtasks
    ]
    return OperatorSummary(
        op.id_hex,
        op.uid,
        op.name,
        op.parallelism,
        op.max_parallelism,
        op.finished,
        {INPUT: _channel_totals(op, INPUT), OUTPUT: _channel_totals(op, OUTPUT), UPSTREAM_OUTPUT: BufferTotals()},
        _state_sizes(op.subtasks),
        subtasks,
    )


def files_summary(checkpoint: Checkpoint) -> FilesSummary:
    sizes: dict[str, int] = {}
    inline = 0
    for handle in iter_stream_handles(checkpoint.metadata):
        location = checkpoint.location(handle)
        if location is None:
            inline += handle.size if isinstance(handle, ByteStreamHandle) else 0
        else:
            sizes[location] = max(sizes.get(location, 0), handle.size)
    owners: dict[str, set] = defaultdict(set)
    for op in checkpoint.metadata.operators:
        for s in op.subtasks:
            for h in columns_opened(s.input_channels + s.output_channels):
                location = checkpoint.location(h.delegate)
                if location:
                    owners[location].add((op.id_hex, s.index))
    values = sorted(sizes.values())
    return FilesSummary(
        count=len(values),
        bytes=sum(values),
        min_bytes=values[0] if values else 0,
        median_bytes=int(statistics.median(values)) if values else 0,
        max_bytes=values[-1] if values else 0,
        small_files=sum(v < SMALL_FILE_BYTES for v in values),
        small_file_limit_bytes=SMALL_FILE_BYTES,
        inline_bytes=inline,
        channel_state_files=len(owners),
        shared_channel_state_files=[(f, len(o)) for f, o in sorted(owners.items()) if len(o) > 1],
    )


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def properties_summary(raw: bytes | None) -> dict | None:
    """CheckpointProperties (metadata v4+) with snake_case keys; None for older versions."""
    if raw is None:
        return None
    decoded = read_java_object(raw)
    snapshot_type = decoded.get("checkpointType") or {}
    summary: dict[str, Any] = {_snake(k): v for k, v in decoded.items() if isinstance(v, bool)}
    summary["checkpoint_type"] = snapshot_type.get("name")
    summary["sharing_files_strategy"] = snapshot_type.get("sharingFilesStrategy")
    summary["savepoint_format"] = snapshot_type.get("formatType")  # CANONICAL or NATIVE; None for a checkpoint
    return summary


def inspect(session: Session) -> InspectReport:
    """The checkpoint's contents; with exchanges described, their records scanned too. What
    cannot be read (a missing or truncated file, a corrupt channel) is listed in ``problems``
    and everything else is still shown."""
    checkpoint = session.checkpoint
    md = checkpoint.metadata
    report = InspectReport(
        md.checkpoint_id,
        md.version,
        properties_summary(md.properties),
        [MasterStateSummary(m.name, m.version, len(m.payload)) for m in md.master_states],
        [operator_summary(checkpoint, op) for op in md.operators],
        files_summary(checkpoint),
    )
    report.problems = list(checkpoint.file_problems())
    if session.exchanges is not None:
        from ckpt_tool.exchanges import scan_each_exchange  # the record path, only when records are read

        report.engine = session.engine_name
        report.exchanges = scan_each_exchange(checkpoint, session.exchanges, session.engine, session.progress)
        report.problems += [
            f"exchange {md.exchange_label(s.exchange.upstream_id, s.exchange.downstream_id)}: {s.problem}"
            for s in report.exchanges
            if s.problem
        ]
    return report
