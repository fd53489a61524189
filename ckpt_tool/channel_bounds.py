"""How many channels each input gate and output partition of an operator has, as Flink's restore
indexes them.

Flink's restore of channel state (``SequentialChannelStateReaderImpl``) takes the input gate, or the
result partition, at a handle's first index and the channel, or subpartition, at its second: an
index outside them fails it (``ArrayIndexOutOfBoundsException``). A gate has one channel per
subtask of the sending operator at most (every one on an all-to-all exchange, fewer on a pointwise
one), a partition one subpartition per subtask of the receiving operator at most. With Flink's
plan (``--plan``) a vertex has one input gate per input edge and at most one result partition per
consuming edge: a gate or partition index past them is wrong too (Flink:
``ArrayIndexOutOfBoundsException``). Where neither the plan nor the exchanges say, only a negative
index is known to be wrong.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Optional

import numpy as np

from ckpt_tool.flink.model import INPUT, OUTPUT
from ckpt_tool.flink.plan import JobPlan
from ckpt_tool.records.schema import Exchange

UNBOUNDED = 1 << 15  # Flink's highest max parallelism: no channel index reaches it


class ChannelBounds:
    """The channels of each (operator, gate) and subpartitions of each (operator, partition)."""

    def __init__(self, parallelism: dict[str, int], exchanges: Sequence[Exchange], job_plan: Optional[JobPlan] = None) -> None:
        self._inputs = {(e.downstream_id, e.gate): parallelism[e.upstream_id] for e in exchanges if e.upstream_id in parallelism}
        self._outputs = {
            (e.upstream_id, e.partition): parallelism[e.downstream_id]
            for e in exchanges
            if e.upstream_id and e.partition_stated and e.downstream_id in parallelism
        }
        # (operator, direction) -> how many input gates (the chain's head) or result partitions (its
        # tail) its vertex has, at most, where Flink's plan tells
        self._gates: dict[tuple[str, str], int] = {}
        if job_plan is not None:
            consumers = Counter(edge.upstream for vertex in job_plan.vertices.values() for edge in vertex.inputs)
            for vertex in job_plan.vertices.values():
                self._gates[(vertex.id, INPUT)] = max([len(vertex.inputs)] + [edge.gate + 1 for edge in vertex.inputs])
                if vertex.tail is not None:
                    self._gates[(vertex.tail, OUTPUT)] = consumers[vertex.id]

    def of(self, operator_id: str, direction: str, gate: int) -> int:
        """How many channels (input) or subpartitions (output) the gate or partition has (0 for a
        negative one; ``UNBOUNDED`` where the exchanges do not say)."""
        if gate < 0 or gate >= self._gates.get((operator_id, direction), UNBOUNDED):
            return 0
        return (self._inputs if direction == INPUT else self._outputs).get((operator_id, gate), UNBOUNDED)

    def first_outside(self, operator_id: str, direction: str, gates: np.ndarray, channels: np.ndarray) -> Optional[int]:
        """The position of the first (gate, channel) pair no such channel, or None."""
        if not len(gates):
            return None
        first = int(gates[0])
        if bool((gates == first).all()):  # one gate, as a merged handle's channels mostly are: no sort
            limit: np.ndarray | int = self.of(operator_id, direction, first)
        else:
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
        gates = self._gates.get((operator_id, direction), UNBOUNDED)
        if gate >= gates:
            what = "input gate" if direction == INPUT else "result partition"
            return f"no such {what}: its vertex has {gates} {what}{'' if gates == 1 else 's'} in Flink's plan"
        side = "channel" if direction == INPUT else "subpartition"
        where = "gate" if direction == INPUT else "partition"
        return f"no such channel: its {where} has {bound} {side}s, one per subtask of the operator at its other end at most"
