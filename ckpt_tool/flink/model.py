"""The contents of a Flink checkpoint's ``_metadata``, one dataclass per kind of handle.

Every field Flink writes is kept, so that writing a parsed file back gives the same bytes.
Names follow Flink's classes (``org.apache.flink.runtime.state``) where that helps to look them up.
"""

from __future__ import annotations

import copy
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Optional, Union

import numpy as np

# --- copying ------------------------------------------------------------------------------------

# values ``copy.deepcopy`` gives back as they are (a tuple only where its items are of these)
_ATOMIC = frozenset((int, float, bool, str, bytes, type(None)))
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _copied(value, memo: dict):
    """``copy.deepcopy(value, memo)``, without its generic path for the values handles hold most:
    atomic values and tuples of them as they are, a list of them by a shallow copy."""
    kind = type(value)
    if kind in _ATOMIC or (kind is tuple and all(type(item) in _ATOMIC for item in value)):
        return value
    if kind is list and id(value) not in memo and all(type(item) in _ATOMIC for item in value):
        new = memo[id(value)] = value.copy()
        copy._keep_alive(value, memo)  # type: ignore[attr-defined]  # as deepcopy keeps what its memo names
        return new
    return copy.deepcopy(value, memo)


class FieldCopy:
    """``copy.deepcopy`` field by field, the same copy as the generic one at a third of its cost:
    a rewrite copies the source's metadata, a subtask state and its handles per subtask (20,480
    subtask states at p=4,096)."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict):
        kind = type(self)
        names = _FIELD_NAMES.get(kind)
        if names is None:
            names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(kind))  # type: ignore[arg-type]
        new = object.__new__(kind)
        memo[id(self)] = new
        for name in names:
            object.__setattr__(new, name, _copied(getattr(self, name), memo))
        return new


# --- stream state handles (where bytes live) -------------------------------------------------


@dataclass
class ByteStreamHandle(FieldCopy):
    """``ByteStreamStateHandle``: state small enough to be stored inline in ``_metadata``."""

    name: str
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass
class FileHandle(FieldCopy):
    """``FileStateHandle``: a whole file, by absolute path as Flink wrote it."""

    path: str
    size: int


@dataclass
class RelativeFileHandle(FieldCopy):
    """``RelativeFileStateHandle``: a file relative to the checkpoint's own directory."""

    relative_path: str
    size: int


@dataclass
class WrittenFileHandle(RelativeFileHandle):
    """A ``RelativeFileHandle`` to a file that this run writes into its output (serialized as
    one). Read back, it is a ``RelativeFileHandle``: a source's relative file is never taken for
    one of the run's own, even where a run before named it the same."""


@dataclass
class SegmentFileHandle:
    """``SegmentFileStateHandle`` (file merging): a byte range of a shared physical file."""

    start: int
    size: int
    scope: int
    path: str
    logical_file_id: str


@dataclass
class EmptySegmentFileHandle:
    """``EmptySegmentFileStateHandle``: file merging's placeholder for empty state."""

    size: int = 0


# --- keyed state ------------------------------------------------------------------------------


@dataclass
class KeyGroupsHandle(FieldCopy):
    """``KeyGroupsStateHandle`` (hashmap backend): one offset per key group into ``delegate``.

    ``tag`` is the type byte Flink wrote: 3 (old, no id), 12 (with ``handle_id``) or 7 (savepoint).
    """

    tag: int
    start_key_group: int
    offsets: list[int]
    delegate: Optional[StreamHandle]
    handle_id: Optional[str] = None

    @property
    def key_groups(self) -> range:
        return range(self.start_key_group, self.start_key_group + len(self.offsets))

    @property
    def size(self) -> int:
        """Its delegate's size, as Flink's ``KeyGroupsStateHandle.getStateSize``."""
        return self.delegate.size if self.delegate else 0


@dataclass
class HandleAndLocalPath:
    local_path: str
    handle: Optional[StreamHandle]


