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

Flink's keyBy never sends a record to a subtask outside its key group: replicas (a naive rescale, a
checkpoint during recovery) sit there with a copy at another subtask, and channel state moved to the
wrong subtask holds runs of another subtask's records. Where more than a quarter of an upstream
subtask's records sit outside their holder's key groups without a copy, and their owners change from
one record to the next more than a quarter of the time, the schema's key (or type) is not the job's
and routing by it would put records where Flink cannot process them: that is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ckpt_tool.errors import CheckpointFormatError, CkptError
from ckpt_tool.flink.channel_state import Pieces
from ckpt_tool.framing import framing as _framing
from ckpt_tool.records.batch import ChannelRecords, FramedChannels, KeyGroups
from ckpt_tool.records.keys import operator_index_for_key_group
from ckpt_tool.records.scan import digest_holders, suspect_key_groups, suspect_records
from ckpt_tool.records.schema import Exchange, SchemaError


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
    channels: list[tuple[int, ChannelRecords]],
    spec: RouteSpec,
    keys: Optional[KeyGroups],
    counters: RouteCounters,
    upstream: int = 0,
    old_parallelism: int = 1,
) -> Iterator[tuple[int, bytes, int]]:
    """(new downstream subtask, its records framed, how many) for the old channels
    (old downstream subtask, records) of upstream subtask ``upstream``; ``old_parallelism`` is the
    old downstream parallelism (which says the key groups each old subtask held)."""
    groups = [_key_groups(keys, records, upstream, downstream) for downstream, records in channels]
    dropped = [None] * len(channels)
    if keys:
        copies, dropped = _replica_copies(channels, groups, counters)
        _refuse_misplaced(channels, groups, copies, spec, upstream, old_parallelism)
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


def _key_groups(keys: Optional[KeyGroups], records: ChannelRecords, upstream: int, downstream: int) -> Optional[np.ndarray]:
    if keys is None:
        return None
    try:
        return keys.of(records, records.is_record)
    except CkptError as exc:
        raise type(exc)(f"channel {upstream} -> {downstream}: {exc}") from None


def _replica_copies(channels, groups, counters: RouteCounters) -> tuple[list, list]:
    """Per channel, masks of the records held by several old downstream subtasks (in key groups
    that several of them hold), and of the copies to drop: all but the lowest subtask's. The
    suspect records of all the channels are grouped by their digests at once (an inflated
    checkpoint holds millions of copies); records of one digest are compared byte for byte before
    any is dropped."""
    held = [(None, downstream, np.flatnonzero(np.bincount(g))) for (downstream, _), g in zip(channels, groups)]
    suspects = suspect_key_groups(held).get(None)  # one upstream channel: no key needed
    if not suspects:
        return [None] * len(channels), [None] * len(channels)
    found = [suspect_records(records, g, suspects) for (_, records), g in zip(channels, groups)]
    counts = np.array([len(indices) for indices, _ in found], dtype=np.int64)
    copy = np.zeros(int(counts.sum()), dtype=bool)
    drop = np.zeros_like(copy)
    if len(copy):
        holder = np.repeat(np.array([downstream for downstream, _ in channels], dtype=np.int64), counts)
        digest = np.frombuffer(b"".join([digests for _, digests in found]), dtype=np.uint64).reshape(-1, 2)
        order, first, group, subtasks = digest_holders(digest, holder)  # subtasks: holders of each digest
        _check_copies_equal(channels, found, order, first, group, subtasks)
        holders = holder[order]
        copy[order] = subtasks[group] > 1
        drop[order] = holders[np.flatnonzero(first)][group] != holders  # not the lowest holder
        counters.replicas_found += int((subtasks - 1).sum())
        counters.replicas_removed += int(drop.sum())
    copies, drops = [], []
    ends = np.cumsum(counts)
    for ((_, records), (indices, _)), at, end in zip(zip(channels, found), ends - counts, ends):
        copies.append(np.zeros(len(records.tags), dtype=bool))
        drops.append(np.zeros(len(records.tags), dtype=bool))
        copies[-1][indices], drops[-1][indices] = copy[at:end], drop[at:end]
    return copies, drops


COMPARED_AT_ONCE = 1 << 16  # copies compared byte for byte with their digest's first record at a time


