"""The units of work an engine runs: plain-data tasks and the functions that do them.

A task names where its buffers are (file URIs and offsets, or inline bytes), so that a worker
needs neither the metadata nor the driver. Its function reads through the one channel-state
reader, computes with the records layer, writes through the one channel-state writer, and
returns small figures.

Engines run these in batches of a bounded byte budget (``Engine.map``/``map_batches`` with
sizes), so that the number of engine tasks follows the bytes, not the number of channels; and
the work of a batch follows its bytes too: its channels are read with one call per file, framed in
one C pass and computed on with one NumPy pass (``framed_blocks``), falling back to the channel
by channel path only where that fails, which then names the channel and the element.

- ``scan_batch``: the logical channels u -> d of a batch; their figures, as columns
  (``scan_channel``: one channel, for digests of suspect records and the errors).
- ``route_task``: one new input channel c of an exchange. It reads every old channel u -> d
  with u mod N_up = c, once, and writes channel c of every new subtask (a handle's buffers may
  lie anywhere in its file). No record crosses tasks, so there is no shuffle. ``route_batch``
  reads the channels of all the route tasks of a batch first, and writes one file for them all.
- ``read_back``: a written file, read through the new metadata's handles: each handle's records
  counted and digested, and every byte of the file referenced exactly once (``check_back``: and
  compared with what was routed into each). What route tasks place and read-backs find are
  columns (``Placed``, ``ReadBack``), not an object per handle.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Optional

import numpy as np
import xxhash

from ckpt_tool.engine import BATCH_MAX_BYTES, plan_batches
from ckpt_tool.engine.channels import ChannelTable, ChannelTask, narrow, ranges
from ckpt_tool.engine.channels import channel_tasks as channel_tasks  # where the operations take it from
from ckpt_tool.errors import CheckpointFormatError, CkptError, naming
from ckpt_tool.flink.channel_state import (
    BUFFER_SIZE,
    HEADER,
    BufferSource,
    ChannelStateReader,
    ChannelStateWriter,
    Pieces,
    Placement,
    SmallChannelsFile,
    in_order,
    small_channels_file,
)
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.framing import framing as _framing
from ckpt_tool.memory import reuse_memory
from ckpt_tool.records.batch import ChannelRecords, FramedChannels, KeyGroups, Values, frame_channel, frame_joined
from ckpt_tool.records.elements import WATERMARK
from ckpt_tool.records.keys import key_group_range, operator_index_for_key_group
from ckpt_tool.records.route import (
    NotTogether,
    RouteCounters,
    RouteSpec,
    route_channel_in_pieces,
    route_together,
    route_upstream,
    together_key_groups,
)
from ckpt_tool.records.scan import DIGEST_BYTES, FIGURES, ChannelScan, ScanColumns, holding_keys, scan_records
from ckpt_tool.records.schema import Exchange
from ckpt_tool.storage import io_for, is_local, join


def read_channel(reader: ChannelStateReader, task: ChannelTask) -> ChannelRecords:
    """The channel's stitched elements: its input side, then its output side."""
    return frame_channel(b"".join([reader.payload(source) for source in task.inputs + task.outputs]))


def read_whole_records(
    reader: ChannelStateReader, task: ChannelTask, label: str, exchange: Exchange, keys: Optional[KeyGroups]
) -> ChannelRecords:
    """A channel that is rewritten must split into whole records of its type: a cut record would
    be lost, and one that does not decode is not what the schema says."""
    with naming(f"{label}: channel {task.upstream_subtask} -> {task.downstream_subtask}"):
        records = read_channel(reader, task)
        if records.trailing:
            raise _cut_record(records.trailing, len(records.data))
        check_values(records, exchange, keys)
    return records


def _cut_record(trailing: int, size: int) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"{trailing} bytes of a cut record at byte {size - trailing} (the channel's data does not split into whole records)"
    )


def _checked(
    pieces: Iterable[tuple[FramedChannels, int]], exchange: Exchange, keys: Optional[KeyGroups]
) -> Iterator[tuple[FramedChannels, int]]:
    """The pieces, each one's record values checked as ``check_values`` checks a channel's."""
    for framed, before in pieces:
        check_values(framed.records, exchange, keys)
        yield framed, before


_KEY_GROUPS: dict[tuple[int, int], tuple[Exchange, KeyGroups]] = {}  # by exchange object and max parallelism


def key_groups_of(exchange: Exchange, max_parallelism: int) -> Optional[KeyGroups]:
    """The exchange's key-group function, made once per exchange object (the channels of a batch
    share it: parsing the record type per channel would cost more than reading the channel)."""
    if not exchange.keyed:
        return None
    known = _KEY_GROUPS.get((id(exchange), max_parallelism))
    if known is None or known[0] is not exchange:
        if len(_KEY_GROUPS) > 64:
            _KEY_GROUPS.clear()
        known = _KEY_GROUPS[(id(exchange), max_parallelism)] = (exchange, KeyGroups(exchange, max_parallelism))
    return known[1]


def check_values(records: ChannelRecords, exchange: Exchange, keys: Optional[KeyGroups]) -> None:
    """Every record value must fill exactly its framed length (a keyed exchange's are checked
    as their key groups are computed)."""
    if keys is None:
        Values(exchange).check(records, records.is_record)


def scan_channel(
    task: ChannelTask, exchange: Exchange, suspects: frozenset = frozenset(), reader: Optional[ChannelStateReader] = None
) -> ChannelScan:
    """Figures of one logical channel: buffers, elements by kind and, when keyed, key groups."""
    reuse_memory()
    if reader is None:
        with ChannelStateReader() as own:
            records = read_channel(own, task)
    else:
        records = read_channel(reader, task)
    scan = ChannelScan(
        task.exchange_index,
        task.upstream_subtask,
        task.downstream_subtask,
        sum(len(s.offsets) for s in task.inputs),
        sum(len(s.offsets) for s in task.outputs),
    )
    owned = key_group_range(task.max_parallelism, task.parallelism, task.downstream_subtask)
    keys = key_groups_of(exchange, task.max_parallelism)
    with naming(f"channel {task.upstream_subtask} -> {task.downstream_subtask}"):
        check_values(records, exchange, keys)
        return scan_records(scan, records, keys, owned, suspects)


# Channels handled in one pass together hold at most about this many bytes: one pass saves the
# per-channel cost of many small channels, while blocks of a few MiB keep its arrays in the
# processor's caches and its buffers in reused memory (one pass over 64 MiB of large channels was
# 1.5 to 3 times slower than channel by channel).
TOGETHER_BYTES = 1 << 20
# Blocks are read this many bytes at a time (each file once for all of them): the p channels of a
# subtask of ckpt's rescale's output lay in p files until it wrote a file per engine task, and a
# read per 1 MiB block opened and mapped each file again (at p=4,096 dense, millions of times).
READ_TOGETHER_BYTES = 8 << 20
# A route task of at most this many bytes is routed first, then written at once where each of its new
# channels fits in a buffer (``small_channels_file``): the many small tasks of a job at high parallelism
# (a few KiB to a few MiB: a rescale of p=4,096 dense to 1,024 routes 1.6 MB into each of 1,024 new
# channels of a task, a few hundred bytes each, which at 1 MiB had streamed a call per channel).
# Larger ones stream their file as they route, a piece per target of each upstream subtask.
COLLECT_BYTES = 16 << 20
SMALL_CHANNEL = 64 << 10  # mean bytes of a channel below which a rescale reads an engine task's channels at once
# Bytes of each routed channel's digest the driver keeps until the proof, the first of its xxh3-128
# digest: a 64-bit hash, which a channel read back other than routed matches by chance once in 2^64
ROUTED_DIGEST = 8


