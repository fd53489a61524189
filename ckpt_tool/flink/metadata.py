"""Read and write Flink's ``_metadata`` file, versions 3 to 6 (Flink 1.13 to 2.3).

The layout follows Flink's ``Checkpoints``, ``MetadataV2V3SerializerBase``, ``MetadataV3Serializer``
... ``MetadataV6Serializer`` and ``ChannelStateHandleSerializerV1/V2``:

* header: magic ``0x4960672d``, version;
* checkpoint id, master states, operator states;
* v5+: each operator starts with its name and uid; v6: channel handles carry a type byte and may
  be merged; v4+: java-serialized ``CheckpointProperties`` follow the operators (kept verbatim).
"""

from __future__ import annotations

import gc
import struct
from collections.abc import Sequence
from typing import NoReturn, Optional

import numpy as np

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.javaio import JavaReader, JavaWriter
from ckpt_tool.flink.javaser import read_checkpoint_properties
from ckpt_tool.flink.model import (
    INPUT,
    OUTPUT,
    UPPER_BOUND_MAX_PARALLELISM,
    AnyChannelHandle,
    ByteStreamHandle,
    ChangelogBackendHandle,
    ChangelogStreamHandle,
    ChannelColumns,
    ChannelStateHandle,
    CheckpointMetadata,
    EmptySegmentFileHandle,
    FileHandle,
    HandleAndLocalPath,
    HandleFiles,
    IncrementalKeyedHandle,
    InMemoryChangelogHandle,
    KeyGroupsHandle,
    MasterState,
    MergedChannelStateHandle,
    OperatorState,
    OperatorStateHandle,
    OperatorStateInfo,
    RelativeFileHandle,
    SegmentFileHandle,
    StateChange,
    SubtaskState,
    opened_up,
    uniform_merged_channels,
)

HEADER_MAGIC = 0x4960672D
MASTER_STATE_MAGIC = -915728746  # 0xc96b1696 as a signed int
SUPPORTED_VERSIONS = (3, 4, 5, 6)
# Handles inside handles (key-groups around a stream, changelog around materialized state): Flink
# writes 2 levels at most; ckpt refuses more than this rather than recursing without bound.
MAX_HANDLE_DEPTH = 16
SHARED_SIZES = 1 << 16  # distinct channel sizes the reader shares between handles (see _MetadataReader)

# type bytes of MetadataV2V3SerializerBase
NULL_HANDLE = 0
BYTE_STREAM = 1
FILE_STREAM = 2
KEY_GROUPS = 3
SEGMENT_SCOPES = ("EXCLUSIVE", "SHARED")  # CheckpointedStateScope, by ordinal
OPERATOR_STATE = 4
INCREMENTAL = 5
RELATIVE_STREAM = 6
SAVEPOINT_KEY_GROUPS = 7
CHANGELOG = 8
CHANGELOG_BYTE_INCREMENT = 9
CHANGELOG_FILE_INCREMENT = 10
INCREMENTAL_V2 = 11
KEY_GROUPS_V2 = 12
CHANGELOG_FILE_INCREMENT_V2 = 13
CHANGELOG_V2 = 14
SEGMENT_FILE = 15
EMPTY_SEGMENT_FILE = 16
SEGMENT_OPERATOR_STATE = 17

# type bytes of ChannelStateHandleSerializerV2 (metadata v6)
# A plain channel handle's fixed head (subtask, gate or partition, channel or subpartition, number of
# buffer offsets), read in one go: metadata of a job at parallelism p holds up to p^2 of them.
_CHANNEL_HEAD = struct.Struct(">iiii")
_LONG = struct.Struct(">q")
_INT = struct.Struct(">i")
_MERGED_CHANNEL_HEAD = struct.Struct(">iiqi")  # a channel in a merged handle: info, state size, offset count
_OFFSETS = {count: struct.Struct(f">{count}q") for count in range(1, 9)}
# a plain channel handle of up to 8 buffers, but its delegate, in one pack: its tag (version 6+),
# subtask, info, offset count, offsets and state size
_PLAIN_CHANNEL = {
    (tagged, count): struct.Struct((">B" if tagged else ">") + f"iiii{count}qq") for tagged in (False, True) for count in range(9)
}
_FILE_TAGS = (bytes([FILE_STREAM]), bytes([RELATIVE_STREAM]))
CHANNEL_TAGS = {(INPUT, False): 1, (OUTPUT, False): 2, (INPUT, True): 3, (OUTPUT, True): 4}


# ------------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------------


def read_metadata(data: bytes, source: str = "_metadata") -> CheckpointMetadata:
    """Parse a whole ``_metadata`` file. Raises CheckpointFormatError on anything Flink would reject."""
    reader = JavaReader(data, source)
    if len(data) < 8:
        raise CheckpointFormatError(f"{source} is not a Flink checkpoint: only {len(data)} bytes")
    magic = reader.i32("magic number")
    if magic != HEADER_MAGIC:
        raise CheckpointFormatError(
            f"{source} is not a Flink checkpoint: magic number 0x{magic & 0xFFFFFFFF:08x}, expected 0x{HEADER_MAGIC:08x}"
        )
    version = reader.i32("metadata version")
    if version not in SUPPORTED_VERSIONS:
        newer = " (newer than this ckpt knows: written by a Flink release after 2.3?)" if version > SUPPORTED_VERSIONS[-1] else ""
        raise CheckpointFormatError(
            f"{source} has metadata version {version}{newer}; supported versions are "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))} (Flink 1.13 to 2.3)"
        )
    collecting = gc.isenabled()
    gc.disable()  # the parse makes no reference cycles: the collector would only rescan millions of handles
    try:
        return _MetadataReader(reader, version).read()
    finally:
        if collecting:
            gc.enable()