def _check_copies_equal(channels, found, order, first, group, subtasks) -> None:
    """Every record whose digest several subtasks hold equals, byte for byte, the first record of
    that digest: a digest is not proof (xxh3 is fast, not collision-proof against crafted input),
    so nothing is dropped as a copy of a record it does not equal."""
    copied = np.flatnonzero(subtasks[group] > 1)  # positions in ``order``
    if not len(copied):
        return
    bounds = [records.element_bounds(indices) for (_, records), (indices, _) in zip(channels, found)]
    sizes = np.concatenate([ends - starts for starts, ends in bounds])
    joined = b"".join([_framing.gather(records.data, *bound) for (_, records), bound in zip(channels, bounds)])
    at = (np.cumsum(sizes) - sizes)[order]  # each record's place in ``joined``, in digest order
    lengths = sizes[order]
    twin = np.flatnonzero(first)[group]  # each record's digest's first record, in digest order
    for start in range(0, len(copied), COMPARED_AT_ONCE):
        mine = copied[start : start + COMPARED_AT_ONCE]
        theirs = twin[mine]
        if (lengths[mine] != lengths[theirs]).any() or _framing.gather(joined, at[mine], at[mine] + lengths[mine]) != (
            _framing.gather(joined, at[theirs], at[theirs] + lengths[theirs])
        ):
            raise CheckpointFormatError(
                "two different records of one upstream subtask have the same xxh3-128 digest, so ckpt cannot tell "
                "the copies of a record apart (a crafted checkpoint?): refused"
            )


def _refuse_misplaced(channels, groups, copies, spec: RouteSpec, upstream: int, old_parallelism: int) -> None:
    """Refuse a schema by which records sit outside their holder's key groups record by record."""
    records = stray = switches = 0
    for (downstream, channel), key_groups, copy in zip(channels, groups, copies):
        owners = operator_index_for_key_group(spec.max_parallelism, old_parallelism, key_groups.astype(np.int64))
        if copy is not None:
            owners = owners[~copy[channel.is_record]]
        records += len(key_groups)
        stray += int((owners != downstream).sum())
        switches += int((owners[1:] != owners[:-1]).sum())
    if 4 * stray > records and 4 * switches > records:
        raise _misplaced(spec, upstream, stray, records)


def _misplaced(spec: RouteSpec, upstream: int, stray: int, records: int) -> SchemaError:
    return SchemaError(
        f"by the schema's key {list(spec.exchange.key)} of {spec.exchange.record_type or 'its decoder'}, "
        f"{stray} of the {records} records from upstream subtask {upstream} sit outside the key groups of the "
        "subtask holding them, with no copy elsewhere and owners changing from one record to the next, "
        "which neither Flink nor a naive rescale nor a moved channel leaves: the key or the record type is not the job's"
    )


class NotTogether(Exception):
    """The channels of an upstream subtask hold copies of records (key groups that several old
    subtasks hold): ``route_upstream`` handles them channel by channel."""


def route_together(
    framed: FramedChannels,
    downstreams: np.ndarray,
    spec: RouteSpec,
    keys: Optional[KeyGroups],
    counters: RouteCounters,
    upstream: int = 0,
    old_parallelism: int = 1,
) -> Pieces:
    """``route_upstream`` of the framed channels of upstream subtask ``upstream`` (old downstream
    subtask of channel k: ``downstreams[k]``; no channel holds a cut record), with one NumPy pass
    over all their records and one copy of their bytes: the same pieces (new downstream subtask,
    its records framed, how many), in the same order (channel by channel, targets ascending), as
    columns (``Pieces``, which iterate as those tuples).
    Raises NotTogether where records may be held twice (nothing is counted then); a CkptError
    where the records do not fit (``route_upstream`` of the channels says which)."""
    groups = None if keys is None else together_key_groups(framed, downstreams, spec, keys, old_parallelism)
    return _routed_pieces(framed, downstreams, spec, groups, counters)


def together_key_groups(
    framed: FramedChannels,
    downstreams: np.ndarray,
    spec: RouteSpec,
    keys: KeyGroups,
    old_parallelism: int,
    upstream_of_channel: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The key groups of the framed channels' records, where ``route_together`` may route them
    together: raises NotTogether where an upstream subtask's channels may hold copies of records
    (a key group that several of its old downstream subtasks hold) or hold records outside their
    holder's key groups record by record (``route_upstream`` then refuses them, naming them).
    The channels are one upstream subtask's, or, with ``upstream_of_channel`` (a number per
    channel), several upstream subtasks', each judged on its own."""
    records, channel = framed.records, framed.channel
    is_record = records.is_record
    record_channel = channel[is_record]
    groups = keys.of(records, is_record).astype(np.int64)
    held_by = downstreams[record_channel].astype(np.int64)
    owners = operator_index_for_key_group(spec.max_parallelism, old_parallelism, groups)
    astray = owners != held_by
    if not astray.any():  # every record in its key group's subtask: no group is held twice
        return groups
    if upstream_of_channel is None:
        upstream = np.zeros(len(groups), dtype=np.int64)
    else:
        upstream = upstream_of_channel[record_channel].astype(np.int64)
    # a key group held by several old subtasks of one upstream subtask's channels: maybe copies
    held = np.unique((upstream * old_parallelism + held_by) * spec.max_parallelism + groups)
    by_upstream = held // (old_parallelism * spec.max_parallelism) * spec.max_parallelism + held % spec.max_parallelism
    if len(by_upstream) != len(np.unique(by_upstream)):
        raise NotTogether()
    count = int(upstream.max()) + 1
    stray = np.bincount(upstream[astray], minlength=count)
    switched = (owners[1:] != owners[:-1]) & (record_channel[1:] == record_channel[:-1])
    switches = np.bincount(upstream[1:][switched], minlength=count)
    records_of = np.bincount(upstream, minlength=count)
    if ((4 * stray > records_of) & (4 * switches > records_of)).any():
        raise NotTogether()  # refused, with its message, by route_upstream
    return groups


