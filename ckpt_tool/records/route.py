"""Routing in-flight records to the subtasks of a new parallelism (seed 000 §4.1, offline).

Every record of an old logical channel u -> d (input side of d stitched with output side of u)
goes to the new downstream subtask that owns its key group (keyed exchanges) or, for rebalance
and rescale exchanges, to one chosen round robin. It lands in input channel c = u mod N_up of
the new subtask's gate, after the records of the same old channel that came before it, so the
order of each old channel is kept. Output-side data is recovered on the downstream side
(seed 000 §4.2): the new checkpoint holds only input-channel state for rescaled exchanges.
Watermarks and other non-record elements are not carried over: Flink emits watermarks anew
after a restore, and a watermark moved into another channel could make records late.

One task per new channel c of an exchange reads every old channel u -> d with u mod N_up = c,
once, and writes one channel-state file holding channel c of every new subtask (a handle's
buffers may lie anywhere in its file). No record crosses tasks, so there is no shuffle, and a
task holds one upstream subtask's channels at a time: memory does not grow with the input.
Copies of one record that Flink replicated to several old subtasks (they share the upstream
channel) are found within the task and kept once, at the lowest old subtask.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field
from itertools import groupby
from typing import Iterator

import numpy as np

from ckpt_tool.records.keys import operator_index_for_key_group
from ckpt_tool.records.scan import ChannelTask, key_groups_for, read_channel, suspect_digests, suspect_key_groups
from ckpt_tool.records.schema import Exchange
from ckpt_tool.storage import io_for, join

BUFFER_SIZE = 32 * 1024  # Flink's default network buffer (memory segment) size
_LENGTH = struct.Struct(">i")


@dataclass
class RouteSpec:
    """What a worker needs to route one exchange's records. Picklable."""

    exchange: Exchange
    new_upstream_parallelism: int
    new_downstream_parallelism: int
    max_parallelism: int


@dataclass
class RouteTask:
    """New input channel ``new_channel`` of an exchange: the old channels that feed it, in
    (upstream, downstream) order, and the file to write."""

    exchange_index: int
    new_channel: int
    channels: list[ChannelTask]
    file_name: str


@dataclass
class RoutedFile:
    """What a route task wrote: per new downstream subtask, (buffer offsets, size, records) of
    its channel ``new_channel``; and counters."""

    exchange_index: int
    new_channel: int
    file_name: str
    file_size: int = 0
    placed: dict[int, tuple[list[int], int, int]] = field(default_factory=dict)
    records_in: int = 0
    bytes_in: int = 0
    replicas_found: int = 0
    replicas_removed: int = 0
    non_records_dropped: int = 0


def route_tasks(channels: list[ChannelTask], specs: list[RouteSpec], file_name) -> list[RouteTask]:
    """Group old channels by the new channel they feed; ``file_name(exchange_index, c)``."""
    grouped: dict[tuple[int, int], list[ChannelTask]] = {}
    for task in channels:
        c = task.upstream_subtask % specs[task.exchange_index].new_upstream_parallelism
        grouped.setdefault((task.exchange_index, c), []).append(task)
    return [
        RouteTask(index, c, sorted(tasks, key=lambda t: (t.upstream_subtask, t.downstream_subtask)), file_name(index, c))
        for (index, c), tasks in sorted(grouped.items())
    ]