class _MetadataReader:
    def __init__(self, reader: JavaReader, version: int):
        self.r = reader
        self.version = version
        self.holder = ""  # the operator (and subtask) whose handles are being read, for errors
        self.depth = 0  # handles being read inside other handles
        self._files: dict[bytes, object] = {}  # file handles read, by their serialized bytes
        # equal channel infos and subtask indexes, one object each: p² channel handles repeat p
        # distinct (gate, channel) tuples and p subtask indexes; sizes too, as long as few differ
        self._shared: dict = {}
        self._sizes: dict[int, int] = {}

    def unknown(self, what: str, tag: int, at: int) -> NoReturn:
        """Fail on a handle type ckpt does not know, naming its tag and who holds it."""
        self.r.fail(f"unknown {what} type tag {tag} in {self.holder}", at=at)

    def nested(self, read):
        """``read()``, a handle inside another, refused beyond ``MAX_HANDLE_DEPTH`` levels."""
        if self.depth >= MAX_HANDLE_DEPTH:
            self.r.fail(f"handles nested more than {MAX_HANDLE_DEPTH} deep in {self.holder}")
        self.depth += 1
        try:
            return read()
        finally:
            self.depth -= 1

    def read(self) -> CheckpointMetadata:
        r = self.r
        start = r.pos
        checkpoint_id = r.i64("checkpoint id")
        if checkpoint_id < 0:
            r.fail(f"invalid checkpoint id {checkpoint_id}", at=start)
        masters = [self.master_state() for _ in range(r.count("number of master states"))]
        operators = [self.operator_state() for _ in range(r.count("number of operator states"))]
        properties = None
        if self.version >= 4:
            if not r.remaining:
                r.fail("missing checkpoint properties")
            start = r.pos
            read_checkpoint_properties(r)  # Flink deserializes them; a damaged stream fails here too
            properties = r.data[start : r.pos]
        if r.remaining:
            # Flink's writer never leaves any, its loader would leave them unread: a sign of damage
            after = "the checkpoint properties" if self.version >= 4 else "the operator states"
            r.fail(f"{r.remaining} trailing bytes after {after}")
        return CheckpointMetadata(self.version, checkpoint_id, masters, operators, properties)

    def master_state(self) -> MasterState:
        r = self.r
        start = r.pos
        if r.i32("master state magic") != MASTER_STATE_MAGIC:
            r.fail("wrong magic number of a master state", at=start)
        length = r.i32("master state length")
        if length <= 0:
            r.fail(f"master state length {length}", at=start + 4)
        inner = JavaReader(r.raw(length, "master state"), r.source)
        inner.pos = 0
        version = inner.i32("master state version")
        name = inner.utf("master state name")
        payload = inner.raw(inner.count("master state payload length"), "master state payload")
        if inner.remaining:
            r.fail("trailing bytes in a master state", at=start)
        return MasterState(version, name, payload)

    def operator_state(self) -> OperatorState:
        r = self.r
        name = uid = None
        if self.version >= 5:
            name = r.utf("operator name") or None
            uid = r.utf("operator uid") or None
        operator_id = r.raw(16, "operator id")
        names = ", ".join(f'{what} "{value}"' for what, value in (("uid", uid), ("name", name)) if value)
        self.holder = f"operator {operator_id.hex()}" + (f" ({names})" if names else "")
        operator = self.holder
        at = r.pos
        parallelism = r.i32("parallelism")
        max_parallelism = r.i32("max parallelism")
        if not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
            r.fail(f"max parallelism {max_parallelism} is outside 1 to {UPPER_BOUND_MAX_PARALLELISM} (Flink's bound)", at=at)
        if not 1 <= parallelism <= max_parallelism:
            r.fail(f"parallelism {parallelism} is outside 1 to the max parallelism {max_parallelism}", at=at)
        at = r.pos
        coordinator = self.stream_handle()
        if coordinator is not None and not isinstance(coordinator, ByteStreamHandle):
            r.fail("coordinator state is not an inline byte-stream handle", at=at)
        op = OperatorState(operator_id, parallelism, max_parallelism, name, uid, coordinator)
        num_subtasks = r.i32("number of subtask states")
        if num_subtasks < 0:
            if coordinator is not None:
                r.fail("a fully finished operator has coordinator state", at=at)
            op.fully_finished = True
            return op
        held: set[int] = set()
        for _ in range(num_subtasks):
            at = r.pos
            stored = r.i32("subtask index")
            index = -stored - 1 if stored < 0 else stored
            if index >= parallelism or index in held:
                what = "repeats" if index in held else f"is not below the parallelism {parallelism}"
                r.fail(f"subtask index {index} {what}", at=at)
            held.add(index)
            self.holder = f"{operator} subtask {index}"
            if stored < 0:
                op.subtasks.append(SubtaskState(index=index, finished=True))
            else:
                op.subtasks.append(self.subtask_state(stored))
        return op

    def subtask_state(self, index: int) -> SubtaskState:
        r = self.r
        state = SubtaskState(index)
        if r.i32("managed operator state flag") != 0:
            state.managed_operator = self.operator_state_handle()
        if r.i32("raw operator state flag") != 0:
            state.raw_operator = self.operator_state_handle()
        state.managed_keyed = self.keyed_handle()
        state.raw_keyed = self.keyed_handle()
        state.input_channels = [self.channel_handle(INPUT) for _ in range(r.count("input channel handles"))]
        state.output_channels = [self.channel_handle(OUTPUT) for _ in range(r.count("result subpartition handles"))]
        return state

    # --- handles --------------------------------------------------------------------------------

    def stream_handle(self):
        r = self.r
        at = r.pos
        if r.data[at : at + 1] in _FILE_TAGS:
            known = self._file_handle(r)
            if known is not None:
                return known
        tag = r.u8("stream handle type")
        if tag == NULL_HANDLE:
            return None
        if tag == FILE_STREAM:
            size = r.i64("file size")
            return FileHandle(self.file_path("file path"), size)
        if tag == BYTE_STREAM:
            name = r.utf("handle name")
            return ByteStreamHandle(name, r.raw(r.count("inline state length"), "inline state"))
        if tag == RELATIVE_STREAM:
            path = self.file_path("relative path")
            return RelativeFileHandle(path, r.i64("file size"))
        if tag == KEY_GROUPS:
            start, offsets = self.key_group_offsets()
            return KeyGroupsHandle(KEY_GROUPS, start, offsets, self.nested(self.stream_handle))
        if tag == SEGMENT_FILE:
            start, size, scope = r.i64("segment start"), r.i64("segment size"), r.i32("segment scope")
            if not 0 <= scope < len(SEGMENT_SCOPES):  # Flink: CheckpointedStateScope.values()[scope]
                known = ", ".join(f"{i} {name}" for i, name in enumerate(SEGMENT_SCOPES))
                r.fail(f"segment scope {scope} is none of Flink's ({known}; Flink: ArrayIndexOutOfBoundsException)", r.pos - 4)
            return SegmentFileHandle(start, size, scope, self.file_path("segment file path"), r.utf("logical file id"))
        if tag == EMPTY_SEGMENT_FILE:
            return EmptySegmentFileHandle()
        self.unknown("stream state handle", tag, at)

    def _file_handle(self, r: JavaReader):
        """A file or relative file handle with an ASCII path, read at once; one object per file
        and size (the handles of the channels of one file share it, as they do in Flink's memory).
        None, with the reader unmoved, for anything else."""
        data, at = r.data, r.pos
        tag = data[at]
        if tag == FILE_STREAM:
            start, tail = at + 9, 0
        else:
            start, tail = at + 1, 8
        if start + 2 > len(data):
            return None
        length = data[start] << 8 | data[start + 1]
        end = start + 2 + length + tail
        if end > len(data):
            return None
        raw = bytes(data[at:end])
        known = self._files.get(raw)
        if known is None:
            path = raw[start - at + 2 : start - at + 2 + length]
            if not path.isascii() or 0 in path:  # a NUL: refused by ``file_path``
                return None
            size = _LONG.unpack_from(data, at + 1 if tag == FILE_STREAM else end - 8)[0]
            if size < 0:
                return None
            known = (FileHandle if tag == FILE_STREAM else RelativeFileHandle)(path.decode("ascii"), size)
            self._files[raw] = known
        r.pos = end
        return known

    def file_path(self, what: str) -> str:
        """A file's path or name: refused where it holds a NUL character, which no file's name can
        (Java reads it; Flink's restore then fails to open the file)."""
        at = self.r.pos
        path = self.r.utf(what)
        if "\x00" in path:
            self.r.fail(f"{what} holds a NUL character, which no file's name can", at=at)
        return path

    def key_range(self) -> tuple[int, int]:
        return self.r.i32("start key group"), self.r.i32("number of key groups")

    def key_group_offsets(self) -> tuple[int, list[int]]:
        r = self.r
        start = r.i32("start key group")
        count = r.count("number of key groups", 8)
        return start, [r.i64("key group offset") for _ in range(count)]

    def keyed_handle(self):
        r = self.r
        at = r.pos
        tag = r.i8("keyed state handle type")
        if tag == NULL_HANDLE:
            return None
        if tag in (KEY_GROUPS, KEY_GROUPS_V2, SAVEPOINT_KEY_GROUPS):
            start, offsets = self.key_group_offsets()
            delegate = self.stream_handle()
            handle_id = r.utf("state handle id") if tag == KEY_GROUPS_V2 else None
            return KeyGroupsHandle(tag, start, offsets, delegate, handle_id)
        if tag in (INCREMENTAL, INCREMENTAL_V2):
            v2 = tag == INCREMENTAL_V2
            checkpoint_id = r.i64("checkpoint id")
            backend_id = r.utf("backend id")
            start, num = self.key_range()
            checkpointed_size = r.i64("checkpointed size") if v2 else -1
            meta = self.stream_handle()
            shared = self.handle_and_local_paths()
            private = self.handle_and_local_paths()
            handle_id = r.utf("state handle id") if v2 else None
            return IncrementalKeyedHandle(
                tag, checkpoint_id, backend_id, start, num, checkpointed_size, meta, shared, private, handle_id
            )
        if tag in (CHANGELOG, CHANGELOG_V2):
            start, num = self.key_range()
            checkpointed_size = r.i64("checkpointed size")
            materialized = [self.nested(self.keyed_handle) for _ in range(r.count("materialized handles"))]
            non_materialized = [self.nested(self.keyed_handle) for _ in range(r.count("changelog handles"))]
            materialization_id = r.i64("materialization id")
            checkpoint_id = r.i64("checkpoint id") if tag == CHANGELOG_V2 else materialization_id
            return ChangelogBackendHandle(
                tag,
                start,
                num,
                checkpointed_size,
                materialized,
                non_materialized,
                materialization_id,
                checkpoint_id,
                r.utf("state handle id"),
            )
        if tag == CHANGELOG_BYTE_INCREMENT:
            start, num = self.key_range()
            seq_from, seq_to = r.i64("sequence number"), r.i64("sequence number")
            changes = []
            for _ in range(r.count("number of changes")):
                key_group = r.i32("change key group")
                changes.append(StateChange(key_group, r.raw(r.count("change length"), "change")))
            return InMemoryChangelogHandle(start, num, seq_from, seq_to, changes, r.utf("state handle id"))
        if tag in (CHANGELOG_FILE_INCREMENT, CHANGELOG_FILE_INCREMENT_V2):
            start, num = self.key_range()
            parts = []
            for _ in range(r.count("number of changelog files")):
                offset = r.i64("changelog offset")
                parts.append((self.stream_handle(), offset))
            state_size, checkpointed_size = r.i64("state size"), r.i64("checkpointed size")
            handle_id = r.utf("state handle id")
            storage = r.utf("storage identifier") if tag == CHANGELOG_FILE_INCREMENT_V2 else None
            return ChangelogStreamHandle(tag, start, num, parts, state_size, checkpointed_size, handle_id, storage)
        self.unknown("keyed state handle", tag, at)

    def handle_and_local_paths(self) -> list[HandleAndLocalPath]:
        r = self.r
        result = []
        for _ in range(r.count("number of state files")):
            local_path = self.file_path("local path")  # the name RocksDB's restore gives the file it downloads
            result.append(HandleAndLocalPath(local_path, self.stream_handle()))
        return result

    def operator_state_handle(self) -> Optional[OperatorStateHandle]:
        r = self.r
        at = r.pos
        tag = r.i8("operator state handle type")
        if tag == NULL_HANDLE:
            return None
        if tag not in (OPERATOR_STATE, SEGMENT_OPERATOR_STATE):
            self.unknown("operator state handle", tag, at)
        states = []
        for _ in range(r.count("number of operator states")):
            name = r.utf("operator state name")
            mode_at = r.pos
            mode = r.i8("distribution mode")
            if not 0 <= mode <= 2:
                r.fail(f"unknown distribution mode {mode}", at=mode_at)
            offsets = [r.i64("partition offset") for _ in range(r.count("number of partition offsets", 8))]
            states.append(OperatorStateInfo(name, mode, offsets))
        handle = OperatorStateHandle(tag, states, None)
        if tag == SEGMENT_OPERATOR_STATE:
            handle.task_owned_dir = self.file_path("task-owned directory")
            handle.shared_dir = self.file_path("shared directory")
            handle.is_empty = r.boolean("empty flag")
        handle.delegate = self.stream_handle()
        return handle

    def channel_handle(self, direction: str):
        r = self.r
        if self.version < 6:
            return self.plain_channel_handle(direction)
        at = r.pos
        tag = r.u8("channel state handle type")
        if tag == CHANNEL_TAGS[(direction, False)]:
            return self.plain_channel_handle(direction)
        if tag == CHANNEL_TAGS[(direction, True)]:
            return self.merged_channel_handle(direction)
        self.unknown(f"{direction} channel state handle", tag, at)

    def plain_channel_handle(self, direction: str) -> ChannelStateHandle:
        r = self.r
        shared = self._shared.setdefault
        fast = self._plain_channel_head(r)
        if fast is not None:  # the common, well-formed case; anything else is read field by field below
            subtask, info, offsets, size = fast
        else:
            subtask = r.i32("subtask index")
            info = (r.i32("gate or partition index"), r.i32("channel or subpartition index"))
            offsets = _buffer_offsets(r)
            size = r.i64("channel state size")
        size = self.shared_size(size)
        return ChannelStateHandle(direction, shared(subtask, subtask), shared(info, info), offsets, size, self.stream_handle())

    def shared_size(self, size: int) -> int:
        """``size``, as the object of an equal size read before while fewer than SHARED_SIZES differ."""
        known = self._sizes.get(size)
        if known is None:
            known = size
            if len(self._sizes) < SHARED_SIZES:
                self._sizes[size] = size
        return known

    @staticmethod
    def _plain_channel_head(r: JavaReader) -> Optional[tuple[int, tuple[int, int], tuple[int, ...], int]]:
        """A plain channel handle up to its stream handle, read with two or three unpacks where it
        is well formed (then the reader moves past it); None, with the reader unmoved, otherwise."""
        data, at = r.data, r.pos
        if at + 16 > len(data):
            return None
        subtask, gate, channel, count = _CHANNEL_HEAD.unpack_from(data, at)
        end = at + 16 + 8 * count
        if not 0 < count <= 8 or end + 8 > len(data):
            return None
        offsets = _OFFSETS[count].unpack_from(data, at + 16)
        previous = -1
        for offset in offsets:
            if offset < 4 or offset < previous + 4:
                return None
            previous = offset
        size = _LONG.unpack_from(data, end)[0]
        if subtask < 0 or gate < 0 or channel < 0 or size < 0:
            return None
        r.pos = end + 8
        return subtask, (gate, channel), offsets, size

    def merged_channel_handle(self, direction: str) -> MergedChannelStateHandle:
        r = self.r
        subtask = r.i32("subtask index")
        size = r.i64("merged state size")
        delegate = self.stream_handle()
        at = r.pos
        serialized = r.raw(r.count("length of merged channel offsets"), "merged channel offsets")
        totals = _merged_offsets_totals(serialized)
        if totals is None:  # not well formed: read field by field, for the error that says where
            _unmerge(JavaReader(serialized, f"{r.source} (merged channel offsets at byte {at})"))
            totals = _merged_offsets_totals(serialized, check=False)
        assert totals is not None  # _unmerge raised, or every field is in place
        return MergedChannelStateHandle(direction, subtask, size, delegate, serialized, *totals)


