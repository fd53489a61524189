"""Planning a rewrite: the new parallelism of every operator, and which exchanges' in-flight data
is rerouted or dropped. What cannot be carried to the new layout is refused here, before
anything is read or written.

1. New parallelism per operator: ``--parallelism N`` for the operators at the job's parallelism
   (the most common one), ``--operator REF=N`` for any operator (with a plan, for every operator
   chained with it); N at most the max parallelism.
2. Edge by edge: the in-flight data of every exchange whose upstream or downstream parallelism
   changes is rerouted, if its partitioner allows it (HASH by key group, REBALANCE and SHUFFLE
   round robin, GLOBAL to subtask 0); a repair also reroutes every keyed exchange and drops what
   flows into chosen operators. Exchanges whose parallelism does not change keep their channel
   state as it is, and an edge without in-flight data needs nothing, whatever its partitioner.
3. Refused: in-flight data on FORWARD, RESCALE (pointwise), BROADCAST, CUSTOM or undescribed
   exchanges whose parallelism changes; N above max parallelism; finished markers (FLIP-147) that
   Flink would refuse to restore, in the checkpoint or in the one about to be written (Flink's
   ``VertexFinishedStateChecker``, with Flink's words; needs ``--plan``). A partially finished
   operator is rescaled as Flink does it: the finished subtasks' (empty) state is dropped and the
   running subtasks' state is redistributed, so all its new subtasks run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Optional

from ckpt_tool.errors import CkptError
from ckpt_tool.flink.finished import finished_state_problem
from ckpt_tool.flink.model import (
    INPUT,
    OUTPUT,
    CheckpointMetadata,
    gates_holding,
)
from ckpt_tool.flink.plan import JobPlan
from ckpt_tool.records.schema import Exchange

REROUTABLE = ("HASH", "REBALANCE", "SHUFFLE", "GLOBAL")


class RescaleError(CkptError):
    """A rewrite that would not restore correctly, refused with the reason."""


@dataclass
class RescalePlan:
    old: dict[str, int]
    new: dict[str, int]
    exchanges: list[Exchange]
    rescaled: list[int]  # indexes into exchanges whose in-flight data is rerouted
    dropped: list[int] = field(default_factory=list)  # indexes of exchanges whose in-flight data is dropped
    job_plan: Optional[JobPlan] = None  # Flink's plan where given: every gate and partition of each vertex

    def changes(self, op_id: str) -> bool:
        return self.old[op_id] != self.new[op_id]

    def replaced_gates(self) -> tuple[set[tuple[str, int]], set[tuple[Optional[str], int]]]:
        """The (operator, gate) inputs and (operator, partition) outputs of the exchanges whose
        in-flight data is rerouted or dropped: the channels on all others are carried unchanged."""
        replaced = [self.exchanges[i] for i in self.rescaled + self.dropped]
        return {(e.downstream_id, e.gate) for e in replaced}, {(e.upstream_id, e.partition) for e in replaced}

    def new_sender_parallelism(self, exchange: Exchange) -> int:
        """The new parallelism of a rerouted exchange's sender (rerouted exchanges have one)."""
        if exchange.upstream_id is None:
            raise RescaleError(f"exchange into {exchange.downstream_id}: the sending operator is unknown")
        return self.new[exchange.upstream_id]


def plan_rescale(
    metadata: CheckpointMetadata,
    parallelism: Optional[int],
    overrides: dict[str, int],
    exchanges: list[Exchange],
    job_plan: Optional[JobPlan] = None,
    drop: Optional[list[str]] = None,
) -> RescalePlan:
    """``drop``: operators whose incoming in-flight data is dropped (``--drop-in-flight``)."""
    old = {op.id_hex: op.parallelism for op in metadata.operators}
    job_parallelism = Counter(old.values()).most_common(1)[0][0] if old else 1
    new = {op_id: (parallelism if parallelism and p == job_parallelism else p) for op_id, p in old.items()}
    new.update(_overrides(metadata, overrides, job_plan))
    for op in metadata.operators:
        if new[op.id_hex] < 1:
            raise RescaleError(f"operator {op.label}: parallelism must be at least 1")
        if new[op.id_hex] > op.max_parallelism:
            raise RescaleError(
                f"operator {op.label}: parallelism {new[op.id_hex]} is above its max parallelism {op.max_parallelism}"
            )
    plan = RescalePlan(old, new, exchanges, [], job_plan=job_plan)
    _drop(metadata, plan, drop or [])
    _check_finished_markers(metadata, plan, job_plan)
    _check_channel_state(metadata, plan)
    return plan


def _overrides(metadata: CheckpointMetadata, overrides: dict[str, int], job_plan: Optional[JobPlan]) -> dict[str, int]:
    """``--operator REF=N``, applied with a plan to every operator chained with REF (a chain runs
    at one parallelism)."""
    result: dict[str, int] = {}
    named: dict[str, str] = {}
    for ref, value in overrides.items():
        try:
            op_id = metadata.operator(ref).id_hex
        except KeyError:
            raise RescaleError(f"--operator {ref}: no such operator (use its uid, name or id)") from None
        vertex = job_plan.vertex_of(op_id) if job_plan else None
        for member in vertex.members if vertex else [op_id]:
            if member in result and result[member] != value:
                raise RescaleError(
                    f"--operator {ref}={value} and --operator {named[member]}={result[member]} name operators chained "
                    "together, which run at one parallelism"
                )
            result[member], named[member] = value, ref
    return result