def scan_batch(tasks: list[ChannelTask] | ChannelTable, exchanges: list[Exchange]) -> ScanColumns:
    """``scan_channel`` of every channel of an engine task, as columns: the channels of each
    exchange are read ``READ_TOGETHER_BYTES`` at a time (``framed_blocks``), and scanned
    ``TOGETHER_BYTES`` at a time with one NumPy pass over all their records. Where that fails (a
    corrupt channel, a record that does not fit its type), the channels are scanned one by one,
    which raises the error that names the channel and the element."""
    reuse_memory()
    rows = BatchRows.of(tasks)
    parts = []
    with ChannelStateReader() as reader:
        for block in framed_blocks(rows, reader, read_up_to=LARGE_CHANNEL_BYTES):
            exchange = exchanges[block.exchange_index]
            max_parallelism, parallelism = rows.parallelisms(block.start)
            if block.large:
                try:  # a large channel, in pieces (else on its own, below, which names what does not read)
                    (task,) = rows.tasks(block.start, block.stop)
                    parts.append(scan_in_pieces(reader, task, exchange, block.exchange_index, max_parallelism, parallelism))
                    continue
                except CkptError:
                    pass
            for start, stop in _row_blocks(rows.size[block.start : block.stop], block.start, TOGETHER_BYTES):
                scanned = None
                if block.read is not None:
                    framed, input_buffers, output_buffers = block.read
                    a, b = start - block.start, stop - block.start
                    try:
                        scanned = _scan_framed(
                            framed.part(a, b),
                            exchange,
                            block.exchange_index,
                            rows.upstream[start:stop],
                            rows.downstream[start:stop],
                            input_buffers[a:b],
                            output_buffers[a:b],
                            max_parallelism,
                            parallelism,
                        )
                    except CkptError:
                        pass  # channel by channel, below
                if scanned is None:
                    channels = rows.tasks(start, stop)
                    scanned = ScanColumns.of_scans([scan_channel(t, exchange, reader=reader) for t in channels])
                parts.append(scanned)
    return ScanColumns.concatenate(parts)


@dataclass
class HeldDigests:
    """Records that may be held twice (``digest_batch``): each one's exchange, upstream and
    downstream subtask, and its xxh3-128 digest (``DIGEST_BYTES`` each, in that order)."""

    exchange_index: np.ndarray
    upstream: np.ndarray
    downstream: np.ndarray
    digests: bytes

    @staticmethod
    def concatenate(parts: Sequence[HeldDigests]) -> HeldDigests:
        def column(name: str) -> np.ndarray:
            return np.concatenate([getattr(p, name) for p in parts]) if parts else np.zeros(0, np.int64)

        return HeldDigests(column("exchange_index"), column("upstream"), column("downstream"), b"".join(p.digests for p in parts))


def digest_batch(tasks: list[ChannelTask] | ChannelTable, exchanges: list[Exchange], suspects: np.ndarray) -> HeldDigests:
    """The records of an engine task's channels whose (exchange, upstream subtask, key group) is
    one of ``suspects`` (sorted ``holding_keys``: key groups several downstream subtasks of one
    upstream subtask hold), with their digests. The channels are read and framed
    ``READ_TOGETHER_BYTES`` at a time (``framed_blocks``) and digested in one call a block (an
    inflated checkpoint holds millions of such records in p² channels); a large channel, or a
    block that does not read together, channel by channel (``scan_channel``)."""
    reuse_memory()
    rows = BatchRows.of(tasks)
    parts: list[HeldDigests] = []
    with ChannelStateReader() as reader:
        for block in framed_blocks(rows, reader, read_up_to=LARGE_CHANNEL_BYTES):
            exchange = exchanges[block.exchange_index]
            max_parallelism, _ = rows.parallelisms(block.start)
            keys = key_groups_of(exchange, max_parallelism)
            if block.read is None or keys is None:
                for task in rows.tasks(block.start, block.stop):
                    mine = holding_keys(task.exchange_index, task.upstream_subtask, 0)
                    groups = suspects[(suspects >> 16) == (mine >> 16)] & 0xFFFF
                    scan = scan_channel(task, exchange, frozenset(groups.tolist()), reader=reader)
                    count = len(scan.digests) // DIGEST_BYTES
                    u, d = task.upstream_subtask, task.downstream_subtask
                    held = [np.full(count, v, dtype=np.int64) for v in (task.exchange_index, u, d)]
                    parts.append(HeldDigests(held[0], held[1], held[2], scan.digests))
                continue
            framed = block.read[0]
            records = framed.records
            check_values(records, exchange, keys)
            is_record = records.is_record
            record_channel = framed.channel[is_record]
            upstream = rows.upstream[block.start : block.stop].astype(np.int64)[record_channel]
            groups = keys.of(records, is_record).astype(np.int64)
            chosen = np.isin(holding_keys(block.exchange_index, upstream, groups), suspects)
            indices = np.flatnonzero(is_record)[chosen]
            downstream = rows.downstream[block.start : block.stop].astype(np.int64)[record_channel[chosen]]
            parts.append(
                HeldDigests(
                    np.full(len(indices), block.exchange_index, dtype=np.int64),
                    upstream[chosen],
                    downstream,
                    _framing.digests(records.data, *records.element_bounds(indices)),
                )
            )
    return HeldDigests.concatenate(parts)


# A channel of more bytes is scanned in pieces of PIECE_BUFFERS buffers (``scan_in_pieces``), not
# read whole: a channel Flink writes holds a few network buffers, but a rescale to parallelism 1 of
# a job at p=4,096 makes one new channel of all its in-flight data (1.5 GB in the bench).
LARGE_CHANNEL_BYTES = 64 << 20
PIECE_BUFFERS = 256


class ChannelPieces:
    """A stream of buffers (a channel's: its input side, then its output side, as stitched; or a
    written handle's), read ``buffers`` of them at a time and framed piece by piece, a record cut
    between two pieces carried into the next: iterates as (the piece's whole elements framed as
    one channel, how many elements came before it). Once iterated, ``bytes`` is the stream's,
    ``trailing`` the bytes of a cut record at its end and, with ``lengths``, ``lengths`` each
    buffer's payload length, in order."""

    def __init__(
        self, reader: ChannelStateReader, sources: Sequence[BufferSource], buffers: int = PIECE_BUFFERS, lengths: bool = False
    ) -> None:
        self.reader, self.sources, self.buffers, self.want_lengths = reader, sources, buffers, lengths
        self.bytes = self.trailing = 0
        self.lengths: list[int] = []

    @classmethod
    def of(cls, reader: ChannelStateReader, task: ChannelTask, buffers: int = PIECE_BUFFERS) -> ChannelPieces:
        """One channel's stream, its input side, then its output side."""
        return cls(reader, task.inputs + task.outputs, buffers)

    def __iter__(self) -> Iterator[tuple[FramedChannels, int]]:
        carry, before = b"", 0
        for source in self.sources:
            for first in range(0, len(source.offsets), self.buffers):
                offsets = source.offsets[first : first + self.buffers]
                part = BufferSource(source.location, source.inline, source.segment, offsets, source.beneath)
                if self.want_lengths:
                    piece, lengths = self.reader.payload_and_lengths(part)
                    self.lengths += lengths
                else:
                    piece = self.reader.payload(part)
                self.reader.release(part)  # read: its file's pages need not stay in this process
                self.bytes += len(piece)
                data = carry + piece if carry else piece
                del piece
                records = frame_channel(data)
                cut = len(data) - records.trailing
                carry = data[cut:]
                count = len(records.starts)
                yield (
                    FramedChannels(
                        ChannelRecords(records.data, records.starts, records.ends, records.tags, 0),
                        np.array([0, cut], dtype=np.int64),
                        np.array([0, count], dtype=np.int64),
                        np.zeros(count, dtype=np.int64),
                        np.zeros(1, dtype=np.int64),
                    ),
                    before,
                )
                before += count
                del data, records
        self.trailing = len(carry)


