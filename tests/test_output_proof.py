"""The proof a rewrite gives before it writes ``_metadata`` (ckpt_tool.rewrite.verify_output), with
faults put into a real rewrite's output.

A real Flink 2.3 checkpoint (flink23-hashmap-p2) is rescaled 2 -> 5 up to its proof (``stage``:
state reassigned, in-flight records routed into files, their handles placed in the new metadata);
then one thing is broken, in the new metadata's handles, in a written file or in what the routing
reported, and the proof must refuse it, naming the exchange, the subtask and the channel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from catalog import fixture_named
from ckpt_tool.engine.tasks import ReadBackTask, _read_back_one_by_one, _read_back_together
from ckpt_tool.flink.metadata import write_metadata
from ckpt_tool.flink.model import INPUT, ChannelColumns, RelativeFileHandle, columns_opened
from ckpt_tool.planning import plan_rescale
from ckpt_tool.rewrite import OutputVerificationError, RescaleReport, Staged, stage, verify_output
from ckpt_tool.session import Session
from ckpt_tool.writer.claim import claimed

BASE = fixture_named("flink23-hashmap-p2")


@pytest.fixture
def staged(tmp_path: Path):
    """(session, staged rewrite, destination) of a 2 -> 5 rescale, under the destination's claim."""
    destination = str(tmp_path / "out")
    with Session.open(str(BASE.checkpoint), BASE.schema, BASE.plan, "local") as session:
        plan = plan_rescale(session.metadata, 5, {}, session.described_exchanges, session.plan, None)
        with claimed(destination) as claim:
            result = stage(session, destination, plan, claim, RescaleReport(False))
            assert result is not None and result.routed
            yield session, result, destination


def new_handles(staged: Staged) -> list:
    """(subtask state, handle) of every handle into a routed file, in the new metadata (whose
    ``ChannelColumns`` are opened up into handles, in place, to be changed one by one)."""
    names = {r.file_name for r in staged.routed}
    for op in staged.metadata.operators:
        for s in op.subtasks:
            s.input_channels = list(columns_opened(s.input_channels))
    return [
        (s, h)
        for op in staged.metadata.operators
        for s in op.subtasks
        for h in s.input_channels
        if isinstance(h.delegate, RelativeFileHandle) and h.delegate.relative_path in names
    ]


def prove(staged_rewrite) -> None:
    session, result, destination = staged_rewrite
    verify_output(session, result.metadata, result.rescaled, result.routed, destination)


def test_the_untouched_output_proves_itself(staged):
    session, result, destination = staged
    records = verify_output(session, result.metadata, result.rescaled, result.routed, destination)
    assert records.tolist() == [sum(int(r.placed.records.sum()) for r in result.routed)] and records.sum() > 0
    assert len(new_handles(result)) == sum(len(r.placed) for r in result.routed)


def test_new_handles_are_columns_and_write_as_the_handles_they_hold(staged):
    """The new handles of a subtask are one ``ChannelColumns``: ``_metadata`` holds the same bytes
    as with them opened up into handles, and both prove themselves with the same records."""
    session, result, destination = staged
    columns = [
        h for op in result.metadata.operators for s in op.subtasks for h in s.input_channels if isinstance(h, ChannelColumns)
    ]
    assert columns and sum(c.channel_count for c in columns) == sum(len(r.placed) for r in result.routed)
    as_columns = verify_output(session, result.metadata, result.rescaled, result.routed, destination)
    written = write_metadata(result.metadata)
    opened = new_handles(result)
    assert len(opened) == sum(c.channel_count for c in columns)
    assert write_metadata(result.metadata) == written
    assert verify_output(session, result.metadata, result.rescaled, result.routed, destination).tolist() == as_columns.tolist()


def test_a_fault_in_the_columns_is_refused(staged):
    result = staged[1]
    subtask, columns = next(
        (s, h) for op in result.metadata.operators for s in op.subtasks for h in s.input_channels if isinstance(h, ChannelColumns)
    )
    routed_channel = int(columns.channel[0])
    columns.channel = columns.channel.copy()
    columns.channel[0] = 99  # the routed channel has no handle now: the first check to fail
    with pytest.raises(
        OutputVerificationError, match=rf"subtask {subtask.index} holds no handle for new channel {routed_channel}"
    ):
        prove(staged)
    columns.channel[0] = routed_channel
    columns.file = columns.file.copy()
    columns.file[0] = (columns.file[0] + 1) % len(columns.files.handles)
    with pytest.raises(OutputVerificationError, match=r"references ckpt-inflight-\S+, its records were routed to ckpt-inflight-"):
        prove(staged)


