"""Channel-state files (in-flight network buffers): the one reader, the one writer, and which channels pair.

A channel-state file, as ``ChannelStateSerializerImpl`` writes it, is an int version (0) followed
by buffers, each an int length and that many bytes. A channel handle lists the offsets of its
buffers' length fields, in the order they were written. Several channels, and with
``execution.checkpointing.unaligned.max-subtasks-per-channel-state-file`` several subtasks, share
one file.

A logical channel upstream subtask u -> downstream subtask d is the input state of d for
(gate, channel) followed by the output state of u for (partition, subpartition). Records run
across the boundary: the output side often starts with the tail of a record whose head ends the
input side, so the two are stitched before records are split. Which input channel and which
subpartition connect u and d depends on the edge's distribution pattern (see
:func:`pointwise_channels`); ``ckpt_tool.engine.channels`` pairs them, as columns.

Everything here reads and writes through ``FileIO``: local files are memory-mapped and read
buffer by buffer, object stores are read with ranged GETs. Sizes come from the bytes that are
really there, never from the metadata alone.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.model import ByteStreamHandle, ChannelStateHandle, SegmentFileHandle
from ckpt_tool.framing import framing as _framing
from ckpt_tool.storage import FileIO, io_for, is_local
from ckpt_tool.storage.local import LocalFileIO

if TYPE_CHECKING:
    from ckpt_tool.flink.checkpoint import Checkpoint

SERIALIZATION_VERSION = 0
HEADER = struct.pack(">i", SERIALIZATION_VERSION)
BUFFER_SIZE = 32 * 1024  # Flink's default network buffer (memory segment) size
_LENGTH = struct.Struct(">i")
SPAN_SLACK = 4096  # read past the last buffer's length field: at high parallelism buffers are small
SPAN_LIMIT = 1 << 20  # a span read into memory at most (about): a larger one is mapped, paged in as read
SPAN_GAP = 64 << 10  # buffers of a file further apart than this are read as separate runs
# local files whose header this process has read, by device, inode, size and modification time (a
# rescale at p=4,096 reads a span of each of 4,096 files in each of its tasks: the header once, not
# once a task); forked workers inherit it
_HEADED: set[tuple[int, int, int, int]] = set()
MAX_HEADED = 1 << 16
MAX_OPEN_MAPS = 128  # files a reader keeps mapped at once (each holds a descriptor; `ulimit -n` may be 1024)


# --- reading ----------------------------------------------------------------------------------


@dataclass(slots=True)
class BufferSource:
    """Where one channel handle's buffers are: a file (or a segment of one) or inline bytes, and
    the offsets of their length fields. Plain data, so that a task can carry it to a worker."""

    location: Optional[str]
    inline: Optional[bytes]
    segment: Optional[tuple[int, int]]
    offsets: Sequence[int] | np.ndarray  # not changed once built (a handle's own tuple, list or column, not a copy)
    beneath: Optional[str] = None  # the source's job directory: files named in it are read only there

    @staticmethod
    def of(checkpoint: Checkpoint, handle: ChannelStateHandle) -> BufferSource:
        """Where ``handle``'s buffers are (a checkpoint may hold millions: what its file says is
        worked out once per file, by the checkpoint)."""
        return BufferSource.in_delegate(checkpoint, handle.delegate, handle.offsets)

    @staticmethod
    def in_delegate(checkpoint: Checkpoint, delegate, offsets: Sequence[int] | np.ndarray) -> BufferSource:
        """Buffers at ``offsets`` of a channel handle's delegate (a file, a segment of one, or inline data)."""
        inline = delegate.data if isinstance(delegate, ByteStreamHandle) else None
        segment = (delegate.start, delegate.size) if isinstance(delegate, SegmentFileHandle) else None
        location = checkpoint.location(delegate)
        return BufferSource(location, inline, segment, offsets, checkpoint.beneath(location))

    @property
    def where(self) -> str:
        return self.location or "inline channel state"


