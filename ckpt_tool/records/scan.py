"""Figures of one logical channel's records: elements by kind, key groups, misplaced records, and
digests of the records that may be held twice. Pure computation over ``ChannelRecords``.

Record digests, for finding copies of one record held by several subtasks, are computed only for
the key groups that several downstream subtasks hold (``suspects``); a healthy checkpoint has none.
"""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ckpt_tool.framing import framing as _framing
from ckpt_tool.records.batch import ChannelRecords, KeyGroups
from ckpt_tool.records.elements import WATERMARK


@dataclass
class ChannelScan:
    """What one logical channel u -> d of an exchange holds."""

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
    digests: builtins.bytes = b""  # xxh3-128 of the records in suspect key groups, 16 bytes each
    misplaced_key_groups: frozenset = frozenset()  # key groups of its records that its subtask does not own


DIGEST_BYTES = 16  # an xxh3-128 digest, as ``_framing.digests`` makes it


def suspect_records(records: ChannelRecords, key_groups: np.ndarray, suspects: frozenset) -> tuple[np.ndarray, bytes]:
    """The element indices of the records whose key group (``key_groups``, one per record) is a
    suspect, and the xxh3-128 digest of each such element (16 bytes each, in that order), made
    in one call: an inflated checkpoint holds millions of them."""
    chosen = np.zeros(len(records.tags), dtype=bool)
    chosen[records.is_record] = np.isin(key_groups, list(suspects))
    indices = np.flatnonzero(chosen)
    return indices, _framing.digests(records.data, *records.element_bounds(indices))


def digest_holders(digest: np.ndarray, holder: np.ndarray, *outer: np.ndarray) -> tuple[np.ndarray, ...]:
    """Records grouped by (``outer`` keys, their digest), each group's holders counted, at once:
    ``digest`` is each record's xxh3-128 as (n, 2) uint64, ``holder`` the subtask holding it.
    Returns the records' order (grouped, each group's records by holder), in that order a mask of
    each group's first record and each record's group, and each group's number of distinct
    holders (a record twice in one holder counts once).

    Sorted by one 64-bit mix of each record's keys, stably (the records come by holder within
    each group, as a scan and a route gather them); where two different keys share a mix, or a
    group's holders are out of order, by all the keys (``np.lexsort``, 2 to 3 times as long)."""
    if not len(digest):
        return _holders_of(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), holder)
    with np.errstate(over="ignore"):
        mixed = digest[:, 0] ^ (digest[:, 1] * np.uint64(0x9E3779B97F4A7C15))
        for place, key in enumerate(outer, 1):
            mixed ^= (key.astype(np.uint64) + np.uint64(place)) * np.uint64(0xC2B2AE3D27D4EB4F)
    order = np.argsort(mixed, kind="stable")
    same = _same_keys(order, digest, outer)
    held = holder[order]
    mixed = mixed[order]
    if (same != (mixed[1:] == mixed[:-1])).any() or (same & (held[1:] < held[:-1])).any():
        order = np.lexsort((holder, digest[:, 1], digest[:, 0], *reversed(outer)))
        same = _same_keys(order, digest, outer)
    first = np.ones(len(order), dtype=bool)
    first[1:] = ~same
    return _holders_of(order, first, holder)


def _same_keys(order: np.ndarray, digest: np.ndarray, outer: tuple[np.ndarray, ...]) -> np.ndarray:
    """For each record in ``order`` after the first, whether its keys equal the one's before it."""
    ranked = digest[order]
    same = (ranked[1:] == ranked[:-1]).all(axis=1)
    for key in outer:
        ranked_key = key[order]
        same &= ranked_key[1:] == ranked_key[:-1]
    return same


def _holders_of(order: np.ndarray, first: np.ndarray, holder: np.ndarray) -> tuple[np.ndarray, ...]:
    held = holder[order]
    new_holder = first.copy()  # the first record of each (group, holder)
    new_holder[1:] |= held[1:] != held[:-1]
    group = np.cumsum(first) - 1
    return order, first, group, np.bincount(group, weights=new_holder).astype(np.int64)


