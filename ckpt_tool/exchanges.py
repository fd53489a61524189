"""The in-flight records of exchanges, scanned: the figures ``inspect``, ``verify`` and ``repair`` share.

Logical channels are scanned on the session's engine, in tasks of a bounded byte budget. Copies of one record held by several
downstream subtasks can only be in key groups that several of them hold for the same upstream
channel, so digests are computed only in a second pass over those channels; a healthy checkpoint
needs none.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from ckpt_tool.engine import Engine, Progress
from ckpt_tool.engine.tasks import ChannelTable, HeldDigests, Junction, channel_tasks, digest_batch, junction, scan_batch
from ckpt_tool.errors import CkptError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import OUTPUT
from ckpt_tool.framing import framing as _framing
from ckpt_tool.records.keys import key_group_range
from ckpt_tool.records.scan import FIGURES, ChannelScan, ScanColumns, digest_holders, holding_keys, suspects_of_holdings
from ckpt_tool.records.schema import Exchange
from ckpt_tool.records.skeleton import CONTRADICTED, FIT

# a channel row of ``ExchangeScan.as_dict()``'s JSON, as the literal text around its values (the
# last value, misplaced_records, is null where the exchange is not keyed)
_CHANNEL_ROW = (
    '{"upstream_subtask": ',
    ', "downstream_subtask": ',
    ', "input_buffers": ',
    ', "output_buffers": ',
    ', "bytes": ',
    ', "records": ',
    ', "watermarks": ',
    ', "other_elements": ',
    ', "partial_bytes": ',
    ', "misplaced_records": ',
    "}",
)
_KEYED_ROW = tuple(part.encode() for part in _CHANNEL_ROW)
_UNKEYED_ROW = (*_KEYED_ROW[:-2], _KEYED_ROW[-2] + b"null" + _KEYED_ROW[-1])
ROWS_AT_ONCE = 1 << 16  # channel rows encoded in one piece


@dataclass
class ExchangeScan:
    """One exchange's in-flight records: per logical channel and in total. ``scanned`` holds the
    channels' figures as the scan returned them (by downstream subtask: a downstream subtask's input
    state is one file); ``figures`` the same in (upstream, downstream) order, put so only when
    asked for (a job at parallelism p has p² channels; totals, sums per subtask and checks need no
    order)."""

    exchange: Exchange
    scanned: ScanColumns
    duplicate_records: int
    subtask_key_groups: list[range]  # of the downstream subtasks
    problem: Optional[str] = None  # why its records could not be read, if so
    histogram: Optional[np.ndarray] = None  # records per key group, when keyed

    @property
    def keyed(self) -> bool:
        return self.exchange.keyed

    @property
    def partitioner(self) -> Optional[str]:
        return self.exchange.partitioner or ("HASH" if self.keyed else None)

    @functools.cached_property
    def figures(self) -> ScanColumns:
        """Its channels' figures in (upstream, downstream) order, as they are listed."""
        return channel_order(self.scanned)

    @functools.cached_property
    def channels(self) -> list[ChannelScan]:
        return self.figures.scans()

    def channels_with_problems(self) -> list[ChannelScan]:
        """The channels that end in a cut record or (keyed) hold records outside their subtask's
        key groups, in (upstream, downstream) order: only they are put in order."""
        columns = self.scanned.columns
        flagged = columns["trailing_bytes"] > 0
        if self.keyed:
            flagged |= columns["misplaced_records"] > 0
        return channel_order(self.scanned.select(np.flatnonzero(flagged))).scans()

    def per_downstream(self) -> dict[str, np.ndarray]:
        """Its channels' figures summed per downstream subtask, for the subtasks that have channels
        (in subtask order), with ``channels`` their number: what a terminal shows of an exchange
        at high parallelism (p² channels). Summed in one pass (as floats: exact below 2**53)."""
        columns = self.scanned.columns
        subtask = columns["downstream_subtask"].astype(np.int64)
        counts = np.bincount(subtask)
        found = np.flatnonzero(counts)
        result = {"downstream_subtask": found, "channels": counts[found]}
        for name in FIGURES[3:]:
            sums = np.bincount(subtask, weights=columns[name], minlength=len(counts))
            result[name] = sums[found].astype(np.int64)
        return result

    def total(self, figure: str) -> int:
        return int(self.scanned.columns[figure].sum())

    @property
    def key_group_histogram(self) -> Counter:
        if self.histogram is None:
            return Counter()
        found = np.flatnonzero(self.histogram)
        return Counter(dict(zip(found.tolist(), self.histogram[found].tolist())))

    def as_dict(self, channels: bool = True) -> dict:
        """The documented layout; without ``channels``, the channel rows are left out (the key last,
        ``channels_json`` encodes them)."""
        exchange, keyed = self.exchange, self.keyed
        histogram = self.key_group_histogram
        columns = FIGURES[1:]  # every figure but the exchange's index
        rows = zip(*(self.figures.columns[name].tolist() for name in columns)) if channels else iter(())
        result = {
            "upstream": exchange.upstream_id,
            "downstream": exchange.downstream_id,
            "gate": exchange.gate,
            "partition": exchange.partition,
            "partitioner": self.partitioner,
            "type": exchange.record_type,
            "key": list(exchange.key) if exchange.key else None,
            "keyed": keyed,
            "records": self.total("records"),
            "watermarks": self.total("watermarks"),
            "other_elements": self.total("other_elements"),
            "bytes": self.total("bytes"),
            "partial_bytes": self.total("trailing_bytes"),
            "misplaced_records": self.total("misplaced_records") if keyed else None,
            "duplicate_records": self.duplicate_records if keyed else None,
            "key_group_histogram": {str(k): histogram[k] for k in sorted(histogram)} if keyed else None,
            "subtask_key_groups": [[r.start, r.stop - 1] for r in self.subtask_key_groups] if keyed else None,
            "problem": self.problem,
            "channels": [
                {
                    "upstream_subtask": u,
                    "downstream_subtask": d,
                    "input_buffers": i,
                    "output_buffers": o,
                    "bytes": b,
                    "records": r,
                    "watermarks": w,
                    "other_elements": e,
                    "partial_bytes": t,
                    "misplaced_records": m if keyed else None,
                }
                for u, d, i, o, b, r, w, e, t, m in rows
            ],
        }
        if not channels:
            del result["channels"]
        return result

    def channels_json(self) -> Iterator[str]:
        """``json.dumps`` of the items of ``as_dict()["channels"]``, made from the columns without
        the dicts (a job at parallelism p has up to p² channels): pieces of up to ROWS_AT_ONCE
        rows, each piece the rows' texts joined by ", " (as a JSON list joins its items)."""
        keyed = self.keyed
        names = FIGURES[1:] if keyed else FIGURES[1:-1]
        columns = [self.figures.columns[name] for name in names]
        parts = _KEYED_ROW if keyed else _UNKEYED_ROW
        for start in range(0, len(self.figures), ROWS_AT_ONCE):
            stop = min(start + ROWS_AT_ONCE, len(self.figures))
            values = np.empty((stop - start, len(columns)), dtype=np.int64)
            for j, column in enumerate(columns):
                values[:, j] = column[start:stop]
            yield _framing.int_rows(parts, values, b", ").decode()