class ChannelStateReader:
    """Reads the buffers of channel handles. Files stay open (mapped) for the reader's lifetime,
    since channels share files; ``close`` releases them. Use one reader per task."""

    def __init__(self) -> None:
        self._mapped: dict[str, Any] = {}  # memory maps (or bytes) of files, by URI
        self._local: dict[str, bool] = {}
        self._confined: dict[str, FileIO] = {}  # local FileIOs confined to a directory, by it

    def __enter__(self) -> ChannelStateReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for data in self._mapped.values():
            _close_map(data)
        self._mapped.clear()

    def payload(self, source: BufferSource) -> bytes:
        """The payloads of the source's buffers, concatenated: its part of a channel's stream."""
        data, offsets = self._data(source)
        return _payloads(data, offsets, source.where)

    def joined_payloads(self, sources: list[BufferSource]) -> tuple[bytes, np.ndarray]:
        """``payload`` of every source, concatenated in order, and each one's size in bytes: the
        sources of one local file are read with one call, however many there are."""
        groups: dict[Any, list[int]] = {}
        for index, source in enumerate(sources):
            groups.setdefault((source.location, source.segment) if source.inline is None else index, []).append(index)
        for key in [k for k in groups if isinstance(k, tuple) and (k[0] is None or not self._is_local(k[0]))]:
            for index in groups.pop(key):  # an object store's file is read by ranges, source by source
                groups[index] = [index]
        sizes = np.zeros(len(sources), dtype=np.int64)
        blobs = []
        for members in groups.values():
            first = sources[members[0]]
            data, shifted = self._data(first)  # an object store's offsets are shifted to the span read
            if len(members) == 1:
                offsets = np.asarray(shifted, dtype=np.int64)
            else:
                offsets = np.array(list(chain.from_iterable([sources[m].offsets for m in members])), dtype=np.int64)
            if len(offsets) and offsets.min() < len(HEADER):
                raise CheckpointFormatError(f"{first.where}: buffer offset {offsets.min()} is inside the file header")
            counts = np.array([len(sources[m].offsets) for m in members], dtype=np.int64)
            try:
                blob, found = _framing.payloads_many(data, offsets, counts)
            except ValueError as exc:
                raise CheckpointFormatError(f"{first.where}: {exc}") from None
            sizes[members] = np.frombuffer(found, dtype=np.int64)
            blobs.append((members, blob))
        return in_order(blobs, sizes), sizes

    def grouped_payloads(
        self, source: BufferSource, counts: np.ndarray, lengths: bool = True
    ) -> tuple[bytes, np.ndarray, Optional[np.ndarray]]:
        """The payloads of the source's buffers, concatenated, read with one call: group g is the
        next ``counts[g]`` buffers (a file's handles, one after another). Returns the bytes, each
        group's payload bytes, and with ``lengths`` each buffer's payload length (every buffer
        checked to lie in the file)."""
        if not lengths:
            read = self._span_payloads(source, counts)
            if read is not None:
                return read
        data, offsets = self._data(source)
        at = np.asarray(offsets, dtype=np.int64)
        if len(at) and at.min() < len(HEADER):
            raise CheckpointFormatError(f"{source.where}: buffer offset {at.min()} is inside the file header")
        try:
            blob, found = _framing.payloads_many(data, at, np.asarray(counts, dtype=np.int64))
        except ValueError as exc:
            raise CheckpointFormatError(f"{source.where}: {exc}") from None
        return blob, np.frombuffer(found, dtype=np.int64), _lengths_at(data, at) if lengths else None

    def _span_payloads(self, source: BufferSource, counts: np.ndarray) -> Optional[tuple[bytes, np.ndarray, None]]:
        """``grouped_payloads`` without lengths of a local file not mapped yet, from the spans of
        its buffers read into memory (with the header): a task of a rescale at p=4,096 reads a few
        kB of each of 4,096 files, where mapping each file costs more than reading its spans. The
        buffers are read in runs, a new one where the next buffer lies more than SPAN_GAP bytes on
        (a route task's upstream subtasks u and u + p' lie far apart in a downstream subtask's file:
        one span from the first to the last read most of every file for each task). None where
        the runs hold over about ``SPAN_LIMIT`` bytes or do not read cleanly: the mapped path then
        reads the file and says what is wrong, in its words."""
        location = source.location
        if source.inline is not None or source.segment or location is None or location in self._mapped:
            return None
        if not len(source.offsets) or not self._is_local(location):
            return None
        io = self._io(location, source.beneath)
        if not isinstance(io, LocalFileIO):
            return None
        at = np.ascontiguousarray(source.offsets, dtype=np.int64)
        found_runs = _framing.span_runs(at, SPAN_GAP)  # (first, last) offsets, in file order
        firsts = [first for first, _ in found_runs]
        lasts = [last for _, last in found_runs]
        if firsts[0] < len(HEADER) or sum(lasts) - sum(firsts) > SPAN_LIMIT:
            return None

        def run(read, first: int, last: int) -> Optional[bytes]:
            """The bytes from the buffer at ``first`` to the end of the one at ``last``."""
            wanted = last + len(HEADER) - first  # up to the last buffer's length, and a page more
            data = read(first, wanted + SPAN_SLACK)
            if len(data) < wanted:
                return None
            (length,) = _LENGTH.unpack_from(data, wanted - len(HEADER))
            if length < 0 or wanted + length > 2 * SPAN_LIMIT:
                return None
            if wanted + length > len(data) == wanted + SPAN_SLACK:  # the rest of a larger last buffer
                data += read(first + len(data), wanted + length - len(data))
            return data if wanted + length <= len(data) else None

        def spans(read) -> Optional[list[bytes]]:
            identity = getattr(read, "identity", None)
            if identity is None or identity not in _HEADED:
                if read(0, len(HEADER)) != HEADER:
                    return None
                if identity is not None:
                    if len(_HEADED) >= MAX_HEADED:
                        _HEADED.clear()
                    _HEADED.add(identity)
            found, total = [], 0
            for first, last in zip(firsts, lasts):
                data = run(read, first, last)
                total += 0 if data is None else len(data)
                if data is None or total > 2 * SPAN_LIMIT:
                    return None
                found.append(data)
            return found

        runs = io.read_spans(location, spans)
        if not isinstance(runs, list):
            return None
        try:  # each buffer where its run lies, and ending inside its run (the bytes after it are not the file's)
            starts, many = np.array(firsts, dtype=np.int64), np.asarray(counts, dtype=np.int64)
            blob, found = _framing.payloads_in_runs(runs, starts, at, many)
        except ValueError:
            return None
        return blob, np.frombuffer(found, dtype=np.int64), None

    def _io(self, location: str, beneath: Optional[str]) -> FileIO:
        """The FileIO that reads ``location``, confined to ``beneath`` where given (a local one made
        once per directory: a batch maps thousands of files of one checkpoint)."""
        if beneath is None or not self._is_local(location):
            io = io_for(location)
            return io if beneath is None else io.confined(beneath)
        confined = self._confined.get(beneath)
        if confined is None:
            confined = self._confined[beneath] = io_for(location).confined(beneath)
        return confined

    def _is_local(self, location: str) -> bool:
        known = self._local.get(location)
        if known is None:
            known = self._local[location] = is_local(location)
        return known

    def payload_and_lengths(self, source: BufferSource) -> tuple[bytes, list[int]]:
        """The payloads concatenated, and each buffer's length."""
        data, offsets = self._data(source)
        stream = _payloads(data, offsets, source.where)
        return stream, [_LENGTH.unpack_from(data, o)[0] for o in offsets]

    def buffer_digests(self, source: BufferSource, min_bytes: int = 0) -> list[bytes]:
        """An xxh3-128 digest of each buffer of at least ``min_bytes``, read where it lies (no copy)."""
        data, offsets = self._data(source)
        if len(offsets) and min(offsets) < len(HEADER):
            raise CheckpointFormatError(f"{source.where}: buffer offset {min(offsets)} is inside the file header")
        try:
            return split_digests(_read_in_place(data, offsets, min_bytes, self._releaser(source))[1])
        except ValueError as exc:
            raise CheckpointFormatError(f"{source.where}: {exc}") from None

    def buffer_digests_together(self, sources: list[BufferSource], min_bytes: int = 0) -> Optional[list[bytes]]:
        """``buffer_digests`` of all ``sources``, in file order, in one pass where they lie in one
        local file (or one segment of it): one length read over all their buffers, a digest only of
        those of at least ``min_bytes``. None where they do not, or where a buffer does not read or
        two overlap (then each source, on its own, says which)."""
        first = sources[0]
        if any(s.location != first.location or s.segment != first.segment or s.inline is not None for s in sources[1:]):
            return None
        offsets = list(chain.from_iterable(s.offsets for s in sources))
        joined = BufferSource(first.location, first.inline, first.segment, offsets, first.beneath)
        owned = self.buffer_digests_owned(joined, np.zeros(len(offsets), dtype=np.int64), min_bytes)
        return None if owned is None else split_digests(owned[0])

    def buffer_digests_owned(
        self, source: BufferSource, owners: np.ndarray, min_bytes: int = 0
    ) -> Optional[tuple[bytes, list[int]]]:
        """``buffer_digests_together`` of one local file's buffers listed by many handles (of many
        subtasks) at once: buffer i at ``source.offsets[i]`` is held by ``owners[i]``. Returns the
        digests of the buffers of at least ``min_bytes`` in file order (16 bytes each, joined), and
        each one's owner; None where the file is not local, or a buffer does not read or two
        overlap."""
        if source.inline is not None or source.location is None or not self._is_local(source.location):
            return None
        try:
            data, _ = self._data(source)
        except CheckpointFormatError:
            return None
        offsets = np.asarray(source.offsets, dtype=np.int64)
        owners = np.asarray(owners)
        if len(offsets) > 1 and not bool((offsets[1:] >= offsets[:-1]).all()):  # else in file order already
            order = np.argsort(offsets, kind="stable")
            offsets, owners = offsets[order], owners[order]
        if not len(offsets) or offsets[0] < len(HEADER):
            return None if len(offsets) else (b"", [])
        try:
            sizes, found = _read_in_place(data, offsets, min_bytes, self._releaser(source))  # found: of the ``large``
        except ValueError:
            return None
        large = sizes >= min_bytes
        return found, owners[large].tolist()

    def release(self, source: BufferSource) -> None:
        """Let go of the mapped pages of the source's buffers, once read: a stream read a piece at
        a time (``ChannelPieces``) would otherwise keep all of its file resident in this process
        (the 1.5 GB channel of a rescale to parallelism 1). They stay in the page cache."""
        release = self._releaser(source)
        if release is None or not len(source.offsets) or source.location is None:
            return
        first, last = min(source.offsets), max(source.offsets)
        try:
            (length,) = _LENGTH.unpack_from(self._mapped[source.location], (source.segment[0] if source.segment else 0) + last)
        except (ValueError, struct.error):
            return
        release(first, last + _LENGTH.size + max(0, length))

    def _releaser(self, source: BufferSource) -> Optional[Callable[[int, int], None]]:
        """Where the source's file is mapped: a function that lets go of the mapped pages of its
        bytes ``start`` to ``end`` (offsets as the source's, within its segment)."""
        mapped = self._mapped.get(source.location) if source.inline is None and source.location else None
        if not isinstance(mapped, mmap.mmap):
            return None
        base = source.segment[0] if source.segment else 0

        def release(start: int, end: int) -> None:
            start, end = (base + start) // mmap.PAGESIZE * mmap.PAGESIZE, min(len(mapped), base + end)
            if end > start:
                try:
                    mapped.madvise(mmap.MADV_DONTNEED, start, end - start)
                except (OSError, ValueError):
                    pass  # only memory is at stake: the pages stay mapped

        return release

    def buffers(self, source: BufferSource) -> list[bytes]:
        """The payloads of the source's buffers, one by one."""
        stream, lengths = self.payload_and_lengths(source)
        ends = np.cumsum(lengths).tolist() if lengths else []
        return [stream[end - length : end] for length, end in zip(lengths, ends)]

    def _data(self, source: BufferSource):
        """The bytes the offsets point into (a whole file, a segment, inline bytes or, on object
        stores, the span of the buffers behind a header) and the offsets into them."""
        data: memoryview
        location = source.location
        if source.inline is not None:
            data, offsets = memoryview(source.inline), source.offsets
        elif location is None:
            raise CheckpointFormatError("a channel handle has neither a file nor inline data")
        elif not self._is_local(location) and not source.segment:
            span, offsets = self._ranged_span(location, source)
            data = memoryview(span)
        else:
            if location not in self._mapped:
                if len(self._mapped) >= MAX_OPEN_MAPS:  # each map holds a file descriptor: the oldest goes
                    _close_map(self._mapped.pop(next(iter(self._mapped))))
                self._mapped[location] = self._io(location, source.beneath).map(location)
            data, offsets = memoryview(self._mapped[location]), source.offsets
        if source.segment:
            start, size = source.segment
            if start < 0 or size < 0 or start + size > len(data):
                raise CheckpointFormatError(
                    f"{source.where}: segment of {size} bytes at {start} is outside the file ({len(data)} bytes)"
                )
            data = data[start : start + size]
        if bytes(data[: len(HEADER)]) != HEADER:
            raise CheckpointFormatError(f"{source.where}: not a channel-state file (bad header)")
        return data, offsets

    @staticmethod
    def _ranged_span(location: str, source: BufferSource) -> tuple[bytes, list[int]]:
        """Object stores: two ranged GETs (the last buffer's length, then the span of all buffers)
        instead of the whole file, which other subtasks' channels share. Returns the span behind
        a file header, and the offsets shifted to it."""
        if not len(source.offsets):
            return HEADER, []
        io = io_for(location)
        first, last = min(source.offsets), max(source.offsets)
        if first < len(HEADER):
            raise CheckpointFormatError(f"{source.where}: buffer offset {first} is inside the file header")
        (last_length,) = _LENGTH.unpack(io.read_range(location, last, 4))
        if last_length < 0:
            raise CheckpointFormatError(f"{source.where}: negative buffer length at offset {last}")
        span = io.read_range(location, first, last + 4 + last_length - first)
        return HEADER + span, [o - first + len(HEADER) for o in source.offsets]