def scan_in_pieces(
    reader: ChannelStateReader,
    task: ChannelTask,
    exchange: Exchange,
    exchange_index: int,
    max_parallelism: int,
    parallelism: int,
    buffers: int = PIECE_BUFFERS,
) -> ScanColumns:
    """``_scan_framed`` of one channel, a piece at a time (``ChannelPieces``): the figures are sums
    over the pieces, but for its bytes and the cut record at its end."""
    upstream = np.array([task.upstream_subtask], dtype=np.int64)
    downstream = np.array([task.downstream_subtask], dtype=np.int64)
    none = np.zeros(1, dtype=np.int64)
    pieces = ChannelPieces.of(reader, task, buffers)
    summed = dict.fromkeys(("records", "watermarks", "other_elements", "misplaced_records"), 0)
    histograms: dict[int, np.ndarray] = {}
    held = []
    for framed, _ in pieces:  # each piece's figures added up as it comes
        part = _scan_framed(framed, exchange, exchange_index, upstream, downstream, none, none, max_parallelism, parallelism)
        for name in summed:
            summed[name] += int(part.columns[name][0])
        for index, counts in part.histograms.items():
            known = histograms.get(index)
            histograms[index] = counts if known is None else known + counts
        if len(part.holdings):
            held.append(part.holdings)
    fixed = {
        "exchange_index": exchange_index,
        "upstream_subtask": task.upstream_subtask,
        "downstream_subtask": task.downstream_subtask,
        "input_buffers": _buffers(task.inputs) if task.inputs else 0,
        "output_buffers": _buffers(task.outputs) if task.outputs else 0,
        "bytes": pieces.bytes,
        "trailing_bytes": pieces.trailing,
    }
    result = ScanColumns.empty()
    result.columns = {name: np.array([fixed[name] if name in fixed else summed[name]], dtype=np.int64) for name in FIGURES}
    result.histograms = histograms
    if held:
        result.holdings = np.unique(np.concatenate(held))
    return result


@dataclass(frozen=True)
class BatchRows:
    """The channels of an engine task (a table of them, or a list of tasks), with the columns a
    pass over them needs: row i is channel i."""

    channels: ChannelTable | list[ChannelTask]
    exchange_index: np.ndarray
    size: np.ndarray  # bytes of each channel's handles
    upstream: np.ndarray  # int64
    downstream: np.ndarray
    local: bool  # a table whose files are all local ones: read from its columns (``_read_rows``)

    @staticmethod
    def of(channels: ChannelTable | list[ChannelTask]) -> BatchRows:
        if isinstance(channels, ChannelTable):
            return BatchRows(
                channels,
                channels.exchange_index,
                channels.size,
                channels.upstream.astype(np.int64),
                channels.downstream.astype(np.int64),
                _all_local(channels),
            )
        tasks = list(channels)

        def column(name: str) -> np.ndarray:
            return np.fromiter((getattr(t, name) for t in tasks), dtype=np.int64, count=len(tasks))

        return BatchRows(
            tasks, column("exchange_index"), column("size"), column("upstream_subtask"), column("downstream_subtask"), False
        )

    def tasks(self, start: int, stop: int) -> list[ChannelTask]:
        channels = self.channels
        return channels.tasks(start, stop) if isinstance(channels, ChannelTable) else channels[start:stop]

    def parallelisms(self, row: int) -> tuple[int, int]:
        """The max parallelism and the (downstream) parallelism of row ``row``'s exchange."""
        channels = self.channels
        if isinstance(channels, ChannelTable):
            index = int(channels.exchange_index[row])
            return int(channels.max_parallelism[index]), int(channels.parallelism[index])
        return channels[row].max_parallelism, channels[row].parallelism

    def read(self, reader: ChannelStateReader, start: int, stop: int) -> tuple[FramedChannels, np.ndarray, np.ndarray]:
        """Rows ``start`` to ``stop`` read and framed together, with each one's input-side and
        output-side buffers."""
        if self.local:
            assert isinstance(self.channels, ChannelTable)
            return _read_rows(reader, self.channels, start, stop)
        tasks = self.tasks(start, stop)
        return (
            _read_channels(reader, tasks),
            np.fromiter((_buffers(t.inputs) for t in tasks), dtype=np.int64, count=len(tasks)),
            np.fromiter((_buffers(t.outputs) for t in tasks), dtype=np.int64, count=len(tasks)),
        )


@dataclass(frozen=True)
class FramedBlock:
    """Rows ``start`` to ``stop`` of a batch, all of one exchange, and ``read`` of them
    (``BatchRows.read``), or None where they did not read or frame together: then the caller
    reads them channel by channel, which names the channel that does not read. ``large``: one
    channel of more than ``read_up_to`` bytes, left unread for the caller to read in pieces."""

    exchange_index: int
    start: int
    stop: int
    read: Optional[tuple[FramedChannels, np.ndarray, np.ndarray]]
    large: bool = False


def framed_blocks(rows: BatchRows, reader: ChannelStateReader, read_up_to: Optional[int] = None) -> Iterator[FramedBlock]:
    """The rows of each exchange, ``READ_TOGETHER_BYTES`` at a time (a larger channel alone), each
    block read and framed together: a table of channels in local files from its columns, each file
    once per block; other channels through their tasks. What a scan, and ``ckpt records``, walk.
    With ``read_up_to``, a channel of more bytes is not read (``read`` None): the caller reads it."""
    index = rows.exchange_index
    runs = np.flatnonzero(np.diff(index, prepend=-1)).tolist() + [len(index)] if len(index) else [0]
    for run_start, run_stop in zip(runs[:-1], runs[1:]):
        exchange_index = int(index[run_start])
        for start, stop in _row_blocks(rows.size[run_start:run_stop], run_start, READ_TOGETHER_BYTES):
            if read_up_to is not None and stop - start == 1 and rows.size[start] > read_up_to:
                yield FramedBlock(exchange_index, start, stop, None, large=True)
                continue
            try:
                read: Optional[tuple[FramedChannels, np.ndarray, np.ndarray]] = rows.read(reader, start, stop)
            except CkptError:
                read = None
            yield FramedBlock(exchange_index, start, stop, read)


def read_framed(
    reader: ChannelStateReader, channels: ChannelTable | list[ChannelTask], start: int = 0, stop: Optional[int] = None
) -> FramedChannels:
    """Every channel (of a table: rows ``start`` to ``stop``), read and framed together (the
    framing only: not each channel's buffers, nor the subtask columns of ``BatchRows``)."""
    if isinstance(channels, ChannelTable):
        stop = len(channels) if stop is None else stop
        if _all_local(channels):
            return _read_rows(reader, channels, start, stop, buffers=False)[0]
        channels = channels.tasks(start, stop)
    return _read_channels(reader, channels)


def _all_local(table: ChannelTable) -> bool:
    """Whether every file of the table is a local one (not inline data, not an object store's)."""
    return all(location is not None and inline is None and is_local(location) for location, inline, _, _ in table.files)