class _BufferWriter:
    """Cuts each new subtask's record stream into network buffers as it grows and yields them
    framed for a channel-state file (a NumPy copy per batch of buffers), noting where each went."""

    def __init__(self, result: RoutedFile):
        self.result = result
        self.position = 4  # after the file's version header
        self.pending: dict[int, bytes] = {}
        self.records: Counter = Counter()
        self.sizes: Counter = Counter()
        self.offsets: dict[int, list[int]] = {}

    def add(self, target: int, framed: bytes, records: int) -> Iterator:
        self.records[target] += records
        pending = self.pending.pop(target, b"")
        stream = pending + framed if pending else framed
        full = len(stream) // BUFFER_SIZE
        if full:
            yield self._buffers(target, stream, full, BUFFER_SIZE)
        self.pending[target] = stream[full * BUFFER_SIZE:]

    def finish(self) -> Iterator:
        for target in sorted(self.pending):
            if self.pending[target]:
                yield self._buffers(target, self.pending[target], 1, len(self.pending[target]))
        for target, offsets in self.offsets.items():
            self.result.placed[target] = (offsets, self.sizes[target], self.records[target])
        self.result.file_size = self.position

    def _buffers(self, target: int, stream: bytes, count: int, size: int) -> np.ndarray:
        """``count`` buffers of ``size`` bytes from the start of ``stream``, each after its length."""
        out = np.empty((count, 4 + size), dtype=np.uint8)
        out[:, :4] = np.frombuffer(_LENGTH.pack(size), dtype=np.uint8)
        out[:, 4:] = np.frombuffer(stream, dtype=np.uint8, count=count * size).reshape(count, size)
        step = 4 + size
        self.offsets.setdefault(target, []).extend(range(self.position, self.position + count * step, step))
        self.sizes[target] += count * step
        self.position += count * step
        return out


def route_task(task: RouteTask, spec: RouteSpec, dst: str) -> RoutedFile:
    """Route the task's records and write its channel-state file under ``dst``."""
    result = RoutedFile(task.exchange_index, task.new_channel, task.file_name)
    writer = _BufferWriter(result)

    def chunks() -> Iterator[bytes]:
        yield struct.pack(">i", 0)  # ChannelStateSerializerImpl's version
        for _, channels in groupby(task.channels, key=lambda t: t.upstream_subtask):
            for target, framed, records in _route_upstream(list(channels), spec, result):
                yield from writer.add(target, framed, records)
        yield from writer.finish()

    io_for(dst).write_stream(join(dst, task.file_name), chunks())
    return result


def _route_upstream(channels: list[ChannelTask], spec: RouteSpec, result: RoutedFile):
    """(new subtask, framed records, count) for the old channels of one upstream subtask."""
    decoded = [(task, read_channel(task)[0]) for task in channels]
    keys = key_groups_for(spec.exchange, spec.max_parallelism)
    groups = [keys.of(records, records.is_record) if keys else None for _, records in decoded]
    dropped = _replica_copies(decoded, groups, result) if keys else [None] * len(decoded)
    for (task, records), key_groups, drop in zip(decoded, groups, dropped):
        is_record = records.is_record
        result.records_in += int(is_record.sum())
        result.bytes_in += int((records.ends - records.starts)[is_record].sum())
        result.non_records_dropped += int((~is_record).sum())
        if key_groups is not None:
            targets = np.full(len(is_record), -1, dtype=np.int64)
            targets[is_record] = operator_index_for_key_group(
                spec.max_parallelism, spec.new_downstream_parallelism, key_groups.astype(np.int64)
            )
            if drop is not None:
                targets[drop] = -1
        else:
            sequence = np.arange(len(is_record))
            targets = np.where(is_record, (task.downstream_subtask + sequence) % spec.new_downstream_parallelism, -1)
        for target in np.flatnonzero(np.bincount(targets[targets >= 0])).tolist():
            chosen = targets == target
            yield target, records.framed(chosen), int(chosen.sum())


def _replica_copies(decoded, groups, result: RoutedFile) -> list:
    """Per channel, a mask of the record copies to drop: where one record is held by several old
    downstream subtasks (in key groups that several of them hold), all but the lowest's."""
    held = [(None, task.downstream_subtask, np.flatnonzero(np.bincount(g))) for (task, _), g in zip(decoded, groups)]
    suspects = suspect_key_groups(held).get(None)  # one upstream channel: no key needed
    if not suspects:
        return [None] * len(decoded)
    candidates = [suspect_digests(records, g, suspects) for (_, records), g in zip(decoded, groups)]
    digests: dict[bytes, set[int]] = {}
    for (task, _), found in zip(decoded, candidates):
        for _, digest in found:
            digests.setdefault(digest, set()).add(task.downstream_subtask)
    result.replicas_found += sum(len(s) - 1 for s in digests.values())
    drops = []
    for (task, records), found in zip(decoded, candidates):
        drop = np.zeros(len(records.tags), dtype=bool)
        for index, digest in found:
            drop[index] = min(digests[digest]) != task.downstream_subtask
        result.replicas_removed += int(drop.sum())
        drops.append(drop)
    return drops