def _merged_offsets_totals(data: bytes, check: bool = True) -> Optional[tuple[int, int, int, tuple[int, ...]]]:
    """Channels, buffers, the sum of channel state sizes and the gates (or partitions) of merged
    channel offsets, in one pass of a few unpacks per channel; None where anything is not as Flink
    writes it (``_unmerge`` then names it): a negative index, size or count, buffer offsets inside
    the file header, repeated or overlapping, more offsets than bytes left, trailing bytes.
    ``check=False``: the totals of offsets ``_unmerge`` read without a fault."""
    if len(data) < 4:
        return None
    if check:
        uniform = _uniform_offsets_totals(data)
        if uniform is not None:
            return uniform
    (count,) = _INT.unpack_from(data, 0)
    end = len(data)
    if count < 0 or 20 * count > end - 4:
        return None
    pos, buffers, size_sum = 4, 0, 0
    gates: dict[int, None] = {}
    head = _MERGED_CHANNEL_HEAD.unpack_from
    for _ in range(count):
        if pos + 20 > end:
            return None
        gate, channel, size, number = head(data, pos)
        pos += 20
        if check and (gate < 0 or channel < 0 or size < 0 or number < 0 or pos + 8 * number > end):
            return None
        if number:
            offsets = _OFFSETS[number].unpack_from(data, pos) if number <= 8 else struct.unpack_from(f">{number}q", data, pos)
            if check:
                previous = -1
                for offset in offsets:
                    if offset < 4 or offset < previous + 4:
                        return None
                    previous = offset
        pos += 8 * number
        buffers += number
        size_sum += size
        gates[gate] = None
    if pos != end:
        return None
    return count, buffers, size_sum, tuple(gates)