def in_order(blobs: list[tuple[Any, bytes]], sizes: np.ndarray) -> bytes:
    """Payloads read file by file back in the order of their sources: ``blobs`` holds, per file,
    the indexes of its sources (in order) and their payloads one after another; source i has
    ``sizes[i]`` bytes. ``blobs`` is emptied: the payloads are held twice at most, not three
    times (at p=4,096 dense an engine task reads 64 MB from 4,096 files)."""
    if _consecutive(blobs, len(sizes)):  # files met in table order (a scan's rows by downstream subtask): joined as read
        joined = blobs[0][1] if len(blobs) == 1 else b"".join(blob for _, blob in blobs)
        blobs.clear()
        return joined
    starts = np.zeros(len(sizes), dtype=np.int64)
    position = 0
    for members, blob in blobs:
        group_sizes = sizes[members]
        starts[members] = position + np.cumsum(group_sizes) - group_sizes
        position += len(blob)
    joined = b"".join(blob for _, blob in blobs)
    blobs.clear()
    return _framing.gather(joined, starts, starts + sizes)


def _consecutive(blobs: list[tuple[Any, bytes]], count: int) -> bool:
    """Whether the sources of ``blobs``, one after another, are 0 to ``count`` - 1 in order."""
    at = 0
    for members, _ in blobs:
        if not np.array_equal(members, np.arange(at, at + len(members))):
            return False
        at += len(members)
    return at == count


