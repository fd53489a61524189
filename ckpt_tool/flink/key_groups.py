"""Where keyed state's key groups are, as Flink's restore finds them.

A key-groups handle (``KeyGroupsStateHandle``) lists one offset per key group into its data, which
starts with the backend's ``KeyedBackendSerializationProxy`` (an int version, then, from version 2,
a byte saying whether key groups are compressed). Two formats put different bytes at an offset:

- the hashmap backend's checkpoints and native savepoints (``HeapSnapshotStrategy``): the key
  group's id, an int, written before the key group's (maybe compressed) states. Its restore
  (``HeapRestoreOperation``) reads the id at each offset and fails on another ("Unexpected
  key-group in restore."); an offset past the data fails it too ("position out of bounds" for
  inline state, the end of the file for a file).
- the canonical format (``FullSnapshotAsyncWriter``): canonical savepoints of every backend, and
  RocksDB's full checkpoints of Flink 1.15 (handle type 12, like the hashmap backend's) and before
  (type 3; from 1.16 they are native, incremental handles). A key group with entries starts with
  a state's id, a short, then its first entry, the key's and the value's bytes each after an int
  length; an empty key group's offset is 0. Its
  restore (``FullSnapshotRestoreOperation``) reads entries from each offset other than 0: a key or
  a value that runs past the next key group fails it (``EOFException``, a negative length
  ``NegativeArraySizeException``, a huge one out of memory).

Which format a handle holds is read from its data, not from its type byte: its offsets either hold
the key groups' ids (or nearly all do: a corrupt offset among them), or they do not. Where they do
not, each offset other than 0 must start a first entry that ends before the next key group, in
uncompressed data (compressed entries are not read). Raw keyed state holds the operator's own bytes
(an empty last key group may start at its end): its offsets are only checked to lie inside the
data. A backend's offsets other than 0 are in key-group order, as every backend writes them.

``ckpt verify`` reports what this finds; ``rescale`` and ``repair`` refuse it before writing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Optional, TypeVar

from ckpt_tool.errors import CheckpointFormatError, CkptError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import (
    ByteStreamHandle,
    ChangelogBackendHandle,
    KeyGroupsHandle,
    SegmentFileHandle,
    key_group_range,
)

ID_BYTES = 4  # the key group's id, an int, at its offset (the hashmap backend's format)
ENTRY_HEAD = 2 + 4  # the canonical format's state id (a short) and its first key's length (an int)
COMPRESSION_FLAG = 4  # the proxy's byte after its version (version 2 and later): compressed key groups
# On an object store the data is read with one ranged read from the first offset to the last (and
# ENTRY_SLACK past it), where that is at most this many bytes; past it only the offsets are checked
# (a read per key group would be thousands of requests)
REMOTE_SPAN = 64 << 20
ENTRY_SLACK = 64 << 10
At = Callable[[int, int], bytes]  # (start, length) -> up to that many bytes of the data there
T = TypeVar("T")


def key_group_problems(checkpoint: Checkpoint, read_files: bool = True) -> Iterator[tuple[str, int, str]]:
    """(operator label, subtask index, message) for each key-groups handle whose key groups are
    not where it says: the first key group found astray in it. A file that does not read is left
    to the check of the files (so are all files where not ``read_files``: inline state is read
    then, files only bounded and ordered)."""
    for op in checkpoint.metadata.operators:
        for subtask in op.subtasks:
            for kind, keyed in (("managed", subtask.managed_keyed), ("raw", subtask.raw_keyed)):
                message = _range_problem(keyed, op.max_parallelism, op.parallelism, subtask.index)
                if message:
                    yield op.label, subtask.index, f"{kind} keyed state: {message}"
                    continue
                for handle in _key_groups_handles(keyed):
                    try:
                        message = _problem(checkpoint, handle, kind == "managed", read_files)
                    except CkptError:
                        continue
                    if message:
                        yield op.label, subtask.index, f"{kind} keyed state: {message}"


def _range_problem(keyed, max_parallelism: int, parallelism: int, index: int) -> Optional[str]:
    """What is wrong with a keyed handle's key-group range, in words, or None. Flink's snapshot of
    a subtask covers its own range (``computeKeyGroupRangeForOperatorIndex``), and a rescale gives a
    subtask the handles that share key groups with its range; a rescale assigns state by the
    handle's range, so an empty range (``KeyGroupRange.of`` of a count below 1), or one outside the
    operator's key groups or sharing none with the subtask's, loses the state or misplaces it."""
    groups = getattr(keyed, "key_groups", None)
    if not isinstance(groups, range):
        return None
    if not len(groups):
        count = groups.stop - groups.start
        return (
            f"its key-group range (from {groups.start}, {count} key groups) is empty: Flink assigns its state to "
            "no subtask at a rescale (KeyGroupRange.of), and the state is lost"
        )
    own = key_group_range(max_parallelism, parallelism, index)
    if groups.start < 0 or groups.stop > max_parallelism or groups.stop <= own.start or groups.start >= own.stop:
        return (
            f"its key groups {groups.start}..{groups.stop - 1} are none of the subtask's own "
            f"{own.start}..{own.stop - 1} (max parallelism {max_parallelism}, parallelism {parallelism}): Flink "
            "assigns keyed state by its key groups, not by the subtask holding it"
        )
    return None


def refuse_misplaced_key_groups(checkpoint: Checkpoint) -> None:
    """Raise, naming the operator and subtask, where Flink's restore would not find a key group."""
    for label, index, message in key_group_problems(checkpoint):
        raise CheckpointFormatError(f"operator {label} subtask {index}: {message}; Flink's restore would fail on it: refused")


