"""A checkpoint at a URI: its parsed ``_metadata`` and access to the files its handles name."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Optional

import xxhash

from ckpt_tool.errors import CheckpointFormatError, StorageError
from ckpt_tool.flink.changelog import COMPRESSED, changelog_files
from ckpt_tool.flink.job_dir import newest_complete
from ckpt_tool.flink.metadata import iter_stream_handles, map_stream_handles, read_metadata
from ckpt_tool.flink.model import (
    ByteStreamHandle,
    CheckpointMetadata,
    EmptySegmentFileHandle,
    FileHandle,
    RelativeFileHandle,
    SegmentFileHandle,
)
from ckpt_tool.storage import FileIO, io_for, is_local, join, normalize_uri, parent, within

METADATA_FILE = "_metadata"
# The most ckpt reads of a _metadata file (its size from the open file, before reading): a job at
# parallelism 4,096 whose all-to-all exchange has in-flight data on every channel writes about
# 1.1 GB (16.7 million channel handles); a larger one is refused unread.
MAX_METADATA_BYTES = 2 * 1024 * 1024 * 1024


@dataclass
class PathMapping:
    """Maps the absolute paths Flink wrote onto where the checkpoint is now.

    Flink's handles may hold absolute paths into the job's checkpoint directory:
    ``…/<job>/chk-7/<uuid>`` (exclusive), ``…/<job>/shared/<uuid>`` (RocksDB incremental),
    ``…/<job>/taskowned/<uuid>`` and ``…/<job>/dstl/<uuid>`` (the changelog state backend's
    files, where its ``state.changelog.dstl.dfs.base-path`` is the checkpoint directory); with file
    merging (FLIP-306) one directory deeper: ``…/<job>/shared/job_<id>_op_<op>_<subtask>_<parallelism>/<uuid>``
    and ``…/<job>/taskowned/job_<id>_tm_<tm>/<uuid>``. A checkpoint copied elsewhere keeps those
    paths; the original ``chk-<id>`` directory is found at the checkpoint's current location, and
    anything else under the original job directory at the same place under the checkpoint's current
    parent. A job restored in CLAIM mode (or LEGACY) references files under the directory of the
    job it was restored from (``…/<old-job>/shared/<uuid>``): the original job directory is the one
    named as the checkpoint's current parent is, else the one most of its files lie under. Such a
    job's files are read beside the checkpoint's job directory where they were copied along with it
    (``<checkpoints>/<old-job>/shared/<uuid>``, as a copy of the whole checkpoints directory keeps
    them: ``exists`` finds the first one), else where Flink wrote them. A checkpoint with no file
    in its own directory whose files all lie in another job's (ckpt's output carries its own files
    relative to itself, and references such files where it found them) is not taken for moved
    where its first file is still where it was written, in the checkpoint's kind of store, and not
    beside it.
    """

    original_job_dir: str | None
    original_checkpoint_dir: str | None
    checkpoint_dir: str
    siblings: dict[str, str] = field(default_factory=dict)  # another job's original directory -> where it is now

    @staticmethod
    def detect(metadata: CheckpointMetadata, checkpoint_dir: str, exists: Optional[Callable[[str], bool]] = None) -> PathMapping:
        paths = [normalize_uri(h.path) for h in iter_stream_handles(metadata) if isinstance(h, (FileHandle, SegmentFileHandle))]
        exclusive = re.compile(rf"^(.*)/chk-{metadata.checkpoint_id}/.+$")
        job_owned = re.compile(r"^(.*)/(shared|taskowned|dstl)/([^/]+/)?[^/]+$")
        here = parent(normalize_uri(checkpoint_dir).rstrip("/")).rstrip("/").rsplit("/", 1)[-1]
        for pattern in (exclusive, job_owned):  # a file inside the checkpoint directory says most
            found = Counter(match.group(1) for match in map(pattern.match, paths) if match)
            if found:
                named = [job_dir for job_dir in found if job_dir.rsplit("/", 1)[-1] == here]
                job_dir = named[0] if named else found.most_common(1)[0][0]
                mapping = PathMapping(job_dir, f"{job_dir}/chk-{metadata.checkpoint_id}", checkpoint_dir)
                if pattern is job_owned and not named and exists is not None:
                    # only another job's files, none in the checkpoint's own directory (a checkpoint
                    # ckpt wrote carries its own): where they are not beside it but still where they
                    # were written, in the checkpoint's kind of store, they were never moved
                    first = next(path for path in paths if path.startswith(job_dir + "/"))
                    if is_local(first) == is_local(checkpoint_dir) and not exists(mapping.resolve(first)) and exists(first):
                        return PathMapping(None, None, checkpoint_dir)
                if exists is not None and mapping.original_checkpoint_dir != checkpoint_dir:
                    mapping.siblings = mapping._copied_along(paths, job_owned, exists)
                return mapping
        return PathMapping(None, None, checkpoint_dir)

    def _copied_along(self, paths: list[str], job_owned: re.Pattern, exists: Callable[[str], bool]) -> dict[str, str]:
        """The directories of other jobs beside the original job directory (in the checkpoints
        directory) whose files lie at the same place beside the checkpoint's job directory now,
        each tried once, on its first file (a path each: millions of channel handles name a few files)."""
        assert self.original_job_dir is not None
        own, beside = self.original_job_dir + "/", parent(self.original_job_dir).rstrip("/") + "/"
        base = parent(parent(self.checkpoint_dir)).rstrip("/")
        siblings: dict[str, str] = {}
        tried: set[str] = set()
        for path in paths:
            if path.startswith(own) or not path.startswith(beside):
                continue
            name = path[len(beside) :].split("/", 1)[0]
            if name in tried or not job_owned.match(path):
                continue
            tried.add(name)
            other, now = beside + name, f"{base}/{name}"
            if now != other and exists(now + path[len(other) :]):
                siblings[other] = now
        return siblings

    def resolve(self, path: str) -> str:
        path = normalize_uri(path)
        job_dir, checkpoint_dir = self.original_job_dir, self.original_checkpoint_dir
        if job_dir is None or checkpoint_dir is None or checkpoint_dir == self.checkpoint_dir:
            return path
        if path.startswith(checkpoint_dir + "/"):
            return self.checkpoint_dir + path[len(checkpoint_dir) :]
        if path.startswith(job_dir + "/"):
            return parent(self.checkpoint_dir) + path[len(job_dir) :]
        for other, now in self.siblings.items():
            if path.startswith(other + "/"):
                return now + path[len(other) :]
        return path


@dataclass
class Checkpoint:
    uri: str
    io: FileIO
    _metadata: Optional[CheckpointMetadata]  # None: forgotten (``forget_metadata``), read again when asked
    paths: PathMapping
    _locations: dict[tuple[bool, str], str] = field(default_factory=dict, repr=False, compare=False)
    chosen_from: Optional[str] = None  # the job directory it was chosen from, when it was given one
    _handle_locations: dict[int, tuple] = field(default_factory=dict, repr=False, compare=False)
    _job_dir: Optional[tuple[str, str]] = field(default=None, repr=False, compare=False)
    _beneath: dict[str, Optional[str]] = field(default_factory=dict, repr=False, compare=False)
    _metadata_digest: Optional[bytes] = field(default=None, repr=False, compare=False)  # of the bytes parsed
    _referenced: Optional[list[str]] = field(default=None, repr=False, compare=False)  # kept while forgotten

    @property
    def metadata(self) -> CheckpointMetadata:
        """The parsed ``_metadata``; read and parsed again if it was forgotten (the same bytes, or
        a CheckpointFormatError: the input changed while ckpt ran)."""
        if self._metadata is None:
            data = self.io.read_at_most(self.metadata_uri, MAX_METADATA_BYTES)
            if xxhash.xxh3_128_digest(data) != self._metadata_digest:
                raise CheckpointFormatError(f"{self.metadata_uri} changed while ckpt was reading the checkpoint")
            self._metadata = read_metadata(data, source=self.metadata_uri)
        return self._metadata

    @metadata.setter
    def metadata(self, metadata: CheckpointMetadata) -> None:
        self._metadata, self._metadata_digest, self._referenced = metadata, None, None

    @property
    def metadata_uri(self) -> str:
        return join(self.uri, METADATA_FILE)

    def forget_metadata(self) -> None:
        """Drop the parsed metadata until it is next asked for (then read again from the same
        bytes): a rewrite that has taken what it needs from the channel handles of a job at high
        parallelism no longer holds them (hundreds of MB at p=4,096). Only where the bytes it was
        parsed from are known (``open``). The files it references (a path each) are kept: the
        writer asks for them last, to make no output file more readable than the source's."""
        if self._metadata_digest is not None and self._metadata is not None:
            self._referenced = self.referenced_files()
            self._metadata = None

    @staticmethod
    def open(uri: str) -> Checkpoint:
        """Open a checkpoint directory (or its ``_metadata`` file) and parse the metadata. A job
        directory (``…/<job-id>/``, holding ``chk-<n>`` directories) stands for its newest
        complete checkpoint (``chosen_from`` then names it)."""
        uri = normalize_uri(uri).rstrip("/")
        if uri.endswith("/" + METADATA_FILE):
            uri = parent(uri)
        chosen_from = None
        if not io_for(uri).exists(join(uri, METADATA_FILE)):
            newest = newest_complete(io_for(uri), uri)
            if newest is None:
                raise StorageError(f"{uri} is not a checkpoint: it has no {METADATA_FILE} file")
            chosen_from, uri = uri, newest.uri
        io = io_for(uri).confined(job_directory(uri))  # every file named in the job directory is read there
        metadata_uri = join(uri, METADATA_FILE)
        data = io.read_at_most(metadata_uri, MAX_METADATA_BYTES)
        metadata = read_metadata(data, source=metadata_uri)
        refuse_escaping_paths(metadata, metadata_uri)
        checkpoint = Checkpoint(uri, io, metadata, PathMapping.detect(metadata, uri, exists), chosen_from=chosen_from)
        checkpoint._metadata_digest = xxhash.xxh3_128_digest(data)
        del data
        if is_local(uri):
            checkpoint.refuse_escaping_links()
        return checkpoint

    @property
    def job_dir(self) -> str:
        """The job directory: files named in it are read only where they really are inside it."""
        known = self._job_dir
        if known is None or known[0] != self.uri:  # worked out once (per uri): millions of channels ask
            known = self._job_dir = (self.uri, job_directory(self.uri))
        return known[1]

    def beneath(self, location: Optional[str]) -> Optional[str]:
        """The directory a file at ``location`` is read only inside of: the job directory where the
        file is local, else None (by location, worked out once: the channels of a file share it)."""
        if location is None:
            return None
        if location not in self._beneath:
            self._beneath[location] = self.job_dir if is_local(location) else None
        return self._beneath[location]

    def location(self, handle) -> str | None:
        """Where a stream handle's bytes are now, or None for inline data (by handle object: the
        channel handles of one file share their delegate, and a checkpoint may hold millions)."""
        known = self._handle_locations.get(id(handle))
        if known is not None and known[0] is handle:
            return known[1]
        location = self.file_location(handle) if isinstance(handle, (FileHandle, RelativeFileHandle, SegmentFileHandle)) else None
        self._handle_locations[id(handle)] = (handle, location)
        return location

    def file_location(self, handle: FileHandle | RelativeFileHandle | SegmentFileHandle) -> str:
        """Where a file handle's file is now (each path resolved once: checkpoints hold thousands)."""
        relative = isinstance(handle, RelativeFileHandle)
        key = (relative, handle.relative_path if isinstance(handle, RelativeFileHandle) else handle.path)
        if key not in self._locations:
            self._locations[key] = join(self.uri, key[1]) if relative else self.paths.resolve(key[1])
        return self._locations[key]

    def referenced_files(self) -> list[str]:
        """Every file the metadata references, where it is now, without duplicates."""
        if self._metadata is None and self._referenced is not None:  # forgotten: not read again for this
            return list(self._referenced)
        found = (self.location(h) for h in iter_stream_handles(self.metadata))
        return sorted({uri for uri in found if uri is not None})

    def file_problems(self) -> Iterator[str]:
        """One message per referenced file that is missing, not the size ``_metadata`` records (a
        changelog file has one byte more, its compression flag; a compressed one is not measured: its
        recorded size counts uncompressed bytes) or, for file merging's physical files, shorter than a
        segment it holds."""
        recorded: dict[str, int] = {}
        segment_ends: dict[str, int] = {}
        for handle in iter_stream_handles(self.metadata):
            if isinstance(handle, (FileHandle, RelativeFileHandle)):
                recorded[self.file_location(handle)] = handle.size
            elif isinstance(handle, SegmentFileHandle):
                uri = self.file_location(handle)
                segment_ends[uri] = max(segment_ends.get(uri, 0), handle.start + handle.size)
        changelog = {self.location(h) for h in changelog_files(self.metadata)}
        for uri in self.referenced_files():
            if not self.io.exists(uri):
                yield f"{uri} is missing: the checkpoint's _metadata references it"
                continue
            if uri in recorded:
                expected = recorded[uri]
                if uri in changelog:
                    if self.io.read_range(uri, 0, 1) == bytes([COMPRESSED]):
                        continue
                    expected += 1
                if self.io.size(uri) != expected:
                    yield f"{uri} has {self.io.size(uri)} bytes, but the checkpoint's _metadata records {expected}"
            elif uri in segment_ends and self.io.size(uri) < segment_ends[uri]:
                end = segment_ends[uri]
                yield f"{uri} has {self.io.size(uri)} bytes, but a segment the checkpoint's _metadata records ends at {end}"

    def refuse_escaping_links(self) -> None:
        """A referenced file inside the job directory that is a symbolic link out of it (to
        ``/etc/shadow``, say) is refused: its bytes would be read, and copied into an output.
        Checked here once, early, for a clear message before anything is written; every read
        checks it again on the file it opens (``FileIO.confined``), as a link may be swapped in
        while ckpt runs."""
        job_dir = self.job_dir
        real_job_dir = os.path.realpath(job_dir)
        real_dirs: dict[str, str] = {}
        for uri in map(os.path.abspath, self.referenced_files()):
            if not within(uri, job_dir):
                continue  # a file Flink shares with other jobs (CLAIM mode): left where it is, never copied
            directory, name = os.path.split(uri)
            if directory not in real_dirs:
                real_dirs[directory] = os.path.realpath(directory)
            real = os.path.join(real_dirs[directory], name)
            if os.path.islink(real):
                real = os.path.realpath(real)
            if not within(real, real_job_dir):
                raise CheckpointFormatError(
                    f"{uri} is a symbolic link to {real}, outside the checkpoint's job directory {job_dir}: refused"
                )

    def require_files(self) -> None:
        """Fail with a clear error if a referenced file is missing or not the size recorded."""
        for problem in self.file_problems():
            raise StorageError(problem)

    def handle_bytes(self, handle) -> bytes:
        """The whole content of a stream handle (a file, a file segment or inline data)."""
        if isinstance(handle, ByteStreamHandle):
            return handle.data
        if isinstance(handle, EmptySegmentFileHandle):
            return b""
        uri = self.location(handle)
        if uri is None:
            raise CheckpointFormatError(f"cannot read state from a {type(handle).__name__}")
        if isinstance(handle, SegmentFileHandle):
            return self.io.read_range(uri, handle.start, handle.size)
        return self.io.read(uri)


