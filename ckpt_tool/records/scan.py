"""Scanning in-flight records: one task per logical channel, plain data that can travel to Spark.

A task names where its buffers are (file URIs and offsets, or inline bytes) so that a worker
needs neither the metadata nor the driver: it reads, stitches, frames, classifies and keys the
records of one logical channel (ckpt_tool.records.batch) and returns small figures. Record
digests, for finding copies of one record held by several subtasks, are computed only for the
key groups that several downstream subtasks hold (``suspects``); a healthy checkpoint has none.
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Hashable, Iterable, Optional

import numpy as np

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.channel_state import HEADER, LogicalChannel, logical_channels
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import ByteStreamHandle, ChannelStateHandle, SegmentFileHandle
from ckpt_tool.records import _framing
from ckpt_tool.records.batch import ChannelRecords, KeyGroups, frame_channel
from ckpt_tool.records.elements import WATERMARK
from ckpt_tool.records.keys import key_group_range
from ckpt_tool.records.schema import Exchange
from ckpt_tool.storage import io_for
from ckpt_tool.storage.base import is_s3


@dataclass
class BufferSource:
    """The buffers of one channel handle: a file (or file segment) or inline bytes, and offsets."""

    location: Optional[str]
    inline: Optional[bytes]
    segment: Optional[tuple[int, int]]
    offsets: list[int]

    @staticmethod
    def of(checkpoint: Checkpoint, handle: ChannelStateHandle) -> "BufferSource":
        delegate = handle.delegate
        inline = delegate.data if isinstance(delegate, ByteStreamHandle) else None
        segment = (delegate.start, delegate.size) if isinstance(delegate, SegmentFileHandle) else None
        return BufferSource(checkpoint.location(delegate), inline, segment, list(handle.offsets))

    def payload(self) -> bytes:
        """The buffers' payloads, concatenated: this handle's part of a channel's record stream."""
        where = self.location or "inline channel state"
        offsets = self.offsets
        if self.inline is None and is_s3(self.location) and not self.segment:
            data, offsets = self._ranged_span()
        else:
            data = memoryview(self.inline if self.inline is not None else _mapped_file(self.location))
        if self.segment:
            data = data[self.segment[0]:self.segment[0] + self.segment[1]]
        if bytes(data[:len(HEADER)]) != HEADER:
            raise CheckpointFormatError(f"{where}: not a channel-state file (bad header)")
        if offsets and min(offsets) < len(HEADER):
            raise CheckpointFormatError(f"{where}: buffer offset {min(offsets)} is inside the file header")
        try:
            return _framing.payloads(data, np.asarray(offsets, dtype=np.int64))
        except ValueError as exc:
            raise CheckpointFormatError(f"{where}: {exc}") from None

    def _ranged_span(self) -> tuple[bytes, list[int]]:
        """Object stores: two ranged GETs (the last buffer's length, then the span of all
        buffers) instead of the whole file, which other subtasks' channels share. Returns the
        span behind a file header, and the offsets shifted to it."""
        if not self.offsets:
            return HEADER, []
        io = io_for(self.location)
        first, last = min(self.offsets), max(self.offsets)
        (last_length,) = struct.unpack(">i", io.read_range(self.location, last, 4))
        if last_length < 0:
            raise CheckpointFormatError(f"{self.location}: negative buffer length at offset {last}")
        span = io.read_range(self.location, first, last + 4 + last_length - first)
        return HEADER + span, [o - first + len(HEADER) for o in self.offsets]


@lru_cache(maxsize=16)
def _mapped_file(uri: str):
    """Channel-state files are shared by many channels; keep the last few open in this process
    (memory-mapped where local, so that a channel reads only its own buffers)."""
    return io_for(uri).map(uri)


@dataclass
class ChannelTask:
    exchange_index: int
    upstream_subtask: int
    downstream_subtask: int
    max_parallelism: int
    parallelism: int
    inputs: list[BufferSource]
    outputs: list[BufferSource]


@dataclass
class ChannelStats:
    exchange_index: int
    upstream_subtask: int
    downstream_subtask: int
    input_buffers: int = 0
    output_buffers: int = 0
    bytes: int = 0
    records: int = 0
    watermarks: int = 0
    other_elements: int = 0
    trailing_bytes: int = 0
    misplaced_records: int = 0
    key_groups: Counter = field(default_factory=Counter)
    digests: list[bytes] = field(default_factory=list)  # of the records in suspect key groups


