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
