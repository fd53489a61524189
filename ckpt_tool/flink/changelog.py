"""The changelog state backend's files (``state.changelog.storage: filesystem``, Flink's DSTL).

A changelog file starts with one byte, 1 when its contents are compressed, then holds the change
sets of one or more changelog handles (``StateChangeFormat``): a handle's ``(file, offset)`` pair
points, ``offset`` bytes after that first byte, at a change set: the number of key groups, then
per key group the number of changes, the key group (-1 for state metadata) and each change as a
length and its bytes. The size Flink records for a changelog file counts the bytes after the
first one (uncompressed).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.javaio import JavaReader
from ckpt_tool.flink.model import ChangelogBackendHandle, ChangelogStreamHandle, CheckpointMetadata, StreamHandle

COMPRESSED = 1
METADATA_KEY_GROUP = -1  # StateChange.META_KEY_GROUP


@dataclass
class ChangeSet:
    """What one change set holds: data changes, metadata changes and the key groups changed."""

    data_changes: int
    metadata_changes: int
    key_groups: set[int]


def changelog_handles(
    metadata: CheckpointMetadata,
) -> Iterator[tuple[str, int, ChangelogBackendHandle, ChangelogStreamHandle]]:
    """(operator label, subtask index, backend handle, changelog handle) of every changelog
    handle in file storage."""
    for op in metadata.operators:
        for s in op.subtasks:
            for keyed in (s.managed_keyed, s.raw_keyed):
                if isinstance(keyed, ChangelogBackendHandle):
                    for handle in keyed.non_materialized:
                        if isinstance(handle, ChangelogStreamHandle):
                            yield op.label, s.index, keyed, handle


def changelog_files(metadata: CheckpointMetadata) -> list[StreamHandle]:
    """The stream handles of every changelog file the checkpoint references."""
    return [file for *_, handle in changelog_handles(metadata) for file, _ in handle.handles_and_offsets if file]


def read_change_set(data: bytes, offset: int, source: str) -> ChangeSet:
    """Decode the change set at ``offset`` of a changelog file's bytes ``data``."""
    if not data:
        raise CheckpointFormatError(f"{source}: an empty changelog file")
    if data[0] == COMPRESSED:
        raise CheckpointFormatError(f"{source}: a compressed changelog file (state.changelog.dstl.dfs.compression.enabled)")
    if not 0 <= offset < len(data) - 1:
        raise CheckpointFormatError(f"{source}: change set offset {offset} is outside the file's {len(data) - 1} bytes")
    reader = JavaReader(data, source)
    reader.pos = 1 + offset
    found = ChangeSet(0, 0, set())
    for _ in range(reader.count("number of key groups")):
        changes = reader.count("number of changes")
        key_group = reader.i32("key group")
        for _ in range(changes):
            reader.raw(reader.count("change length"), "state change")
        if key_group == METADATA_KEY_GROUP:
            found.metadata_changes += changes
        else:
            found.data_changes += changes
            found.key_groups.add(key_group)
    return found