def scan_records(
    scan: ChannelScan, records: ChannelRecords, keys: Optional[KeyGroups], owned: range, suspects: frozenset
) -> ChannelScan:
    """Fill ``scan`` with the figures of ``records``; ``owned`` is the key-group range of the
    downstream subtask that holds them."""
    is_record = records.is_record
    scan.bytes = len(records.data)
    scan.records = int(is_record.sum())
    scan.watermarks = int((records.tags == WATERMARK).sum())
    scan.other_elements = int((~is_record).sum()) - scan.watermarks
    scan.trailing_bytes = records.trailing
    if keys is not None and scan.records:
        groups = keys.of(records, is_record)
        misplaced = (groups < owned.start) | (groups >= owned.stop)
        scan.misplaced_records = int(misplaced.sum())
        scan.misplaced_key_groups = frozenset(np.unique(groups[misplaced]).tolist())
        counts = np.bincount(groups)
        found = np.flatnonzero(counts)
        scan.key_groups = Counter(dict(zip(found.tolist(), counts[found].tolist())))
        if suspects:
            _, scan.digests = suspect_records(records, groups, suspects)
    return scan


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
    for (channel, group), holding in holders.items():
        if len(holding) > 1:
            suspects.setdefault(channel, set()).add(group)
    return {channel: frozenset(groups) for channel, groups in suspects.items()}


FIGURES = (
    "exchange_index",
    "upstream_subtask",
    "downstream_subtask",
    "input_buffers",
    "output_buffers",
    "bytes",
    "records",
    "watermarks",
    "other_elements",
    "trailing_bytes",
    "misplaced_records",
)
_NARROW = np.iinfo(np.int32)


def holding_keys(exchange: np.ndarray | int, upstream: np.ndarray | int, group: np.ndarray | int) -> np.ndarray:
    """(exchange index, upstream subtask, key group) as one int64: subtasks and key groups are
    below Flink's highest max parallelism, 2^15."""
    return (np.asarray(exchange, dtype=np.int64) << 32) | (np.asarray(upstream, dtype=np.int64) << 16) | group