def channel_tasks(checkpoint: Checkpoint, exchanges: list[Exchange]) -> list[ChannelTask]:
    tasks = []
    metadata = checkpoint.metadata
    for index, exchange in enumerate(exchanges):
        downstream = metadata.operator(exchange.downstream_id)
        upstream = metadata.operator(exchange.upstream_id) if exchange.upstream_id else None
        channel: LogicalChannel
        for channel in logical_channels(upstream, downstream, exchange.gate, exchange.partition):
            tasks.append(
                ChannelTask(
                    index,
                    channel.upstream_subtask,
                    channel.downstream_subtask,
                    downstream.max_parallelism,
                    downstream.parallelism,
                    [BufferSource.of(checkpoint, h) for h in channel.input_handles],
                    [BufferSource.of(checkpoint, h) for h in channel.output_handles],
                )
            )
    return tasks


def read_channel(task: ChannelTask) -> tuple[ChannelRecords, int, int]:
    """The channel's stitched elements, and its input and output buffer counts."""
    stream = b"".join([source.payload() for source in task.inputs + task.outputs])
    count = lambda sources: sum(len(source.offsets) for source in sources)  # noqa: E731
    return frame_channel(stream), count(task.inputs), count(task.outputs)


_KEY_GROUPS: dict = {}


def key_groups_for(exchange: Exchange, max_parallelism: int) -> Optional[KeyGroups]:
    """Each keyed exchange's KeyGroups, built once per process."""
    if not exchange.keyed:
        return None
    ident = (exchange.record_type, exchange.key, exchange.decoder, max_parallelism)
    if ident not in _KEY_GROUPS:
        _KEY_GROUPS[ident] = KeyGroups(exchange, max_parallelism)
    return _KEY_GROUPS[ident]


def suspect_digests(records: ChannelRecords, key_groups: np.ndarray, suspects: frozenset) -> list[tuple[int, bytes]]:
    """(element index, digest) of the records whose key group (``key_groups``, one per record)
    is a suspect."""
    chosen = np.zeros(len(records.tags), dtype=bool)
    chosen[records.is_record] = np.isin(key_groups, list(suspects))
    return [(i, hashlib.blake2b(records.element(i), digest_size=16).digest()) for i in np.flatnonzero(chosen).tolist()]


def scan_channel(task: ChannelTask, exchange: Exchange, suspects: frozenset = frozenset()) -> ChannelStats:
    """Figures of one logical channel: buffers, elements by kind and, when keyed, key groups."""
    records, input_buffers, output_buffers = read_channel(task)
    is_record = records.is_record
    watermarks = int((records.tags == WATERMARK).sum())
    stats = ChannelStats(
        task.exchange_index, task.upstream_subtask, task.downstream_subtask, input_buffers, output_buffers,
        len(records.data), int(is_record.sum()), watermarks, int((~is_record).sum()) - watermarks, records.trailing,
    )
    keys = key_groups_for(exchange, task.max_parallelism)
    if keys is not None and stats.records:
        groups = keys.of(records, is_record)
        owned = key_group_range(task.max_parallelism, task.parallelism, task.downstream_subtask)
        stats.misplaced_records = int(((groups < owned.start) | (groups >= owned.stop)).sum())
        counts = np.bincount(groups)
        found = np.flatnonzero(counts)
        stats.key_groups = Counter(dict(zip(found.tolist(), counts[found].tolist())))
        if suspects:
            stats.digests = [digest for _, digest in suspect_digests(records, groups, suspects)]
    return stats


def suspect_key_groups(holdings: Iterable[tuple[Hashable, int, Iterable[int]]]) -> dict[Hashable, frozenset]:
    """From (upstream channel, downstream subtask, key groups it holds): per upstream channel, the
    key groups that several downstream subtasks hold. Only there can one record be held twice
    (Flink replicates a channel's buffers to several subtasks on recovery; each copy stays on its
    upstream channel)."""
    holders: dict[tuple[Hashable, int], set[int]] = {}
    for channel, downstream, groups in holdings:
        for group in groups:
            holders.setdefault((channel, group), set()).add(downstream)
    suspects: dict[Hashable, set[int]] = {}
    for (channel, group), downstream in holders.items():
        if len(downstream) > 1:
            suspects.setdefault(channel, set()).add(group)
    return {channel: frozenset(groups) for channel, groups in suspects.items()}
