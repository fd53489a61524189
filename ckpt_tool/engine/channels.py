"""The logical channels of exchanges as columns: ``ChannelTable``.

An all-to-all exchange at parallelism p has p² logical channels u -> d. The driver keeps them as
NumPy columns (about 44 bytes a channel with one buffer source, no Python object per channel):
per channel its exchange, u, d, state size and sources; per source (a channel handle: input side
first, then output side) its file, and where its buffer offsets lie in one flat array. A
``ChannelTask`` (plain data, what the task functions take) is made from a row only where it is
used: engines hand a batch's rows to its worker (``part``), which makes the batch's tasks.

Merged channel-state handles (Flink 2.1+) whose channels all list as many buffers are read into
the columns with NumPy, without decoding them channel by channel; other handles one by one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.channel_state import BufferSource, pointwise_channels
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import (
    INPUT,
    OUTPUT,
    ChannelStateHandle,
    MergedChannelStateHandle,
    OperatorState,
    columns_opened,
    uniform_merged_channels,
)
from ckpt_tool.flink.plan import POINTWISE_PARTITIONERS
from ckpt_tool.memory import release_memory
from ckpt_tool.records.schema import Exchange


@dataclass(slots=True)
class ChannelTask:
    """One logical channel u -> d of exchange ``exchange_index``: where its buffers are."""

    exchange_index: int
    upstream_subtask: int
    downstream_subtask: int
    max_parallelism: int
    parallelism: int
    inputs: list[BufferSource]
    outputs: list[BufferSource]
    size: int = 0  # bytes of its handles (as the metadata says), what an engine task's budget counts


FileOf = tuple[Optional[str], Optional[bytes], Optional[tuple[int, int]], Optional[str]]  # location, inline, segment, beneath


@dataclass
class ChannelTable:
    """Logical channels as columns (see the module's docstring). Row i is channel i; its sources
    are ``source_start[i]`` and the ``inputs[i] + outputs[i]`` after it, in the source columns.
    The sources of consecutive rows lie one after another, and so do their offsets in ``offsets``
    (``channel_tasks`` and ``take`` build them so). Behaves as a read-only sequence of
    ``ChannelTask`` (each made when asked)."""

    exchange_index: np.ndarray  # per channel
    upstream: np.ndarray
    downstream: np.ndarray
    size: np.ndarray
    source_start: np.ndarray
    inputs: np.ndarray
    outputs: np.ndarray
    source_file: np.ndarray  # per source: index into ``files``
    offset_start: np.ndarray  # per source: its offsets are offsets[offset_start : offset_start + offset_count]
    offset_count: np.ndarray
    offsets: np.ndarray  # every source's buffer offsets, one flat array
    files: list[FileOf]
    max_parallelism: list[int]  # per exchange
    parallelism: list[int]

    def __len__(self) -> int:
        return len(self.exchange_index)

    def part(self, start: int, stop: int) -> ChannelTable:
        """Rows ``start`` to ``stop`` as a table of their own: what one engine task works on (a
        forked worker or Spark gets columns, and makes tasks only where it needs them). Its
        columns are ``slice``'s (views where they can be: consecutive rows' sources and offsets
        lie one after another, so no gather of them, as ``take`` does for any rows), and it lists
        only the files its sources name, renumbered (what Spark is handed carries no others)."""
        table = self.slice(start, stop)
        if table.files is self.files and len(table.source_file):
            used, renumbered = _used(table.source_file, len(self.files))
            if len(used) < len(self.files):
                table.source_file = renumbered.astype(np.int32)
                table.files = [self.files[i] for i in used.tolist()]
        return table

    def slice(self, start: int, stop: int) -> ChannelTable:
        """Rows ``start`` to ``stop`` as a table that shares this one's files and, where it can,
        its columns (the sources of consecutive rows, and their offsets, lie one after another):
        the route tasks of one engine task, taken from its table without a copy each."""
        if start >= stop:
            return self.take(np.zeros(0, dtype=np.int64))
        first = int(self.source_start[start])
        last = int(self.source_start[stop - 1]) + int(self.inputs[stop - 1]) + int(self.outputs[stop - 1])
        low = int(self.offset_start[first])
        high = int(self.offset_start[last - 1]) + int(self.offset_count[last - 1])
        return ChannelTable(
            self.exchange_index[start:stop],
            self.upstream[start:stop],
            self.downstream[start:stop],
            self.size[start:stop],
            self.source_start[start:stop] - first,
            self.inputs[start:stop],
            self.outputs[start:stop],
            self.source_file[first:last],
            self.offset_start[first:last] - low,
            self.offset_count[first:last],
            self.offsets[low:high],
            self.files,
            self.max_parallelism,
            self.parallelism,
        )

    def tasks(self, start: int, stop: int) -> list[ChannelTask]:
        """The tasks of rows ``start`` to ``stop`` (made from a few column slices: the sources of
        consecutive rows, and their offsets, lie one after another)."""
        if start >= stop:
            return []
        exchanges = self.exchange_index[start:stop].tolist()
        inputs, outputs = self.inputs[start:stop].tolist(), self.outputs[start:stop].tolist()
        first, last = int(self.source_start[start]), int(self.source_start[stop - 1]) + inputs[-1] + outputs[-1]
        counts = self.offset_count[first:last].tolist()
        low = int(self.offset_start[first]) if counts else 0
        flat = self.offsets[low : low + sum(counts)].tolist()
        files = self.files
        sources, at = [], 0
        for file, count in zip(self.source_file[first:last].tolist(), counts):
            location, inline, segment, beneath = files[file]
            sources.append(BufferSource(location, inline, segment, flat[at : at + count], beneath))
            at += count
        tasks, at = [], 0
        maxima, parallelisms = self.max_parallelism, self.parallelism
        for exchange, u, d, ins, outs, size in zip(
            exchanges, self.upstream[start:stop].tolist(), self.downstream[start:stop].tolist(), inputs, outputs,
            self.size[start:stop].tolist(),
        ):  # fmt: skip
            tasks.append(
                ChannelTask(
                    exchange,
                    u,
                    d,
                    maxima[exchange],
                    parallelisms[exchange],
                    sources[at : at + ins],
                    sources[at + ins : at + ins + outs],
                    size,
                )
            )
            at += ins + outs
        return tasks

    def __getitem__(self, i: int) -> ChannelTask:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        return self.tasks(i, i + 1)[0]

    def __iter__(self) -> Iterator[ChannelTask]:
        for start in range(0, len(self), 4096):  # made a slice at a time
            yield from self.tasks(start, min(start + 4096, len(self)))

    @staticmethod
    def concatenate(tables: list[ChannelTable]) -> ChannelTable:
        """The rows of ``tables`` one after another, in one table (each file listed once; slices
        of one table keep its list of files). The tables are of one build (``channel_tasks``):
        they share the exchanges."""
        files: dict[FileOf, int] = {}
        source_files, source_starts, offset_starts = [], [], []
        sources = offsets = 0
        shared = bool(tables) and all(table.files is tables[0].files for table in tables)  # slices of one table
        for table in tables:
            if shared:
                source_files.append(table.source_file)
            else:
                mapping = np.array([files.setdefault(f, len(files)) for f in table.files], dtype=np.int64)
                source_files.append(mapping[table.source_file] if len(table.source_file) else table.source_file.astype(np.int64))
            source_starts.append(table.source_start.astype(np.int64) + sources)
            offset_starts.append(table.offset_start.astype(np.int64) + offsets)
            sources += len(table.source_file)
            offsets += len(table.offsets)
        first = tables[0] if tables else None

        def joined(name: str, parts: Optional[list] = None) -> np.ndarray:
            arrays = parts if parts is not None else [getattr(t, name) for t in tables]
            return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)

        return ChannelTable(
            joined("exchange_index"),
            joined("upstream"),
            joined("downstream"),
            joined("size"),
            joined("source_start", source_starts),
            joined("inputs"),
            joined("outputs"),
            joined("source_file", source_files),
            joined("offset_start", offset_starts),
            joined("offset_count"),
            joined("offsets"),
            list(tables[0].files) if shared else list(files),  # shared: the same indexes
            first.max_parallelism if first else [],
            first.parallelism if first else [],
        )

    def take(self, rows: np.ndarray) -> ChannelTable:
        """The channels at ``rows`` (indexes or a mask), in that order, with only their own sources
        and offsets (a table handed to another process carries no more than its channels)."""
        rows = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows, dtype=np.int64)
        counts = self.inputs[rows].astype(np.int64) + self.outputs[rows]
        sources = ranges(self.source_start[rows].astype(np.int64), counts)
        offset_counts = self.offset_count[sources].astype(np.int64)
        offset_starts = np.zeros(len(sources), dtype=np.int64)
        np.cumsum(offset_counts[:-1], out=offset_starts[1:])
        source_starts = np.zeros(len(rows), dtype=np.int64)
        np.cumsum(counts[:-1], out=source_starts[1:])
        used, source_file = _used(self.source_file[sources], len(self.files))
        return ChannelTable(
            self.exchange_index[rows],
            self.upstream[rows],
            self.downstream[rows],
            self.size[rows],
            narrow(source_starts),
            self.inputs[rows],
            self.outputs[rows],
            source_file.reshape(-1).astype(np.int32),
            narrow(offset_starts),
            offset_counts.astype(np.int32),
            self.offsets[ranges(self.offset_start[sources].astype(np.int64), offset_counts)],
            [self.files[i] for i in used.tolist()],
            self.max_parallelism,
            self.parallelism,
        )


def _used(indexes: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(indexes, return_inverse=True)`` of indexes below ``count`` (a table's files,
    thousands, against its sources, millions), by marking instead of sorting."""
    present = np.zeros(count, dtype=bool)
    present[indexes] = True
    used = np.flatnonzero(present)
    renumbered = np.cumsum(present, dtype=np.int64) - 1
    return used, renumbered[indexes]