@dataclass
class ScanColumns:
    """The figures of many channels as columns (an integer array per figure of ``ChannelScan``,
    one row per channel), records per key group of each keyed exchange, and ``holdings``: the
    ``holding_keys`` of the (exchange, upstream subtask, key group) of the records held where
    their key group does not belong (misplaced). What a scan task returns for all its channels
    at once: a few arrays, not an object per channel.

    Joined (``concatenate``), a figure is int32 where its values fit, and a figure that is zero
    in every channel (most are: watermarks, partial bytes, ...) a read-only broadcast zero that
    takes no memory: a job at parallelism p has up to p² channels."""

    columns: dict[str, np.ndarray]
    histograms: dict[int, np.ndarray] = field(default_factory=dict)
    holdings: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.columns["bytes"])

    def figures_only(self) -> ScanColumns:
        """Without the columns that name the channels (exchange, upstream and downstream subtask):
        what a scan task sends back where the caller has them (the channels it handed out)."""
        columns = {name: column for name, column in self.columns.items() if name not in FIGURES[:3]}
        return ScanColumns(columns, self.histograms, self.holdings)

    @staticmethod
    def empty() -> ScanColumns:
        return ScanColumns({name: np.zeros(0, dtype=np.int64) for name in FIGURES})

    @staticmethod
    def of_scans(scans: list[ChannelScan]) -> ScanColumns:
        columns = {name: np.array([getattr(s, name) for s in scans], dtype=np.int64).reshape(-1) for name in FIGURES}
        histograms: dict[int, Counter] = {}
        misplaced: set[tuple[int, int, int]] = set()
        for s in scans:
            if s.key_groups:
                histograms.setdefault(s.exchange_index, Counter()).update(s.key_groups)
                misplaced.update((s.exchange_index, s.upstream_subtask, g) for g in s.misplaced_key_groups)
        arrays = {}
        for index, counts in histograms.items():
            array = np.zeros(max(counts) + 1, dtype=np.int64)
            array[list(counts)] = list(counts.values())
            arrays[index] = array
        rows = np.array(sorted(misplaced), dtype=np.int64).reshape(-1, 3)
        return ScanColumns(columns, arrays, holding_keys(rows[:, 0], rows[:, 1], rows[:, 2]))

    @staticmethod
    def concatenate(parts: list[ScanColumns]) -> ScanColumns:
        """The parts' rows one after another. Consumes ``parts`` (the list is emptied, each part
        dropped once copied), so that the parts and the whole are not held at once."""
        if not parts:
            return ScanColumns.empty()
        rows = sum(len(p) for p in parts)
        held = sum(len(p.holdings) for p in parts)
        columns: dict[str, np.ndarray] = {}
        for name in parts[0].columns:
            low = min((int(p.columns[name].min()) for p in parts if len(p)), default=0)
            high = max((int(p.columns[name].max()) for p in parts if len(p)), default=0)
            if low == high == 0:
                columns[name] = np.broadcast_to(np.zeros(1, dtype=np.int32), (rows,))
            else:
                narrow = _NARROW.min <= low and high <= _NARROW.max
                columns[name] = np.empty(rows, dtype=np.int32 if narrow else np.int64)
        holdings = np.empty(held, dtype=np.int64)
        histograms: dict[int, np.ndarray] = {}
        parts.reverse()
        row = at = 0
        while parts:
            part = parts.pop()
            for name, column in columns.items():
                if column.strides[0]:
                    column[row : row + len(part)] = part.columns[name]
            holdings[at : at + len(part.holdings)] = part.holdings
            row, at = row + len(part), at + len(part.holdings)
            for index, counts in part.histograms.items():
                known = histograms.get(index)
                if known is None:
                    histograms[index] = counts.astype(np.int64)
                else:
                    size = max(len(known), len(counts))
                    merged = np.zeros(size, dtype=np.int64)
                    merged[: len(known)] += known
                    merged[: len(counts)] += counts
                    histograms[index] = merged
        return ScanColumns(columns, histograms, holdings)

    def __getstate__(self) -> dict:
        """Pickled (a forked worker's result) with each broadcast zero as its length only."""
        state = dict(self.__dict__)
        state["columns"] = {
            name: ("zero", len(column)) if not column.strides[0] and len(column) > 1 else column
            for name, column in self.columns.items()
        }
        return state

    def __setstate__(self, state: dict) -> None:
        columns = state["columns"]
        for name, column in columns.items():
            if isinstance(column, tuple):
                columns[name] = np.broadcast_to(np.zeros(1, dtype=np.int32), (column[1],))
        self.__dict__.update(state)

    def misplaced(self) -> set[tuple[int, int, int]]:
        """The (exchange, upstream subtask, key group) of ``holdings``."""
        keys = self.holdings.tolist()
        return {(key >> 32, (key >> 16) & 0xFFFF, key & 0xFFFF) for key in keys}

    def select(self, rows: np.ndarray | slice) -> ScanColumns:
        """The channels at ``rows`` (indexes, in their order, or a mask; or a slice: then views of
        the columns), a broadcast zero staying one; histograms and holdings stay whole."""
        if isinstance(rows, slice):  # a slice of a broadcast zero is one
            columns = {name: column[rows] for name, column in self.columns.items()}
        else:
            count = int(np.count_nonzero(rows)) if rows.dtype == bool else len(rows)
            columns = {
                name: column[rows] if column.strides[0] else np.broadcast_to(column[:1], (count,))
                for name, column in self.columns.items()
            }
        return ScanColumns(columns, self.histograms, self.holdings)

    def scans(self) -> list[ChannelScan]:
        """One ChannelScan per row (without key groups: they are in ``histograms``)."""
        columns = [self.columns[name].tolist() for name in FIGURES]
        return [ChannelScan(*row) for row in zip(*columns)]


def suspects_of_holdings(scans: ScanColumns) -> dict[tuple[int, int], frozenset]:
    """Per (exchange, upstream subtask), the key groups that may be held by several downstream
    subtasks: those held where they do not belong (each key group has one owner, so a key group
    held twice is misplaced at least once). A wider set than ``suspect_key_groups`` (a key group
    misplaced once and not held by its owner is one too): it only chooses which channels are
    digested, and a digest held once is no copy. Takes the holdings from ``scans``."""
    keys = np.unique(scans.holdings)
    scans.holdings = np.zeros(0, dtype=np.int64)
    suspects: dict[tuple[int, int], set[int]] = {}
    exchanges, upstreams, groups = (keys >> 32).tolist(), ((keys >> 16) & 0xFFFF).tolist(), (keys & 0xFFFF).tolist()
    for exchange, upstream, group in zip(exchanges, upstreams, groups):
        suspects.setdefault((exchange, upstream), set()).add(group)
    return {channel: frozenset(groups) for channel, groups in suspects.items()}
