"""The record path's sequential loops in Python and NumPy: the same functions, results and
errors as the C module ``_framing.c``, for a machine where that module cannot load (a Spark
executor of another platform than the one ckpt was built on). Slower, never different: a test
compares both on real and generated channels."""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import xxhash

_LENGTH = np.dtype(">i4")


def _as_bytes(data: Any) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _int64s(values: Any) -> np.ndarray:
    return np.frombuffer(_as_bytes(values), dtype=np.int64)


def _length_at(view: memoryview, at: int) -> int:
    return int.from_bytes(view[at : at + 4], "big", signed=True)


def frame(data: Any) -> tuple[bytes, int]:
    """The offsets of every whole record's length field (native int64 bytes), and where the
    first incomplete record begins."""
    view = _as_bytes(data)
    size, pos = len(view), 0
    starts: list[int] = []
    while pos + 4 <= size:
        length = _length_at(view, pos)
        if length < 0:
            raise ValueError(f"negative record length {length} at byte {pos} of a channel")
        if pos + 4 + length > size:
            break
        starts.append(pos)
        pos += 4 + length
    return np.asarray(starts, dtype=np.int64).tobytes(), pos


def frame_segments(data: Any, bounds: Any) -> tuple[bytes, bytes]:
    """``frame`` of each segment data[bounds[i]:bounds[i+1]]: the offsets (in data) of every whole
    record's length field of every segment, and per segment where its first incomplete record begins."""
    view = _as_bytes(data)
    at = _int64s(bounds).tolist()
    if any(b < 0 or b > len(view) for b in at) or any(b < a for a, b in zip(at, at[1:])):
        raise ValueError("segment bounds outside the data")
    starts, ends = [], []
    for first, last in zip(at, at[1:]):
        found, end = frame(view[first:last])
        starts.append(np.frombuffer(found, dtype=np.int64) + first)
        ends.append(first + end)
    return (np.concatenate(starts).tobytes() if starts else b""), np.asarray(ends, dtype=np.int64).tobytes()


def _ranges(view: memoryview, starts: Any, ends: Any) -> zip:
    """The ranges (start, end) of two int64 buffers, each checked to lie inside ``view``."""
    first, last = _int64s(starts), _int64s(ends)
    if len(first) != len(last):
        raise ValueError("starts and ends differ in length")
    if len(first) and ((first < 0).any() or (last < first).any() or (last > len(view)).any()):
        raise ValueError("range outside the data")
    return zip(first.tolist(), last.tolist())


def gather(data: Any, starts: Any, ends: Any) -> bytes:
    """data[starts[i]:ends[i]] for every i, concatenated."""
    view = _as_bytes(data)
    return b"".join(view[a:b] for a, b in _ranges(view, starts, ends))


def digests(data: Any, starts: Any, ends: Any) -> bytes:
    """The xxh3-128 digest of each data[starts[i]:ends[i]] (16 bytes, canonical), concatenated."""
    view = _as_bytes(data)
    return b"".join(xxhash.xxh3_128(view[a:b]).digest() for a, b in _ranges(view, starts, ends))


def _checked_lengths(view: memoryview, at: np.ndarray) -> list[int]:
    lengths, previous_end = [], 0
    for offset in at.tolist():
        if offset < 0 or offset + 4 > len(view):
            raise ValueError(f"buffer offset {offset} is outside the file ({len(view)} bytes)")
        if offset < previous_end:
            raise ValueError(f"buffer offset {offset} repeats or overlaps the buffer before it (which ends at {previous_end})")
        length = _length_at(view, offset)
        if length < 0 or offset + 4 + length > len(view):
            raise ValueError(f"buffer at offset {offset} of length {length} runs past the end ({len(view)} bytes)")
        previous_end = offset + 4 + length
        lengths.append(length)
    return lengths


def payloads(data: Any, offsets: Any) -> bytes:
    """The payloads of the checked buffers at the offsets, concatenated."""
    view = _as_bytes(data)
    at = _int64s(offsets)
    lengths = _checked_lengths(view, at)
    return b"".join(view[offset + 4 : offset + 4 + length] for offset, length in zip(at.tolist(), lengths))


def payloads_many(data: Any, offsets: Any, counts: Any) -> tuple[bytes, bytes]:
    """``payloads`` of several handles of one file (handle h: the next counts[h] offsets): their
    payloads concatenated, and each handle's payload bytes (native int64s)."""
    at, many = _int64s(offsets), _int64s(counts).tolist()
    if any(c < 0 for c in many) or sum(many) > len(at):
        raise ValueError("buffer counts do not match the offsets")
    pieces, sizes, used = [], [], 0
    for count in many:
        piece = payloads(data, at[used : used + count].tobytes())
        pieces.append(piece)
        sizes.append(len(piece))
        used += count
    return b"".join(pieces), np.asarray(sizes, dtype=np.int64).tobytes()


def span_runs(offsets: Any, gap: int) -> list[tuple[int, int]]:
    """The offsets sorted, in runs cut where the next lies more than ``gap`` on: each run's first
    and last offset."""
    ordered = sorted(_int64s(offsets).tolist())
    runs: list[tuple[int, int]] = []
    for at in ordered:
        if runs and at - runs[-1][1] <= gap:
            runs[-1] = (runs[-1][0], at)
        else:
            runs.append((at, at))
    return runs