def _scan_with_digests(engine: Engine, tasks: ChannelTable, exchanges: list[Exchange], progress: Progress):
    """Channel figures and, per exchange, the copies of records held by several downstream
    subtasks of one upstream subtask (``_copies_held``)."""
    # channels of one downstream subtask together (``tasks`` by downstream: its input state is one
    # file), in byte-sized batches, each scanned in one pass (scan_batch) and returned as columns
    scans = ScanColumns.concatenate(
        engine.map_batches(lambda batch: scan_batch(batch, exchanges).figures_only(), tasks, progress, tasks.size)
    )
    # the rows are the tasks' rows, in order (as int32, whatever the table narrowed them to)
    named = tuple(column.astype(np.int32, copy=False) for column in (tasks.exchange_index, tasks.upstream, tasks.downstream))
    scans.columns = dict(zip(FIGURES[:3], named)) | {name: scans.columns[name] for name in FIGURES[3:]}
    suspects = suspects_of_holdings(scans)
    if not suspects:  # no key group held where it does not belong: nothing held twice (p² rows spared)
        return scans, Counter()
    suspect_keys = np.unique(
        np.concatenate([holding_keys(e, u, np.array(sorted(groups), dtype=np.int64)) for (e, u), groups in suspects.items()])
    )
    wide = int(tasks.upstream.max(initial=0)) + 1  # (exchange, upstream) as one number
    wanted = np.array([e * wide + u for e, u in suspects if u < wide], dtype=np.int64)
    again = tasks.take(np.isin(tasks.exchange_index.astype(np.int64) * wide + tasks.upstream, wanted))
    # the channels of the upstream subtasks that hold suspects, in byte-sized batches (not a task
    # per channel: an inflated checkpoint's are all of them, p² at p=128 already 16,384)
    held = HeldDigests.concatenate(
        engine.map_batches(lambda batch: digest_batch(batch, exchanges, suspect_keys), again, sizes=again.size)
    )
    return scans, _copies_held(held)