def route_channel_in_pieces(
    pieces: Iterable[tuple[FramedChannels, int]],
    downstream: int,
    spec: RouteSpec,
    keys: Optional[KeyGroups],
    counters: RouteCounters,
    upstream: int = 0,
    old_parallelism: int = 1,
) -> Iterator[Pieces]:
    """``route_upstream`` of an upstream subtask's one old channel (to old downstream subtask
    ``downstream``), which comes in pieces (``ChannelPieces``: each piece's whole elements, and
    how many came before it), routed piece by piece: the same records to the same targets, in the
    same order, without the whole channel in memory (a rescale to parallelism 1 makes one channel
    of all the job's in-flight data). One channel holds no copies of records; a schema by which
    its records sit outside their holder's key groups record by record is refused, as
    ``route_upstream`` refuses it, once all the pieces are counted."""
    downstreams = np.array([downstream], dtype=np.int64)
    records = stray = switches = 0
    last_owner: Optional[int] = None
    for framed, before in pieces:
        groups = None
        if keys is not None:
            groups = keys.of(framed.records, framed.records.is_record).astype(np.int64)
            owners = operator_index_for_key_group(spec.max_parallelism, old_parallelism, groups)
            if len(owners):
                records += len(owners)
                stray += int((owners != downstream).sum())
                switches += int((owners[1:] != owners[:-1]).sum()) + int(last_owner is not None and int(owners[0]) != last_owner)
                last_owner = int(owners[-1])
        yield _routed_pieces(framed, downstreams, spec, groups, counters, before)
    if 4 * stray > records and 4 * switches > records:
        raise _misplaced(spec, upstream, stray, records)


def _routed_pieces(
    framed: FramedChannels,
    downstreams: np.ndarray,
    spec: RouteSpec,
    groups: Optional[np.ndarray],
    counters: RouteCounters,
    before: int = 0,
) -> Pieces:
    """The framed channels' records routed (``groups``: their key groups, where keyed), as
    ``route_together`` returns them; ``before``: elements of the (one) channel before these."""
    records, channel = framed.records, framed.channel
    is_record = records.is_record
    if groups is not None:
        targets = np.full(len(is_record), -1, dtype=np.int64)
        targets[is_record] = operator_index_for_key_group(spec.max_parallelism, spec.new_downstream_parallelism, groups)
    elif spec.exchange.partitioner == "GLOBAL":
        targets = np.where(is_record, 0, -1)
    else:
        sequence = np.arange(len(is_record)) - framed.first[channel] + before  # each element's index in its channel
        targets = np.where(is_record, (downstreams[channel] + sequence) % spec.new_downstream_parallelism, -1)
    counters.records_in += int(is_record.sum())
    counters.bytes_in += int((records.ends - records.starts)[is_record].sum())
    counters.non_records_dropped += int((~is_record).sum())
    chosen = np.flatnonzero(targets >= 0)
    order = chosen[np.argsort(channel[chosen] * spec.new_downstream_parallelism + targets[chosen], kind="stable")]
    if not len(order):
        return Pieces.of([])
    data = _framing.gather(records.data, records.starts[order], records.ends[order])
    piece_key = channel[order] * spec.new_downstream_parallelism + targets[order]
    cuts = np.flatnonzero(piece_key[1:] != piece_key[:-1]) + 1
    firsts = np.concatenate([[0], cuts])
    lasts = np.concatenate([cuts, [len(order)]])
    sizes = np.cumsum(records.ends[order] - records.starts[order])
    begins = np.concatenate([[0], sizes[lasts[:-1] - 1]])
    return Pieces(targets[order][firsts], data, begins, sizes[lasts - 1], (lasts - firsts).astype(np.int64))
