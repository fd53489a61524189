"""Whether each managed operator state a handle names has its meta info and its partitions, as
Flink's restore finds them.

A managed operator-state handle (``OperatorStreamStateHandle``) maps each state's name to the
offsets of its partitions in the handle's data. The data starts with the backend's
``OperatorBackendSerializationProxy``: the meta info of every state the backend held (its name,
written by ``writeUTF``, then its mode and serializers), before the partitions. Flink's restore
(``OperatorStateRestoreOperation``) registers a state for each meta info. Up to Flink 1.18 it then
looks up each name of the handle's map among them, and fails on one it does not find ("Found state
without corresponding meta info: <name>"). From 1.19 it reads, for each meta info, the partitions
the map gives its name: a name the map holds without meta info is never read, and the state of the
meta info it stood for restores empty, without an error (Flink 2.3 restored a source's renamed
reader state so, and the job counted 1,396 records, not its 60,010).

Each partition's offset lies inside the data, past its start (the proxy): Flink's restore
deserializes an element there. And each name of a handle's map is in the data before its first
partition, as ``writeUTF`` writes it (a two-byte length, then the name in modified UTF-8). Its
serializers are not decoded: a name found there is taken as its meta info (a necessary condition,
not a proof). Flink's backend writes
the meta info of every state it holds into every handle, and Flink's own rescale keeps each handle's
data whole, so a real handle always passes. Raw operator state is the operator's own bytes, with
no meta info: it is not checked.

``ckpt verify`` reports what this finds (``operator-state``); ``rescale`` and ``repair``
refuse it before writing.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Optional

from ckpt_tool.errors import CheckpointFormatError, CkptError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.javaio import encode_modified_utf8
from ckpt_tool.flink.key_groups import read_state
from ckpt_tool.flink.model import ByteStreamHandle, OperatorStateHandle

# the meta info read at most (the proxy before the first partition); past it a handle is not checked
MAX_META_INFO = 1 << 20


def operator_state_problems(checkpoint: Checkpoint, read_files: bool = True) -> Iterator[tuple[str, int, str]]:
    """(operator label, subtask index, message) for each managed operator-state handle that names a
    state whose meta info its data does not hold, or a partition outside its data: the first such.
    Inline state is always read, files only where ``read_files`` (a file that does not read is left
    to the check of the files)."""
    for op in checkpoint.metadata.operators:
        for subtask in op.subtasks:
            handle = subtask.managed_operator
            if not isinstance(handle, OperatorStateHandle) or not handle.states:
                continue
            try:
                message = _problem(checkpoint, handle, read_files)
            except CkptError:
                continue
            if message:
                yield op.label, subtask.index, message


def refuse_unsound_operator_state(checkpoint: Checkpoint) -> None:
    """Raise, naming the operator and subtask, where Flink's restore would not find a state's meta
    info or a partition."""
    for label, index, message in operator_state_problems(checkpoint):
        raise CheckpointFormatError(f"operator {label} subtask {index}: {message}; Flink would not restore it: refused")


def _problem(checkpoint: Checkpoint, handle: OperatorStateHandle, read_files: bool) -> Optional[str]:
    delegate = handle.delegate
    if delegate is None:  # an empty handle
        return None
    for state in handle.states:
        outside = next((o for o in state.offsets if not 0 < o < delegate.size), None)
        if outside is not None:  # 0 is the proxy's start; an element takes at least a byte
            said = " (Flink: position out of bounds)" if isinstance(delegate, ByteStreamHandle) else ""
            return (
                f'managed operator state "{state.name}" has a partition at byte {outside}, outside its'
                f" handle's {delegate.size} bytes of data{said}"
            )
    offsets = [o for state in handle.states for o in state.offsets]
    head = min([delegate.size, *offsets])  # the proxy, before the first partition
    if head <= 0 or head > MAX_META_INFO:
        return None
    if not read_files and not isinstance(delegate, ByteStreamHandle):
        return None
    data = read_state(checkpoint, delegate, [0], lambda at: at(0, head))
    if data is None or len(data) < head:
        return None
    for state in handle.states:
        encoded = encode_modified_utf8(state.name)
        if len(encoded) > 0xFFFF or struct.pack(">H", len(encoded)) + encoded not in data:
            return (
                f'managed operator state "{state.name}" has no meta info in its handle\'s data (Flink up to 1.18:'
                f' "Found state without corresponding meta info: {state.name}"; from 1.19 Flink restores the'
                " state of that meta info empty)"
            )
    return None