def _copies_held(held: HeldDigests) -> Counter:
    """Per exchange, the copies among the records that may be held twice (``digest_batch``): a
    record whose digest several downstream subtasks of one upstream subtask hold is held
    ``holders - 1`` times too often. Grouped at once with NumPy (an inflated checkpoint holds
    millions of copies)."""
    if not len(held.exchange_index):
        return Counter()
    exchange, upstream, downstream = held.exchange_index, held.upstream, held.downstream
    digest = np.frombuffer(held.digests, dtype=np.uint64).reshape(-1, 2)
    order, first, _, holders = digest_holders(digest, downstream, exchange, upstream)
    copies = np.bincount(exchange[order][first], weights=holders - 1).astype(np.int64)
    return Counter({index: int(n) for index, n in enumerate(copies.tolist()) if n})


def scan_exchanges(
    checkpoint: Checkpoint, exchanges: list[Exchange], engine: Engine, progress: Progress = None
) -> list[ExchangeScan]:
    """Records per channel, key-group histograms, misplaced and duplicate records per exchange."""
    scans, duplicates = _scan_with_digests(engine, channel_tasks(checkpoint, exchanges, by_downstream=True), exchanges, progress)
    exchange_index = scans.columns["exchange_index"]
    if len(exchange_index) > 1 and not bool((exchange_index[1:] >= exchange_index[:-1]).all()):
        scans = scans.select(np.argsort(exchange_index, kind="stable"))  # the tasks' table has them exchange by exchange
    bounds = np.searchsorted(scans.columns["exchange_index"], np.arange(len(exchanges) + 1))
    return [
        ExchangeScan(
            exchange,
            scans.select(slice(int(bounds[index]), int(bounds[index + 1]))),  # views of the columns
            duplicates[index],
            _key_group_ranges(checkpoint, exchange),
            histogram=scans.histograms.get(index, np.zeros(0, dtype=np.int64)) if exchange.keyed else None,
        )
        for index, exchange in enumerate(exchanges)
    ]


TILE = 256  # rows and columns of a tile transposed at once: both sides stay in the cache


def channel_order(scanned: ScanColumns) -> ScanColumns:
    """``scanned``'s rows (one exchange's channels, each (upstream, downstream) once) in
    (upstream, downstream) order. Rows by (downstream, upstream) over a full grid (every upstream
    subtask with every downstream, as on an all-to-all edge where every channel holds data) are a
    matrix transposed, tile by tile; other rows are sorted. A broadcast zero stays one."""
    columns = scanned.columns
    upstream, downstream = columns["upstream_subtask"], columns["downstream_subtask"]
    if len(upstream) < 2:
        return scanned
    key = upstream.astype(np.int64) * (int(downstream.max()) + 1) + downstream
    if bool((key[1:] >= key[:-1]).all()):
        return scanned
    grid = _grid(upstream, downstream)
    if grid is None:
        return scanned.select(np.argsort(key, kind="stable"))
    rows, cols = grid
    ordered = {name: _transposed(c, rows, cols) if c.strides[0] else c for name, c in columns.items()}
    return ScanColumns(ordered, scanned.histograms, scanned.holdings)


def _grid(upstream: np.ndarray, downstream: np.ndarray) -> Optional[tuple[int, int]]:
    """(downstream subtasks, upstream subtasks) where the rows are a full grid by (downstream,
    upstream): blocks of one downstream subtask each, in increasing order, each with the same
    upstream subtasks in increasing order; else None. (Where the rows are not by downstream
    subtask, ``cols`` is whatever the search finds, and the checks refuse it.)"""
    rows = len(downstream)
    cols = int(np.searchsorted(downstream, downstream[0], side="right"))
    if cols < 2 or rows % cols:
        return None
    first = upstream[:cols]
    by_row = downstream.reshape(-1, cols)
    if not (
        bool((first[1:] > first[:-1]).all())
        and bool((by_row[1:, 0] > by_row[:-1, 0]).all())
        and bool((by_row == by_row[:, :1]).all())
        and bool((upstream.reshape(-1, cols) == first).all())
    ):
        return None
    return rows // cols, cols