def _row_blocks(sizes: Sequence[int] | np.ndarray, start: int, limit: int) -> list[tuple[int, int]]:
    """Runs of consecutive rows (from ``start``, of these sizes) of at most ``limit`` bytes (a
    larger row alone), as (start, stop): ``plan_batches``, a search per run (p² rows at p=4,096)."""
    return [(start + run.start, start + run.stop) for run in plan_batches(sizes, limit)]


def _read_rows(
    reader: ChannelStateReader, table: ChannelTable, start: int, stop: int, buffers: bool = True
) -> tuple[FramedChannels, np.ndarray, np.ndarray]:
    """``_read_channels`` of rows ``start`` to ``stop`` of a table whose files are local, from its
    columns: each file's buffers read with one call. Returns the framed channels and each
    channel's input-side and output-side buffers (empty arrays where not ``buffers``)."""
    first = int(table.source_start[start])
    last = int(table.source_start[stop - 1]) + int(table.inputs[stop - 1]) + int(table.outputs[stop - 1])
    source_file = table.source_file[first:last]
    counts = table.offset_count[first:last].astype(np.int64)
    offset_start = table.offset_start[first:last].astype(np.int64)
    # the sources of one file together, in table order: a radix sort where the file indexes fit in
    # 16 bits (a route task's table comes joined, its indexes 64-bit: there a merge sort, 6 times as long)
    order = np.argsort(source_file.astype(np.uint16) if len(table.files) <= 1 << 16 else source_file, kind="stable")
    ordered = source_file[order]
    groups = np.flatnonzero(np.diff(ordered, prepend=-1)).tolist() + [len(order)]
    ordered_counts = counts[order]
    offsets = table.offsets[ranges(offset_start[order], ordered_counts)]  # file by file
    offset_bounds = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(ordered_counts, out=offset_bounds[1:])
    sizes = np.zeros(last - first, dtype=np.int64)
    blobs: list[tuple[np.ndarray, bytes]] = []
    for a, b in zip(groups[:-1], groups[1:]):
        members = order[a:b]
        location, _, segment, beneath = table.files[int(ordered[a])]
        here = offsets[int(offset_bounds[a]) : int(offset_bounds[b])]
        blob, found, _ = reader.grouped_payloads(
            BufferSource(location, None, segment, here, beneath), ordered_counts[a:b], lengths=False
        )
        sizes[members] = found
        blobs.append((members, blob))
    del ordered, ordered_counts, offset_bounds
    data = in_order(blobs, sizes)  # back into table order (emptying blobs)
    source_bounds = np.zeros(last - first + 1, dtype=np.int64)
    np.cumsum(sizes, out=source_bounds[1:])
    rows = stop - start
    per_channel = table.inputs[start:stop].astype(np.int64) + table.outputs[start:stop]
    channel_first = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(per_channel, out=channel_first[1:])
    framed = frame_joined(data, source_bounds[channel_first])
    if not buffers:
        return framed, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    channel_of_source = np.repeat(np.arange(rows), per_channel)
    is_input = np.arange(last - first) - channel_first[:-1][channel_of_source] < table.inputs[start:stop][channel_of_source]
    input_buffers = np.bincount(channel_of_source, weights=counts * is_input, minlength=rows).astype(np.int64)
    output_buffers = np.bincount(channel_of_source, weights=counts * ~is_input, minlength=rows).astype(np.int64)
    return framed, input_buffers, output_buffers


def _read_channels(reader: ChannelStateReader, tasks: list[ChannelTask]) -> FramedChannels:
    """The channels' stitched streams, framed together (``frame_channels``)."""
    sources = [source for task in tasks for source in task.inputs + task.outputs]
    data, sizes = reader.joined_payloads(sources)
    per_channel = np.fromiter((len(task.inputs) + len(task.outputs) for task in tasks), dtype=np.int64, count=len(tasks))
    source_bounds = np.zeros(len(sources) + 1, dtype=np.int64)  # source i: data[source_bounds[i]:source_bounds[i + 1]]
    np.cumsum(sizes, out=source_bounds[1:])
    last_source = np.zeros(len(tasks) + 1, dtype=np.int64)
    np.cumsum(per_channel, out=last_source[1:])
    bounds = source_bounds[last_source]
    return frame_joined(data, bounds)


def _scan_framed(
    framed: FramedChannels,
    exchange: Exchange,
    exchange_index: int,
    upstream: np.ndarray,
    downstream: np.ndarray,
    input_buffers: np.ndarray,
    output_buffers: np.ndarray,
    max_parallelism: int,
    parallelism: int,
) -> ScanColumns:
    """The figures of channels of one exchange, framed together."""
    records, channel, count = framed.records, framed.channel, len(upstream)
    keys = key_groups_of(exchange, max_parallelism)
    check_values(records, exchange, keys)
    is_record = records.is_record
    record_channel = channel[is_record]
    found = np.bincount(record_channel, minlength=count)
    watermarks = np.bincount(channel[records.tags == WATERMARK], minlength=count)
    misplaced = np.zeros(count, dtype=np.int64)
    result = ScanColumns.empty()
    if keys is not None and len(record_channel):
        groups = keys.of(records, is_record).astype(np.int64)
        held_by = downstream[record_channel]
        start = (held_by * max_parallelism + parallelism - 1) // parallelism  # key_group_range, vectorised
        stop = ((held_by + 1) * max_parallelism - 1) // parallelism + 1
        astray = (groups < start) | (groups >= stop)
        misplaced = np.bincount(record_channel[astray], minlength=count)
        result.histograms[exchange_index] = np.bincount(groups, minlength=max_parallelism).astype(np.int64)
        if astray.any():  # where the key groups that may be held twice are (``suspects_of_holdings``)
            result.holdings = np.unique(holding_keys(exchange_index, upstream[record_channel[astray]], groups[astray]))
    result.columns = {
        "exchange_index": np.full(count, exchange_index, dtype=np.int64),
        "upstream_subtask": upstream,
        "downstream_subtask": downstream,
        "input_buffers": input_buffers,
        "output_buffers": output_buffers,
        "bytes": np.diff(framed.bounds),
        "records": found.astype(np.int64),
        "watermarks": watermarks.astype(np.int64),
        "other_elements": (np.bincount(channel, minlength=count) - found - watermarks).astype(np.int64),
        "trailing_bytes": framed.trailing.astype(np.int64),
        "misplaced_records": misplaced.astype(np.int64),
    }
    return result


def _buffers(sources: list[BufferSource]) -> int:
    return len(sources[0].offsets) if len(sources) == 1 else sum(len(s.offsets) for s in sources)


@dataclass
class Junction:
    """Where the output side of a logical channel meets its input side: whether the stitched
    stream splits into whole elements with valid tags (``problem`` says why not), and whether both
    sides hold data (an empty side proves nothing)."""

    exchange_index: int
    upstream_subtask: int
    downstream_subtask: int
    both_sides: bool
    problem: Optional[str] = None


def junction(task: ChannelTask) -> Junction:
    """The framing-level test of the pairing of ``task``'s output side with its input side: the
    output side must continue the input side's last record, and every element from there on must
    be whole and carry a valid ``StreamElementSerializer`` tag."""
    with ChannelStateReader() as reader:
        inputs = b"".join(reader.payload(source) for source in task.inputs)
        outputs = b"".join(reader.payload(source) for source in task.outputs)
    result = Junction(task.exchange_index, task.upstream_subtask, task.downstream_subtask, bool(inputs and outputs))
    if not inputs and not outputs:
        return result
    try:
        records = frame_channel(inputs + outputs)
    except CkptError as exc:
        result.problem = str(exc)
        return result
    if records.trailing:
        where = "at the end of the input side, with no output side to continue it" if not outputs else "at the end"
        result.problem = f"{records.trailing} bytes of a cut record {where} (byte {len(records.data) - records.trailing})"
    return result