def _lengths_at(data, at: np.ndarray) -> np.ndarray:
    """The 4-byte big-endian buffer lengths at offsets ``at`` (each inside ``data``), as int64s."""
    fields = np.frombuffer(data, dtype=np.uint8)[at[:, None] + np.arange(4)].astype(np.uint32)
    lengths = fields[:, 0] << 24 | fields[:, 1] << 16 | fields[:, 2] << 8 | fields[:, 3]
    return lengths.view(np.int32).astype(np.int64)


def _digests(data, offsets: Sequence[int] | np.ndarray, sizes: np.ndarray, min_bytes: int) -> bytes:
    """An xxh3-128 digest of each buffer (at its offset, of its payload size) of at least
    ``min_bytes``, read where it lies (no copy): 16 bytes each, joined."""
    at, size = np.asarray(offsets, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    kept = size >= min_bytes
    return _framing.digests(data, at[kept] + 4, at[kept] + 4 + size[kept])


def split_digests(joined: bytes) -> list[bytes]:
    """The 16-byte digests ``_digests`` joined, one by one."""
    return [joined[i : i + 16] for i in range(0, len(joined), 16)]


# Buffers read where they lie in a mapped file are read this many bytes of the file at a time, the
# pages of each window let go before the next (``_read_in_place``).
IN_PLACE_WINDOW_BYTES = 64 << 20


def _read_in_place(
    data, offsets: Sequence[int] | np.ndarray, min_bytes: int, release: Optional[Callable[[int, int], None]]
) -> tuple[np.ndarray, bytes]:
    """Each buffer's payload length (raises ValueError where one does not read), and ``_digests``
    of those of at least ``min_bytes`` (joined). With ``release`` (a mapped file's) and buffers in file
    order over more than IN_PLACE_WINDOW_BYTES, a window of the file at a time, each window's
    pages let go once read: reading even one length maps the pages around it, and a channel of
    1.5 GB would stay resident whole."""
    at = np.asarray(offsets, dtype=np.int64)
    if release is not None and len(at) > 1 and int(at[-1] - at[0]) > IN_PLACE_WINDOW_BYTES and (np.diff(at) > 0).all():
        sizes, digests, start, end = [], [], 0, 0
        try:
            while start < len(at):
                stop = max(start + 1, int(np.searchsorted(at, at[start] + IN_PLACE_WINDOW_BYTES)))
                window = at[start:stop]
                if int(window[0]) < end:
                    raise ValueError("a buffer overlaps the window before")  # as the whole read says
                size = np.frombuffer(_framing.lengths(data, window), dtype=np.int64)
                digests.append(_digests(data, window, size, min_bytes))
                sizes.append(size)
                end = int(window[-1]) + _LENGTH.size + int(size[-1])
                release(int(window[0]), end)
                start = stop
            return np.concatenate(sizes), b"".join(digests)
        except ValueError:
            pass  # read whole below, which says where
    size = np.frombuffer(_framing.lengths(data, at), dtype=np.int64)
    return size, _digests(data, at, size, min_bytes)


def _close_map(data) -> None:
    close = getattr(data, "close", None)
    if close:
        try:
            close()
        except BufferError:  # a view of the map is still referenced (by an error's traceback):
            pass  # the map is released with the last view


def _payloads(data, offsets: list[int], where: str) -> bytes:
    """Buffers must lie inside the file, after its header, in the order written and without
    overlapping one another (a handle never lists a buffer twice)."""
    if offsets and min(offsets) < len(HEADER):
        raise CheckpointFormatError(f"{where}: buffer offset {min(offsets)} is inside the file header")
    try:
        return _framing.payloads(data, np.asarray(offsets, dtype=np.int64))
    except ValueError as exc:
        raise CheckpointFormatError(f"{where}: {exc}") from None


# --- writing ----------------------------------------------------------------------------------


@dataclass
class Placement:
    """Where one target's buffers went in a written file: offsets of their length fields, and
    the handle's state size (payloads plus a 4-byte length each)."""

    offsets: list[int] = field(default_factory=list)
    size: int = 0


WRITE_BUFFERS = 256  # full buffers framed for the file at a time (8 MiB of Flink's default 32 KiB)


class ChannelStateWriter:
    """Streams one channel-state file. ``add(target, stream)`` appends bytes to a target's
    channel (the bytes of whole records); they are cut into network buffers of ``buffer_size``
    as they come and emitted framed for the file. ``placements`` says where each target's
    buffers went once ``finish`` has run."""

    def __init__(self, buffer_size: int = BUFFER_SIZE) -> None:
        self.buffer_size = buffer_size
        self.position = len(HEADER)
        self.placements: dict[int, Placement] = {}
        self._pending: dict[int, bytes] = {}

    def start(self) -> Iterator[bytes]:
        yield HEADER

    def add(self, target: int, stream: bytes) -> Iterator[np.ndarray]:
        pending = self._pending.pop(target, b"")
        stream = b"".join((pending, stream)) if len(pending) else stream  # bytes or views
        full = len(stream) // self.buffer_size
        view = memoryview(stream)
        for first in range(0, full, WRITE_BUFFERS):  # a large stream a few MiB at a time, not a copy of it whole
            yield self._buffers(target, view[first * self.buffer_size :], min(WRITE_BUFFERS, full - first), self.buffer_size)
        self._pending[target] = stream[full * self.buffer_size :]
        self.placements.setdefault(target, Placement())

    def finish(self) -> Iterator[bytes]:
        """Each target's last, partial buffer, in target order: framed together (a route task of a
        job at high parallelism ends hundreds of small channels at once)."""
        frames: list = []
        pack = _LENGTH.pack
        for target in sorted(self._pending):
            rest = self._pending[target]
            if rest:
                placement = self.placements.setdefault(target, Placement())
                placement.offsets.append(self.position)
                placement.size += 4 + len(rest)
                self.position += 4 + len(rest)
                frames += (pack(len(rest)), rest)
        self._pending.clear()
        if frames:
            yield b"".join(frames)

    @property
    def size(self) -> int:
        return self.position

    def take_placements(self) -> dict[int, Placement]:
        """The placements so far, which the writer forgets (the file goes on with new targets)."""
        placements, self.placements = self.placements, {}
        return placements

    def append(self, made: bytes) -> tuple[int, memoryview]:
        """Append a file made at once (``small_channels_file``: its header, then its buffers) to
        this one, after what is written: how far its offsets move, and the bytes to write."""
        shift = self.position - len(HEADER)
        self.position += len(made) - len(HEADER)
        return shift, memoryview(made)[len(HEADER) :]

    def _buffers(self, target: int, stream: bytes | memoryview, count: int, size: int) -> np.ndarray:
        """``count`` buffers of ``size`` bytes from the start of ``stream``, each after its length."""
        out = np.empty((count, 4 + size), dtype=np.uint8)
        out[:, :4] = np.frombuffer(_LENGTH.pack(size), dtype=np.uint8)
        out[:, 4:] = np.frombuffer(stream, dtype=np.uint8, count=count * size).reshape(count, size)
        step = 4 + size
        placement = self.placements.setdefault(target, Placement())
        placement.offsets.extend(range(self.position, self.position + count * step, step))
        placement.size += count * step
        self.position += count * step
        return out


@dataclass
class Pieces:
    """Pieces of channels for a channel-state file, as columns: piece i goes to target
    ``targets[i]`` (a new subtask's channel), its bytes are ``data[begins[i]:ends[i]]`` (whole
    records), and it holds ``records[i]`` records (the router's count). Iterates as
    (target, bytes, records) tuples, in order."""

    targets: np.ndarray
    data: bytes
    begins: np.ndarray
    ends: np.ndarray
    records: np.ndarray

    def __len__(self) -> int:
        return len(self.targets)

    def __iter__(self) -> Iterator[tuple[int, memoryview, int]]:
        view = memoryview(self.data)
        for target, begin, end, count in zip(
            self.targets.tolist(), self.begins.tolist(), self.ends.tolist(), self.records.tolist()
        ):
            yield target, view[begin:end], count

    @staticmethod
    def of(pieces: Sequence[tuple[int, Any, int]]) -> Pieces:
        """Columns of (target, bytes, records) tuples."""
        lengths = np.fromiter((len(data) for _, data, _ in pieces), dtype=np.int64, count=len(pieces))
        ends = np.cumsum(lengths)
        return Pieces(
            np.fromiter((target for target, _, _ in pieces), dtype=np.int64, count=len(pieces)),
            b"".join([data for _, data, _ in pieces]),
            ends - lengths,
            ends,
            np.fromiter((count for _, _, count in pieces), dtype=np.int64, count=len(pieces)),
        )

    def by_target(self) -> Pieces:
        """The same records with each target's pieces joined into one piece (targets ascending,
        a target's pieces in the order they came): a writer then takes one piece per target, not
        one per old channel (a rescale of p=4,096 to 64 routes 16.8 million one-record pieces into
        4,096 channels). Without a copy where the pieces already come by target."""
        count = len(self.targets)
        if count < 2:
            return self
        if bool((self.targets[1:] >= self.targets[:-1]).all()):
            order: np.ndarray | slice = slice(None)  # they come by target
        else:
            order = np.argsort(self.targets, kind="stable")
        ordered = self.targets[order]
        firsts = np.flatnonzero(np.diff(ordered, prepend=ordered[0] - 1))
        records = np.add.reduceat(self.records[order], firsts)
        if isinstance(order, slice) and bool((self.begins[1:] == self.ends[:-1]).all()):  # one run of bytes: views of it
            lasts = np.append(firsts[1:], count) - 1
            return Pieces(ordered[firsts], self.data, self.begins[firsts], self.ends[lasts], records)
        totals = np.add.reduceat((self.ends - self.begins)[order], firsts)
        ends = np.cumsum(totals)
        data = _framing.gather(self.data, self.begins[order], self.ends[order])
        return Pieces(ordered[firsts], data, ends - totals, ends, records)

    @staticmethod
    def concatenate(parts: Sequence[Pieces]) -> Pieces:
        """The pieces of ``parts`` one after another."""
        shifts = np.cumsum([0] + [len(part.data) for part in parts])
        joined = [np.concatenate(columns) if columns else np.zeros(0, dtype=np.int64) for columns in zip(*[
            (part.targets, part.begins + shift, part.ends + shift, part.records) for part, shift in zip(parts, shifts.tolist())
        ])] or [np.zeros(0, dtype=np.int64)] * 4  # fmt: skip
        return Pieces(joined[0], b"".join([part.data for part in parts]), joined[1], joined[2], joined[3])


@dataclass
class SmallChannelsFile:
    """A channel-state file made at once (``small_channels_file``): its bytes (the header, then each
    non-empty target's one buffer, in target order) and, per target in that order, its buffer's
    offset (-1: none, its channel is empty), the handle's state size (4 + payload, or 0) and the
    records routed to it."""

    data: bytes
    targets: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    records: np.ndarray

    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Where each target's payload begins and ends in ``data`` (0, 0: none)."""
        offsets = self.offsets.astype(np.int64)
        held = offsets >= 0
        return np.where(held, offsets + 4, 0), np.where(held, offsets + self.sizes.astype(np.int64), 0)

    def streams(self) -> Iterator[memoryview]:
        """Each target's payload (its channel's bytes), in target order."""
        view = memoryview(self.data)
        for start, end in zip(*(column.tolist() for column in self._bounds())):
            yield view[start:end]

    def digests(self) -> bytes:
        """The xxh3-128 digest of each target's payload, in target order, 16 bytes each."""
        return _framing.digests(self.data, *self._bounds())


def small_channels_file(pieces: Pieces, buffer_size: int = BUFFER_SIZE) -> Optional[SmallChannelsFile]:
    """The file ``ChannelStateWriter`` writes from these pieces, made at once where no target's
    channel fills a buffer (then each non-empty one is a single partial buffer, written at the
    end in target order, as ``finish`` writes them). None where some target fills a buffer. A
    rescale at high parallelism routes a few records into each of thousands of channels: the
    pieces are joined by target (``Pieces.by_target``) and the file laid out with NumPy, and its
    bytes made with one gather, instead of an object and a few calls per target."""
    joined = pieces.by_target()  # one piece per target, targets ascending
    payload = joined.ends - joined.begins
    if (payload >= buffer_size).any():
        return None
    held = payload > 0
    sizes = np.where(held, 4 + payload, 0)
    offsets = len(HEADER) + np.cumsum(sizes) - sizes
    # the ranges to gather: each non-empty target's buffer length (packed after the data), then its piece
    lengths_at = len(joined.data) + 4 * np.arange(int(held.sum()), dtype=np.int64)
    starts = np.column_stack([lengths_at, joined.begins[held]]).ravel()
    ends = np.column_stack([lengths_at + 4, joined.ends[held]]).ravel()
    source = bytes(joined.data) + payload[held].astype(">i4").tobytes()
    return SmallChannelsFile(
        HEADER + _framing.gather(source, starts, ends), joined.targets, np.where(held, offsets, -1), sizes, joined.records
    )


def write_channel_state_file(
    io: FileIO, uri: str, pieces: Iterable[tuple[int, bytes]], buffer_size: int = BUFFER_SIZE
) -> ChannelStateWriter:
    """Write a channel-state file from (target, bytes of whole records) pieces, streaming;
    returns the writer, whose ``placements`` and ``size`` describe the file."""
    writer = ChannelStateWriter(buffer_size)

    def chunks() -> Iterator:
        yield from writer.start()
        for target, stream in pieces:
            yield from writer.add(target, stream)
        yield from writer.finish()

    io.write_stream(uri, chunks())
    return writer


# --- logical channels ---------------------------------------------------------------------------


def pointwise_channels(upstream_parallelism: int, downstream_parallelism: int) -> list[tuple[int, int, int, int]]:
    """(u, d, input channel of d, subpartition of u) of a POINTWISE edge, as Flink's
    ``EdgeManagerBuildUtil.connectPointwise`` connects the subtasks: equal parallelism pairs
    them one to one; otherwise each downstream subtask reads a contiguous range of upstream
    subtasks, or each upstream subtask feeds a contiguous range of downstream subtasks."""
    links = []
    if upstream_parallelism == downstream_parallelism:
        return [(i, i, 0, 0) for i in range(upstream_parallelism)]
    if upstream_parallelism < downstream_parallelism:
        for u in range(upstream_parallelism):
            start = (u * downstream_parallelism + upstream_parallelism - 1) // upstream_parallelism
            end = ((u + 1) * downstream_parallelism + upstream_parallelism - 1) // upstream_parallelism
            links += [(u, d, 0, d - start) for d in range(start, end)]
    else:
        for d in range(downstream_parallelism):
            start = d * upstream_parallelism // downstream_parallelism
            end = (d + 1) * upstream_parallelism // downstream_parallelism
            links += [(u, d, u - start, 0) for u in range(start, end)]
    return links