def key_group_range(max_parallelism: int, parallelism: int, operator_index: int) -> range:
    """``computeKeyGroupRangeForOperatorIndex`` as a Python range."""
    start = (operator_index * max_parallelism + parallelism - 1) // parallelism
    end = ((operator_index + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


class KeyGroupSpan:
    """A keyed handle's ``num_key_groups`` key groups from ``start_key_group`` (its dataclass's fields)."""

    start_key_group: int
    num_key_groups: int

    @property
    def key_groups(self) -> range:
        return range(self.start_key_group, self.start_key_group + self.num_key_groups)


@dataclass
class IncrementalKeyedHandle(KeyGroupSpan):
    """``IncrementalRemoteKeyedStateHandle`` (RocksDB incremental): shared and private files.

    ``tag`` 5 is the old layout (no checkpointed size, no id), 11 the current one.
    """

    tag: int
    checkpoint_id: int
    backend_id: str
    start_key_group: int
    num_key_groups: int
    checkpointed_size: int
    meta: Optional[StreamHandle]
    shared: list[HandleAndLocalPath]
    private: list[HandleAndLocalPath]
    handle_id: Optional[str]


@dataclass
class ChangelogBackendHandle(KeyGroupSpan):
    """``ChangelogStateBackendHandle``: materialized handles plus changelog deltas (tag 8 or 14)."""

    tag: int
    start_key_group: int
    num_key_groups: int
    checkpointed_size: int
    materialized: list[KeyedHandle]
    non_materialized: list[KeyedHandle]
    materialization_id: int
    checkpoint_id: int
    handle_id: str


@dataclass
class StateChange:
    key_group: int
    change: bytes


@dataclass
class InMemoryChangelogHandle(KeyGroupSpan):
    """``InMemoryChangelogStateHandle`` (tag 9)."""

    start_key_group: int
    num_key_groups: int
    sequence_from: int
    sequence_to: int
    changes: list[StateChange]
    handle_id: str


@dataclass
class ChangelogStreamHandle(KeyGroupSpan):
    """``ChangelogStateHandleStreamImpl`` (tag 10, or 13 with a storage identifier)."""

    tag: int
    start_key_group: int
    num_key_groups: int
    handles_and_offsets: list[tuple[Optional[StreamHandle], int]]
    state_size: int
    checkpointed_size: int
    handle_id: str
    storage_identifier: Optional[str]


# --- operator state ---------------------------------------------------------------------------

DISTRIBUTION_MODES = ("SPLIT_DISTRIBUTE", "UNION", "BROADCAST")


@dataclass
class OperatorStateInfo(FieldCopy):
    """One named operator state inside an operator-state handle."""

    name: str
    mode: int  # ordinal of OperatorStateHandle.Mode, see DISTRIBUTION_MODES
    offsets: list[int]

    @property
    def mode_name(self) -> str:
        return DISTRIBUTION_MODES[self.mode] if 0 <= self.mode < len(DISTRIBUTION_MODES) else str(self.mode)


@dataclass
class OperatorStateHandle(FieldCopy):
    """``OperatorStreamStateHandle`` (tag 4) or its file-merging variant (tag 17)."""

    tag: int
    states: list[OperatorStateInfo]
    delegate: Optional[StreamHandle]
    task_owned_dir: Optional[str] = None
    shared_dir: Optional[str] = None
    is_empty: bool = False


# --- channel state (in-flight data) -------------------------------------------------------------

UPPER_BOUND_MAX_PARALLELISM = 1 << 15  # KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM
INPUT = "input"
OUTPUT = "output"


@dataclass(slots=True)
class ChannelStateHandle(FieldCopy):
    """``InputChannelStateHandle`` or ``ResultSubpartitionStateHandle``.

    ``info`` is (gate, channel) for input and (partition, subpartition) for output; ``offsets``
    point at each buffer's 4-byte length in ``delegate`` (a tuple as read from ``_metadata``, a list
    where ckpt builds them); ``state_size`` counts length prefixes too.
    A job at parallelism p has up to p² of them: the class has slots, no per-object dict, and
    the reader shares equal ``info`` tuples and sizes between handles.
    """

    direction: str
    subtask_index: int
    info: tuple[int, int]
    offsets: Sequence[int]
    state_size: int
    delegate: Optional[StreamHandle]

    @property
    def buffer_count(self) -> int:
        return len(self.offsets)

    @property
    def payload_bytes(self) -> int:
        """Buffer payload bytes, without the 4-byte length before each buffer, read from metadata only.

        A file-backed handle's ``state_size`` is the sum of (4 + payload) over its buffers. An inline
        handle (``ChannelStatePendingResult`` for small state) holds all its buffers merged into one,
        its ``state_size`` is the whole inline blob including the file header, and the lengths are
        right there in the metadata.
        """
        if isinstance(self.delegate, ByteStreamHandle):
            data = self.delegate.data
            return sum(int.from_bytes(data[o : o + 4], "big") for o in self.offsets)
        return self.state_size - 4 * len(self.offsets)


_MERGED_COUNT = struct.Struct(">i")
_MERGED_CHANNEL = struct.Struct(">iiqi")  # a channel in merged offsets: info, state size, number of offsets
_MERGED_OFFSETS = {count: struct.Struct(f">{count}q") for count in range(1, 9)}
# decoded (gate, channel) tuples, one object each, while fewer than this many differ: the p² channels of
# a job at parallelism p repeat p distinct ones, and callers keep decoded channels of many subtasks
_INFOS: dict[tuple[int, int], tuple[int, int]] = {}
SHARED_INFOS = 1 << 16


@dataclass(slots=True)
class MergedChannelStateHandle(FieldCopy):
    """Metadata v6's merged handle: all channels of one subtask that share one delegate.

    ``serialized_offsets`` is Flink's ``serializedChannelOffsets``, kept verbatim (the reader
    checked that it decodes). ``channels`` decodes it, into new objects at every call: a job at
    parallelism p holds p² channels in a few merged handles per subtask, and decoded only while
    used, one subtask at a time, they take no memory. To change one, build a new merged handle
    (``merge_channel_handles``). ``channel_count``, ``buffer_count`` and ``channel_bytes`` (the
    sum of the channels' state sizes) are known without decoding, as are ``gates``: the gates (input)
    or partitions (output) of its channels, each once.
    """

    direction: str
    subtask_index: int
    state_size: int
    delegate: Optional[StreamHandle]
    serialized_offsets: bytes
    channel_count: int = -1  # -1: counted from serialized_offsets
    buffer_count: int = 0
    channel_bytes: int = 0
    gates: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.channel_count < 0:
            totals = merged_offsets_totals(self.serialized_offsets)
            self.channel_count, self.buffer_count, self.channel_bytes, self.gates = totals

    @property
    def channels(self) -> list[ChannelStateHandle]:
        return decode_merged_offsets(self.serialized_offsets, self.direction, self.subtask_index, self.delegate)

    def alike_channels(self) -> Optional[np.ndarray]:
        """Its channels as one array (``uniform_merged_channels``) where they list alike and lie
        in a file; None to take them channel by channel (inline data is read for its lengths)."""
        if isinstance(self.delegate, ByteStreamHandle):
            return None
        return uniform_merged_channels(self.serialized_offsets)

    @property
    def payload_bytes(self) -> int:
        """Buffer payload bytes of all its channels (``ChannelStateHandle.payload_bytes``)."""
        if isinstance(self.delegate, ByteStreamHandle):
            return sum(ch.payload_bytes for ch in self.channels)
        return self.channel_bytes - 4 * self.buffer_count


class HandleFiles:
    """The files a set of ``ChannelColumns`` reference, by index: one list shared by the columns of
    every subtask (replaced whole, in place, where the handles are mapped)."""

    __slots__ = ("handles",)

    def __init__(self, handles: list[StreamHandle]) -> None:
        self.handles = handles


@dataclass(slots=True, eq=False)
class ChannelColumns:
    """Plain channel-state handles (``ChannelStateHandle``) of one subtask and direction, as columns:
    ckpt's rescale at parallelism p places p² of them, which as objects took about 160 bytes each
    (1.5 GB at p=4,096). Written to ``_metadata`` as that many plain handles, in row order.

    Row i is the handle of ``(gate[i], channel[i])`` with state size ``size[i]``, its buffers at
    ``offsets[bounds[i]:bounds[i + 1]]`` in file ``files.handles[file[i]]`` (``offsets`` is shared;
    ``bounds`` has one entry more than there are rows). ``channels`` makes the handles, anew at
    every call, for what reads them one by one.
    """

    direction: str
    subtask_index: int
    gate: np.ndarray  # int32
    channel: np.ndarray  # int32
    size: np.ndarray  # int64
    bounds: np.ndarray  # int64
    offsets: np.ndarray  # int64
    file: np.ndarray  # int32
    files: HandleFiles

    @property
    def channel_count(self) -> int:
        return len(self.gate)

    @property
    def buffer_count(self) -> int:
        return int(self.bounds[-1] - self.bounds[0])

    @property
    def state_size(self) -> int:
        return int(self.size.sum())

    @property
    def payload_bytes(self) -> int:
        """As the handles' ``payload_bytes``: their files are files, not inline data."""
        return self.state_size - 4 * self.buffer_count

    @property
    def gates(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.gate.tolist()))

    def rows_on(self, gate: int) -> np.ndarray:
        """The rows of one gate (or partition)."""
        return np.flatnonzero(self.gate == gate)

    def handles_at(self, rows: Sequence[int]) -> list[ChannelStateHandle]:
        """The handles of ``rows``, as objects."""
        delegates, offsets, bounds = self.files.handles, self.offsets, self.bounds
        gate, channel, size, file = self.gate, self.channel, self.size, self.file
        return [
            ChannelStateHandle(
                self.direction,
                self.subtask_index,
                (int(gate[row]), int(channel[row])),
                tuple(offsets[bounds[row] : bounds[row + 1]].tolist()),
                int(size[row]),
                delegates[int(file[row])],
            )
            for row in rows
        ]

    @property
    def channels(self) -> list[ChannelStateHandle]:
        return self.handles_at(range(len(self.gate)))


def opened_up(handles: Sequence[AnyChannelHandle], kind) -> list[AnyChannelHandle]:
    """``handles`` with each one of ``kind`` (a class, or a tuple of them: merged handles, columns)
    as its channels' plain handles, the others as they are."""
    result: list[AnyChannelHandle] = []
    for h in handles:
        if isinstance(h, kind):
            result += h.channels
        else:
            result.append(h)
    return result


def columns_opened(handles: Sequence[AnyChannelHandle]) -> list[Union[ChannelStateHandle, MergedChannelStateHandle]]:
    """``handles`` with each ``ChannelColumns`` as its handles (the reader makes none: only ckpt's
    rescale places them, in metadata it writes)."""
    return opened_up(handles, ChannelColumns)  # type: ignore[return-value]


def channels_of(handles: Sequence[AnyChannelHandle], gate: int) -> list[ChannelStateHandle]:
    """The per-channel handles of one gate (input) or partition (output) among ``handles``: merged
    handles that hold none of its channels are not decoded, columns make only its rows' handles."""
    result: list[ChannelStateHandle] = []
    for handle in handles:
        if isinstance(handle, ChannelStateHandle):
            if handle.info[0] == gate:
                result.append(handle)
        elif isinstance(handle, ChannelColumns):
            result.extend(handle.handles_at(handle.rows_on(gate).tolist()))
        elif handle.gates == (gate,):
            result.extend(handle.channels)
        elif gate in handle.gates:
            result.extend(ch for ch in handle.channels if ch.info[0] == gate)
    return result


@dataclass
class GateFigures:
    """One gate's (input) or partition's (output) channels among some handles, summed: buffers,
    payload bytes (``payload_bytes``), and the highest channel (or subpartition) index, -1 where
    it has none."""

    buffers: int = 0
    bytes: int = 0
    highest: int = -1

    def add(self, handles: Sequence[AnyChannelHandle], gate: int) -> GateFigures:
        """These figures with ``channels_of(handles, gate)`` added, from the handles where they
        can be: a merged handle (or columns) whose channels are all on ``gate`` is summed as it
        is, its highest channel read as one array where its channels are alike, and none is
        decoded into per-channel objects but one whose channels lie on several gates (a
        ``ckpt schema`` of a job at parallelism p would otherwise make p² of them)."""
        for handle in handles:
            if isinstance(handle, ChannelStateHandle):
                if handle.info[0] == gate:
                    self.buffers += handle.buffer_count
                    self.bytes += handle.payload_bytes
                    self.highest = max(self.highest, handle.info[1])
            elif handle.gates != (gate,):
                if gate in handle.gates:
                    self.add(channels_of([handle], gate), gate)
            elif isinstance(handle, ChannelColumns):
                self.buffers += handle.buffer_count
                self.bytes += handle.payload_bytes
                self.highest = max(self.highest, int(handle.channel.max()))
            else:
                alike = handle.alike_channels()
                if alike is None:
                    self.add(handle.channels, gate)
                    continue
                self.buffers += handle.buffer_count
                self.bytes += handle.payload_bytes
                self.highest = max(self.highest, int(alike["channel"].max()))
        return self


def handle_gates(handles: Sequence[AnyChannelHandle]) -> set[int]:
    """The gates (input) or partitions (output) of the channels of ``handles``, none decoded."""
    return {g for h in handles for g in ((h.info[0],) if isinstance(h, ChannelStateHandle) else h.gates)}


def gates_holding(handles: Sequence[AnyChannelHandle]) -> list[int]:
    """The gates (input) or partitions (output) on which ``handles`` hold a buffer, each once, in
    the order their channels first hold one. A merged handle of one gate is not decoded (a job at
    parallelism p has p² channels), nor one of several whose channels are alike (read as one
    array); columns are read as arrays."""
    found: dict[int, None] = {}
    for handle in handles:
        if isinstance(handle, ChannelStateHandle):
            if handle.offsets:
                found[handle.info[0]] = None
        elif len(handle.gates) == 1:
            if handle.buffer_count:
                found[handle.gates[0]] = None
        elif isinstance(handle, ChannelColumns):
            found.update(dict.fromkeys(handle.gate[np.diff(handle.bounds) > 0].tolist()))
        elif (alike := uniform_merged_channels(handle.serialized_offsets)) is not None:
            found.update(dict.fromkeys(alike["gate"][alike["buffers"] > 0].tolist()))
        else:
            found.update(dict.fromkeys(ch.info[0] for ch in handle.channels if ch.offsets))
    return list(found)


def merged_offsets_totals(data: bytes) -> tuple[int, int, int, tuple[int, ...]]:
    """Channels, buffers, the sum of state sizes and the gates (or partitions) in well-formed merged offsets."""
    (count,) = _MERGED_COUNT.unpack_from(data, 0)
    pos, buffers, size_sum = 4, 0, 0
    gates: dict[int, None] = {}
    head = _MERGED_CHANNEL.unpack_from
    for _ in range(count):
        gate, _, size, offsets = head(data, pos)
        pos += 20 + 8 * offsets
        buffers += offsets
        size_sum += size
        gates[gate] = None
    return count, buffers, size_sum, tuple(gates)


def uniform_merged_channels(data: bytes) -> Optional[np.ndarray]:
    """Merged offsets whose channels all list the same number of buffers (up to 8; a channel of a
    job at high parallelism mostly holds one), as one structured NumPy array of ``gate``,
    ``channel``, ``size``, ``buffers`` and ``offsets`` (channels × buffers, absent for none),
    read in place; None for any other layout (then decode channel by channel). Nothing is checked
    here but the layout."""
    if len(data) < 24:
        return None
    (count,) = _MERGED_COUNT.unpack_from(data, 0)
    (buffers,) = _MERGED_COUNT.unpack_from(data, 20)
    if count <= 0 or not 0 <= buffers <= 8 or len(data) != 4 + count * (20 + 8 * buffers):
        return None
    fields = [("gate", ">i4"), ("channel", ">i4"), ("size", ">i8"), ("buffers", ">i4")]
    channels = np.frombuffer(data, np.dtype(fields + ([("offsets", ">i8", (buffers,))] if buffers else [])), count, 4)
    return channels if (channels["buffers"] == buffers).all() else None


def decode_merged_offsets(
    data: bytes, direction: str, subtask_index: int, delegate: Optional[StreamHandle]
) -> list[ChannelStateHandle]:
    """Well-formed merged offsets (``AbstractMergedChannelStateHandle#serializedChannelOffsets``)
    as one handle per channel, each in ``delegate``."""
    (count,) = _MERGED_COUNT.unpack_from(data, 0)
    pos = 4
    head = _MERGED_CHANNEL.unpack_from
    channels: list[ChannelStateHandle] = []
    append = channels.append
    infos = _INFOS
    for _ in range(count):
        gate, channel, size, number = head(data, pos)
        pos += 20
        if 0 < number <= 8:
            offsets: tuple[int, ...] = _MERGED_OFFSETS[number].unpack_from(data, pos)
        else:
            offsets = struct.unpack_from(f">{number}q", data, pos)
        pos += 8 * number
        info = infos.get((gate, channel))
        if info is None:
            info = (gate, channel)
            if len(infos) < SHARED_INFOS:
                infos[info] = info
        append(ChannelStateHandle(direction, subtask_index, info, offsets, size, delegate))
    return channels


# --- operators and the checkpoint ---------------------------------------------------------------


@dataclass
class SubtaskState(FieldCopy):
    """One subtask's state; ``finished`` subtasks (FLIP-147) carry nothing else."""

    index: int
    finished: bool = False
    managed_operator: Optional[OperatorStateHandle] = None
    raw_operator: Optional[OperatorStateHandle] = None
    managed_keyed: Optional[KeyedHandle] = None
    raw_keyed: Optional[KeyedHandle] = None
    input_channels: list[AnyChannelHandle] = field(default_factory=list)
    output_channels: list[AnyChannelHandle] = field(default_factory=list)

    def channel_handles_on(self, direction: str, gates: Callable[[int], bool]) -> list[AnyChannelHandle]:
        """The handles of one direction on the gates (input) or partitions (output) that ``gates``
        accepts: a merged handle (or columns) as it is where it accepts all its channels' gates,
        opened up where only some."""
        handles = self.input_channels if direction == INPUT else self.output_channels
        result: list[AnyChannelHandle] = []
        for handle in handles:
            if isinstance(handle, ChannelStateHandle):
                if gates(handle.info[0]):
                    result.append(handle)
                continue
            accepted = [gates(gate) for gate in handle.gates]
            if all(accepted):
                result.append(handle)
            elif any(accepted):
                result.extend(ch for ch in handle.channels if gates(ch.info[0]))
        return result

    def channels_on(self, direction: str, gate: int) -> list[ChannelStateHandle]:
        """The per-channel handles of one gate (input) or partition (output) (``channels_of``)."""
        return channels_of(self.input_channels if direction == INPUT else self.output_channels, gate)

    def channel_handles(self, direction: str) -> list[ChannelStateHandle]:
        """The per-channel handles of one direction, merged handles (and columns) opened up."""
        handles = self.input_channels if direction == INPUT else self.output_channels
        return opened_up(handles, (MergedChannelStateHandle, ChannelColumns))  # type: ignore[return-value]


@dataclass
class OperatorState(FieldCopy):
    operator_id: bytes  # 16 bytes: Flink's OperatorID (lower long, upper long)
    parallelism: int
    max_parallelism: int
    name: Optional[str] = None
    uid: Optional[str] = None
    coordinator_state: Optional[ByteStreamHandle] = None
    fully_finished: bool = False
    subtasks: list[SubtaskState] = field(default_factory=list)

    @property
    def id_hex(self) -> str:
        return self.operator_id.hex()

    @property
    def label(self) -> str:
        """How messages name the operator: its uid, else its name, else its id."""
        return self.uid or self.name or self.id_hex

    @property
    def finished(self) -> str:
        """``"all"``, ``"partial"`` or ``"none"``, as FLIP-147 finished markers say."""
        if self.fully_finished:
            return "all"
        done = sum(1 for s in self.subtasks if s.finished)
        if done and done == len(self.subtasks) == self.parallelism:
            return "all"
        return "partial" if done else "none"


@dataclass
class MasterState:
    version: int
    name: str
    payload: bytes


@dataclass
class CheckpointMetadata:
    version: int
    checkpoint_id: int
    master_states: list[MasterState]
    operators: list[OperatorState]
    properties: Optional[bytes] = None  # v4+: java-serialized CheckpointProperties, verbatim

    def operator(self, ref: str) -> OperatorState:
        """Find an operator by 32-hex-digit id, uid or name; by uid also where the metadata
        stores no uids (v3, v4), through the id Flink derives from a uid."""
        for op in self.operators:
            if ref in (op.id_hex, op.uid, op.name):
                return op
        from ckpt_tool.flink.operator_id import operator_id_of_uid

        hashed = operator_id_of_uid(ref)
        for op in self.operators:
            if op.id_hex == hashed:
                return op
        raise KeyError(ref)

    def label(self, operator_id: Optional[str]) -> str:
        """How messages name an operator given by id: its label, or ``?`` when unknown."""
        for op in self.operators:
            if op.id_hex == operator_id:
                return op.label
        return "?"

    def exchange_label(self, upstream_id: Optional[str], downstream_id: str) -> str:
        return f"{self.label(upstream_id)} -> {self.label(downstream_id)}"


StreamHandle = Union[ByteStreamHandle, FileHandle, RelativeFileHandle, SegmentFileHandle, EmptySegmentFileHandle, KeyGroupsHandle]
KeyedHandle = Union[
    KeyGroupsHandle, IncrementalKeyedHandle, ChangelogBackendHandle, InMemoryChangelogHandle, ChangelogStreamHandle
]
AnyChannelHandle = Union[ChannelStateHandle, MergedChannelStateHandle, ChannelColumns]