def finished_markers_after(metadata: CheckpointMetadata, plan: RescalePlan) -> dict[str, str]:
    """Each operator's FLIP-147 marker in the rewritten checkpoint: a partially finished operator
    whose parallelism changes has only running subtasks afterwards."""
    return {
        op.id_hex: ("none" if op.finished == "partial" and plan.changes(op.id_hex) else op.finished) for op in metadata.operators
    }


def _check_finished_markers(metadata: CheckpointMetadata, plan: RescalePlan, job_plan: Optional[JobPlan]) -> None:
    if job_plan is None:
        return
    before = {op.id_hex: op.finished for op in metadata.operators}
    problem = finished_state_problem(job_plan, before.get)
    if problem:
        raise RescaleError(f"Flink would not restore this checkpoint: {problem}")
    problem = finished_state_problem(job_plan, finished_markers_after(metadata, plan).get)
    if problem:
        raise RescaleError(f"Flink would not restore the rescaled checkpoint: {problem}")


def plan_repair(
    metadata: CheckpointMetadata, exchanges: list[Exchange], drop: list[str], job_plan: Optional[JobPlan] = None
) -> RescalePlan:
    """Same parallelism; keyed exchanges rerouted (replicas kept once, misplaced records moved to
    the subtask owning their key group); exchanges into the ``drop`` operators lose their data."""
    same = {op.id_hex: op.parallelism for op in metadata.operators}
    plan = RescalePlan(same, dict(same), exchanges, [], job_plan=job_plan)
    _drop(metadata, plan, drop)
    _check_channel_state(metadata, plan, reroute_keyed=True)
    return plan


def _drop(metadata: CheckpointMetadata, plan: RescalePlan, drop: list[str]) -> None:
    """Mark the exchanges into the ``drop`` operators as dropped."""
    dropped_ids = set()
    for ref in drop:
        try:
            dropped_ids.add(metadata.operator(ref).id_hex)
        except KeyError:
            raise RescaleError(f"--drop-in-flight {ref}: no such operator (use its uid, name or id)") from None
    plan.dropped = [i for i, e in enumerate(plan.exchanges) if e.downstream_id in dropped_ids]
    covered = {plan.exchanges[i].downstream_id for i in plan.dropped}
    for op in metadata.operators:
        if op.id_hex in dropped_ids and op.id_hex not in covered and any(s.channel_handles(INPUT) for s in op.subtasks):
            raise RescaleError(f"--drop-in-flight {op.label}: no exchange in --plan/--schema leads into it")


REFUSAL_REASONS = {
    "FORWARD": "a forward exchange pairs subtasks one to one",
    "RESCALE": "a rescale exchange pairs subtasks pointwise, by their indexes",
    "BROADCAST": "a broadcast exchange sends every record to every subtask",
    "CUSTOM": "a custom partitioner's choice cannot be repeated offline",
    None: "its partitioner is unknown (pass --plan or name it in --schema)",
}


def _check_channel_state(metadata: CheckpointMetadata, plan: RescalePlan, reroute_keyed: bool = False) -> None:
    """Every in-flight byte must belong to an exchange that can be carried to the new layout."""
    known_inputs = {(e.downstream_id, e.gate): i for i, e in enumerate(plan.exchanges)}
    known_outputs = {(e.upstream_id, e.partition): i for i, e in enumerate(plan.exchanges) if e.upstream_id}
    holding: set[int] = set()
    for op in metadata.operators:
        for direction, known in ((INPUT, known_inputs), (OUTPUT, known_outputs)):
            for s in op.subtasks:
                for gate in gates_holding(s.input_channels if direction == INPUT else s.output_channels):
                    index = known.get((op.id_hex, gate))
                    if index is None:
                        if plan.changes(op.id_hex):
                            side = "input gate" if direction == INPUT else "output partition"
                            raise RescaleError(
                                f"operator {op.label} has in-flight data on {side} {gate} "
                                "that no exchange in --plan/--schema describes"
                            )
                        continue
                    holding.add(index)
    for index, exchange in enumerate(plan.exchanges):
        up = exchange.upstream_id
        changes = plan.changes(exchange.downstream_id) or (up is not None and plan.changes(up))
        if index in plan.dropped or index not in holding or not (changes or (reroute_keyed and exchange.keyed)):
            continue
        label = f"{metadata.exchange_label(up, exchange.downstream_id)} (gate {exchange.gate})"
        if up is None:
            raise RescaleError(f"exchange {label}: the sending operator is unknown; name it in --schema")
        partitioner = exchange.partitioner or ("HASH" if exchange.keyed else None)
        if partitioner == "HASH" and not exchange.keyed:
            raise RescaleError(f"exchange {label} is keyed but --schema gives no record type and key for it")
        if partitioner not in REROUTABLE:
            reason = REFUSAL_REASONS.get(partitioner, f"its partitioner {partitioner} keeps no rescalable order")
            raise RescaleError(f"exchange {label} holds in-flight data and its parallelism changes, but {reason}")
        plan.rescaled.append(index)


def gates_in(replaced: Collection[tuple[Optional[str], int]], operator_id: str, wanted: bool) -> Callable[[int], bool]:
    """Whether a gate (or partition) of the operator is among ``replaced`` (``wanted``) or not."""
    return lambda gate: ((operator_id, gate) in replaced) == wanted
