"""Routing in-flight records to the subtasks of a new parallelism (seed 000 §4.1, offline).

Every record of an old logical channel u -> d (input side of d stitched with output side of u)
goes to the new downstream subtask that owns its key group (HASH), to subtask 0 (GLOBAL, as
Flink's GlobalPartitioner sends everything there), or to one chosen round robin (REBALANCE,
SHUFFLE: any subtask is as right as another). It lands in input channel c = u mod N_up of
the new subtask's gate, after the records of the same old channel that came before it, so the
order of each old channel is kept. Output-side data is recovered on the downstream side
(seed 000 §4.2): the new checkpoint holds only input-channel state for rescaled exchanges.
Watermarks and other non-record elements are not carried over: Flink emits watermarks anew
after a restore, and a watermark moved into another channel could make records late.

This module computes where records go; reading and writing the files is the caller's
(ckpt_tool.engine.tasks). Copies of one record that Flink replicated to several old subtasks
(they share the upstream channel) are found among the channels of one upstream subtask and kept
once, at the lowest old subtask.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ckpt_tool.records.batch import ChannelRecords, KeyGroups
from ckpt_tool.records.keys import operator_index_for_key_group
from ckpt_tool.records.scan import suspect_digests, suspect_key_groups
from ckpt_tool.records.schema import Exchange


@dataclass
class RouteSpec:
    """What a worker needs to route one exchange's records. Picklable."""

    exchange: Exchange
    new_upstream_parallelism: int
    new_downstream_parallelism: int
    max_parallelism: int
    label: str = ""  # how messages name the exchange


@dataclass
class RouteCounters:
    records_in: int = 0
    bytes_in: int = 0
    replicas_found: int = 0
    replicas_removed: int = 0
    non_records_dropped: int = 0


def route_upstream(
    channels: list[tuple[int, ChannelRecords]], spec: RouteSpec, keys: Optional[KeyGroups], counters: RouteCounters
) -> Iterator[tuple[int, bytes, int]]:
    """(new downstream subtask, its records framed, how many) for the old channels
    (old downstream subtask, records) of one upstream subtask."""
    groups = [keys.of(records, records.is_record) if keys else None for _, records in channels]
    dropped = _replica_copies(channels, groups, counters) if keys else [None] * len(channels)
    for (downstream, records), key_groups, drop in zip(channels, groups, dropped):
        is_record = records.is_record
        counters.records_in += int(is_record.sum())
        counters.bytes_in += int((records.ends - records.starts)[is_record].sum())
        counters.non_records_dropped += int((~is_record).sum())
        if key_groups is not None:
            targets = np.full(len(is_record), -1, dtype=np.int64)
            targets[is_record] = operator_index_for_key_group(
                spec.max_parallelism, spec.new_downstream_parallelism, key_groups.astype(np.int64)
            )
            if drop is not None:
                targets[drop] = -1
        elif spec.exchange.partitioner == "GLOBAL":
            targets = np.where(is_record, 0, -1)
        else:
            sequence = np.arange(len(is_record))
            targets = np.where(is_record, (downstream + sequence) % spec.new_downstream_parallelism, -1)
        for target in np.flatnonzero(np.bincount(targets[targets >= 0])).tolist():
            chosen = targets == target
            yield target, records.framed(chosen), int(chosen.sum())


def _replica_copies(channels, groups, counters: RouteCounters) -> list:
    """Per channel, a mask of the record copies to drop: where one record is held by several old
    downstream subtasks (in key groups that several of them hold), all but the lowest's."""
    held = [(None, downstream, np.flatnonzero(np.bincount(g))) for (downstream, _), g in zip(channels, groups)]
    suspects = suspect_key_groups(held).get(None)  # one upstream channel: no key needed
    if not suspects:
        return [None] * len(channels)
    candidates = [suspect_digests(records, g, suspects) for (_, records), g in zip(channels, groups)]
    digests: dict[bytes, set[int]] = {}
    for (downstream, _), found in zip(channels, candidates):
        for _, digest in found:
            digests.setdefault(digest, set()).add(downstream)
    counters.replicas_found += sum(len(s) - 1 for s in digests.values())
    drops = []
    for (downstream, records), found in zip(channels, candidates):
        drop = np.zeros(len(records.tags), dtype=bool)
        for index, digest in found:
            drop[index] = min(digests[digest]) != downstream
        counters.replicas_removed += int(drop.sum())
        drops.append(drop)
    return drops