def _key_groups_handles(keyed) -> list[KeyGroupsHandle]:
    if isinstance(keyed, KeyGroupsHandle):
        return [keyed]
    if isinstance(keyed, ChangelogBackendHandle):  # its materialized part, restored by the backend inside
        return [h for inner in keyed.materialized for h in _key_groups_handles(inner)]
    return []


def _problem(checkpoint: Checkpoint, handle: KeyGroupsHandle, managed: bool, read_files: bool) -> Optional[str]:
    """The first key group of ``handle`` not where it says, in words, or None. ``managed``: a
    backend's snapshot (in one of the two formats, its key groups in order); raw keyed state is the
    operator's, in any order."""
    delegate, offsets, first = handle.delegate, handle.offsets, handle.start_key_group
    if delegate is None or not offsets:
        return None
    size = delegate.size
    for i, offset in enumerate(offsets):
        if offset < 0 or offset > size or (managed and offset and offset + ID_BYTES > size):  # 4 bytes in either format
            return f"key group {first + i} starts at byte {offset}, outside its state's {size} bytes" + (
                " (Flink: position out of bounds)" if isinstance(delegate, ByteStreamHandle) else ""
            )
    if not managed:
        return None
    if read_files or isinstance(delegate, ByteStreamHandle):
        found = read_state(checkpoint, delegate, offsets, lambda at: _astray(at, offsets, first, size))
        if found is not None:
            return found or None
    return _out_of_order(offsets, first)


def _astray(at: At, offsets: list[int], first: int, size: int) -> str:
    """What the bytes at the offsets say (``at(start, length)``: the data's bytes there): "" where
    each key group is where Flink's restore looks for it, in either format, else the first one
    astray. The offsets are inside the data."""
    ids = [_int(at(o, ID_BYTES)) if o + ID_BYTES <= size else None for o in offsets]
    astray = [i for i, found in enumerate(ids) if found != first + i]
    if not astray:
        return ""  # the hashmap backend's: each key group's id at its offset
    if 2 * len(astray) < len(offsets):  # its ids but at a few: offsets of the hashmap backend's gone astray
        i = astray[0]
        return (
            f"key group {first + i} starts at byte {offsets[i]}, where the state holds key group {ids[i]}'s id"
            " (Flink: Unexpected key-group in restore.)"
        )
    disorder = _out_of_order(offsets, first)
    if disorder:
        return disorder
    if at(COMPRESSION_FLAG, 1) not in (b"", b"\x00") and _int(at(0, 4)) >= 2:
        return ""  # compressed key groups: their entries are not read
    written = sorted((o, i) for i, o in enumerate(offsets) if o)
    for (offset, i), end in zip(written, [o for o, _ in written[1:]] + [size]):
        entry = _first_entry_end(at, offset)
        if entry is None or entry > end:
            ahead = "the end of its state" if end == size else "the next key group"
            return (
                f"key group {first + i} starts at byte {offset}, where no entry of a state starts"
                f" (one read there does not end before {ahead}, at byte {end}; Flink's restore reads past it)"
            )
    return ""