def _transposed(column: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``column`` read as a rows × cols matrix, transposed (as one column again), tile by tile: a
    plain transposed copy strides the whole matrix for every row it writes (at p=4,096, 4.2 s
    for ten columns against 0.7 s so)."""
    matrix = column.reshape(rows, cols)
    result = np.empty((cols, rows), dtype=column.dtype)
    for i in range(0, cols, TILE):
        for j in range(0, rows, TILE):
            result[i : i + TILE, j : j + TILE] = matrix[j : j + TILE, i : i + TILE].T
    return result.reshape(-1)


def _key_group_ranges(checkpoint: Checkpoint, exchange: Exchange) -> list[range]:
    downstream = checkpoint.metadata.operator(exchange.downstream_id)
    return [key_group_range(downstream.max_parallelism, downstream.parallelism, i) for i in range(downstream.parallelism)]


def scan_each_exchange(
    checkpoint: Checkpoint, exchanges: list[Exchange], engine: Engine, progress: Progress = None
) -> list[ExchangeScan]:
    """Like ``scan_exchanges``, but an exchange whose records cannot be read (a missing file, a
    corrupt channel) is reported with its problem instead of failing the others."""
    result = []
    for exchange in exchanges:
        try:
            result += scan_exchanges(checkpoint, [exchange], engine, progress)
        except CkptError as exc:
            result.append(ExchangeScan(exchange, ScanColumns.empty(), 0, _key_group_ranges(checkpoint, exchange), str(exc)))
    return result


def record_counter(checkpoint: Checkpoint, exchanges: list[Exchange], engine: Engine):
    """A function of an exchange's index to its in-flight record count, scanned on first ask."""
    counts: dict[int, int] = {}

    def records_of(index: int) -> int:
        if index not in counts:
            counts[index] = scan_exchanges(checkpoint, [exchanges[index]], engine)[0].total("records")
        return counts[index]

    return records_of


class MappingError(CkptError):
    """The bytes contradict which output partition the exchanges say feeds them, or cannot tell."""


def _untyped(exchange: Exchange) -> bool:
    return not exchange.record_type and not exchange.decoder


def check_output_mapping(
    checkpoint: Checkpoint, exchanges: list[Exchange], engine: Engine, only: Optional[set[int]] = None
) -> None:
    """Framing-level proof of which output partition feeds which exchange, for every operator that
    sends to several exchanges, holds output-side in-flight data and sends to an untyped one (a
    typed exchange's records are checked value by value): the stated pairing must hold at every
    logical channel (``junction``), and no other pairing of the same partitions may hold too.
    ``only``: indexes of the exchanges whose data is rewritten (the others are left as they are)."""
    metadata = checkpoint.metadata
    by_sender: dict[str, list[int]] = defaultdict(list)
    for index, exchange in enumerate(exchanges):
        if exchange.upstream_id:
            by_sender[exchange.upstream_id].append(index)
    for sender, indexes in by_sender.items():
        sent = [exchanges[i] for i in indexes]
        if len(sent) < 2 or not any(_untyped(e) for e in sent):
            continue
        if only is not None and not any(i in only for i in indexes):
            continue
        if not any(h.offsets for s in metadata.operator(sender).subtasks for h in s.channel_handles(OUTPUT)):
            continue
        _prove_pairing(checkpoint, sender, sent, engine)


def _prove_pairing(checkpoint: Checkpoint, sender: str, sent: list[Exchange], engine: Engine) -> None:
    metadata = checkpoint.metadata
    stated = [e.partition for e in sent]
    outcomes: dict[tuple[int, ...], list[Junction]] = {}
    for pairing in itertools.permutations(stated):
        candidates = [replace(e, partition=p) for e, p in zip(sent, pairing)]
        outcomes[pairing] = engine.map(junction, channel_tasks(checkpoint, candidates))
    fitting = [pairing for pairing, found in outcomes.items() if not any(j.problem for j in found)]
    names = [f"{metadata.label(e.downstream_id)} (gate {e.gate})" for e in sent]

    def described(pairing: tuple[int, ...]) -> str:
        return ", ".join(f"partition {p} -> {name}" for p, name in zip(pairing, names))

    stated_key = tuple(stated)
    others = [p for p in fitting if p != stated_key and any(_untyped(e) and a != b for e, a, b in zip(sent, p, stated_key))]
    sender_label = metadata.label(sender)
    if stated_key not in fitting:
        bad = next(j for j in outcomes[stated_key] if j.problem)
        exchange = sent[bad.exchange_index]
        message = (
            f"{sender_label} -> {metadata.label(exchange.downstream_id)} (gate {exchange.gate}): the output side of partition "
            f"{exchange.partition}, channel {bad.upstream_subtask} -> {bad.downstream_subtask}, does not continue the input "
            f"side's last record: {bad.problem}. The stated pairing ({described(stated_key)}) is contradicted by the bytes"
        )
        if len(others) == 1:
            message += f"; the bytes fit {described(others[0])} only"
        raise MappingError(message + ". Give each exchange its `partition` in --schema as the job has it.")
    if others:
        tested = sum(j.both_sides for j in outcomes[stated_key])
        raise MappingError(
            f"{sender_label} sends to {', '.join(names)} through several output partitions and the bytes cannot tell which "
            f"feeds which: the stated pairing ({described(stated_key)}) and {described(others[0])} both split every logical "
            f"channel into whole records ({tested} channels hold data on both sides). Give these exchanges their record "
            "types in --schema (records are then checked value by value), or drop their in-flight data (--drop-in-flight)."
        )


def pairing_evidence(checkpoint: Checkpoint, engine: Engine) -> Callable[[Exchange], str]:
    """What the bytes say of a candidate exchange (a sender's output partition paired with an
    input gate), as ``ckpt schema`` prints it next to each candidate sender."""

    def evidence(candidate: Exchange) -> str:
        found = engine.map(junction, channel_tasks(checkpoint, [candidate]))
        problems = [j for j in found if j.problem]
        if problems:
            first = problems[0]
            return f"{CONTRADICTED} (channel {first.upstream_subtask} -> {first.downstream_subtask}: {first.problem})"
        tested = sum(j.both_sides for j in found)
        if not tested:
            return "the bytes cannot tell (no channel holds data on both sides)"
        return f"{FIT} ({tested} channels: the output side continues the input side)"

    return evidence


def _described(pairing: tuple[int, ...], names: list[str]) -> str:
    return ", ".join(f"partition {p} -> {name}" for p, name in zip(pairing, names))


MAX_PAIRED_CONSUMERS = 5  # 5! pairings of partitions to consumers, each tested on every channel


def resolve_partitions(checkpoint: Checkpoint, exchanges: list[Exchange], engine: Callable[[], Engine]) -> list[str]:
    """Where an operator sends to several exchanges, holds output-side in-flight data and the
    partition of some exchange is not stated (Flink's plan does not give it), the pairing of its
    output partitions 0..k-1 with its k exchanges that the bytes alone fit is taken (``junction``
    on every logical channel, stated partitions kept); none or several are refused with the
    evidence. Returns a note per pairing taken."""
    metadata = checkpoint.metadata
    by_sender: dict[str, list[Exchange]] = defaultdict(list)
    for exchange in exchanges:
        if exchange.upstream_id:
            by_sender[exchange.upstream_id].append(exchange)
    notes = []
    for sender, sent in by_sender.items():
        if len(sent) < 2 or all(e.partition_stated for e in sent):
            continue
        if not any(h.offsets for s in metadata.operator(sender).subtasks for h in s.channel_handles(OUTPUT)):
            continue
        names = [f"{metadata.label(e.downstream_id)} (gate {e.gate})" for e in sent]
        label = metadata.label(sender)
        if len(sent) > MAX_PAIRED_CONSUMERS:
            raise MappingError(f"{label} sends to {len(sent)} exchanges: give each its `partition` in --schema")
        fitting: list[tuple[int, ...]] = []
        contradicted: list[str] = []
        for pairing in itertools.permutations(range(len(sent))):
            if any(e.partition_stated and e.partition != p for e, p in zip(sent, pairing)):
                continue
            candidates = [replace(e, partition=p) for e, p in zip(sent, pairing)]
            found = engine().map(junction, channel_tasks(checkpoint, candidates))
            bad = next((j for j in found if j.problem), None)
            if bad is None:
                fitting.append(pairing)
            else:
                contradicted.append(
                    f"partition {pairing[bad.exchange_index]} -> {names[bad.exchange_index]}: channel "
                    f"{bad.upstream_subtask} -> {bad.downstream_subtask}, {bad.problem}"
                )

        if len(fitting) != 1:
            said = (
                f"the pairings {_described(fitting[0], names)} and {_described(fitting[1], names)} both fit the bytes"
                if fitting
                else "the bytes contradict every pairing (" + "; ".join(contradicted[:3]) + ")"
            )
            raise MappingError(
                f"{label} sends to {', '.join(names)} and holds in-flight output data, but which output partition feeds "
                f"which is not known (Flink's plan does not say) and {said}: give `partition` for each in --schema"
            )
        for exchange, partition in zip(sent, fitting[0]):
            exchange.partition, exchange.partition_stated = partition, True
        notes.append(f"{label}: {_described(fitting[0], names)}, the one pairing the bytes fit")
    return notes