def _buffer_offsets(r: JavaReader) -> tuple[int, ...]:
    """A channel handle's buffer offsets: after the file header, in the order written, each
    buffer's 4-byte length at least before the next (a handle never lists a buffer twice)."""
    at = r.pos
    count = r.count("number of buffer offsets", 8)
    offsets = struct.unpack(f">{count}q", r.raw(8 * count, "buffer offsets"))
    previous = -1
    for offset in offsets:
        if offset < 4 or offset < previous + 4:
            r.fail(f"buffer offset {offset} is inside the file header or repeats or overlaps the one before", at=at)
        previous = offset
    return offsets


def _uniform_offsets_totals(data: bytes) -> Optional[tuple[int, int, int, tuple[int, ...]]]:
    """``_merged_offsets_totals`` of well-formed merged offsets whose channels all list the same
    number of buffers (up to 8; a channel of a job at high parallelism mostly holds one), checked
    with a few NumPy passes over them as one array; None for anything else."""
    channels = uniform_merged_channels(data)
    if channels is None:
        return None
    count, buffers = len(channels), int(channels["buffers"][0])
    if (channels["gate"] < 0).any() or (channels["channel"] < 0).any() or (channels["size"] < 0).any():
        return None
    if buffers:
        offsets = channels["offsets"]
        if (offsets[:, 0] < 4).any() or (buffers > 1 and (np.diff(offsets, axis=1) < 4).any()):
            return None
    gates, first = np.unique(channels["gate"], return_index=True)
    in_order = tuple(int(gate) for gate in gates[np.argsort(first)])
    sizes = channels["size"]
    # summed in int64 where it cannot overflow (sizes are not negative here), else exactly
    total = int(sizes.sum(dtype=np.int64)) if int(sizes.max(initial=0)) < (1 << 62) // max(count, 1) else sum(sizes.tolist())
    return count, count * buffers, total, in_order


def _unmerge(r: JavaReader) -> None:
    """Read ``AbstractMergedChannelStateHandle``'s serialized per-channel offsets field by field,
    failing where they are not as Flink writes them."""
    for _ in range(r.count("number of merged channels")):
        r.i32("gate or partition index")
        r.i32("channel or subpartition index")
        r.i64("channel state size")
        _buffer_offsets(r)
    if r.remaining:
        r.fail("trailing bytes in merged channel offsets")