# --- routing ------------------------------------------------------------------------------------


def inflight_file_name(downstream_id: str, gate: int, channel: int) -> str:
    return f"ckpt-inflight-{downstream_id}-{gate}-{channel}"


ATTEMPT = "-attempt-"


def attempt_file_name(file_name: str) -> str:
    """The name this attempt of a task writes: on Spark, which retries failed tasks and may run
    speculative copies, every attempt writes a file of its own (``<name>-attempt-<id>``); the
    driver references the winner's and, once no attempt runs any more, removes the others
    (``discard_other_attempts``)."""
    if "pyspark" in sys.modules:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None:
            return f"{file_name}{ATTEMPT}{context.taskAttemptId()}"
    return file_name


def discard_other_attempts(dst: str, task_files: list[str], routed: list[RoutedFile]) -> list[str]:
    """Remove the files that attempts of the route tasks writing ``task_files``, other than the
    ones in ``routed``, left under ``dst`` (a failed, lost or speculative attempt); returns their
    names."""
    winners = {r.file_name for r in routed}
    prefixes = tuple(name + ATTEMPT for name in task_files)
    io, removed = io_for(dst), []
    for name in io.list_names(dst):  # the files directly in dst: ckpt writes into no subdirectory
        if name.startswith(prefixes) and name not in winners:
            io.delete(join(dst, name))
            removed.append(name)
    return removed


@dataclass
class RouteTask:
    """New input channel ``new_channel`` of an exchange: the old channels that feed it, in
    (upstream, downstream) order (a table of only theirs), and the file to write."""

    exchange_index: int
    new_channel: int
    channels: ChannelTable
    file_name: str

    @property
    def size(self) -> int:
        return int(self.channels.size.sum())


@dataclass
class Placed:
    """Where a route task's file holds channel ``new_channel`` of each new downstream subtask, as
    columns in subtask order (a route task of a job at high parallelism places hundreds): row i
    is subtask ``subtask[i]``, its buffers' offsets ``offsets[bounds[i]:bounds[i + 1]]``, the
    handle's state size, and the records routed into it with a digest of their bytes
    (``digests[8 * i : 8 * i + 8]``, ``short_digests``)."""

    subtask: np.ndarray
    size: np.ndarray
    records: np.ndarray
    digests: bytes
    offsets: np.ndarray
    bounds: np.ndarray
    payload: int = -1  # payload bytes of its buffers once ``figures_only`` (-1: from the columns)

    def __len__(self) -> int:
        return len(self.subtask)

    def figures_only(self) -> Placed:
        """Without where its buffers lie (once they are placed in the new metadata): what the
        proof and the report still use, at a third less of the driver's memory."""
        none = np.zeros(0, dtype=np.int32)
        return Placed(self.subtask, none, self.records, self.digests, none, np.zeros(1, dtype=np.int32), self.payload_bytes)

    @classmethod
    def empty(cls) -> Placed:
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, none, b"", none, np.zeros(1, dtype=np.int64))

    def digest_matrix(self) -> np.ndarray:
        """The digests as a (rows, ROUTED_DIGEST) array of bytes."""
        return np.frombuffer(self.digests, dtype=np.uint8).reshape(len(self), ROUTED_DIGEST)

    @property
    def payload_bytes(self) -> int:
        """Payload bytes of all its buffers (without their 4-byte lengths)."""
        return self.payload if self.payload >= 0 else int(self.size.sum()) - 4 * len(self.offsets)


@dataclass
class RoutedFile:
    """What a route task wrote: per new downstream subtask, its channel ``new_channel``."""

    exchange_index: int
    new_channel: int
    file_name: str
    file_size: int = 0
    placed: Placed = field(default_factory=Placed.empty)
    counters: RouteCounters = field(default_factory=RouteCounters)


def _placed(placed: dict[int, Placement], records: Counter, digests: dict[int, Any], shift: int = 0) -> Placed:
    """Placements as columns (their offsets ``shift`` bytes further on), with the records and
    digests routed to each target."""
    targets = sorted(placed)
    placements = [placed[t] for t in targets]
    bounds = np.zeros(len(targets) + 1, dtype=np.int64)
    np.cumsum([len(p.offsets) for p in placements], out=bounds[1:])
    offsets = np.fromiter(chain.from_iterable(p.offsets for p in placements), dtype=np.int64, count=int(bounds[-1]))
    offsets += shift
    # narrowed where they fit: the driver holds every task's (9.4 million rows from 4,096 to 3,072)
    return Placed(
        narrow(np.array(targets, dtype=np.int64)),
        narrow(np.array([p.size for p in placements], dtype=np.int64)),
        narrow(np.array([records[t] for t in targets], dtype=np.int64)),
        b"".join([digests[t].digest()[:ROUTED_DIGEST] for t in targets]),
        narrow(offsets),
        narrow(bounds),
    )


def _placed_small(small: SmallChannelsFile, shift: int) -> Placed:
    """``_placed`` of a file made at once: a buffer per non-empty target."""
    held = small.offsets >= 0
    bounds = np.zeros(len(small.targets) + 1, dtype=np.int64)
    np.cumsum(held, out=bounds[1:])
    return Placed(
        narrow(small.targets),
        narrow(small.sizes),
        narrow(small.records),
        short_digests(small.digests()),
        narrow(small.offsets[held] + shift),
        narrow(bounds),
    )


class RouteTasks:
    """The route tasks of a rescale, made lazily (``Lazy``: an engine makes a batch's tasks where
    it runs): task i is new input channel ``new_channel[i]`` of exchange ``exchange[i]``, fed by
    rows ``bounds[i]`` to ``bounds[i + 1]`` of one channel table in route order. The driver holds
    that one table, not a copy per task besides it (at p=4,096 dense, 16.8 million channels)."""

    def __init__(self, table: ChannelTable, specs: list[RouteSpec]) -> None:
        self.table = table
        modulus = np.array([spec.new_upstream_parallelism for spec in specs], dtype=np.int64)
        exchange = table.exchange_index.astype(np.int64)
        new_channel = table.upstream % modulus[exchange] if len(exchange) else exchange
        key = exchange * (int(modulus.max(initial=1)) + 1) + new_channel
        if len(key) > 1 and not (np.diff(key) >= 0).all():
            raise ValueError("the channel table is not in route order (channel_tasks(..., grouped=...))")
        starts = np.flatnonzero(np.diff(key, prepend=-1)) if len(key) else key
        self.bounds = np.append(starts, len(key)).astype(np.int64)
        self.exchange = exchange[starts].astype(np.int32)
        self.new_channel = new_channel[starts].astype(np.int32)
        self.names = [
            inflight_file_name(specs[e].exchange.downstream_id, specs[e].exchange.gate, c)
            for e, c in zip(self.exchange.tolist(), self.new_channel.tolist())
        ]

    def __len__(self) -> int:
        return len(self.names)

    @property
    def sizes(self) -> np.ndarray:
        """Each task's bytes."""
        if not len(self):
            return np.zeros(0, dtype=np.int64)
        return np.add.reduceat(self.table.size.astype(np.int64), self.bounds[:-1])

    def part(self, start: int, stop: int) -> list[RouteTask]:
        """Tasks ``start`` to ``stop``: the rows of all of them taken at once, each task a slice
        of those (``ChannelTable.slice``, sharing the files)."""
        if start >= stop:
            return []
        bounds = self.bounds.tolist()
        base = bounds[start]
        rows = self.table.part(base, bounds[stop])
        return [
            RouteTask(
                int(self.exchange[i]), int(self.new_channel[i]), rows.slice(bounds[i] - base, bounds[i + 1] - base), self.names[i]
            )
            for i in range(start, stop)
        ]

    def __iter__(self) -> Iterator[RouteTask]:
        return iter(self.part(0, len(self)))