def test_a_missing_handle_is_refused(staged):
    subtask, handle = new_handles(staged[1])[0]
    subtask.input_channels.remove(handle)
    with pytest.raises(
        OutputVerificationError, match=rf"subtask {subtask.index} holds no handle for new channel {handle.info[1]}"
    ):
        prove(staged)


def test_two_handles_for_one_channel_are_refused(staged):
    subtask, handle = new_handles(staged[1])[0]
    subtask.input_channels.append(handle)
    with pytest.raises(
        OutputVerificationError, match=rf"two handles for subtask {subtask.index} channel \({handle.info[0]}, {handle.info[1]}\)"
    ):
        prove(staged)


def test_a_handle_for_a_channel_nothing_was_routed_to_is_refused(staged):
    subtask, handle = new_handles(staged[1])[0]
    stray = type(handle)(INPUT, handle.subtask_index, (handle.info[0], 99), handle.offsets, handle.state_size, handle.delegate)
    subtask.input_channels.append(stray)
    with pytest.raises(OutputVerificationError, match=rf"subtask {subtask.index} references channel 99, which was not routed"):
        prove(staged)


def test_a_handle_into_another_channels_file_is_refused(staged):
    by_subtask: dict = {}
    for subtask, handle in new_handles(staged[1]):
        by_subtask.setdefault(subtask.index, []).append(handle)
    first, second = next(handles for handles in by_subtask.values() if len(handles) >= 2)[:2]
    first.delegate, second.delegate = second.delegate, first.delegate
    with pytest.raises(OutputVerificationError, match=r"references ckpt-inflight-\S+, its records were routed to ckpt-inflight-"):
        prove(staged)


def test_bytes_referenced_twice_are_refused(staged):
    by_file: dict = {}
    for _, handle in new_handles(staged[1]):
        by_file.setdefault(handle.delegate.relative_path, []).append(handle)
    first, second = next(handles for handles in by_file.values() if len(handles) >= 2)[:2]
    second.offsets = list(first.offsets)
    with pytest.raises(
        OutputVerificationError, match=r"ckpt-inflight-\S+: bytes \d+ to \d+ are (referenced twice|not referenced by any handle)"
    ):
        prove(staged)


def test_a_changed_byte_in_a_written_file_is_refused(staged):
    _, result, destination = staged
    # the smallest channel in one buffer: its last byte is its last record's last byte (a string's)
    _, handle = min(
        ((s, h) for s, h in new_handles(result) if len(h.offsets) == 1 and h.state_size > 4),
        key=lambda pair: pair[1].state_size,
    )
    path = Path(destination) / handle.delegate.relative_path
    data = bytearray(path.read_bytes())
    data[handle.offsets[0] + handle.state_size - 1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(
        OutputVerificationError, match=r"reads back (\d+) records \(0 bytes left over\), \1 were routed, bytes differ"
    ):
        prove(staged)


def test_a_count_that_differs_from_what_was_routed_is_refused(staged):
    routed = staged[1].routed[0]
    routed.placed.records = routed.placed.records.copy()
    routed.placed.records[0] += 1
    expected = int(routed.placed.records[0])
    where = f"subtask {int(routed.placed.subtask[0])} channel {routed.new_channel}"
    with pytest.raises(
        OutputVerificationError,
        match=rf"{where} reads back {expected - 1} records \(0 bytes left over\), {expected} were routed; no _metadata",
    ):
        prove(staged)


def test_reading_back_at_once_and_handle_by_handle_agree(staged):
    """Large channels are read back handle by handle (and any file where the one pass fails): both
    ways find the same records, digests and coverage, on a file whole and with a buffer unreferenced."""
    _, result, destination = staged
    by_file: dict = {}
    for _, handle in new_handles(result):
        by_file.setdefault(handle.delegate.relative_path, []).append(handle)
    name, handles = max(by_file.items(), key=lambda item: len(item[1]))
    size = next(r.file_size for r in result.routed if r.file_name == name)
    offsets = np.array([o for h in handles for o in h.offsets], dtype=np.int64)
    counts = np.array([len(h.offsets) for h in handles], dtype=np.int64)
    for task in (
        ReadBackTask(name, str(Path(destination) / name), size, offsets, counts),
        ReadBackTask(name, str(Path(destination) / name), size, offsets[1:], np.concatenate([[counts[0] - 1], counts[1:]])),
    ):
        together, one_by_one = _read_back_together(task), _read_back_one_by_one(task)
        assert together.problem == one_by_one.problem
        assert together.records.tolist() == one_by_one.records.tolist() and together.records.sum() > 0
        assert together.digests == one_by_one.digests and together.trailing.tolist() == one_by_one.trailing.tolist()
    assert together.problem is not None and "not referenced by any handle" in together.problem
