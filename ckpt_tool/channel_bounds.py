"""How many channels each input gate and output partition of an operator has, as Flink's restore
indexes them.

Flink's restore of channel state (``SequentialChannelStateReaderImpl``) takes the input gate, or the
result partition, at a handle's first index and the channel, or subpartition, at its second: an
index outside them fails it (``ArrayIndexOutOfBoundsException``). A gate has one channel per
subtask of the sending operator at most (every one on an all-to-all exchange, fewer on a pointwise
one), a partition one subpartition per subtask of the receiving operator at most. Where the
exchanges (``--plan``, ``--schema``) do not name a gate, or state no partition, only a negative
index is known to be wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np

from ckpt_tool.flink.model import INPUT
from ckpt_tool.records.schema import Exchange

UNBOUNDED = 1 << 15  # Flink's highest max parallelism: no channel index reaches it


class ChannelBounds:
    """The channels of each (operator, gate) and subpartitions of each (operator, partition)."""

    def __init__(self, parallelism: dict[str, int], exchanges: Sequence[Exchange]) -> None:
        self._inputs = {(e.downstream_id, e.gate): parallelism[e.upstream_id] for e in exchanges if e.upstream_id in parallelism}
        self._outputs = {
            (e.upstream_id, e.partition): parallelism[e.downstream_id]
            for e in exchanges
            if e.upstream_id and e.partition_stated and e.downstream_id in parallelism
        }

    def of(self, operator_id: str, direction: str, gate: int) -> int:
        """How many channels (input) or subpartitions (output) the gate or partition has (0 for a
        negative one; ``UNBOUNDED`` where the exchanges do not say)."""
        if gate < 0:
            return 0
        return (self._inputs if direction == INPUT else self._outputs).get((operator_id, gate), UNBOUNDED)

    def first_outside(self, operator_id: str, direction: str, gates: np.ndarray, channels: np.ndarray) -> Optional[int]:
        """The position of the first (gate, channel) pair no such channel, or None."""
        if not len(gates):
            return None
        distinct, each = np.unique(gates, return_inverse=True)
        limit = np.array([self.of(operator_id, direction, int(g)) for g in distinct], dtype=np.int64)[each]
        outside = (channels < 0) | (channels >= limit)
        return int(np.argmax(outside)) if outside.any() else None

    def problem(self, operator_id: str, direction: str, gate: int, channel: int) -> Optional[str]:
        """Why the channel does not exist, in words, or None where it may."""
        bound = self.of(operator_id, direction, gate)
        if 0 <= channel < bound:
            return None
        if min(gate, channel) < 0:
            return "no such channel: a negative index"
        side = "channel" if direction == INPUT else "subpartition"
        where = "gate" if direction == INPUT else "partition"
        return f"no such channel: its {where} has {bound} {side}s, one per subtask of the operator at its other end at most"
