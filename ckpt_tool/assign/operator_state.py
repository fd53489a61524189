"""Operator state for a new parallelism, as ``RoundRobinOperatorStateRepartitioner`` does.

Each state has a distribution mode: SPLIT_DISTRIBUTE (the list elements of all old subtasks are
dealt out, consecutive runs to consecutive new subtasks), UNION (every new subtask gets every
element) or BROADCAST (new subtask i gets old subtask i mod old parallelism's copy).

``_metadata`` holds one operator-state handle per subtask, so a new subtask's elements are
written into one new state file: the old files' common header (the serialization proxy that
describes the states, everything before the first element) followed by the elements.
An element runs from its offset to the next offset in its file, or to the end.

File merging's handles (FLIP-306, tag 17) are read through their segment and the new handles are
plain ones (tag 4), as Flink's repartitioner makes them at a new parallelism; an empty one (no
states, an empty segment) holds nothing and is passed over, as Flink's restore passes it over.
"""

from __future__ import annotations

from typing import Optional

from ckpt_tool.errors import CkptError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import ByteStreamHandle, OperatorStateHandle, OperatorStateInfo, RelativeFileHandle, WrittenFileHandle

SPLIT_DISTRIBUTE, UNION, BROADCAST = 0, 1, 2
INLINE_LIMIT = 20 * 1024  # Flink's default execution.checkpointing.data-inline-threshold


class OperatorStateError(CkptError):
    """Operator state that ckpt cannot reassign."""


def split_elements(data: bytes, handle: OperatorStateHandle) -> tuple[bytes, dict[str, list[bytes]]]:
    """(header, elements per state name) of one operator-state file."""
    outside = [o for s in handle.states for o in s.offsets if not 0 <= o <= len(data)]
    if outside:  # refused before (flink/operator_state.py), with what Flink's restore says of it
        raise OperatorStateError(f"an operator-state partition at byte {outside[0]}, outside its {len(data)} bytes")
    ends = sorted({o for s in handle.states for o in s.offsets} | {len(data)})
    following = {start: end for start, end in zip(ends, ends[1:])}
    header = data[: ends[0]] if len(ends) > 1 else data
    return header, {s.name: [data[o : following[o]] for o in s.offsets] for s in handle.states}


def reassign_operator_state(
    checkpoint: Checkpoint, handles: list[Optional[OperatorStateHandle]], new_parallelism: int, file_prefix: str
) -> tuple[list[Optional[OperatorStateHandle]], dict[str, bytes]]:
    """New handles (one per new subtask, or None) and the new files they reference."""
    old = [h for h in handles if h is not None and not h.is_empty]
    if not old:
        return [None] * new_parallelism, {}
    headers: set[bytes] = set()
    elements: list[dict[str, list[bytes]]] = []
    modes: dict[str, int] = {}
    for handle in old:
        header, by_name = split_elements(checkpoint.handle_bytes(handle.delegate), handle)
        headers.add(header)
        elements.append(by_name)
        for state in handle.states:
            modes.setdefault(state.name, state.mode)
    if len(headers) != 1:
        raise OperatorStateError("old subtasks describe their operator state differently; cannot merge it")
    header = headers.pop()
    per_subtask: list[dict[str, list[bytes]]] = [{name: [] for name in modes} for _ in range(new_parallelism)]
    for name, mode in modes.items():
        if mode == SPLIT_DISTRIBUTE:
            items = [e for by_name in elements for e in by_name.get(name, [])]
            base, extra = divmod(len(items), new_parallelism)
            start = 0
            for index in range(new_parallelism):
                count = base + (1 if index < extra else 0)
                per_subtask[index][name] = items[start : start + count]
                start += count
        elif mode == UNION:
            items = [e for by_name in elements for e in by_name.get(name, [])]
            for target in per_subtask:
                target[name] = list(items)
        elif mode == BROADCAST:
            for index, target in enumerate(per_subtask):
                target[name] = list(elements[index % len(elements)].get(name, []))
        else:
            raise OperatorStateError(f"unknown distribution mode {mode} of operator state {name!r}")
    new_handles: list[Optional[OperatorStateHandle]] = []
    files: dict[str, bytes] = {}
    for index, by_name in enumerate(per_subtask):
        data = bytearray(header)
        states = []
        for name, items in by_name.items():
            offsets = []
            for item in items:
                offsets.append(len(data))
                data += item
            states.append(OperatorStateInfo(name, modes[name], offsets))
        delegate: ByteStreamHandle | RelativeFileHandle
        if len(data) <= INLINE_LIMIT:
            delegate = ByteStreamHandle(f"{file_prefix}-{index}", bytes(data))
        else:
            files[f"{file_prefix}-{index}"] = bytes(data)
            delegate = WrittenFileHandle(f"{file_prefix}-{index}", len(data))
        new_handles.append(OperatorStateHandle(4, states, delegate))
    return new_handles, files
