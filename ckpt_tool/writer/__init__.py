"""Write checkpoints: data files first, ``_metadata`` last, never over an existing checkpoint."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Optional

from ckpt_tool.errors import CkptError, OutputExistsError
from ckpt_tool.flink.checkpoint import METADATA_FILE, Checkpoint
from ckpt_tool.flink.metadata import (
    MERGED,
    OPERATOR_STATE,
    PLAIN,
    SEGMENT_OPERATOR_STATE,
    channel_handle_form,
    map_stream_handles,
    merging_gains,
    metadata_chunks,
    set_channel_handle_form,
)
from ckpt_tool.flink.model import (
    CheckpointMetadata,
    FileHandle,
    OperatorStateHandle,
    RelativeFileHandle,
    SegmentFileHandle,
    WrittenFileHandle,
)
from ckpt_tool.storage import io_for, is_local, join, normalize_uri, parent, within
from ckpt_tool.writer.claim import Claim, claimed, is_output_name

Progress = Optional[Callable[[int, int], None]]


class DestinationError(CkptError):
    """A destination that ckpt must not write to."""


def _canonical(uri: str) -> str:
    """One spelling of a location, symlinks resolved where local, for comparing locations."""
    uri = normalize_uri(uri).rstrip("/")
    return os.path.realpath(uri) if is_local(uri) else uri


def check_destination(dst: str, source: Optional[str] = None) -> None:
    """Refuse a destination that holds a checkpoint, is a file, or lies inside the source
    checkpoint (Flink's checkpoint cleanup would delete it with the source) or around it."""
    if is_local(dst) and os.path.isfile(normalize_uri(dst)):
        raise DestinationError(f"destination {dst} is a file; give a directory (it may not exist yet)")
    if source is not None:
        where, origin = _canonical(dst), _canonical(source)
        if within(where, origin):
            raise DestinationError(
                f"destination {dst} is inside the source checkpoint {source}; Flink's checkpoint cleanup would delete "
                "it with the source: choose a directory outside Flink's checkpoint directories"
            )
        if within(origin, where):
            raise DestinationError(f"destination {dst} contains the source checkpoint {source}; choose another directory")
    if io_for(dst).exists(join(dst, METADATA_FILE)):
        raise OutputExistsError(f"{join(dst, METADATA_FILE)} already exists; choose a new destination")


def readable_mode(source: Checkpoint) -> int:
    """Permission bits for every file written: no more readable than any local file of the
    source (nor than the umask allows); the owner, who read the source, keeps read and write."""
    umask = os.umask(0)
    os.umask(umask)
    mode = 0o666 & ~umask
    if is_local(source.uri):
        for path in [join(source.uri, METADATA_FILE), *source.referenced_files()]:
            try:
                mode &= os.stat(path).st_mode
            except OSError:
                continue  # missing files are reported where they are read
    return mode | 0o600


def release_source_directories(metadata: CheckpointMetadata) -> None:
    """Make every file-merging operator handle (tag 17) a plain one (tag 4) with the same delegate,
    and drop the empty ones (which hold nothing, and which Flink's restore passes over), in place.

    A file-merging handle names its job's ``taskowned/`` and ``shared/`` directories, which Flink
    registers as shared state on restore and deletes once it owns the restored checkpoint (CLAIM
    mode) and no checkpoint refers to them: an output keeping them would let Flink delete the
    source's files. Flink's own repartitioner makes the same plain handles at a new parallelism.
    """
    for op in metadata.operators:
        for s in op.subtasks:
            for name in ("managed_operator", "raw_operator"):
                handle: Optional[OperatorStateHandle] = getattr(s, name)
                if handle is not None and handle.tag == SEGMENT_OPERATOR_STATE:
                    plain = None if handle.is_empty else OperatorStateHandle(OPERATOR_STATE, handle.states, handle.delegate)
                    setattr(s, name, plain)


def where_read(handle: FileHandle | RelativeFileHandle | SegmentFileHandle, location: str):
    """A file outside the source's directories (another job's, in CLAIM mode), referenced where
    ckpt read it: where Flink wrote it, or beside the source's job directory where a copy of the
    whole checkpoints directory keeps it (``PathMapping``), so that Flink finds it there too."""
    if isinstance(handle, RelativeFileHandle) or normalize_uri(handle.path) == location:
        return handle
    return replace(handle, path="file:" + os.path.abspath(location) if is_local(location) else location)


def write_checkpoint(
    src: Checkpoint,
    metadata: CheckpointMetadata,
    dst: str,
    new_files: dict[str, bytes],
    progress: Progress = None,
    already_written: frozenset[str] = frozenset(),
    claim: Optional[Claim] = None,
    channel_handles: Optional[str] = None,
    source_form: Optional[str] = None,
) -> CheckpointMetadata:
    """Write ``metadata`` as a checkpoint at ``dst``, under ``claim`` (else under a claim of its own).

    ``new_files`` maps names relative to ``dst`` to their bytes (referenced from ``metadata`` by
    ``WrittenFileHandle``); ``already_written`` names relative files an engine wrote there (the
    same). A source's ``RelativeFileHandle`` is copied like its other files, whatever its name.
    Files of ``src`` that ``metadata`` still references and that lie inside the source checkpoint
    or its job directory (RocksDB's ``shared/``, file merging's ``shared/`` and ``taskowned/``) are
    copied into ``dst`` under names of ckpt's own (a handle's path never becomes an output path)
    and referenced relative to it (``metadata`` is changed in place), so the output can be moved;
    a file-merging segment becomes a file of its own (its offsets count from the segment's start,
    as a file's do). Files outside are left where they are. File-merging operator handles become
    plain ones (``release_source_directories``). Channel state handles are written in the form
    ``channel_handles`` names (``plain`` or ``merged``), by default in the form of ``src``'s
    (``channel_handle_form``): what Flink wrote, Flink reads; but plain where merged handles would
    each hold one channel (``merging_gains``), as they would only be larger. ``source_form``: the
    form of ``src``'s handles where the caller took it before ``src`` forgot its metadata. Every
    file is made no more readable than the source's, and ``_metadata`` is written last.
    """
    dst = normalize_uri(dst).rstrip("/")
    check_destination(dst)
    if claim is None:
        with claimed(dst) as own:
            return write_checkpoint(src, metadata, dst, new_files, progress, already_written, own, channel_handles, source_form)
    out = io_for(dst)
    job_dir = parent(src.uri)
    copies: dict[tuple[str, Optional[tuple[int, int]]], str] = {}  # (source location, segment) -> name in dst

    def carry(handle):
        """Copy a file of the source (or the segment of one a file-merging handle names) into
        ``dst`` and refer to it relative to the checkpoint, so that the output can be moved or
        downloaded and still restores."""
        if isinstance(handle, WrittenFileHandle):
            return handle  # this run's own file, or a copy made here (a source's file of the same name is still copied)
        if not isinstance(handle, (FileHandle, RelativeFileHandle, SegmentFileHandle)):
            return handle
        location = src.file_location(handle)
        if not any(location.startswith(base + "/") for base in (src.uri, job_dir)):
            return where_read(handle, location)  # outside the source's directories: left where it is
        segment = (handle.start, handle.size) if isinstance(handle, SegmentFileHandle) else None
        name = copies.setdefault((location, segment), f"ckpt-copy-{len(copies):06d}")
        return WrittenFileHandle(name, handle.size)

    def copied(location: str, segment: Optional[tuple[int, int]]) -> bytes:
        return src.io.read(location) if segment is None else src.io.read_range(location, *segment)

    form = channel_handles or source_form or channel_handle_form(src.metadata)
    if channel_handles is None and form == MERGED and not merging_gains(metadata):
        form = PLAIN  # a merged handle per channel would only be larger
    set_channel_handle_form(metadata, form)
    release_source_directories(metadata)
    map_stream_handles(metadata, carry)
    writes = [(join(dst, name), lambda data=data: data) for name, data in sorted(new_files.items())]
    writes += [(join(dst, name), lambda piece=piece: copied(*piece)) for piece, name in sorted(copies.items(), key=str)]
    # journaled before they are created (and an engine's files, journaled before it ran; files a
    # caller wrote under names of its own are its own)
    claim.will_create([*sorted(new_files), *copies.values(), *sorted(n for n in already_written if is_output_name(n))])
    for done, (target, content) in enumerate(writes, start=1):
        out.write(target, content())
        if progress:
            progress(done, len(writes))
    mode = readable_mode(src)
    for uri in claim.created_files():  # this run's files only; a link or hard link there is refused
        out.set_mode(uri, mode)
    published = join(dst, METADATA_FILE)
    chunks = metadata_chunks(metadata)  # serialized whole before the file is created
    out.write_stream(published, chunks)
    try:
        out.set_mode(published, mode)
    except BaseException:
        out.delete(published)  # ckpt's own: it did not exist a moment ago
        raise
    return metadata
