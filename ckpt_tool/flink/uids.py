"""Which state Flink's restore maps to an operator: the state under the id Flink gives it. Flink
2.x writes each operator's state under its generated id (``PendingCheckpoint``), which for an
operator with a uid is the uid's hash (``StreamGraphHasherV2``, ``operator_id_of_uid``), and
stores the uid beside it; a restore maps state by id only (``Checkpoints.loadAndValidateCheckpoint``)."""

from __future__ import annotations

from collections.abc import Iterator

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.model import CheckpointMetadata, OperatorState
from ckpt_tool.flink.operator_id import operator_id_of_uid


def uid_problems(metadata: CheckpointMetadata) -> Iterator[tuple[str, str]]:
    """(operator label, message) for each operator whose state is not under the id its uid hashes
    to. Flink (2.x, whose metadata stores uids) writes each operator's state under its generated
    id, which for an operator with a uid is the uid's hash (``StreamGraphHasherV2``), and a restore
    maps state by id only: state under another id is not the operator's. An operator without
    state is not named: Flink skips the empty state of an id no operator has
    (``Checkpoints.loadAndValidateCheckpoint``, "Skipping empty savepoint state")."""
    for op in metadata.operators:
        if op.uid and _holds_state(op) and (expected := operator_id_of_uid(op.uid)) != op.id_hex:
            yield (
                op.label,
                f"its state is under operator id {op.id_hex}, but Flink gives the operator with uid "
                f"{op.uid!r} the id {expected} (the uid's hash) and maps state by id (Flink: Cannot map "
                f"checkpoint/savepoint state for operator {op.id_hex} to the new program)",
            )


def _holds_state(op: OperatorState) -> bool:
    """Whether Flink would find state to restore: coordinator state, or a subtask with any handle
    (``OperatorSubtaskState.hasState``)."""
    return op.coordinator_state is not None or any(
        s.managed_operator is not None
        or s.raw_operator is not None
        or s.managed_keyed is not None
        or s.raw_keyed is not None
        or len(s.input_channels) > 0
        or len(s.output_channels) > 0
        for s in op.subtasks
    )


def refuse_mismatched_uids(metadata: CheckpointMetadata) -> None:
    """Raise, naming the operator, where its state is not under the id its uid hashes to."""
    for label, message in uid_problems(metadata):
        raise CheckpointFormatError(f"operator {label}: {message}; Flink would not restore it: refused")