# ------------------------------------------------------------------------------------------------
# writing
# ------------------------------------------------------------------------------------------------


def write_metadata(metadata: CheckpointMetadata) -> bytes:
    """Serialize like Flink's serializer of ``metadata.version``."""
    return b"".join(metadata_chunks(metadata, 0))


def metadata_chunks(metadata: CheckpointMetadata, size: int = 16 << 20) -> list[bytes]:
    """``write_metadata`` in pieces of about ``size`` bytes (cut where a subtask's state ends; one
    piece for 0): a job at parallelism p in the thousands has a ``_metadata`` of hundreds of MB, and
    one buffer grown to that size leaves as much again of freed copies in the C heap."""
    if metadata.version not in SUPPORTED_VERSIONS:
        raise CheckpointFormatError(f"cannot write metadata version {metadata.version}")
    w = _MetadataWriter(JavaWriter(), metadata.version, size)
    w.write(metadata)
    return w.chunks


def serialize_merged_offsets(channels: Sequence[ChannelStateHandle]) -> bytes:
    """The ``serializedChannelOffsets`` of a merged handle holding ``channels``, as
    ``AbstractMergedChannelStateHandle`` writes them: their count, then per channel its info,
    state size and buffer offsets."""
    out = bytearray(_INT.pack(len(channels)))
    head = _MERGED_CHANNEL_HEAD.pack
    for ch in channels:
        offsets = ch.offsets
        count = len(offsets)
        out += head(ch.info[0], ch.info[1], ch.state_size, count)
        if 0 < count <= 8:
            out += _OFFSETS[count].pack(*offsets)
        elif count:
            out += struct.pack(f">{count}q", *offsets)
    return bytes(out)


# --- plain or merged channel state handles -------------------------------------------------------

PLAIN = "plain"
MERGED = "merged"
HANDLE_FORMS = (PLAIN, MERGED)
MERGED_SINCE = 6  # the metadata version (Flink 2.1) that holds merged channel state handles


def channel_handle_form(metadata: CheckpointMetadata) -> str:
    """How ``metadata`` holds its in-flight data: ``MERGED`` where its channel handles are merged
    ones (Flink 2.1+ writes nothing else, FLINK-33734) or where it holds none in a version that
    holds merged ones; ``PLAIN`` otherwise (one handle per channel, Flink up to 2.0)."""
    if metadata.version < MERGED_SINCE:
        return PLAIN
    for op in metadata.operators:
        for s in op.subtasks:
            for handle in s.input_channels or s.output_channels:
                return MERGED if isinstance(handle, MergedChannelStateHandle) else PLAIN
    return MERGED


def merging_gains(metadata: CheckpointMetadata) -> bool:
    """Whether merged handles would hold several channels anywhere: some subtask holds two
    channels of one direction in one file, or a merged handle of several channels. Where none
    does, a merged handle per channel is larger than a plain one, in the file and in Flink's heap
    (a rescale whose engine tasks each placed one channel of a subtask, say)."""
    for op in metadata.operators:
        for s in op.subtasks:
            for handles in (s.input_channels, s.output_channels):
                # columns: ckpt places them only in files of its own, which nothing else references
                if any(isinstance(c, ChannelColumns) and len(np.unique(c.file)) < c.channel_count for c in handles):
                    return True
                others = [h for h in handles if not isinstance(h, ChannelColumns)]
                if len({id(handle.delegate) for handle in others}) < len(others):
                    return True
                if any(isinstance(handle, MergedChannelStateHandle) and handle.channel_count > 1 for handle in others):
                    return True
    return False


def set_channel_handle_form(metadata: CheckpointMetadata, form: str) -> None:
    """Make every subtask hold its channel handles in ``form``, in place: ``PLAIN``, one handle per
    channel; ``MERGED``, one merged handle per subtask index and delegate, direction by direction,
    as Flink's ``ChannelStateHelper.mergeInputStateCollection`` / ``mergeOutputStateCollection``
    group them (by delegate; each in the order its channels come). A merged handle that stays
    whole is kept as it is."""
    if form not in HANDLE_FORMS:
        raise ValueError(f"unknown channel handle form {form!r}")
    if form == MERGED and metadata.version < MERGED_SINCE:
        raise CheckpointFormatError(
            f"metadata version {metadata.version} cannot hold merged channel state handles "
            f"(version {MERGED_SINCE}, Flink 2.1, introduced them)"
        )
    for op in metadata.operators:
        for s in op.subtasks:
            if form == PLAIN:  # columns are plain handles already
                s.input_channels = opened_up(s.input_channels, MergedChannelStateHandle)
                s.output_channels = opened_up(s.output_channels, MergedChannelStateHandle)
            else:
                s.input_channels = list[AnyChannelHandle](merge_channel_handles(s.input_channels))
                s.output_channels = list[AnyChannelHandle](merge_channel_handles(s.output_channels))


def merge_channel_handles(handles: Sequence[AnyChannelHandle]) -> list[MergedChannelStateHandle]:
    """``handles`` (plain or merged, of one direction) as merged handles: one per subtask index and
    delegate (by identity: the channels of one file share its handle object). A merged handle
    that nothing joins is kept as it is, undecoded."""
    groups: dict[tuple[int, int], list[ChannelStateHandle | MergedChannelStateHandle]] = {}
    columns = [handle for handle in handles if isinstance(handle, ChannelColumns)]
    for handle in handles:
        if not isinstance(handle, ChannelColumns):
            groups.setdefault((handle.subtask_index, id(handle.delegate)), []).append(handle)
    result = []
    for (subtask, _), members in groups.items():
        if len(members) == 1 and isinstance(members[0], MergedChannelStateHandle):
            result.append(members[0])
            continue
        channels: list[ChannelStateHandle] = opened_up(members, MergedChannelStateHandle)  # type: ignore[assignment]
        if not channels:
            continue
        first = channels[0]
        result.append(
            MergedChannelStateHandle(
                first.direction,
                subtask,
                sum(ch.state_size for ch in channels),
                first.delegate,
                serialize_merged_offsets(channels),
                len(channels),
                sum(len(ch.offsets) for ch in channels),
                sum(ch.state_size for ch in channels),
                tuple(dict.fromkeys(ch.info[0] for ch in channels)),
            )
        )
    # columns are only placed in files of ckpt's own, which no other handle references
    return result + [merged for c in columns for merged in merged_columns(c)]