# the integer types a table's columns are narrowed to, each for values below a sixteenth of its
# range (int32: a quarter), so that a sum of two, or an index one past, never wraps
_NARROW = ((np.int8, 1 << 4), (np.int16, 1 << 12), (np.int32, 1 << 30))


def narrow(column: np.ndarray, smallest: type = np.int32) -> np.ndarray:
    """``column`` in the smallest integer type from ``smallest`` up (int8, int16, int32) where its
    values fit with room to spare (positions, sizes, counts, subtasks: a table of p² channels
    keeps them at a half to an eighth of the bytes); else as it is. Callers widen before any
    arithmetic that could leave that room (shifts, products, sums of many)."""
    low, high = (int(column.min()), int(column.max())) if len(column) else (0, 0)
    if low < 0:
        return column
    for kind, limit in _NARROW:
        if np.dtype(kind).itemsize >= np.dtype(smallest).itemsize and high < limit:
            return column if column.dtype == kind else column.astype(kind)
    return column


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenation of ``range(start, start + count)`` for each pair, as one array."""
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(counts)
    shift = np.repeat(starts - (ends - counts), counts)
    return np.arange(total, dtype=np.int64) + shift


def runs_in_order(values: np.ndarray, lengths: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``values`` held in runs one after another (run i: the next ``lengths[i]`` of them), the runs
    taken in ``order``: run ``order[0]``'s values first, then run ``order[1]``'s, and so on. Where
    every run holds one value (a buffer per channel, as at high parallelism), one gather instead of
    the ranges of all the runs and their temporaries."""
    if bool((lengths == 1).all()):
        return values[order]
    first = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], dtype=np.int64, out=first[1:])
    return values[ranges(first[order], lengths[order].astype(np.int64))]


