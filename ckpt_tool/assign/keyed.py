"""Keyed state for a new parallelism.

Each new subtask owns the key-group range ``KeyGroupRangeAssignment`` gives it and receives the
intersection of every old handle with that range, as ``StateAssignmentOperation`` computes it:
a key-groups handle (hashmap) is cut to the range with its offsets; an incremental RocksDB
handle is shared whole by every new subtask whose range it overlaps (RocksDB clips on restore).

A changelog state backend handle is intersected as ``ChangelogStateBackendHandleImpl`` does it:
its materialized handles are cut as above; a changelog file handle is kept whole (the same files
and offsets) with its key-group range narrowed, its sizes 0 and a new id
(``ChangelogStateHandleStreamImpl.getIntersection``); an in-memory changelog handle is kept whole
if any of its changes is in the range. On restore Flink applies only the changes of the key
groups the new subtask owns (``ChangelogBackendLogApplier``).

``_metadata`` holds one keyed handle per subtask. Where a new subtask needs several old handles,
they go into one ``ChangelogStateBackendHandle``: the materialized parts of all of them, then
their changelogs in the old subtasks' order, with the highest materialization id (what
``ChangelogKeyedStateBackend`` makes of several restored handles). Without changelog, a job
without the changelog backend restores it through Flink's ``DeactivatedChangelogStateBackend``,
which restores the materialized handles with rescaling.
Flink 1.15 (metadata v3) has neither; there the key-group blocks of several hashmap files are
merged into one new file (``merge_key_groups``), and RocksDB state that would need several
handles is refused.
"""

from __future__ import annotations

import bisect
import uuid
from dataclasses import replace
from typing import Optional

from ckpt_tool.errors import CkptError
from ckpt_tool.flink.key_groups import holds_its_id
from ckpt_tool.flink.metadata import CHANGELOG_V2
from ckpt_tool.flink.model import (
    ChangelogBackendHandle,
    ChangelogStreamHandle,
    IncrementalKeyedHandle,
    InMemoryChangelogHandle,
    KeyedHandle,
    KeyGroupsHandle,
    WrittenFileHandle,
)
from ckpt_tool.records.keys import key_group_range


class KeyedStateError(CkptError):
    """Keyed state that ckpt cannot reassign."""


def _pieces(handle) -> list:
    """The materialized handles a keyed handle stands for (a changelog handle's materialized part)."""
    if handle is None:
        return []
    if isinstance(handle, ChangelogBackendHandle):
        return [p for inner in handle.materialized for p in _pieces(inner)]
    if isinstance(handle, (KeyGroupsHandle, IncrementalKeyedHandle)):
        return [handle]
    raise KeyedStateError(f"cannot reassign keyed state held in a {type(handle).__name__}")


def _changelog_intersection(handle: KeyedHandle, wanted: range) -> Optional[KeyedHandle]:
    """A changelog handle's part for the key groups ``wanted``, as Flink's ``getIntersection``."""
    if isinstance(handle, InMemoryChangelogHandle):
        return handle if any(c.key_group in wanted for c in handle.changes) else None
    if not isinstance(handle, ChangelogStreamHandle):
        raise KeyedStateError(f"cannot reassign a changelog held in a {type(handle).__name__}")
    common = _common(handle.key_groups, wanted)
    if not common:
        return None
    narrowed = replace(handle, start_key_group=common.start, num_key_groups=len(common), handle_id=str(uuid.uuid4()))
    narrowed.state_size = narrowed.checkpointed_size = 0
    return narrowed


def _common(first: range, second: range) -> range:
    """The key groups in both ranges (empty if none)."""
    return range(max(first.start, second.start), min(first.stop, second.stop))


def _intersection(handle, wanted: range):
    common = _common(handle.key_groups, wanted)
    if not common:
        return None
    if isinstance(handle, KeyGroupsHandle):
        offsets = handle.offsets[common.start - handle.start_key_group : common.stop - handle.start_key_group]
        return KeyGroupsHandle(handle.tag, common.start, offsets, handle.delegate, handle.handle_id)
    return handle