def exists(uri: str) -> bool:
    """Whether a file is at ``uri``, in whichever store it names."""
    return io_for(uri).exists(uri)


def job_directory(uri: str) -> str:
    """The job directory of the checkpoint at ``uri``: its parent (absolute, where local)."""
    return parent(uri) if not is_local(uri) else os.path.dirname(os.path.abspath(normalize_uri(uri)))


def _escapes(path: str) -> bool:
    return ".." in path.split("/")


def refuse_escaping_paths(metadata: CheckpointMetadata, source: str) -> None:
    """Refuse, as corrupt, a handle whose path could lead out of where it belongs: a relative
    path that is absolute, empty, a URI or has a ``..`` segment, or any path with a ``..``
    segment (Flink writes neither). Names the operator and subtask that hold it."""
    owner = ["", ""]

    def enter(op, subtask) -> None:
        owner[:] = [op.label, "its coordinator" if subtask is None else f"subtask {subtask.index}"]

    def check(handle):
        if isinstance(handle, RelativeFileHandle):
            path = handle.relative_path
            bad = not path or path.startswith("/") or "://" in path or _escapes(path)
        elif isinstance(handle, (FileHandle, SegmentFileHandle)):
            path = handle.path
            bad = _escapes(normalize_uri(path))
        else:
            return handle
        if bad:
            raise CheckpointFormatError(
                f"{source}: operator {owner[0]}, {owner[1]}: the state handle path {path!r} leads out of the checkpoint; refused"
            )
        return handle

    map_stream_handles(metadata, check, enter)
