"""In-flight data a rewrite keeps as it was, proven before anything is written.

An exchange whose two sides keep their parallelism keeps its channels' handles: ckpt neither reads
nor routes their records, and the new ``_metadata`` names the same buffers in the same files. Flink's
restore reads them as they are (``SequentialChannelStateReaderImpl``): it takes the input gate, or
the result partition, at the handle's first index and the channel, or subpartition, at its second
(an index outside them: ``ArrayIndexOutOfBoundsException``), then reads each buffer at its offset (a
buffer past the end of its file: ``EOFException``). A rewrite that exits 0 must not carry such a
handle, so each carried channel is checked as that restore reads it: its indices inside the job
(``ChannelBounds``), and every buffer's length field and payload inside its data (on an object
store, where that would download every carried byte, each buffer's length field inside the size
the metadata records).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from ckpt_tool.channel_bounds import ChannelBounds
from ckpt_tool.errors import CheckpointFormatError, CkptError
from ckpt_tool.flink.channel_state import HEADER, BufferSource, ChannelStateReader
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import INPUT, OUTPUT, ChannelColumns, ChannelStateHandle, MergedChannelStateHandle, opened_up
from ckpt_tool.planning import RescalePlan, gates_in
from ckpt_tool.storage import is_local

LENGTH_BYTES = 4  # a buffer's length field, an int
NO_DIGEST = 1 << 62  # a buffer length no buffer reaches: the lengths are read, nothing is digested


def carried_problems(checkpoint: Checkpoint, plan: RescalePlan) -> Iterator[str]:
    """What Flink's restore would fail on in the channels ``plan`` carries unchanged, in words,
    each naming its operator, subtask and channel."""
    replaced_inputs, replaced_outputs = plan.replaced_gates()
    bounds = ChannelBounds(plan.old, plan.exchanges, plan.job_plan)
    by_data: dict[tuple, list[tuple[tuple, BufferSource]]] = defaultdict(list)  # (where, source) by data
    for op in checkpoint.metadata.operators:
        for s in op.subtasks:
            for direction, replaced_here in ((INPUT, replaced_inputs), (OUTPUT, replaced_outputs)):
                kept = s.channel_handles_on(direction, gates_in(replaced_here, op.id_hex, False))
                for handle in opened_up(kept, (MergedChannelStateHandle, ChannelColumns)):
                    assert isinstance(handle, ChannelStateHandle)
                    where = (op.label, s.index, direction, *handle.info)  # put in words where it is wrong
                    missing = bounds.problem(op.id_hex, direction, *handle.info)
                    if missing:
                        yield f"{_words(where)}: {missing}"
                        continue
                    source = BufferSource.of(checkpoint, handle)
                    if source.inline is None and (source.location is None or not is_local(source.location)):
                        outside = _past_the_end(handle)  # an object store: the offsets only, nothing downloaded
                        if outside:
                            yield f"{_words(where)}: {source.where}: {outside}"
                        continue
                    key = (source.location, source.segment) if source.inline is None else (id(handle.delegate),)
                    by_data[key].append((where, source))
    with ChannelStateReader() as reader:
        for members in by_data.values():
            if reader.buffer_digests_together([source for _, source in members], NO_DIGEST) is not None:
                continue  # one local file (or segment), every buffer inside it
            for where, source in members:
                try:
                    reader.buffer_digests(source, NO_DIGEST)
                except CkptError as exc:
                    yield f"{_words(where)}: {exc}"


def refuse_unsound_carried(checkpoint: Checkpoint, plan: RescalePlan) -> None:
    """Raise on the first carried channel Flink's restore would fail on."""
    for problem in carried_problems(checkpoint, plan):
        raise CheckpointFormatError(f"in-flight data kept as it was: {problem}; Flink's restore would fail on it: refused")


def _past_the_end(handle: ChannelStateHandle) -> str:
    """Which buffer's length field does not lie inside the data's recorded size, in words, or ""."""
    size = handle.delegate.size if handle.delegate is not None else 0
    for offset in handle.offsets:
        if offset < len(HEADER) or offset + LENGTH_BYTES > size:
            return f"buffer offset {offset} is outside the file ({size} bytes)"
    return ""


def _words(where: tuple) -> str:
    label, subtask, direction, gate, channel = where
    return f"operator {label} subtask {subtask}, {direction} {gate}/{channel}"
