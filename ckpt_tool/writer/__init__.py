"""Write checkpoints: data files first, ``_metadata`` last, never over an existing checkpoint."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Optional

from ckpt_tool.errors import CkptError, OutputExistsError
from ckpt_tool.flink.checkpoint import METADATA_FILE, Checkpoint
from ckpt_tool.flink.metadata import map_stream_handles, write_metadata
from ckpt_tool.flink.model import CheckpointMetadata, FileHandle, RelativeFileHandle, SegmentFileHandle
from ckpt_tool.storage import io_for, join, normalize_uri, parent
from ckpt_tool.storage.base import is_s3

Progress = Optional[Callable[[int, int], None]]


class DestinationError(CkptError):
    """A destination that ckpt must not write to."""


def flink_path(uri: str) -> str:
    """A location spelled as Flink writes it in handles (``file:/…`` for local files)."""
    uri = normalize_uri(uri)
    return uri if "://" in uri else "file:" + uri


def _canonical(uri: str) -> str:
    """One spelling of a location, symlinks resolved where local, for comparing locations."""
    uri = normalize_uri(uri).rstrip("/")
    return uri if is_s3(uri) else os.path.realpath(uri)


def _inside(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer + "/")


def check_destination(dst: str, source: Optional[str] = None) -> None:
    """Refuse a destination that holds a checkpoint, is a file, or lies inside the source
    checkpoint (Flink's checkpoint cleanup would delete it with the source) or around it."""
    if not is_s3(dst) and os.path.isfile(normalize_uri(dst)):
        raise DestinationError(f"destination {dst} is a file; give a directory (it may not exist yet)")
    if source is not None:
        where, origin = _canonical(dst), _canonical(source)
        if _inside(where, origin):
            raise DestinationError(
                f"destination {dst} is inside the source checkpoint {source}; Flink's checkpoint cleanup would delete "
                "it with the source: choose a directory outside Flink's checkpoint directories"
            )
        if _inside(origin, where):
            raise DestinationError(f"destination {dst} contains the source checkpoint {source}; choose another directory")
    if io_for(dst).exists(join(dst, METADATA_FILE)):
        raise OutputExistsError(f"{join(dst, METADATA_FILE)} already exists; choose a new destination")


@contextmanager
def fresh_destination(dst: str) -> Iterator[None]:
    """Refuse a destination holding a checkpoint; if the work inside fails, remove every file it
    added there, so that a failed command leaves nothing behind."""
    check_destination(dst)
    io = io_for(dst)
    before = set(io.list(dst))
    try:
        yield
    except BaseException:
        for uri in io.list(dst):
            if uri not in before:
                io.delete(uri)
        raise


def write_checkpoint(
    src: Checkpoint,
    metadata: CheckpointMetadata,
    dst: str,
    new_files: dict[str, bytes],
    progress: Progress = None,
    already_written: frozenset[str] = frozenset(),
) -> CheckpointMetadata:
    """Write ``metadata`` as a checkpoint at ``dst``.

    ``new_files`` maps names relative to ``dst`` to their bytes (referenced from ``metadata`` by
    ``RelativeFileHandle``); ``already_written`` names relative files an engine wrote there.
    Files of ``src`` that ``metadata`` still references and that lie inside the source checkpoint
    or its job directory (RocksDB's ``shared/``) are copied to the same relative place under
    ``dst`` and referenced relative to it (``metadata`` is changed in place), so the output can
    be moved. Files outside are left where they are. ``_metadata`` is written last.
    """
    dst = normalize_uri(dst).rstrip("/")
    check_destination(dst)
    out = io_for(dst)
    job_dir = parent(src.uri)
    copies: dict[str, str] = {}
    carried: set[int] = set()  # handles made here (a handle object may be reached more than once)

    def carry(handle):
        """Copy a file of the source into ``dst`` and refer to it relative to the checkpoint, so
        that the output can be moved or downloaded and still restores."""
        if id(handle) in carried or (
            isinstance(handle, RelativeFileHandle)
            and (handle.relative_path in new_files or handle.relative_path in already_written)
        ):
            return handle
        if not isinstance(handle, (FileHandle, RelativeFileHandle, SegmentFileHandle)):
            return handle
        location = src.file_location(handle)
        for base in (src.uri, job_dir):
            if location.startswith(base + "/"):
                relative = location[len(base) + 1 :]
                break
        else:
            return handle  # outside the source's directories: left where it is
        copies[location] = join(dst, relative)
        moved: SegmentFileHandle | RelativeFileHandle
        if isinstance(handle, SegmentFileHandle):
            handle.path = flink_path(copies[location])
            moved = handle
        else:
            moved = RelativeFileHandle(relative, handle.size)
        carried.add(id(moved))
        return moved

    map_stream_handles(metadata, carry)
    writes = [(join(dst, name), lambda data=data: data) for name, data in sorted(new_files.items())]
    writes += [(target, lambda source=source: src.io.read(source)) for source, target in sorted(copies.items())]
    for done, (target, content) in enumerate(writes, start=1):
        out.write(target, content())
        if progress:
            progress(done, len(writes))
    out.write(join(dst, METADATA_FILE), write_metadata(metadata))
    return metadata