def route_tasks(checkpoint: Checkpoint, exchanges: list[Exchange], specs: list[RouteSpec]) -> RouteTasks:
    """The old channels of ``exchanges`` grouped by the new channel they feed (``specs``: each
    exchange's new parallelisms), one route task per group."""
    modulus = [spec.new_upstream_parallelism for spec in specs]
    return RouteTasks(channel_tasks(checkpoint, exchanges, grouped=modulus), specs)


def route_task(
    task: RouteTask,
    spec: RouteSpec,
    writer: ChannelStateWriter,
    reader: ChannelStateReader,
    result: RoutedFile,
    framed: Optional[TaskWindow] = None,
) -> Iterator[Any]:
    """Route the task's records into the channel-state file ``writer`` writes, after what it
    holds: yields the file's bytes; ``result`` says what went where once it is done. The channels
    of each upstream subtask are read, framed and routed together (``route_together``); where they
    hold copies of records or do not fit, channel by channel (``route_upstream``), which finds the
    copies or names the channel and the record that does not fit. ``framed``: the task's rows of
    its batch's channels, read a window at a time (``route_batch``)."""
    reuse_memory()
    keys = key_groups_of(spec.exchange, spec.max_parallelism)
    records: Counter = Counter()
    digests: dict[int, Any] = {}  # xxh3-128 digests in progress, by target
    table = task.channels  # in (upstream, downstream) order
    old_parallelism = table.parallelism[task.exchange_index]

    def together(start: int, stop: int) -> Optional[Pieces]:
        if int(table.size[start:stop].sum()) > SMALL_CHANNEL * (stop - start):  # large channels: one by one is faster
            return None
        try:
            mine = framed.part(start, stop) if framed is not None else None
            if mine is None:  # not read with the batch's channels (or their window did not read)
                mine = _read_channels(reader, table.tasks(start, stop))
            if mine.trailing.any():
                return None
            check_values(mine.records, spec.exchange, keys)
            downstreams = table.downstream[start:stop].astype(np.int64)
            upstream = int(table.upstream[start])
            return route_together(mine, downstreams, spec, keys, result.counters, upstream, old_parallelism)
        except (CkptError, NotTogether):
            return None

    def one_by_one(start: int, stop: int):
        channels = table.tasks(start, stop)
        decoded = [(t.downstream_subtask, read_whole_records(reader, t, spec.label, spec.exchange, keys)) for t in channels]
        with naming(spec.label):
            yield from route_upstream(decoded, spec, keys, result.counters, channels[0].upstream_subtask, old_parallelism)

    def in_pieces(channel: ChannelTask):
        """A large channel, its upstream subtask's only one: routed a piece at a time
        (``ChannelPieces``), not read whole."""
        with naming(f"{spec.label}: channel {channel.upstream_subtask} -> {channel.downstream_subtask}"):
            pieces = ChannelPieces.of(reader, channel, PIECE_BUFFERS)
            for part in route_channel_in_pieces(
                _checked(pieces, spec.exchange, keys),
                channel.downstream_subtask,
                spec,
                keys,
                result.counters,
                channel.upstream_subtask,
                old_parallelism,
            ):
                yield from part
            if pieces.trailing:
                raise _cut_record(pieces.trailing, pieces.bytes)

    def routed() -> Iterator[Iterable[tuple[int, Any, int]]]:
        """Pieces (target, framed records, their count), upstream subtask by upstream subtask:
        columns where routed together, else as ``route_upstream`` yields them; an upstream
        subtask's one channel above LARGE_CHANNEL_BYTES a piece at a time (``in_pieces``)."""
        bounds = np.flatnonzero(np.diff(table.upstream, prepend=-1)).tolist() + [len(table)] if len(table) else [0]
        for start, stop in zip(bounds[:-1], bounds[1:]):
            if stop - start == 1 and int(table.size[start]) > LARGE_CHANNEL_BYTES:
                yield in_pieces(table.tasks(start, stop)[0])
                continue
            together_routed = together(start, stop)
            yield one_by_one(start, stop) if together_routed is None else together_routed

    blocks: Iterable[Iterable[tuple[int, Any, int]]] = routed()
    if task.size <= COLLECT_BYTES:  # small: routed first, then written at once where every channel is one buffer
        columns = [block if isinstance(block, Pieces) else Pieces.of(list(block)) for block in blocks]
        small = small_channels_file(Pieces.concatenate(columns))
        if small is not None:
            shift, rest = writer.append(small.data)
            yield rest
            result.placed = _placed_small(small, shift)
            return
        blocks = columns  # some channel fills a buffer: streamed, from the pieces routed
    # each upstream subtask's columns a piece per target (not per old channel and target)
    for target, piece, count in chain.from_iterable(b.by_target() if isinstance(b, Pieces) else b for b in blocks):
        records[target] += count
        digests.setdefault(target, xxhash.xxh3_128()).update(piece)
        yield from writer.add(target, piece)
    yield from writer.finish()
    result.placed = _placed(writer.take_placements(), records, digests)


# An engine task's channels are read this many bytes of them at a time (a larger upstream subtask's
# alone): its whole budget at most (``BATCH_MAX_BYTES``), so that a batch within it is read as one,
# each file once; a route task above it (one new channel fed by many old ones: a rescale of
# p=4,096 dense to 1 is one task of 1.6 GB) holds one window at a time, not all it routes.
READ_WINDOW_BYTES = BATCH_MAX_BYTES


class ReadWindows:
    """Rows of a route batch's table read and framed a window at a time, as its tasks ask for
    them (in order): a window is the rows from the first one asked for, up to READ_WINDOW_BYTES
    (or to the last one asked for, where that is more)."""

    def __init__(self, reader: ChannelStateReader, table: ChannelTable, budget: int = READ_WINDOW_BYTES) -> None:
        self.reader, self.table, self.budget = reader, table, budget
        self.ends = np.zeros(len(table) + 1, dtype=np.int64)
        np.cumsum(table.size, out=self.ends[1:])
        self.start = self.stop = 0
        self.framed: Optional[FramedChannels] = None

    def part(self, start: int, stop: int) -> Optional[FramedChannels]:
        """Rows ``start`` to ``stop``, framed; None where their window does not read (the task
        then reads them itself, and says which channel does not)."""
        if not self.start <= start < stop <= self.stop:
            self.framed = None  # the window before is let go first
            end = int(np.searchsorted(self.ends, self.ends[start] + self.budget, side="right")) - 1
            self.start, self.stop = start, min(len(self.table), max(stop, end))
            try:
                self.framed = read_framed(self.reader, self.table, self.start, self.stop)
            except CkptError:
                self.framed = None
        return None if self.framed is None else self.framed.part(start - self.start, stop - self.start)


@dataclass
class TaskWindow:
    """A route task's rows of its batch's ``ReadWindows``: its row ``i`` is the batch's ``offset + i``."""

    windows: ReadWindows
    offset: int

    def part(self, start: int, stop: int) -> Optional[FramedChannels]:
        return self.windows.part(self.offset + start, self.offset + stop)


