"""Figures of one logical channel's records: elements by kind, key groups, misplaced records, and
digests of the records that may be held twice. Pure computation over ``ChannelRecords``.

Record digests, for finding copies of one record held by several subtasks, are computed only for
the key groups that several downstream subtasks hold (``suspects``); a healthy checkpoint has none.
"""

from __future__ import annotations

import builtins
import hashlib
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

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
    digests: list[builtins.bytes] = field(default_factory=list)  # of the records in suspect key groups


def suspect_digests(records: ChannelRecords, key_groups: np.ndarray, suspects: frozenset) -> list[tuple[int, bytes]]:
    """(element index, digest) of the records whose key group (``key_groups``, one per record)
    is a suspect."""
    chosen = np.zeros(len(records.tags), dtype=bool)
    chosen[records.is_record] = np.isin(key_groups, list(suspects))
    return [(i, hashlib.blake2b(records.element(i), digest_size=16).digest()) for i in np.flatnonzero(chosen).tolist()]


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
        scan.misplaced_records = int(((groups < owned.start) | (groups >= owned.stop)).sum())
        counts = np.bincount(groups)
        found = np.flatnonzero(counts)
        scan.key_groups = Counter(dict(zip(found.tolist(), counts[found].tolist())))
        if suspects:
            scan.digests = [digest for _, digest in suspect_digests(records, groups, suspects)]
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


@dataclass
class ScanColumns:
    """The figures of many channels as columns (an int64 array per figure of ``ChannelScan``, one
    row per channel), records per key group of each keyed exchange, and ``holdings``: the distinct
    (exchange index, upstream subtask, downstream subtask, key group) of the records. What a scan
    task returns for all its channels at once: a few arrays, not an object per channel."""

    columns: dict[str, np.ndarray]
    histograms: dict[int, np.ndarray] = field(default_factory=dict)
    holdings: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), dtype=np.int64))

    def __len__(self) -> int:
        return len(self.columns["exchange_index"])

    @staticmethod
    def empty() -> ScanColumns:
        return ScanColumns({name: np.zeros(0, dtype=np.int64) for name in FIGURES})

    @staticmethod
    def of_scans(scans: list[ChannelScan]) -> ScanColumns:
        columns = {name: np.array([getattr(s, name) for s in scans], dtype=np.int64).reshape(-1) for name in FIGURES}
        histograms: dict[int, Counter] = {}
        rows = []
        for s in scans:
            if s.key_groups:
                histograms.setdefault(s.exchange_index, Counter()).update(s.key_groups)
                rows += [(s.exchange_index, s.upstream_subtask, s.downstream_subtask, g) for g in s.key_groups]
        arrays = {}
        for index, counts in histograms.items():
            array = np.zeros(max(counts) + 1, dtype=np.int64)
            array[list(counts)] = list(counts.values())
            arrays[index] = array
        return ScanColumns(columns, arrays, np.array(rows, dtype=np.int64).reshape(-1, 4))

    @staticmethod
    def concatenate(parts: list[ScanColumns]) -> ScanColumns:
        if not parts:
            return ScanColumns.empty()
        columns = {name: np.concatenate([p.columns[name] for p in parts]) for name in FIGURES}
        histograms: dict[int, np.ndarray] = {}
        for part in parts:
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
        return ScanColumns(columns, histograms, np.concatenate([p.holdings for p in parts]))

    def select(self, rows: np.ndarray | slice) -> ScanColumns:
        """The channels at ``rows`` (indexes, a mask, or a slice: then views of the columns);
        histograms and holdings stay whole."""
        return ScanColumns({name: column[rows] for name, column in self.columns.items()}, self.histograms, self.holdings)

    def scans(self) -> list[ChannelScan]:
        """One ChannelScan per row (without key groups: they are in ``histograms``)."""
        columns = [self.columns[name].tolist() for name in FIGURES]
        return [ChannelScan(*row) for row in zip(*columns)]


def suspects_of_holdings(holdings: np.ndarray) -> dict[tuple[int, int], frozenset]:
    """``suspect_key_groups`` of (exchange, upstream, downstream, key group) rows, each distinct:
    per (exchange, upstream subtask), the key groups that several downstream subtasks hold."""
    if not len(holdings):
        return {}
    channels, counts = np.unique(holdings[:, [0, 1, 3]], axis=0, return_counts=True)
    suspects: dict[tuple[int, int], set[int]] = {}
    for exchange, upstream, group in channels[counts > 1].tolist():
        suspects.setdefault((exchange, upstream), set()).add(group)
    return {channel: frozenset(groups) for channel, groups in suspects.items()}