def merged_columns(h: ChannelColumns) -> list[MergedChannelStateHandle]:
    """``merge_channel_handles`` of the handles ``h`` holds, with NumPy: a merged handle per file
    (in the order the files first come), its channels in row order. ckpt's rescale at parallelism p
    places p² handles in a few files per subtask: objects of them would take gigabytes. Where every
    channel lists the same number of buffers (mostly one, at high parallelism), the channels' table
    is the serialized offsets as they are; each file's figures are summed at once."""
    if not h.channel_count:
        return []
    counts = np.diff(h.bounds)
    order = np.argsort(h.file, kind="stable")  # rows by file, in row order within each
    ordered_counts = counts[order]
    sizes = 20 + 8 * ordered_counts
    ends = np.cumsum(sizes)
    starts = ends - sizes
    low, high = int(ordered_counts.min()), int(ordered_counts.max())
    distinct = [low] if low == high else np.unique(ordered_counts).tolist()
    if len(distinct) == 1:
        out = _channel_table(h, order, distinct[0]).view(np.uint8).reshape(-1)
    else:
        out = np.empty(int(ends[-1]), dtype=np.uint8)
        for count in distinct:
            at = np.flatnonzero(ordered_counts == count)  # positions in file order
            table = _channel_table(h, order[at], count)
            out[(starts[at][:, None] + np.arange(table.dtype.itemsize)).ravel()] = table.view(np.uint8).reshape(-1)
    files = h.file[order]
    firsts = np.flatnonzero(np.diff(files, prepend=-1))
    lasts = np.append(firsts[1:], len(order))
    file_sizes = np.add.reduceat(h.size[order], firsts).tolist()
    file_buffers = np.add.reduceat(ordered_counts, firsts).tolist()
    gates = h.gate[order]
    one_gate = (int(gates[0]),) if bool((gates == gates[0]).all()) else None
    result = []
    for group in np.argsort(order[firsts], kind="stable").tolist():  # files in the order they first come
        first, last = int(firsts[group]), int(lasts[group])
        size = file_sizes[group]
        result.append(
            MergedChannelStateHandle(
                h.direction,
                h.subtask_index,
                size,
                h.files.handles[int(files[first])],
                _INT.pack(last - first) + out[starts[first] : ends[last - 1]].tobytes(),
                last - first,
                file_buffers[group],
                size,
                one_gate or tuple(dict.fromkeys(gates[first:last].tolist())),
            )
        )
    return result


def _channel_table(h: ChannelColumns, rows: np.ndarray, count: int) -> np.ndarray:
    """The channels of ``rows`` (each listing ``count`` buffers) as serialized merged offsets: gate,
    channel, state size, buffer count and the buffers' offsets, big-endian, one record each."""
    fields = [("gate", ">i4"), ("channel", ">i4"), ("size", ">i8"), ("count", ">i4")]
    table = np.empty(len(rows), dtype=np.dtype(fields + ([("offsets", ">i8", (count,))] if count else [])))
    table["gate"], table["channel"], table["size"], table["count"] = h.gate[rows], h.channel[rows], h.size[rows], count
    if count:
        table["offsets"] = h.offsets[h.bounds[rows][:, None] + np.arange(count)]
    return table


class _SerializedFiles:
    """Serialized stream handles by index, grouped by length: ``row[i]`` is handle i's row in the
    matrix of its length ``lengths[i]``."""

    def __init__(self, serialized: list[bytes]) -> None:
        self.lengths = np.array([len(b) for b in serialized], dtype=np.int64)
        self.row = np.zeros(len(serialized), dtype=np.int64)
        self._matrices: dict[int, np.ndarray] = {}
        for length in np.unique(self.lengths).tolist():
            members = np.flatnonzero(self.lengths == length)
            self.row[members] = np.arange(len(members))
            joined = b"".join(serialized[i] for i in members.tolist())
            self._matrices[length] = np.frombuffer(joined, dtype=np.uint8).reshape(len(members), length)

    def matrix(self, length: int) -> np.ndarray:
        return self._matrices[length]