def _size(handle) -> int:
    if isinstance(handle, IncrementalKeyedHandle):
        return max(handle.checkpointed_size, 0)
    return handle.delegate.size if handle.delegate else 0


def _file_key(delegate) -> tuple:
    """The file (or inline bytes) a key-groups handle reads, as a dictionary key."""
    return (type(delegate).__name__, *vars(delegate).values())


def key_group_starts(handles) -> dict[tuple, list[int]]:
    """Per file (``_file_key``), where its key groups start, as all of ``handles`` (key-groups
    handles, maybe views of part of a file) list them together: sorted, 0 left out."""
    starts: dict[tuple, set[int]] = {}
    for handle in handles:
        if isinstance(handle, KeyGroupsHandle) and handle.delegate is not None:
            starts.setdefault(_file_key(handle.delegate), set()).update(handle.offsets)
    return {key: sorted(found - {0}) for key, found in starts.items()}


def merge_key_groups(parts: list[tuple[KeyGroupsHandle, range]], wanted: range, read, name: str, starts: dict):
    """One key-groups handle over ``wanted`` from blocks of several snapshot files.

    A file is a header (the serialization proxy naming the states) then one block per key group,
    in key-group order; a block runs from its start to the next key group's start in the same file,
    or to the end of the file. The hashmap backend writes a block for every key group; the
    canonical format (RocksDB's full checkpoints of Flink 1.15) none for an empty one, whose offset
    is 0, as it stays in the new file. ``starts`` (``key_group_starts`` of all the old subtasks'
    handles) tells where a file's key groups start: a handle may list only some
    of its file's key groups (a view, as a rescale writes it), so its first offset can lie past
    blocks of key groups it does not hold. Where they are not known, those blocks stay in the
    header, which Flink's restore skips (it seeks to each key group's offset). Every file must
    begin with the same header: the shortest one read, which the others start with (a
    serialization proxy is read to its own end, so one cannot begin another unless they are the
    same). Returns the handle (delegate: the new file, relative to the checkpoint) and the file's
    bytes.
    """
    headers, blocks = set(), {}
    for handle, groups in parts:
        data = read(handle.delegate)
        ends = [start for start in starts.get(_file_key(handle.delegate), []) if start < len(data)] + [len(data)]
        headers.add(data[: ends[0]])
        for group in groups:
            start = handle.offsets[group - handle.start_key_group]
            if start:  # 0: an empty key group of the canonical format
                after = bisect.bisect_right(ends, start)
                blocks[group] = data[start : ends[after] if after < len(ends) else len(data)]
    header = min(headers, key=len)
    if any(not other.startswith(header) for other in headers):
        raise KeyedStateError("old subtasks' keyed state files describe their states differently")
    missing = [group for group in wanted if group not in blocks]
    if missing and blocks and all(holds_its_id(block, group) for group, block in blocks.items()):
        # the hashmap backend's format has no empty offset
        raise KeyedStateError(
            f"the new subtask of key groups {wanted.start} to {wanted.stop - 1} takes {len(missing)} of them (from"
            f" {missing[0]}) from no old subtask's keyed state; metadata version 3 holds one keyed handle per subtask,"
            " and the hashmap backend's file cannot leave a key group out (Flink: Unexpected key-group in restore.)"
        )
    merged = bytearray(header)
    offsets = []
    for group in wanted:
        block = blocks.get(group)
        offsets.append(len(merged) if block is not None else 0)
        merged += block or b""
    return KeyGroupsHandle(3, wanted.start, offsets, WrittenFileHandle(name, len(merged))), bytes(merged)


