"""Scanning in-flight records: one task per logical channel, plain data that can travel to Spark.

A task names where its buffers are (file URIs and offsets, or inline bytes) so that a worker
needs neither the metadata nor the driver: it reads, stitches, frames, classifies and keys the
records of one logical channel and returns small figures plus one digest per keyed record.
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.channel_state import HEADER, LogicalChannel, logical_channels, split_buffers
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import ByteStreamHandle, ChannelStateHandle, SegmentFileHandle
from ckpt_tool.records.elements import element_kind
from ckpt_tool.records.framing import split_records
from ckpt_tool.records.keys import key_group_for_hash, key_group_range
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

    def buffers(self) -> list[bytes]:
        if self.inline is not None:
            return split_buffers(self.inline, self.offsets, "inline channel state")
        if is_s3(self.location) and not self.segment:
            return self._ranged_buffers()
        data = _read_file(self.location)
        if self.segment:
            data = data[self.segment[0]:self.segment[0] + self.segment[1]]
        return split_buffers(data, self.offsets, self.location)

    def _ranged_buffers(self) -> list[bytes]:
        """Object stores: two ranged GETs (the last buffer's length, then the span of all
        buffers) instead of the whole file, which other subtasks' channels share."""
        if not self.offsets:
            return []
        io = io_for(self.location)
        first, last = min(self.offsets), max(self.offsets)
        (last_length,) = struct.unpack(">i", io.read_range(self.location, last, 4))
        if last_length < 0:
            raise CheckpointFormatError(f"{self.location}: negative buffer length at offset {last}")
        span = io.read_range(self.location, first, last + 4 + last_length - first)
        # split_buffers expects a whole file: a fake header and the span at its offsets
        shifted = [o - first + len(HEADER) for o in self.offsets]
        return split_buffers(HEADER + span, shifted, self.location)


@lru_cache(maxsize=16)
def _read_file(uri: str) -> bytes:
    """Channel-state files are shared by many channels; keep the last few read in this process."""
    return io_for(uri).read(uri)


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
    digests: list[bytes] = field(default_factory=list)


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


def scan_channel(task: ChannelTask, exchange: Exchange) -> ChannelStats:
    """Figures of one logical channel: buffers, elements by kind and, when keyed, key groups."""
    inputs = [b for source in task.inputs for b in source.buffers()]
    outputs = [b for source in task.outputs for b in source.buffers()]
    stats = ChannelStats(
        task.exchange_index, task.upstream_subtask, task.downstream_subtask,
        len(inputs), len(outputs), sum(map(len, inputs)) + sum(map(len, outputs)),
    )
    framed = split_records(inputs + outputs)
    stats.trailing_bytes = len(framed.trailing)
    key_of = cached_key_function(exchange) if exchange.keyed else None
    owned = key_group_range(task.max_parallelism, task.parallelism, task.downstream_subtask)
    for raw in framed.records:
        element = element_kind(raw)
        if element.kind == "watermark":
            stats.watermarks += 1
        elif element.kind != "record":
            stats.other_elements += 1
        else:
            stats.records += 1
            if key_of is not None:
                key_hash, _ = key_of(raw, element.value_offset)
                key_group = key_group_for_hash(key_hash, task.max_parallelism)
                stats.key_groups[key_group] += 1
                stats.misplaced_records += key_group not in owned
                stats.digests.append(hashlib.blake2b(raw, digest_size=16).digest())
    return stats


_KEY_FUNCTIONS: dict = {}


def cached_key_function(exchange: Exchange):
    """Build each exchange's key function once per process (plug-ins are imported once)."""
    ident = (exchange.record_type, exchange.key, exchange.decoder)
    if ident not in _KEY_FUNCTIONS:
        _KEY_FUNCTIONS[ident] = exchange.key_function()
    return _KEY_FUNCTIONS[ident]