class _MetadataWriter:
    def __init__(self, writer: JavaWriter, version: int, chunk_size: int = 0):
        self.w = writer
        self.version = version
        # file handles written, serialized, by identity: the channel handles of one file share one
        self._files: dict[int, tuple[object, bytes]] = {}
        self._column_files: dict[int, tuple[object, _SerializedFiles]] = {}  # the same, for columns' files
        self.chunk_size = chunk_size  # the buffer is cut into ``chunks`` of this size, 0: never
        self.chunks: list[bytes] = []

    def _cut(self, at_least: int) -> None:
        """Move what is written so far into ``chunks`` once it is ``at_least`` bytes."""
        if len(self.w.buffer) >= max(1, at_least):
            self.chunks.append(bytes(self.w.buffer))
            self.w.buffer = bytearray()

    def write(self, md: CheckpointMetadata) -> None:
        w = self.w
        w.i32(HEADER_MAGIC)
        w.i32(md.version)
        w.i64(md.checkpoint_id)
        w.i32(len(md.master_states))
        for master in md.master_states:
            self.master_state(master)
        w.i32(len(md.operators))
        for op in md.operators:
            self.operator_state(op)
        if self.version >= 4:
            if md.properties is None:
                raise CheckpointFormatError("metadata version 4+ needs checkpoint properties")
            w.raw(md.properties)
        self._cut(0)

    def master_state(self, master: MasterState) -> None:
        inner = JavaWriter()
        inner.i32(master.version)
        inner.utf(master.name)
        inner.i32(len(master.payload))
        inner.raw(master.payload)
        body = inner.getvalue()
        self.w.i32(MASTER_STATE_MAGIC)
        self.w.i32(len(body))
        self.w.raw(body)

    def operator_state(self, op: OperatorState) -> None:
        w = self.w
        if self.version >= 5:
            w.utf(op.name or "")
            w.utf(op.uid or "")
        w.raw(op.operator_id)
        w.i32(op.parallelism)
        w.i32(op.max_parallelism)
        self.stream_handle(op.coordinator_state)
        if op.fully_finished:
            w.i32(-1)
            return
        w.i32(len(op.subtasks))
        for subtask in op.subtasks:
            if subtask.finished:
                w.i32(-(subtask.index + 1))
            else:
                w.i32(subtask.index)
                self.subtask_state(subtask)
                if self.chunk_size:
                    self._cut(self.chunk_size)

    def subtask_state(self, s: SubtaskState) -> None:
        w = self.w
        for handle in (s.managed_operator, s.raw_operator):
            w.i32(0 if handle is None else 1)
            if handle is not None:
                self.operator_state_handle(handle)
        self.keyed_handle(s.managed_keyed)
        self.keyed_handle(s.raw_keyed)
        for channels in (s.input_channels, s.output_channels):
            w.i32(sum(h.channel_count if isinstance(h, ChannelColumns) else 1 for h in channels))
            self.channel_handles(channels)

    def stream_handle(self, h) -> None:
        w = self.w
        if h is None:
            w.u8(NULL_HANDLE)
        elif isinstance(h, FileHandle):
            w.u8(FILE_STREAM)
            w.i64(h.size)
            w.utf(h.path)
        elif isinstance(h, ByteStreamHandle):
            w.u8(BYTE_STREAM)
            w.utf(h.name)
            w.i32(len(h.data))
            w.raw(h.data)
        elif isinstance(h, RelativeFileHandle):
            w.u8(RELATIVE_STREAM)
            w.utf(h.relative_path)
            w.i64(h.size)
        elif isinstance(h, KeyGroupsHandle):
            w.u8(KEY_GROUPS)
            self.key_group_offsets(h)
            self.stream_handle(h.delegate)
        elif isinstance(h, SegmentFileHandle):
            w.u8(SEGMENT_FILE)
            w.i64(h.start)
            w.i64(h.size)
            w.i32(h.scope)
            w.utf(h.path)
            w.utf(h.logical_file_id)
        elif isinstance(h, EmptySegmentFileHandle):
            w.u8(EMPTY_SEGMENT_FILE)
        else:
            raise TypeError(f"not a stream state handle: {type(h).__name__}")

    def key_range(self, h) -> None:
        self.w.i32(h.start_key_group)
        self.w.i32(h.num_key_groups)

    def key_group_offsets(self, h: KeyGroupsHandle) -> None:
        self.w.i32(h.start_key_group)
        self.w.i32(len(h.offsets))
        for offset in h.offsets:
            self.w.i64(offset)

    def keyed_handle(self, h) -> None:
        w = self.w
        if h is None:
            w.u8(NULL_HANDLE)
        elif isinstance(h, KeyGroupsHandle):
            w.u8(h.tag)
            self.key_group_offsets(h)
            self.stream_handle(h.delegate)
            if h.tag == KEY_GROUPS_V2:
                w.utf(h.handle_id or "")
        elif isinstance(h, IncrementalKeyedHandle):
            w.u8(h.tag)
            w.i64(h.checkpoint_id)
            w.utf(h.backend_id)
            self.key_range(h)
            if h.tag == INCREMENTAL_V2:
                w.i64(h.checkpointed_size)
            self.stream_handle(h.meta)
            self.handle_and_local_paths(h.shared)
            self.handle_and_local_paths(h.private)
            if h.tag == INCREMENTAL_V2:
                w.utf(h.handle_id or "")
        elif isinstance(h, ChangelogBackendHandle):
            w.u8(h.tag)
            self.key_range(h)
            w.i64(h.checkpointed_size)
            for group in (h.materialized, h.non_materialized):
                w.i32(len(group))
                for inner in group:
                    self.keyed_handle(inner)
            w.i64(h.materialization_id)
            if h.tag == CHANGELOG_V2:
                w.i64(h.checkpoint_id)
            w.utf(h.handle_id)
        elif isinstance(h, InMemoryChangelogHandle):
            w.u8(CHANGELOG_BYTE_INCREMENT)
            self.key_range(h)
            w.i64(h.sequence_from)
            w.i64(h.sequence_to)
            w.i32(len(h.changes))
            for change in h.changes:
                w.i32(change.key_group)
                w.i32(len(change.change))
                w.raw(change.change)
            w.utf(h.handle_id)
        elif isinstance(h, ChangelogStreamHandle):
            w.u8(h.tag)
            self.key_range(h)
            w.i32(len(h.handles_and_offsets))
            for stream, offset in h.handles_and_offsets:
                w.i64(offset)
                self.stream_handle(stream)
            w.i64(h.state_size)
            w.i64(h.checkpointed_size)
            w.utf(h.handle_id)
            if h.tag == CHANGELOG_FILE_INCREMENT_V2:
                w.utf(h.storage_identifier or "")
        else:
            raise TypeError(f"not a keyed state handle: {type(h).__name__}")

    def handle_and_local_paths(self, items: list[HandleAndLocalPath]) -> None:
        self.w.i32(len(items))
        for item in items:
            self.w.utf(item.local_path)
            self.stream_handle(item.handle)

    def operator_state_handle(self, h: OperatorStateHandle) -> None:
        w = self.w
        w.u8(h.tag)
        w.i32(len(h.states))
        for state in h.states:
            w.utf(state.name)
            w.u8(state.mode)
            w.i32(len(state.offsets))
            for offset in state.offsets:
                w.i64(offset)
        if h.tag == SEGMENT_OPERATOR_STATE:
            w.utf(h.task_owned_dir or "")
            w.utf(h.shared_dir or "")
            w.boolean(h.is_empty)
        self.stream_handle(h.delegate)

    def channel_handles(self, handles) -> None:
        """``channel_handle`` of each, the plain ones of up to 8 buffers in a known file each
        packed in one call (a job at parallelism p has p² of them)."""
        files, tagged, w = self._files, self.version >= 6, self.w
        packs = {count: _PLAIN_CHANNEL[(tagged, count)].pack for count in range(9)}
        tags = {direction: (CHANNEL_TAGS[(direction, False)],) if tagged else () for direction in (INPUT, OUTPUT)}
        for h in handles:
            if type(h) is ChannelColumns:
                w.buffer += self.channel_columns(h)
                continue
            if type(h) is ChannelStateHandle and len(h.offsets) <= 8:
                delegate = h.delegate
                known = files.get(id(delegate))
                if known is not None and known[0] is delegate:
                    info, offsets, buffer = h.info, h.offsets, w.buffer
                    head = tags[h.direction]
                    buffer += packs[len(offsets)](*head, h.subtask_index, *info, len(offsets), *offsets, h.state_size)
                    buffer += known[1]
                    continue
            self.channel_handle(h)

    def channel_columns(self, h: ChannelColumns) -> bytes:
        """The plain handles of ``h``, serialized with NumPy: the rows of each buffer count and
        file-handle length as one structured array, put in place at their rows' positions."""
        serialized = self._files_of(h.files)
        head: list[tuple[str, str]] = [("tag", "u1")] if self.version >= 6 else []
        head += [("subtask", ">i4"), ("gate", ">i4"), ("channel", ">i4"), ("count", ">i4")]
        counts = np.diff(h.bounds)
        lengths = serialized.lengths[h.file]
        classes = counts * (1 << 32) + lengths
        kinds = np.unique(classes)
        if len(kinds) == 1:
            out = None
            rows = np.arange(len(counts))
        else:
            row_sizes = (17 if self.version >= 6 else 16) + 8 * counts + 8 + lengths
            ends = np.cumsum(row_sizes)
            out = np.empty(int(ends[-1]), dtype=np.uint8)
            starts = ends - row_sizes
        for kind in kinds.tolist():
            count, length = kind >> 32, kind & 0xFFFFFFFF
            if out is not None:
                rows = np.flatnonzero(classes == kind)
            fields = head + ([("offsets", ">i8", (count,))] if count else []) + [("size", ">i8"), ("file", "u1", (length,))]
            table = np.empty(len(rows), dtype=np.dtype(fields))
            if self.version >= 6:
                table["tag"] = CHANNEL_TAGS[(h.direction, False)]
            table["subtask"] = h.subtask_index
            table["gate"] = h.gate[rows]
            table["channel"] = h.channel[rows]
            table["count"] = count
            if count:
                table["offsets"] = h.offsets[h.bounds[rows][:, None] + np.arange(count)]
            table["size"] = h.size[rows]
            files = h.file[rows]
            table["file"] = serialized.matrix(length)[serialized.row[files]]
            if out is None:
                return table.tobytes()
            width = table.dtype.itemsize
            out[(starts[rows][:, None] + np.arange(width)).ravel()] = table.view(np.uint8)
        return b"" if out is None else out.tobytes()

    def _files_of(self, files) -> _SerializedFiles:
        """The serialized handles of ``files`` (a ``HandleFiles``), once per object."""
        known = self._column_files.get(id(files))
        if known is None or known[0] is not files:
            serialized = _SerializedFiles([self._handle_bytes(handle) for handle in files.handles])
            known = self._column_files[id(files)] = (files, serialized)
        return known[1]

    def channel_handle(self, h) -> None:
        """One channel handle, field by field (``channel_handles`` packs the common ones at once)."""
        w = self.w
        merged = isinstance(h, MergedChannelStateHandle)
        if self.version >= 6:
            w.u8(CHANNEL_TAGS[(h.direction, merged)])
        elif merged:
            raise CheckpointFormatError(f"metadata version {self.version} cannot hold merged channel state handles")
        if merged:
            w.i32(h.subtask_index)
            w.i64(h.state_size)
            self.stream_handle(h.delegate)
            w.i32(len(h.serialized_offsets))
            w.raw(h.serialized_offsets)
        else:
            offsets = h.offsets
            count = len(offsets)
            w.buffer += _CHANNEL_HEAD.pack(h.subtask_index, h.info[0], h.info[1], count)
            if 0 < count <= 8:
                w.buffer += _OFFSETS[count].pack(*offsets)
            else:
                for offset in offsets:
                    w.i64(offset)
            w.i64(h.state_size)
            self.shared_stream_handle(h.delegate)

    def shared_stream_handle(self, h) -> None:
        """``stream_handle(h)``, a file handle serialized once however many channels share it."""
        if not isinstance(h, (FileHandle, RelativeFileHandle)):
            self.stream_handle(h)
            return
        self.w.buffer += self._handle_bytes(h)

    def _handle_bytes(self, h) -> bytes:
        """``stream_handle(h)`` on its own, as bytes; a file handle's serialized once (by identity)."""
        shared = isinstance(h, (FileHandle, RelativeFileHandle))
        known = self._files.get(id(h)) if shared else None
        if known is None or known[0] is not h:
            outer, self.w = self.w, JavaWriter()
            try:
                self.stream_handle(h)
                known = (h, self.w.getvalue())
            finally:
                self.w = outer
            if shared:
                self._files[id(h)] = known
        return known[1]