class _Overlaps:
    """Which of some key-group ranges overlap a wanted range, without looking at every range for
    every new subtask (p old handles for p' new subtasks would be p × p' checks: 12.6 million
    from 4,096 to 3,072): the ranges sorted by start, those starting within the longest range's
    length before the wanted one's start looked at."""

    def __init__(self, ranges: list[range]):
        self.ranges = ranges
        self.order = sorted(range(len(ranges)), key=lambda i: ranges[i].start)
        self.starts = [ranges[i].start for i in self.order]
        self.longest = max((len(r) for r in ranges), default=0)

    def of(self, wanted: range) -> list[int]:
        """Indexes of the ranges overlapping ``wanted``, in their own order."""
        low = bisect.bisect_left(self.starts, wanted.start - self.longest + 1)
        high = bisect.bisect_left(self.starts, wanted.stop)
        found = [i for i in self.order[low:high] if _common(self.ranges[i], wanted)]
        return sorted(found)


def reassign_keyed(
    old_handles: list, max_parallelism: int, new_parallelism: int, checkpoint_id: int, merge=None
) -> list[Optional[KeyedHandle]]:
    """One keyed handle (or None) per new subtask, from the old subtasks' handles.

    ``merge(parts, wanted, index)``, where given, combines several key-groups handles instead of a
    changelog handle (for metadata without one)."""
    pieces = [p for h in old_handles for p in _pieces(h)]
    changelogs = [h for h in old_handles if isinstance(h, ChangelogBackendHandle) and h.non_materialized]
    if changelogs and merge is not None:
        raise KeyedStateError("ckpt does not reassign the changelog state backend's state in metadata version 3 (Flink 1.15)")
    result: list[Optional[KeyedHandle]] = []
    overlapping_pieces = _Overlaps([p.key_groups for p in pieces])
    for index in range(new_parallelism):
        wanted = key_group_range(max_parallelism, new_parallelism, index)
        candidates = [pieces[i] for i in overlapping_pieces.of(wanted)]  # in the old handles' order
        parts = []
        for part in (_intersection(p, wanted) for p in candidates):
            # an incremental handle shared by several old subtasks (after an earlier rescale) counts once
            if part is not None and part not in parts:
                parts.append(part)
        overlapping = [h for h in changelogs if _common(h.key_groups, wanted)]
        deltas = [d for h in overlapping for d in (_changelog_intersection(c, wanted) for c in h.non_materialized) if d]
        if deltas:
            held = _common(
                range(min(h.key_groups.start for h in overlapping), max(h.key_groups.stop for h in overlapping)), wanted
            )
            result.append(
                ChangelogBackendHandle(
                    tag=CHANGELOG_V2,
                    start_key_group=held.start,
                    num_key_groups=len(held),
                    checkpointed_size=sum(h.checkpointed_size for h in overlapping),
                    materialized=parts,
                    non_materialized=deltas,
                    materialization_id=max(h.materialization_id for h in overlapping),
                    checkpoint_id=checkpoint_id,
                    handle_id=str(uuid.uuid4()),
                )
            )
            continue
        if len(parts) <= 1:
            result.append(parts[0] if parts else None)
            continue
        if merge is not None:
            if not all(isinstance(p, KeyGroupsHandle) for p in parts):
                raise KeyedStateError(
                    "this Flink version's metadata holds one keyed handle per subtask and no changelog handle: "
                    "RocksDB state of several old subtasks cannot be combined; choose a parallelism where each "
                    "new subtask's key groups come from one old subtask"
                )
            originals = [(p, _common(p.key_groups, wanted)) for p in candidates if isinstance(p, KeyGroupsHandle)]
            result.append(merge([(p, r) for p, r in originals if len(r)], wanted, index))
            continue
        result.append(
            ChangelogBackendHandle(
                tag=CHANGELOG_V2,
                start_key_group=wanted.start,
                num_key_groups=len(wanted),
                checkpointed_size=sum(_size(p) for p in parts),
                materialized=parts,
                non_materialized=[],
                materialization_id=0,
                checkpoint_id=checkpoint_id,
                handle_id=str(uuid.uuid4()),
            )
        )
    return result
