"""Where keyed state's key groups are, as Flink's restore finds them.

A key-groups handle (``KeyGroupsStateHandle``) lists one offset per key group into its data.
Flink's restore of the hashmap backend (``HeapRestoreOperation``; its checkpoints and native
savepoints, written by ``HeapSnapshotStrategy``, whose handles carry an id) seeks to each key
group's offset and reads the key group's id there: a different id fails the restore
("Unexpected key-group in restore."), and so does an offset past the data ("position out of
bounds" for inline state, end of file for a file). A canonical savepoint
(``FullSnapshotRestoreOperation``) writes no id and marks an empty key group with offset 0, and
raw keyed state holds the operator's own bytes (an empty last key group may start at its end):
for those the offsets are checked to lie inside the data, and a backend's (not raw state) to be
in key-group order, as every backend writes them (0 aside). So is a handle of Flink 1.14 and
before (no id), which a RocksDB full checkpoint wrote in the canonical format.

``ckpt verify`` reports what this finds; ``rescale`` and ``repair`` refuse it before writing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Optional

from ckpt_tool.errors import CheckpointFormatError, CkptError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.metadata import KEY_GROUPS_V2
from ckpt_tool.flink.model import (
    ByteStreamHandle,
    ChangelogBackendHandle,
    KeyGroupsHandle,
    SegmentFileHandle,
)

ID_BYTES = 4  # the key group's id, an int, at its offset
# On an object store the ids are read with one ranged read from the first offset to the last,
# where that is at most this many bytes; past it only the offsets are checked (a read per key
# group would be thousands of requests)
REMOTE_SPAN = 64 << 20


def key_group_problems(checkpoint: Checkpoint, read_files: bool = True) -> Iterator[tuple[str, int, str]]:
    """(operator label, subtask index, message) for each key-groups handle whose key groups are
    not where it says: the first key group found astray in it. A file that does not read is left
    to the check of the files (so are all files where not ``read_files``: ids are then read from
    inline state only)."""
    for op in checkpoint.metadata.operators:
        for subtask in op.subtasks:
            for kind, keyed in (("managed", subtask.managed_keyed), ("raw", subtask.raw_keyed)):
                for handle in _key_groups_handles(keyed):
                    try:
                        with_ids = kind == "managed" and handle.tag == KEY_GROUPS_V2
                        message = _problem(checkpoint, handle, kind == "managed", with_ids, read_files)
                    except CkptError:
                        continue
                    if message:
                        yield op.label, subtask.index, f"{kind} keyed state: {message}"


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


def _problem(checkpoint: Checkpoint, handle: KeyGroupsHandle, in_order: bool, with_ids: bool, read_files: bool) -> Optional[str]:
    """The first key group of ``handle`` not where it says, in words, or None. ``in_order``: a
    backend's snapshot, which writes its key groups in order (the offsets other than 0 never go
    back; raw keyed state is the operator's, in any order); ``with_ids``: the hashmap backend's,
    with each key group's id at its offset."""
    delegate, offsets, first = handle.delegate, handle.offsets, handle.start_key_group
    if delegate is None or not offsets:
        return None
    size = delegate.size
    tail = ID_BYTES if with_ids else 0
    for i, offset in enumerate(offsets):
        if offset < 0 or offset + tail > size:
            return f"key group {first + i} starts at byte {offset}, outside its state's {size} bytes" + (
                " (Flink: position out of bounds)" if isinstance(delegate, ByteStreamHandle) else ""
            )
    if with_ids and (read_files or isinstance(delegate, ByteStreamHandle)):
        ids = _ids_at(checkpoint, delegate, offsets)
        if ids is not None:  # Flink's own check, and its words
            for i, (offset, found) in enumerate(zip(offsets, ids)):
                if found != first + i:
                    return (
                        f"key group {first + i} starts at byte {offset}, where the state holds key group {found}'s id"
                        " (Flink: Unexpected key-group in restore.)"
                    )
            return None
    if in_order:
        last = 0
        for i, offset in enumerate(offsets):
            if 0 < offset < last:
                return (
                    f"key group {first + i} starts at byte {offset}, before the key group ahead of it"
                    f" (at byte {last}): a state backend writes key groups in order, and Flink's restore reads garbage there"
                )
            last = max(last, offset)
    return None


def _ids_at(checkpoint: Checkpoint, delegate, offsets: list[int]) -> Optional[list[int]]:
    """The int at each offset of the delegate's data (each inside it), or None where reading them
    would take a request per key group (an object store, the offsets far apart)."""
    if isinstance(delegate, ByteStreamHandle):
        data = delegate.data
        return [int.from_bytes(data[o : o + ID_BYTES], "big", signed=True) for o in offsets]
    uri = checkpoint.location(delegate)
    if uri is None:
        return None
    base = delegate.start if isinstance(delegate, SegmentFileHandle) else 0
    io = checkpoint.io
    read_spans = getattr(io, "read_spans", None)
    if read_spans is not None:  # a local file: a read per key group, the file opened once

        def read(at):
            return [at(base + o, ID_BYTES) for o in offsets]

        pieces = read_spans(uri, read)
    else:
        low, high = min(offsets), max(offsets) + ID_BYTES
        if high - low > REMOTE_SPAN:
            return None
        span = io.read_range(uri, base + low, high - low)
        pieces = [span[o - low : o - low + ID_BYTES] for o in offsets]
    if any(len(p) < ID_BYTES for p in pieces):
        raise CkptError(f"{uri} ends before a key group's id")  # shorter than recorded: the files check says so
    return [int.from_bytes(p, "big", signed=True) for p in pieces]