def payloads_in_runs(runs: Any, firsts: Any, offsets: Any, counts: Any) -> tuple[bytes, bytes]:
    """``payloads_many`` of a file read in runs: ``runs[r]`` holds the file's bytes from offset
    ``firsts[r]`` (ascending, the runs apart); each buffer must lie whole inside one run."""
    views, starts = [_as_bytes(r) for r in runs], _int64s(firsts).tolist()
    at, many = _int64s(offsets).tolist(), _int64s(counts).tolist()
    if len(views) != len(starts):
        raise ValueError("the runs and their offsets do not match")
    for r in range(1, len(starts)):
        if starts[r] < starts[r - 1] + len(views[r - 1]):
            raise ValueError("the runs overlap or are out of order")
    pieces: list[bytes] = []
    sizes: list[int] = []
    used = 0
    for count in many:
        if count < 0 or used + count > len(at):
            raise ValueError("buffer counts do not match the offsets")
        previous_end, mine = 0, 0
        for offset in at[used : used + count]:
            r = bisect.bisect_right(starts, offset) - 1
            if r < 0 or offset + 4 > starts[r] + len(views[r]):
                raise ValueError(f"buffer offset {offset} is outside the runs read")
            if offset < previous_end:
                before = f"the buffer before it (which ends at {previous_end})"
                raise ValueError(f"buffer offset {offset} repeats or overlaps {before}")
            inside = offset - starts[r]
            length = _length_at(views[r], inside)
            end = starts[r] + len(views[r])
            if length < 0 or offset + 4 + length > end:
                raise ValueError(f"buffer at offset {offset} of length {length} runs past its run (which ends at {end})")
            previous_end = offset + 4 + length
            pieces.append(bytes(views[r][inside + 4 : inside + 4 + length]))
            mine += length
        sizes.append(mine)
        used += count
    return b"".join(pieces), np.asarray(sizes, dtype=np.int64).tobytes()


def lengths(data: Any, offsets: Any) -> bytes:
    """The checked buffers' payload lengths as native int64s."""
    return np.asarray(_checked_lengths(_as_bytes(data), _int64s(offsets)), dtype=np.int64).tobytes()


def string_tails(data: Any, tails: Any, ends: Any) -> bytes:
    """For each i, 1 where data[tails[i]:ends[i]] is exactly one StringValue (a varint of its
    length + 1, at most 5 bytes, 0 for null, then one varint per UTF-16 unit, each ending in its
    one byte below 0x80), else 0."""
    raw = np.frombuffer(_as_bytes(data), dtype=np.uint8)
    tail, end = _int64s(tails), _int64s(ends)
    if len(tail) != len(end):
        raise ValueError("starts and ends differ in length")
    if len(tail) and ((tail < 0).any() or (end < 0).any() or (end > len(raw)).any()):
        raise ValueError("range outside the data")
    if not len(tail):
        return b""

    def byte(at: np.ndarray) -> np.ndarray:  # where ``at`` is past the value the value does not fit anyway
        return raw[np.clip(at, 0, len(raw) - 1)].astype(np.int64)

    first = byte(tail)
    length, size, more = first & 0x7F, np.ones_like(tail), first >= 0x80
    for k in range(1, 5):
        if not more.any():
            break
        following = byte(tail + k)
        length |= np.where(more, (following & 0x7F) << (7 * k), 0)
        size += more
        more &= following >= 0x80
    chars = tail + size
    fits = (tail < end) & ~more & (chars <= end)
    chars = np.minimum(chars, end)
    empty = chars == end
    endings = end - chars
    low, top = int(chars.min()), int(end.max())  # only the values' bytes (data may be a batch's)
    high = np.flatnonzero(raw[low:top] >= 0x80) + low
    if len(high):
        endings -= np.searchsorted(high, end) - np.searchsorted(high, chars)
    whole = empty | (byte(end - 1) < 0x80)
    return (fits & np.where(length == 0, empty, (endings == length - 1) & whole)).astype(np.uint8).tobytes()


def key_groups(hashes: Any, max_parallelism: int) -> bytes:
    """Flink's ``KeyGroupRangeAssignment.computeKeyGroupForKeyHash`` (``MathUtils.murmurHash`` of
    the hash code, modulo the max parallelism) of each native uint32 hash code, as native int32s."""
    if max_parallelism <= 0 or max_parallelism > 0x7FFFFFFF:
        raise ValueError(f"max parallelism {max_parallelism} out of range")
    u32 = np.uint32
    view = _as_bytes(hashes)
    code = np.frombuffer(view[: len(view) // 4 * 4], dtype=u32)
    with np.errstate(over="ignore"):
        code = code * u32(0xCC9E2D51)
        code = (code << u32(15)) | (code >> u32(17))
        code = code * u32(0x1B873593)
        code = (code << u32(13)) | (code >> u32(19))
        code = code * u32(5) + u32(0xE6546B64)
        code ^= u32(4)
        code ^= code >> u32(16)
        code = code * u32(0x85EBCA6B)
        code ^= code >> u32(13)
        code = code * u32(0xC2B2AE35)
        code ^= code >> u32(16)
    signed = code.view(np.int32).astype(np.int64)
    positive = np.where(signed == -(1 << 31), 0, np.abs(signed))
    return (positive % max_parallelism).astype(np.int32).tobytes()


def int_rows(parts: tuple[bytes, ...], values: Any, separator: bytes) -> bytes:
    """A row per ``len(parts) - 1`` int64s of ``values``: the parts with the row's values in
    decimal between them; the rows joined by ``separator``."""
    if not isinstance(parts, tuple) or not all(isinstance(part, bytes) for part in parts):
        raise TypeError("parts must be a tuple of bytes")
    k = len(parts) - 1
    flat = _int64s(values) if memoryview(values).nbytes else np.zeros(0, dtype=np.int64)  # no rows: no shape to cast
    if k < 1 or len(flat) % k:
        raise ValueError("values are not rows of len(parts) - 1 int64s")
    template = b"%d".join(part.replace(b"%", b"%%") for part in parts)
    return bytes(separator).join([template % tuple(row) for row in flat.reshape(-1, k).tolist()])