class _Sources:
    """Source rows of the channels being built, gathered as pieces of arrays (one piece per merged
    handle read with NumPy, one per run of handles read one by one), joined once at the end. A row
    is kept as one sortable number (``key``: its exchange, subtasks and side), its size, file and
    buffer offsets."""

    def __init__(self, checkpoint: Checkpoint, by_downstream: bool) -> None:
        self.checkpoint = checkpoint
        self.by_downstream = by_downstream
        self.files: list[FileOf] = []
        self._file_index: dict[int, tuple[object, int]] = {}  # by delegate object
        self.exchange = 0  # of the rows being added
        self.modulus = 0  # of their exchange: its rows are grouped by u mod this first (0: not grouped)
        self.pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray | int, np.ndarray | int, np.ndarray]] = []
        self._scalars: dict[str, list[int]] = {k: [] for k in ("u", "d", "side", "file", "size", "count")}
        self._scalar_offsets: list[int] = []
        self.rows = 0

    def file(self, delegate) -> int:
        known = self._file_index.get(id(delegate))
        if known is not None and known[0] is delegate:
            return known[1]
        where = BufferSource.in_delegate(self.checkpoint, delegate, ())
        self.files.append((where.location, where.inline, where.segment, where.beneath))
        self._file_index[id(delegate)] = (delegate, len(self.files) - 1)
        return len(self.files) - 1

    def one(self, u: int, d: int, side: int, handle: ChannelStateHandle) -> None:
        for key, value in zip(self._scalars, (u, d, side, self.file(handle.delegate), handle.state_size, len(handle.offsets))):
            self._scalars[key].append(value)
        self._scalar_offsets.extend(handle.offsets)
        self.rows += 1

    def many(self, u: np.ndarray, d: np.ndarray, side: int, file: int, size: np.ndarray, offsets: np.ndarray) -> None:
        """Channels of one merged handle: ``offsets`` is channels × buffers."""
        self.flush()
        key = self._key(u, d, side)
        self.pieces.append((key, np.asarray(size, dtype=np.int64), file, offsets.shape[1], offsets.astype(np.int64).ravel()))
        self.rows += len(key)

    def _key(self, u, d, side) -> np.ndarray:
        """Exchange, u mod ``modulus`` (where grouped), the two subtasks (each below Flink's highest
        max parallelism, 2**15: u then d, or d then u ``by_downstream``), and the side (input 0,
        output 1), as one int64 in that order."""
        first, second = np.asarray(d if self.by_downstream else u), np.asarray(u if self.by_downstream else d)
        if len(first) and not (min(first.min(), second.min()) >= 0 and max(first.max(), second.max()) < 1 << 15):
            raise CheckpointFormatError(f"a channel-state handle of exchange {self.exchange} names a subtask outside 0 to 32767")
        key = first.astype(np.int64) << 17
        key |= second.astype(np.int64) << 1
        key |= side
        if self.modulus:
            key |= (np.asarray(u, dtype=np.int64) % self.modulus) << 33
        key |= self.exchange << 48
        return key

    def flush(self) -> None:
        """Close the rows added one by one (before the exchange changes)."""
        scalars = self._scalars
        if scalars["u"]:
            key = self._key(np.array(scalars["u"]), np.array(scalars["d"]), np.array(scalars["side"], dtype=np.int64))
            self.pieces.append(
                (
                    key,
                    np.array(scalars["size"], dtype=np.int64),
                    np.array(scalars["file"], dtype=np.int32),
                    np.array(scalars["count"], dtype=np.int32),
                    np.array(self._scalar_offsets, dtype=np.int64),
                )
            )
            for values in scalars.values():
                values.clear()
            self._scalar_offsets.clear()

    def __len__(self) -> int:
        """Source rows gathered so far."""
        return self.rows

    def joined(self) -> tuple[np.ndarray, dict[str, np.ndarray], Optional[np.ndarray]]:
        """The rows' keys, their other columns (size, file, count, offsets), and the order in which
        a table keeps them: by key, then as gathered (None where they were gathered so). Each piece
        is dropped once joined."""
        self.flush()
        pieces, self.pieces = self.pieces, []
        n = self.rows
        key = np.empty(n, dtype=np.int64)
        columns: dict[str, np.ndarray] = {
            "size": np.empty(n, dtype=np.int64),
            "file": np.empty(n, dtype=np.int32),
            "count": np.empty(n, dtype=np.int32),
        }
        offsets = np.empty(sum(len(piece[-1]) for piece in pieces), dtype=np.int64)
        row = at = 0
        pieces.reverse()
        while pieces:
            keys, size, file, count, flat = pieces.pop()
            stop = row + len(keys)
            key[row:stop], columns["size"][row:stop] = keys, size
            columns["file"][row:stop], columns["count"][row:stop] = file, count
            offsets[at : at + len(flat)] = flat
            row, at = stop, at + len(flat)
        columns["offsets"] = offsets
        if n < 2 or bool((key[1:] >= key[:-1]).all()):
            return key, columns, None
        order = np.argsort(key, kind="stable")
        return key[order], columns, order