def route_batch(tasks: list[RouteTask], specs: list[RouteSpec], dst: str) -> list[RoutedFile]:
    """``route_task`` of every task of an engine task, into one channel-state file for them all
    (named after the first task's, ``batch_file_name``): a new subtask's channels then lie in one
    file per batch (a few, by bytes), not one per channel (p of them, as Flink's restore and every
    read of the output would open). The channels of all the tasks are read together, each file
    once per window of READ_WINDOW_BYTES (``ReadWindows`` over the tasks' tables joined), so that
    files shared by the tasks are not opened again and again (a reader keeps at most MAX_OPEN_MAPS
    open), and a batch larger than that does not hold all its channels at once."""
    whole = ChannelTable.concatenate([task.channels for task in tasks])
    name = attempt_file_name(batch_file_name(tasks))
    writer = ChannelStateWriter()
    results = [RoutedFile(task.exchange_index, task.new_channel, name) for task in tasks]
    with ChannelStateReader() as reader:
        # many small channels: every file read once per window, its channels' buffers in one call,
        # then each task routed from memory; else each task reads its channels itself
        windows = ReadWindows(reader, whole) if len(whole) and int(whole.size.sum()) <= SMALL_CHANNEL * len(whole) else None

        def chunks() -> Iterator[Any]:
            yield from writer.start()
            at_once = routed_at_once(tasks, specs, whole, windows) if windows is not None else None
            if at_once is not None:
                yield from at_once.write(writer, results)
                return
            position = 0
            for task, result in zip(tasks, results):
                mine = TaskWindow(windows, position) if windows is not None else None
                yield from route_task(task, specs[task.exchange_index], writer, reader, result, mine)
                position += len(task.channels)

        io_for(dst).write_stream(join(dst, name), chunks())
    for result in results:
        result.file_size = writer.size
    return results


# A batch routed at once (``RoutedAtOnce``) is laid out this many bytes of its tasks at a time: the
# copies stay in the heap an engine task keeps (``reuse_memory``), not mapped and zeroed afresh.
AT_ONCE_CHUNK_BYTES = 4 << 20


@dataclass
class RoutedAtOnce:
    """An engine task's route tasks routed in one NumPy pass over all their records
    (``routed_at_once``): the records of piece i (one task's records for one new subtask, task
    by task, subtasks ascending) are ``chosen[firsts[i]:firsts[i + 1]]`` of ``framed``."""

    tasks: list[RouteTask]
    new_parallelism: int
    framed: FramedChannels
    chosen: np.ndarray
    keys: np.ndarray  # each piece's task * new_parallelism + new subtask
    firsts: np.ndarray
    payload: np.ndarray  # each piece's bytes
    records_in: np.ndarray  # per task
    bytes_in: np.ndarray
    dropped: np.ndarray

    def write(self, writer: ChannelStateWriter, results: list[RoutedFile]) -> Iterator[memoryview]:
        """The bytes of every task's file after what ``writer`` holds, made at once
        (``small_channels_file``) a few MiB of tasks at a time, and each task's placements and
        counters in ``results``."""
        records = self.framed.records
        piece_task = self.keys // self.new_parallelism
        task_pieces = np.searchsorted(piece_task, np.arange(len(self.tasks) + 1))
        piece_bytes = np.zeros(len(self.payload) + 1, dtype=np.int64)
        np.cumsum(self.payload, out=piece_bytes[1:])
        task_bytes = piece_bytes[task_pieces]  # before each task
        task = 0
        while task < len(self.tasks):
            stop = max(task + 1, int(np.searchsorted(task_bytes, task_bytes[task] + AT_ONCE_CHUNK_BYTES, side="right")) - 1)
            a, b = int(task_pieces[task]), int(task_pieces[stop])
            chosen = self.chosen[self.firsts[a] : self.firsts[b]]
            data = _framing.gather(records.data, records.starts[chosen], records.ends[chosen])
            ends = piece_bytes[a + 1 : b + 1] - piece_bytes[a]
            small = small_channels_file(
                Pieces(self.keys[a:b], data, ends - self.payload[a:b], ends, np.diff(self.firsts[a : b + 1]))
            )
            assert small is not None  # no piece fills a buffer (``routed_at_once``)
            shift, rest = writer.append(small.data)
            placed = _placed_small(small, shift)
            subtasks = narrow(small.targets.astype(np.int64) % self.new_parallelism)
            for index in range(task, stop):
                first, last = int(task_pieces[index]) - a, int(task_pieces[index + 1]) - a
                begin, end = int(placed.bounds[first]), int(placed.bounds[last])
                results[index].placed = Placed(
                    subtasks[first:last],
                    placed.size[first:last],
                    placed.records[first:last],
                    placed.digests[first * ROUTED_DIGEST : last * ROUTED_DIGEST],
                    placed.offsets[begin:end],
                    narrow(placed.bounds[first : last + 1].astype(np.int64) - begin),
                )
                counters = results[index].counters
                counters.records_in += int(self.records_in[index])
                counters.bytes_in += int(self.bytes_in[index])
                counters.non_records_dropped += int(self.dropped[index])
            yield rest
            task = stop


def routed_at_once(
    tasks: list[RouteTask], specs: list[RouteSpec], whole: ChannelTable, windows: ReadWindows
) -> Optional[RoutedAtOnce]:
    """The route tasks of an engine task routed in one NumPy pass over all their records (a
    rescale at p=4,096 has thousands of small tasks, each of a few upstream subtasks' channels: a
    pass per upstream subtask and a file made per task cost more than their records), where every
    task is of one keyed exchange, its upstream subtasks' channels are routed together
    (``route_together``) and its file is made at once (``small_channels_file``). Its ``write``
    gives the same bytes, placements and counts as ``route_task`` of each task. Else None, and
    nothing counted: each task is then routed on its own, which names what does not fit."""
    exchanges = {task.exchange_index for task in tasks}
    if len(exchanges) != 1 or any(task.size > COLLECT_BYTES for task in tasks):
        return None
    reuse_memory()
    spec = specs[tasks[0].exchange_index]
    keys = key_groups_of(spec.exchange, spec.max_parallelism)
    if keys is None or not len(whole):
        return None
    # each upstream subtask's channels in each task: one group (the tasks' rows one after another)
    task_of_row = np.repeat(np.arange(len(tasks), dtype=np.int64), [len(task.channels) for task in tasks])
    upstream = whole.upstream.astype(np.int64)
    starts = np.flatnonzero(np.diff(upstream, prepend=-1) | np.diff(task_of_row, prepend=-1))
    if (np.add.reduceat(whole.size.astype(np.int64), starts) > SMALL_CHANNEL * np.diff(np.append(starts, len(whole)))).any():
        return None  # some upstream subtask's channels are large: one by one
    group_of_row = np.zeros(len(whole), dtype=np.int64)
    group_of_row[starts] = 1
    np.cumsum(group_of_row, out=group_of_row)
    group_of_row -= 1
    framed = windows.part(0, len(whole))
    if framed is None or framed.trailing.any():
        return None
    records, channel = framed.records, framed.channel
    try:
        check_values(records, spec.exchange, keys)
        old_parallelism = int(whole.parallelism[tasks[0].exchange_index])
        groups = together_key_groups(framed, whole.downstream, spec, keys, old_parallelism, group_of_row)
    except (CkptError, NotTogether):
        return None
    is_record = records.is_record
    record_task = task_of_row[channel[is_record]]
    # each task's records by new subtask (stable: a subtask's records channel by channel, as routed)
    new_parallelism = spec.new_downstream_parallelism
    piece_key = record_task * new_parallelism + operator_index_for_key_group(spec.max_parallelism, new_parallelism, groups)
    order = np.argsort(piece_key, kind="stable")
    ordered_key = piece_key[order]
    firsts = np.flatnonzero(np.diff(ordered_key, prepend=-1))
    record_lengths = (records.ends - records.starts)[is_record].astype(np.int64)
    chosen = np.flatnonzero(is_record)[order]
    payload = np.add.reduceat(record_lengths[order], firsts) if len(firsts) else np.zeros(0, dtype=np.int64)
    if (payload >= BUFFER_SIZE).any():
        return None  # some new channel fills a buffer: streamed
    return RoutedAtOnce(
        tasks,
        new_parallelism,
        framed,
        chosen,
        ordered_key[firsts],
        np.append(firsts, len(chosen)),
        payload,
        np.bincount(record_task, minlength=len(tasks)),
        np.bincount(record_task, weights=record_lengths, minlength=len(tasks)).astype(np.int64),
        np.bincount(task_of_row[channel[~is_record]], minlength=len(tasks)),
    )