def _first_entry_end(at: At, offset: int) -> Optional[int]:
    """Where the first entry of a canonical key group at ``offset`` ends (a state id, then a key
    and a value, each an int length and its bytes), or None where it cannot be one."""
    head = at(offset, ENTRY_HEAD)
    if len(head) < ENTRY_HEAD or head[0] & 0x80:  # a state id is below 2**15
        return None
    key = _int(head[2:])
    if key < 1:
        return None
    value_at = offset + ENTRY_HEAD + key
    value = at(value_at, 4)
    if len(value) < 4 or _int(value) < 0:
        return None
    return value_at + 4 + _int(value)


def _out_of_order(offsets: list[int], first: int) -> Optional[str]:
    last = 0
    for i, offset in enumerate(offsets):
        if 0 < offset < last:
            return (
                f"key group {first + i} starts at byte {offset}, before the key group ahead of it"
                f" (at byte {last}): a state backend writes key groups in order, and Flink's restore reads garbage there"
            )
        last = max(last, offset)
    return None


def holds_its_id(block: bytes, group: int) -> bool:
    """Whether a key group's block starts with the key group's id, as the hashmap backend's
    format writes it (the canonical format starts with a state's id and an entry)."""
    return len(block) >= ID_BYTES and _int(block) == group


def _int(data: bytes) -> int:
    return int.from_bytes(data[:4], "big", signed=True)


class _Unread(Exception):
    """Bytes an object store's span read did not take."""


def read_state(checkpoint: Checkpoint, delegate, offsets: list[int], examine: Callable[[At], T]) -> Optional[T]:
    """``examine(at)`` over the delegate's data (``at(start, length)``: up to ``length`` bytes at
    ``start``), or None where reading it would take a request per key group (an object store, the
    offsets far apart, or an entry beyond the span read). A local file is opened once and read
    where asked; on an object store the proxy's head and the span of the offsets (and
    ``ENTRY_SLACK`` past the last) are read once."""
    size = delegate.size
    if isinstance(delegate, ByteStreamHandle):
        data = delegate.data
        return examine(lambda start, length: data[start : start + length])
    uri = checkpoint.location(delegate)
    if uri is None:
        return None
    base = delegate.start if isinstance(delegate, SegmentFileHandle) else 0
    io = checkpoint.io
    read_spans = getattr(io, "read_spans", None)
    if read_spans is not None:  # a local file

        def clipped(at):
            return examine(lambda start, length: at(base + start, max(0, min(length, size - start))))

        return read_spans(uri, clipped)
    low, high = min(offsets), min(size, max(offsets) + ENTRY_SLACK)
    if high - low > REMOTE_SPAN:
        return None
    span = io.read_range(uri, base + low, high - low)
    # the proxy's head, from the span where the span starts with it (one request, not two)
    head = span[: COMPRESSION_FLAG + 1] if low == 0 else io.read_range(uri, base, min(size, COMPRESSION_FLAG + 1))

    def at(start: int, length: int) -> bytes:
        if start + length <= len(head):
            return head[start : start + length]
        if low <= start and (start + length <= high or high == size):
            return span[start - low : start - low + length]
        raise _Unread

    try:
        return examine(at)
    except _Unread:
        return None