def channel_tasks(
    checkpoint: Checkpoint, exchanges: list[Exchange], by_downstream: bool = False, grouped: Optional[list[int]] = None
) -> ChannelTable:
    """The logical channels of ``exchanges`` that hold data, exchange by exchange, each exchange's
    by (u, d) (by (d, u) ``by_downstream``, as a scan reads them: a downstream subtask's input
    state is one file; by (u mod ``grouped[exchange]``, u, d) where grouped, as a rescale routes
    them: the channels of each new input channel together): the input state of d on the exchange's
    gate, then the output state of u on its partition, each side's handles in the order the
    metadata lists them. On an all-to-all edge the input channel index is u and the subpartition
    index d; on a pointwise edge (forward, rescale) ``pointwise_channels`` says which is which."""
    metadata = checkpoint.metadata
    sources = _Sources(checkpoint, by_downstream)
    for index, exchange in enumerate(exchanges):
        downstream = metadata.operator(exchange.downstream_id)
        upstream = metadata.operator(exchange.upstream_id) if exchange.upstream_id else None
        pointwise = exchange.partitioner in POINTWISE_PARTITIONERS and upstream is not None and downstream is not None
        sources.flush()
        sources.exchange = index
        sources.modulus = grouped[index] if grouped else 0
        _add_side(sources, downstream, INPUT, exchange.gate, pointwise, upstream)
        _add_side(sources, upstream, OUTPUT, exchange.partition, pointwise, downstream)
    key, rows, order = sources.joined()
    # each column in table order and narrowed as it comes, the old one dropped at once (a table of
    # p² channels: at p=4,096 each column of 16.8 million rows is 134 MB as int64)
    offsets = rows.pop("offsets")
    if order is not None:  # in the sources' order
        offsets = runs_in_order(offsets, rows["count"], order)
        for name in ("count", "size", "file"):
            rows[name] = rows[name][order]
        del order
    offsets = narrow(offsets)
    count = narrow(rows.pop("count"), np.int8)
    file = narrow(rows.pop("file"), np.int16)
    offset_start = np.zeros(len(count), dtype=np.int64)  # each source's offsets as the table keeps them
    np.cumsum(count[:-1], out=offset_start[1:])
    offset_start = narrow(offset_start)
    side = (key & 1).astype(np.int8)
    key >>= 1  # the channel
    new_channel = np.ones(len(key), dtype=bool)
    np.not_equal(key[1:], key[:-1], out=new_channel[1:])
    size = rows.pop("size")
    if new_channel.all():  # a source per channel (as at high parallelism): the rows are the channels
        del new_channel
        channel, outputs = key, side
        starts: np.ndarray = np.arange(len(key), dtype=np.int32)
        inputs = 1 - side
    else:
        starts = np.flatnonzero(new_channel)
        del new_channel
        channel = key[starts]
        per_channel = np.diff(np.append(starts, len(side))).astype(np.int32)
        outputs = np.add.reduceat(side.astype(np.int32), starts) if len(starts) else np.zeros(0, dtype=np.int32)
        inputs = per_channel - outputs
        size = np.add.reduceat(size, starts) if len(starts) else np.zeros(0, dtype=np.int64)
    del key, side
    size = narrow(size)
    first, second = narrow((channel >> 16) & 0xFFFF, np.int16), narrow(channel & 0xFFFF, np.int16)
    ups, downs = (second, first) if by_downstream else (first, second)
    table = ChannelTable(
        narrow(channel >> 47, np.int8),
        ups,
        downs,
        size,
        narrow(starts),
        narrow(inputs, np.int8),
        narrow(outputs, np.int8),
        file,
        offset_start,
        count,
        offsets,
        sources.files,
        [metadata.operator(e.downstream_id).max_parallelism for e in exchanges],
        [metadata.operator(e.downstream_id).parallelism for e in exchanges],
    )
    del rows, size, file, channel, count, offsets, offset_start, starts, first, second, ups, downs
    release_memory()  # what building it from many pieces left on the heap
    return table


