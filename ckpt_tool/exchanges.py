"""The in-flight records of exchanges, scanned: the figures ``inspect``, ``verify`` and ``repair`` share.

Logical channels are scanned on the session's engine, in tasks of a bounded byte budget. Copies of one record held by several
downstream subtasks can only be in key groups that several of them hold for the same upstream
channel, so digests are computed only in a second pass over those channels; a healthy checkpoint
needs none.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Optional

from ckpt_tool.engine import Engine, Progress
from ckpt_tool.engine.tasks import channel_tasks, scan_channel
from ckpt_tool.errors import CkptError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.records.keys import key_group_range
from ckpt_tool.records.scan import ChannelScan, suspect_key_groups
from ckpt_tool.records.schema import Exchange

# (exchange index, upstream subtask, digest) -> old downstream subtasks holding that record
Holders = dict[tuple[int, int, bytes], set[int]]


@dataclass
class ExchangeScan:
    """One exchange's in-flight records: per logical channel and in total."""

    exchange: Exchange
    channels: list[ChannelScan]
    duplicate_records: int
    subtask_key_groups: list[range]  # of the downstream subtasks
    problem: Optional[str] = None  # why its records could not be read, if so

    @property
    def keyed(self) -> bool:
        return self.exchange.keyed

    @property
    def partitioner(self) -> Optional[str]:
        return self.exchange.partitioner or ("HASH" if self.keyed else None)

    def total(self, figure: str) -> int:
        return sum(getattr(c, figure) for c in self.channels)

    @property
    def key_group_histogram(self) -> Counter:
        histogram: Counter = Counter()
        for channel in self.channels:
            histogram.update(channel.key_groups)
        return histogram

    def as_dict(self) -> dict:
        exchange, keyed = self.exchange, self.keyed
        histogram = self.key_group_histogram
        return {
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
                    "upstream_subtask": c.upstream_subtask,
                    "downstream_subtask": c.downstream_subtask,
                    "input_buffers": c.input_buffers,
                    "output_buffers": c.output_buffers,
                    "bytes": c.bytes,
                    "records": c.records,
                    "watermarks": c.watermarks,
                    "other_elements": c.other_elements,
                    "partial_bytes": c.trailing_bytes,
                    "misplaced_records": c.misplaced_records if keyed else None,
                }
                for c in self.channels
            ],
        }


def _scan_with_digests(engine: Engine, tasks, exchanges: list[Exchange], progress: Progress):
    """Channel figures and, per exchange and upstream subtask, the records held by several
    downstream subtasks."""
    # channels of one downstream subtask together (its input state is one file), in byte-sized batches
    tasks = sorted(tasks, key=lambda t: (t.exchange_index, t.downstream_subtask, t.upstream_subtask))
    scans = engine.map(lambda task: scan_channel(task, exchanges[task.exchange_index]), tasks, progress, [t.size for t in tasks])
    suspects = suspect_key_groups(((s.exchange_index, s.upstream_subtask), s.downstream_subtask, s.key_groups) for s in scans)
    again = [t for t in tasks if (t.exchange_index, t.upstream_subtask) in suspects]
    holders: Holders = {}
    for s in engine.map(
        lambda t: scan_channel(t, exchanges[t.exchange_index], suspects[(t.exchange_index, t.upstream_subtask)]),
        again,
        sizes=[t.size for t in again],
    ):
        for digest in s.digests:
            holders.setdefault((s.exchange_index, s.upstream_subtask, digest), set()).add(s.downstream_subtask)
    return scans, {k: v for k, v in holders.items() if len(v) > 1}


def scan_exchanges(
    checkpoint: Checkpoint, exchanges: list[Exchange], engine: Engine, progress: Progress = None
) -> list[ExchangeScan]:
    """Records per channel, key-group histograms, misplaced and duplicate records per exchange."""
    scans, holders = _scan_with_digests(engine, channel_tasks(checkpoint, exchanges), exchanges, progress)
    duplicates: Counter = Counter()
    for (exchange_index, _, _), subtasks in holders.items():
        duplicates[exchange_index] += len(subtasks) - 1
    by_exchange = defaultdict(list)
    for scan in scans:
        by_exchange[scan.exchange_index].append(scan)
    return [
        ExchangeScan(
            exchange,
            sorted(by_exchange[index], key=lambda s: (s.upstream_subtask, s.downstream_subtask)),
            duplicates[index],
            _key_group_ranges(checkpoint, exchange),
        )
        for index, exchange in enumerate(exchanges)
    ]


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
            result.append(ExchangeScan(exchange, [], 0, _key_group_ranges(checkpoint, exchange), str(exc)))
    return result