def batch_file_name(tasks: list[RouteTask]) -> str:
    """The file the route tasks of one engine task write together: the first one's name (the
    names of all of them are journaled before any is written)."""
    return tasks[0].file_name


# --- reading back -------------------------------------------------------------------------------


@dataclass
class ReadBackTask:
    """A written channel-state file and the handles the new metadata holds into it: handle h's
    buffers are the next ``counts[h]`` of ``offsets``; ``routed``: the ``routed_digest`` of what
    was routed into the handles' channels, which ``check_back`` compares with what they read back."""

    name: str
    location: str
    size: int
    offsets: np.ndarray
    counts: np.ndarray
    routed: bytes = b""


@dataclass
class ReadBack:
    """A written file read back through its handles (in the task's order): each handle's records,
    their xxh3-128 digest (16 bytes each, one after another) and the bytes of a cut record at its
    end (narrowed); ``problem`` says which bytes of the file no handle, or two, reference. Compared
    where it is read (``check_back``); the driver reads one only to name a handle that differs."""

    name: str
    problem: Optional[str]
    records: np.ndarray
    digests: bytes
    trailing: np.ndarray


@dataclass
class BackChecked:
    """``check_back`` of a written file: ``problem`` as ``ReadBack`` says it; ``differs``: some
    handle reads back other records than were routed into it, or a cut record."""

    name: str
    problem: Optional[str]
    differs: bool


def short_digests(digests: bytes) -> bytes:
    """The first ROUTED_DIGEST bytes of each 16-byte xxh3-128 digest in ``digests``: what the
    driver keeps of each routed channel's digest (16.8 million channels at p=4,096 dense: 134 MB
    rather than 268)."""
    return np.frombuffer(digests, dtype=np.uint8).reshape(-1, 16)[:, :ROUTED_DIGEST].tobytes()


def routed_digest(records: np.ndarray, digests: bytes) -> bytes:
    """One xxh3-128 digest of the records of a file's handles, in order: each one's record count
    and the digest of its records' bytes (``digests``, ``short_digests``)."""
    combined = xxhash.xxh3_128(np.ascontiguousarray(records, dtype=np.int64).tobytes())
    combined.update(digests)
    return combined.digest()


def check_back(task: ReadBackTask) -> BackChecked:
    """``read_back`` of the task's file, compared where it is read with what was routed into its
    handles (``task.routed``): the driver gets a few figures per file back, not a row per handle
    (16.8 million, ``repair`` at p=4,096 dense), and reads a file again handle by handle only
    where it differs, to name the handle."""
    back = read_back(task)
    if back.problem:
        return BackChecked(task.name, back.problem, False)
    differs = bool(back.trailing.any()) or routed_digest(back.records, short_digests(back.digests)) != task.routed
    return BackChecked(task.name, None, differs)


def read_back(task: ReadBackTask) -> ReadBack:
    """Read a written file's handles as Flink will: count and digest each handle's records, and
    check that its buffers and nothing else fill the file. All handles are read and framed in one
    pass; large channels, or where that pass fails, handle by handle (which says where)."""
    if task.size > SMALL_CHANNEL * len(task.counts):  # large channels: one by one is faster
        return _read_back_one_by_one(task)
    try:
        return _read_back_together(task)
    except CkptError:
        return _read_back_one_by_one(task)


def _read_back_together(task: ReadBackTask) -> ReadBack:
    with ChannelStateReader() as reader:
        source = BufferSource(task.location, None, None, task.offsets.tolist())
        data, sizes, lengths = reader.grouped_payloads(source, task.counts)
    assert lengths is not None
    bounds = np.zeros(len(task.counts) + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    framed = frame_joined(data, bounds)
    counts = np.bincount(framed.channel[framed.records.is_record], minlength=len(task.counts)).astype(np.int64)
    trailing = framed.trailing.astype(np.int64)
    digests = _framing.digests(data, bounds[:-1], bounds[1:] - trailing)
    return ReadBack(task.name, _coverage(task, lengths), narrow(counts), digests, narrow(trailing))


# A handle is read back this many buffers at a time (8 MiB of Flink's default 32 KiB buffers).
READ_BACK_BUFFERS = 256


def _read_back_one_by_one(task: ReadBackTask) -> ReadBack:
    records, digests, trailing, lengths = [], [], [], []
    bounds = np.zeros(len(task.counts) + 1, dtype=np.int64)
    np.cumsum(task.counts, out=bounds[1:])
    with ChannelStateReader() as reader:
        for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            # READ_BACK_BUFFERS at a time: a handle holds a new channel's records, all of them
            # where a rescale to parallelism 1 made it
            source = BufferSource(task.location, None, None, task.offsets[start:stop].tolist())
            pieces = ChannelPieces(reader, [source], READ_BACK_BUFFERS, lengths=True)
            digest, count = xxhash.xxh3_128(), 0
            for framed, _ in pieces:
                count += int(framed.records.is_record.sum())
                digest.update(memoryview(framed.records.data)[: int(framed.bounds[1])])
            lengths += pieces.lengths
            digests.append(digest.digest())
            records.append(count)
            trailing.append(pieces.trailing)
    problem = _coverage(task, np.array(lengths, dtype=np.int64))
    return ReadBack(
        task.name,
        problem,
        narrow(np.array(records, dtype=np.int64)),
        b"".join(digests),
        narrow(np.array(trailing, dtype=np.int64)),
    )


def _coverage(task: ReadBackTask, lengths: np.ndarray) -> Optional[str]:
    """Which bytes of the file no handle references, or two do (None: each byte exactly once);
    ``lengths``: the payload length of the buffer at each of the task's offsets."""
    offsets = np.asarray(task.offsets, dtype=np.int64)
    order = np.argsort(offsets, kind="stable")
    starts, extents = offsets[order], 4 + lengths[order]
    expected = np.concatenate([[len(HEADER)], starts + extents]).astype(np.int64)
    wrong = np.flatnonzero(starts != expected[:-1])
    if len(wrong):
        offset, position = int(starts[wrong[0]]), int(expected[wrong[0]])
        what = "referenced twice" if offset < position else "not referenced by any handle"
        return f"bytes {min(offset, position)} to {max(offset, position)} are {what}"
    if int(expected[-1]) != task.size:
        return f"bytes {int(expected[-1])} to {task.size} are not referenced by any handle"
    return None
