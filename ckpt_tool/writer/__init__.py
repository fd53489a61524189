"""Write checkpoints: data files first, ``_metadata`` last, never over an existing checkpoint."""

from __future__ import annotations

import copy
from typing import Callable, Optional

from ckpt_tool.errors import OutputExistsError
from ckpt_tool.flink.checkpoint import METADATA_FILE, Checkpoint
from ckpt_tool.flink.metadata import iter_stream_handles, write_metadata
from ckpt_tool.flink.model import CheckpointMetadata, FileHandle, RelativeFileHandle, SegmentFileHandle
from ckpt_tool.storage import io_for, join, normalize_uri, parent

Progress = Optional[Callable[[int, int], None]]


def flink_path(uri: str) -> str:
    """A location spelled as Flink writes it in handles (``file:/…`` for local files)."""
    uri = normalize_uri(uri)
    return uri if "://" in uri else "file:" + uri


def check_destination(dst: str) -> None:
    if io_for(dst).exists(join(dst, METADATA_FILE)):
        raise OutputExistsError(f"{join(dst, METADATA_FILE)} already exists; choose a new destination")


def relocate(src: Checkpoint, dst: str, progress: Progress = None) -> CheckpointMetadata:
    """Copy a checkpoint to ``dst`` with every file it references, so that it restores from there.

    Files inside the checkpoint directory or its job directory (RocksDB's ``shared/``) are copied
    to the same relative place under ``dst``; handles are re-pointed at the copies. Handles that
    are relative to the checkpoint stay as they are. Files outside are left where they are.
    """
    dst = normalize_uri(dst).rstrip("/")
    check_destination(dst)
    metadata = copy.deepcopy(src.metadata)
    out = io_for(dst)
    job_dir = parent(src.uri)
    copies: dict[str, str] = {}
    for handle in iter_stream_handles(metadata):
        if not isinstance(handle, (FileHandle, RelativeFileHandle, SegmentFileHandle)):
            continue
        location = src.location(handle)
        if location.startswith(src.uri + "/"):
            target = dst + location[len(src.uri):]
        elif location.startswith(job_dir + "/"):
            target = dst + location[len(job_dir):]
        else:
            continue
        copies[location] = target
        if not isinstance(handle, RelativeFileHandle):
            handle.path = flink_path(target)
    for done, (source, target) in enumerate(sorted(copies.items()), start=1):
        out.write(target, src.io.read(source))
        if progress:
            progress(done, len(copies))
    out.write(join(dst, METADATA_FILE), write_metadata(metadata))
    return metadata
