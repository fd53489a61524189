"""Routing in-flight records to the subtasks of a new parallelism (seed 000 §4.1, offline).

Every record of an old logical channel u -> d (input side of d stitched with output side of u)
goes to the new downstream subtask that owns its key group (keyed exchanges) or, for rebalance
and rescale exchanges, to one chosen round robin. It lands in the input channel u mod N_up of
the new subtask's gate, after the records of the same old channel that came before it, so the
order of each old channel is kept. Output-side data is recovered on the downstream side
(seed 000 §4.2): the new checkpoint holds only input-channel state for rescaled exchanges.
Watermarks and other non-record elements are not carried over: Flink emits watermarks anew
after a restore, and a watermark moved into another channel could make records late.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from ckpt_tool.flink.channel_state import ChannelStateFileBuilder
from ckpt_tool.records.elements import element_kind
from ckpt_tool.records.framing import split_records
from ckpt_tool.records.keys import key_group_for_hash, operator_index_for_key_group
from ckpt_tool.records.scan import ChannelTask, cached_key_function
from ckpt_tool.records.schema import Exchange

BUFFER_SIZE = 32 * 1024  # Flink's default network buffer (memory segment) size
_LENGTH = struct.Struct(">i")


@dataclass
class RouteSpec:
    """What a worker needs to route one exchange's records. Picklable."""

    exchange: Exchange
    new_upstream_parallelism: int
    new_downstream_parallelism: int
    max_parallelism: int
    old_downstream_parallelism: int
    replicas: frozenset = frozenset()  # (digest, old downstream subtask) copies to drop


@dataclass
class RoutedChannel:
    """Counters of one old channel, and its records as (new subtask, sort key, bytes)."""

    exchange_index: int
    records_in: int = 0
    bytes_in: int = 0
    replicas_removed: int = 0
    non_records_dropped: int = 0
    routed: list = field(default_factory=list)


def route_channel(task: ChannelTask, spec: RouteSpec) -> RoutedChannel:
    inputs = [b for source in task.inputs for b in source.buffers()]
    outputs = [b for source in task.outputs for b in source.buffers()]
    framed = split_records(inputs + outputs)
    result = RoutedChannel(task.exchange_index)
    key_of = cached_key_function(spec.exchange) if spec.exchange.keyed else None
    new_channel = task.upstream_subtask % spec.new_upstream_parallelism
    for sequence, raw in enumerate(framed.records):
        element = element_kind(raw)
        if element.kind != "record":
            result.non_records_dropped += 1
            continue
        result.records_in += 1
        result.bytes_in += 4 + len(raw)  # as framed in a buffer
        if spec.replicas and (hashlib.blake2b(raw, digest_size=16).digest(), task.downstream_subtask) in spec.replicas:
            result.replicas_removed += 1
            continue
        if key_of is not None:
            key_group = key_group_for_hash(key_of(raw, element.value_offset)[0], spec.max_parallelism)
            target = operator_index_for_key_group(spec.max_parallelism, spec.new_downstream_parallelism, key_group)
        else:
            target = (task.downstream_subtask + sequence) % spec.new_downstream_parallelism
        order = (spec.exchange.gate, new_channel, task.upstream_subtask, task.downstream_subtask, sequence)
        result.routed.append((target, order, raw))
    return result


def replica_copies(holders: dict[bytes, set[int]]) -> frozenset:
    """Copies to drop where one record is held by several old subtasks: all but the lowest's."""
    return frozenset(
        (digest, subtask) for digest, subtasks in holders.items() if len(subtasks) > 1
        for subtask in subtasks if subtask != min(subtasks)
    )


def pack_buffers(records: list[bytes], buffer_size: int = BUFFER_SIZE) -> list[bytes]:
    """Length-frame records and cut the stream into network buffers (records may span buffers)."""
    stream = b"".join(_LENGTH.pack(len(r)) + r for r in records)
    return [stream[i:i + buffer_size] for i in range(0, len(stream), buffer_size)]


def build_subtask_file(routed: list) -> tuple[bytes, dict[tuple[int, int], tuple[list[int], int, int]]]:
    """One channel-state file for one new subtask: its channels in (gate, channel) order, each
    channel's records in their old order. Returns the bytes and (offsets, size, records) per channel."""
    channels: dict[tuple[int, int], list] = {}
    for order, raw in sorted(routed, key=lambda item: item[0]):
        channels.setdefault(order[:2], []).append(raw)
    builder = ChannelStateFileBuilder()
    placed = {
        channel: (*builder.add(pack_buffers(records)), len(records)) for channel, records in sorted(channels.items())
    }
    return builder.getvalue(), placed