def _add_side(
    sources: _Sources,
    op: Optional[OperatorState],
    direction: str,
    gate: int,
    pointwise: bool,
    other: Optional[OperatorState],
) -> None:
    """The handles of ``op`` on ``gate`` (input) or partition ``gate`` (output) as source rows
    (side 0 input, 1 output) of their logical channels u -> d."""
    if op is None:
        return
    side = 0 if direction == INPUT else 1
    links: Optional[dict[tuple[int, int], int]] = None
    if pointwise:
        assert other is not None
        if direction == INPUT:
            links = {(d, c): u for u, d, c, _ in pointwise_channels(other.parallelism, op.parallelism)}
        else:
            links = {(u, s): d for u, d, _, s in pointwise_channels(op.parallelism, other.parallelism)}

    def one(subtask: int, handle: ChannelStateHandle) -> None:
        peer = handle.info[1] if links is None else links.get((subtask, handle.info[1]))
        if peer is None:
            raise CheckpointFormatError(
                f"channel {handle.info} of subtask {handle.subtask_index} does not exist on this pointwise edge"
            )
        u, d = (peer, subtask) if side == 0 else (subtask, peer)
        sources.one(u, d, side, handle)

    for subtask in op.subtasks:
        handles = columns_opened(subtask.input_channels if direction == INPUT else subtask.output_channels)
        for handle in handles:
            if not isinstance(handle, MergedChannelStateHandle):
                if handle.info[0] == gate:
                    one(subtask.index, handle)
                continue
            if gate not in handle.gates:
                continue
            channels = uniform_merged_channels(handle.serialized_offsets) if links is None else None
            if channels is None:
                for channel in handle.channels:
                    if channel.info[0] == gate:
                        one(subtask.index, channel)
                continue
            if handle.gates != (gate,):
                channels = channels[channels["gate"] == gate]
            peers = channels["channel"].astype(np.int64)
            mine = np.full(len(channels), subtask.index, dtype=np.int64)
            u, d = (peers, mine) if side == 0 else (mine, peers)
            offsets = channels["offsets"] if "offsets" in (channels.dtype.names or ()) else np.zeros((len(channels), 0))
            sources.many(u, d, side, sources.file(handle.delegate), channels["size"], offsets)