def map_stream_handles(metadata: CheckpointMetadata, replace, enter=None) -> None:
    """Replace, in place, every stream handle the checkpoint references by ``replace(handle)``
    (files and inline data; key-groups handles are looked through to their delegate).
    ``enter(operator, subtask)`` is called before the handles of each operator's coordinator
    (subtask None) and of each of its subtasks."""

    def stream(h):
        if h is None:
            return None
        if isinstance(h, KeyGroupsHandle):
            h.delegate = stream(h.delegate)
            return h
        return replace(h)

    def keyed(h) -> None:
        if isinstance(h, KeyGroupsHandle):
            h.delegate = stream(h.delegate)
        elif isinstance(h, IncrementalKeyedHandle):
            h.meta = stream(h.meta)
            for item in h.shared + h.private:
                item.handle = stream(item.handle)
        elif isinstance(h, ChangelogBackendHandle):
            for inner in h.materialized + h.non_materialized:
                keyed(inner)
        elif isinstance(h, ChangelogStreamHandle):
            h.handles_and_offsets = [(stream(inner), offset) for inner, offset in h.handles_and_offsets]

    # channel delegates done, by identity (the channels of one file share one); each kept, so that its id stays its own
    replaced: dict[int, tuple] = {}
    tables: list[HandleFiles] = []  # the files of columns, done

    for op in metadata.operators:
        if enter:
            enter(op, None)
        op.coordinator_state = stream(op.coordinator_state)
        for s in op.subtasks:
            if enter:
                enter(op, s)
            for handle in (s.managed_operator, s.raw_operator):
                if handle is not None:
                    handle.delegate = stream(handle.delegate)
            keyed(s.managed_keyed)
            keyed(s.raw_keyed)
            for ch in s.input_channels + s.output_channels:  # (``shared``, inline: p² of them at parallelism p)
                if isinstance(ch, ChannelColumns):
                    if not any(files is ch.files for files in tables):  # the files of every subtask's columns, once
                        tables.append(ch.files)
                        ch.files.handles = [_replaced(h, replaced, stream) for h in ch.files.handles]
                    continue
                ch.delegate = _replaced(ch.delegate, replaced, stream)  # a merged handle's channels decode with its delegate


def _replaced(h, replaced: dict[int, tuple], stream):
    """``stream(h)``, once per handle object (``replaced`` keeps each, by identity)."""
    done = replaced.get(id(h))
    if done is None:
        done = replaced[id(h)] = (h, stream(h))
    return done[1]


def iter_stream_handles(metadata: CheckpointMetadata) -> list:
    """Every stream handle the checkpoint references (files and inline data), depth first, each
    handle object once (the channel handles of one file share their delegate)."""
    found: list = []
    seen: set[int] = set()

    def collect(handle):
        if id(handle) not in seen:
            seen.add(id(handle))
            found.append(handle)
        return handle

    map_stream_handles(metadata, collect)
    return found
