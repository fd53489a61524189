"""Channel-state files (in-flight network buffers) and logical channels.

A channel-state file, as ``ChannelStateSerializerImpl`` writes it, is an int version (0) followed
by buffers, each an int length and that many bytes. A channel handle lists the offsets of its
buffers' length fields. Several channels, and with
``execution.checkpointing.unaligned.max-subtasks-per-channel-state-file`` several subtasks, share
one file.

A logical channel upstream subtask u -> downstream subtask d is the input state of d for
(gate, channel u) followed by the output state of u for (partition, subpartition d). Records
run across the boundary: the output side often starts with the tail of a record whose head ends
the input side, so the two are stitched before records are split.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Optional

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import INPUT, OUTPUT, ChannelStateHandle, OperatorState

SERIALIZATION_VERSION = 0
HEADER = struct.pack(">i", SERIALIZATION_VERSION)
_LENGTH = struct.Struct(">i")


def read_buffers(checkpoint: Checkpoint, handle: ChannelStateHandle) -> list[bytes]:
    """The payloads of a channel handle's buffers, in order."""
    where = checkpoint.location(handle.delegate) or "inline channel state"
    return split_buffers(checkpoint.handle_bytes(handle.delegate), handle.offsets, where)


def split_buffers(data: bytes, offsets: list[int], where: str) -> list[bytes]:
    """Cut a channel-state file's bytes into the buffers at ``offsets``."""
    if len(data) < len(HEADER) or data[: len(HEADER)] != HEADER:
        raise CheckpointFormatError(f"{where}: not a channel-state file (bad header)")
    buffers = []
    for offset in offsets:
        if offset < len(HEADER) or offset + 4 > len(data):
            raise CheckpointFormatError(f"{where}: buffer offset {offset} is outside the file ({len(data)} bytes)")
        (length,) = _LENGTH.unpack_from(data, offset)
        end = offset + 4 + length
        if length < 0 or end > len(data):
            raise CheckpointFormatError(
                f"{where}: buffer at offset {offset} of length {length} runs past the end ({len(data)} bytes)"
            )
        buffers.append(data[offset + 4:end])
    return buffers


class ChannelStateFileBuilder:
    """Builds one channel-state file; ``add`` returns the offsets and size for a handle."""

    def __init__(self) -> None:
        self.data = bytearray(HEADER)

    def add(self, buffers: list[bytes]) -> tuple[list[int], int]:
        offsets = []
        size = 0
        for payload in buffers:
            offsets.append(len(self.data))
            self.data += _LENGTH.pack(len(payload))
            self.data += payload
            size += 4 + len(payload)
        return offsets, size

    def getvalue(self) -> bytes:
        return bytes(self.data)


@dataclass
class LogicalChannel:
    """The in-flight data of one logical channel u -> d of an exchange."""

    upstream_subtask: int
    downstream_subtask: int
    input_handles: list[ChannelStateHandle] = field(default_factory=list)
    output_handles: list[ChannelStateHandle] = field(default_factory=list)

    def buffers(self, checkpoint: Checkpoint) -> tuple[list[bytes], list[bytes]]:
        """(input-side buffers, output-side buffers), each in order."""
        side = lambda handles: [b for h in handles for b in read_buffers(checkpoint, h)]  # noqa: E731
        return side(self.input_handles), side(self.output_handles)


def logical_channels(
    upstream: Optional[OperatorState],
    downstream: Optional[OperatorState],
    gate: int = 0,
    partition: int = 0,
) -> list[LogicalChannel]:
    """Pair the input state of ``downstream`` (gate ``gate``) with the output state of
    ``upstream`` (partition ``partition``), one LogicalChannel per (u, d) that holds data.

    For an all-to-all exchange the input channel index is the upstream subtask index and the
    subpartition index is the downstream subtask index.
    """
    channels: dict[tuple[int, int], LogicalChannel] = {}

    def channel(u: int, d: int) -> LogicalChannel:
        return channels.setdefault((u, d), LogicalChannel(u, d))

    for subtask in downstream.subtasks if downstream else ():
        for handle in subtask.channel_handles(INPUT):
            if handle.info[0] == gate:
                channel(handle.info[1], subtask.index).input_handles.append(handle)
    for subtask in upstream.subtasks if upstream else ():
        for handle in subtask.channel_handles(OUTPUT):
            if handle.info[0] == partition:
                channel(subtask.index, handle.info[1]).output_handles.append(handle)
    return [channels[key] for key in sorted(channels)]
