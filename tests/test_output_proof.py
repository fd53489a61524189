"""The proof a rewrite gives before it writes ``_metadata`` (ckpt_tool.rewrite.verify_output), with
faults put into a real rewrite's output.

A real Flink 2.3 checkpoint (flink23-hashmap-p2) is rescaled 2 -> 5 up to its proof (``stage``:
state reassigned, in-flight records routed into files, their handles placed in the new metadata);
then one thing is broken, in the new metadata's handles, in a written file or in what the routing
reported, and the proof must refuse it, naming the exchange, the subtask and the channel. Its few
records fit one engine task, so they lie in one file: where a fault needs two files, a checkpoint
generated from it with 3 MB in flight (three engine tasks, three files) is rescaled 6 -> 4.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash

from catalog import fixture_named
from ckpt_tool.engine.tasks import (
    READ_BACK_BUFFERS,
    ROUTED_DIGEST,
    ReadBackTask,
    _read_back_one_by_one,
    _read_back_together,
    short_digests,
)
from ckpt_tool.flink.channel_state import write_channel_state_file
from ckpt_tool.flink.metadata import merge_channel_handles, merged_columns, merging_gains, write_metadata
from ckpt_tool.flink.model import INPUT, ChannelColumns, RelativeFileHandle, columns_opened
from ckpt_tool.planning import plan_rescale
from ckpt_tool.rewrite import OutputVerificationError, RescaleReport, Staged, stage, verify_output
from ckpt_tool.session import Session
from ckpt_tool.storage import io_for
from ckpt_tool.writer.claim import claimed

BASE = fixture_named("flink23-hashmap-p2")


def staged_rescale(checkpoint: str, parallelism: int, destination: str):
    """(session, staged rewrite, destination) of a rescale, under the destination's claim."""
    with Session.open(checkpoint, BASE.schema, BASE.plan, "local") as session:
        plan = plan_rescale(session.metadata, parallelism, {}, session.described_exchanges, session.plan, None)
        with claimed(destination) as claim:
            result = stage(session, destination, plan, claim, RescaleReport(False))
            assert result is not None and result.routed
            yield session, result, destination


@pytest.fixture
def staged(tmp_path: Path):
    """A 2 -> 5 rescale of the real checkpoint, staged."""
    yield from staged_rescale(str(BASE.checkpoint), 5, str(tmp_path / "out"))


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from generate import generate

    checkpoint = tmp_path_factory.mktemp("generated") / "job" / "chk-1"
    generate(checkpoint, 6, 2_000_000)
    return checkpoint


@pytest.fixture
def staged_in_files(generated: Path, tmp_path: Path):
    """A 6 -> 4 rescale of 2 MB in flight, staged: its records lie in several files."""
    for staged_rewrite in staged_rescale(str(generated), 4, str(tmp_path / "out")):
        assert len({r.file_name for r in staged_rewrite[1].routed}) >= 2
        yield staged_rewrite


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


def test_a_fault_in_the_columns_is_refused(staged_in_files):
    staged = staged_in_files
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


def test_a_channel_routed_twice_is_refused(staged):
    """Routing that reports one new channel of a subtask twice (each handle is then held once, and
    no set test finds a channel without its handle) is named, not left to a shape error."""
    routed = staged[1].routed
    routed.append(routed[0])
    first = routed[0]
    where = f"new channel {first.new_channel} of subtask {int(first.placed.subtask[0])} was routed twice"
    with pytest.raises(OutputVerificationError, match=where):
        prove(staged)


def test_the_staged_source_forgot_its_metadata_and_reads_it_again(staged):
    """Staging drops the source's parsed metadata once its channel handles are in the route table
    (``forget_metadata``); asked for again, it is parsed again from the same bytes."""
    session = staged[0]
    assert session.checkpoint._metadata is None
    again = session.checkpoint.metadata
    assert write_metadata(again) == (BASE.checkpoint / "_metadata").read_bytes()
    assert session.checkpoint.metadata is again


def test_a_whole_rescale_does_not_read_the_forgotten_metadata_again(tmp_path: Path):
    """From routing to `_metadata`, nothing asks for the source's parsed metadata again: a rescale
    at high parallelism holds it (hundreds of MB) only until its channel handles are in the table."""
    from ckpt_tool.ops.rescale import rescale

    with Session.open(str(BASE.checkpoint), BASE.schema, BASE.plan, "local") as session:
        report = rescale(session, str(tmp_path / "out"), 5)
        assert session.checkpoint._metadata is None
    assert report.records_out == report.records_in > 0
    assert (tmp_path / "out" / "_metadata").exists()


def test_a_forgotten_metadata_that_changed_is_refused(tmp_path: Path):
    """Read again, ``_metadata`` must be the bytes first read: a checkpoint changed under a run is
    refused, not mixed."""
    import shutil

    from ckpt_tool.errors import CheckpointFormatError
    from ckpt_tool.flink.checkpoint import Checkpoint

    copy = tmp_path / "chk"
    shutil.copytree(BASE.checkpoint, copy)
    checkpoint = Checkpoint.open(str(copy))
    checkpoint.forget_metadata()
    assert checkpoint.metadata.checkpoint_id > 0  # the same bytes: read again
    checkpoint.forget_metadata()
    (copy / "_metadata").write_bytes((copy / "_metadata").read_bytes() + b"\0")
    with pytest.raises(CheckpointFormatError, match="_metadata changed while ckpt was reading the checkpoint"):
        assert checkpoint.metadata is None  # raises before


def test_a_handle_into_another_channels_file_is_refused(staged_in_files):
    staged = staged_in_files
    by_subtask: dict = {}
    for subtask, handle in new_handles(staged[1]):
        by_subtask.setdefault(subtask.index, []).append(handle)
    first, second = next(
        (h, other)
        for handles in by_subtask.values()
        for h in handles
        for other in handles
        if h.delegate.relative_path != other.delegate.relative_path
    )
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


def test_the_driver_keeps_the_first_bytes_of_each_routed_digest(staged):
    """Each routed channel's digest comes back to the driver as the first ROUTED_DIGEST bytes of
    the xxh3-128 digest of its records' bytes (the proof compares those of what it reads back)."""
    _, result, _ = staged
    routed = [r for r in result.routed if len(r.placed)]
    assert routed and all(len(r.placed.digests) == ROUTED_DIGEST * len(r.placed) for r in routed)
    full = bytes(range(32))  # two 16-byte digests
    assert short_digests(full) == bytes(range(ROUTED_DIGEST)) + bytes(range(16, 16 + ROUTED_DIGEST))


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


@pytest.mark.parametrize("cut", [0, 5])
def test_a_handle_of_many_buffers_is_read_back_a_part_at_a_time_as_whole(tmp_path: Path, cut: int):
    """A handle of more than READ_BACK_BUFFERS buffers (a rescale to parallelism 1 writes one new
    channel of all the records) is read back that many buffers at a time, a record cut between
    two of them carried into the next: the same records, digest and cut record as the handle read
    whole, and as its stream says."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from generate import record

    whole = b"".join(struct.pack(">i", len(raw)) + raw for raw in (record(key % 97, key) for key in range(3000)))
    streams = {0: whole[:1000], 1: whole + bytes(range(cut)), 2: whole[:77]}  # a cut record at the end of 1
    writer = write_channel_state_file(io_for(str(tmp_path)), str(tmp_path / "file"), list(streams.items()), buffer_size=97)
    placed = [writer.placements[target] for target in streams]
    assert len(placed[1].offsets) > 3 * READ_BACK_BUFFERS
    task = ReadBackTask(
        "file",
        str(tmp_path / "file"),
        writer.size,
        np.array([o for p in placed for o in p.offsets], dtype=np.int64),
        np.array([len(p.offsets) for p in placed], dtype=np.int64),
    )
    together, one_by_one = _read_back_together(task), _read_back_one_by_one(task)
    assert one_by_one.problem is None and together.problem is None
    assert (
        one_by_one.records.tolist()
        == together.records.tolist()
        == [sum(1 for _ in framed_records(stream)) for stream in streams.values()]
    )
    assert one_by_one.trailing.tolist() == together.trailing.tolist() == [len(s) - framed_end(s) for s in streams.values()]
    assert one_by_one.trailing.tolist()[1] == cut
    assert (
        one_by_one.digests
        == together.digests
        == b"".join(xxhash.xxh3_128(stream[: framed_end(stream)]).digest() for stream in streams.values())
    )


def framed_end(stream: bytes) -> int:
    """Where the last whole element of a stream of length-prefixed elements ends."""
    at = 0
    while at + 4 <= len(stream) and at + 4 + struct.unpack_from(">i", stream, at)[0] <= len(stream):
        at += 4 + struct.unpack_from(">i", stream, at)[0]
    return at


def framed_records(stream: bytes):
    at = 0
    while at + 4 <= len(stream) and at + 4 + struct.unpack_from(">i", stream, at)[0] <= len(stream):
        yield stream[at + 4 : at + 4 + struct.unpack_from(">i", stream, at)[0]]
        at += 4 + struct.unpack_from(">i", stream, at)[0]


def fields(handles) -> list:
    """What a merged handle is made of, to compare two ways of making them."""
    return [
        (m.subtask_index, m.state_size, m.delegate, m.serialized_offsets, m.channel_count, m.buffer_count, m.gates)
        for m in handles
    ]


def test_columns_merge_as_their_handles_do(staged_in_files):
    """A subtask's new channels lie in a file per engine task: written merged, each file's channels
    are one merged handle, made from the columns with NumPy exactly as from the handles as objects."""
    result = staged_in_files[1]
    files = len({r.file_name for r in result.routed})
    subtasks = [s for op in result.metadata.operators for s in op.subtasks]
    columns = [h for s in subtasks for h in s.input_channels if isinstance(h, ChannelColumns)]
    assert columns and all(len(merged_columns(c)) == files for c in columns)
    for c in columns:
        assert fields(merged_columns(c)) == fields(merge_channel_handles(c.channels))
    assert merging_gains(result.metadata)


@pytest.mark.parametrize("layout", ["alike, one file", "alike, files interleaved", "uneven", "two gates"])
def test_columns_of_every_layout_merge_as_their_handles_do(layout):
    """Channels alike (one buffer each, at high parallelism) are serialized as one table, others
    count by count; files interleaved, or channels on two gates, merge as their handles do."""
    from ckpt_tool.flink.model import INPUT, HandleFiles, RelativeFileHandle, gates_holding

    rng = np.random.default_rng(7)
    n = 300
    counts = rng.integers(0, 4, n) if layout == "uneven" else np.ones(n, dtype=np.int64)
    bounds = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    gate = rng.integers(0, 2, n).astype(np.int32) if layout == "two gates" else np.zeros(n, dtype=np.int32)
    file = np.zeros(n, dtype=np.int32) if layout == "alike, one file" else rng.integers(0, 5, n).astype(np.int32)
    files = HandleFiles([RelativeFileHandle(f"part-{i}", 10_000) for i in range(5)])
    columns = ChannelColumns(
        INPUT, 3, gate, np.arange(n, dtype=np.int32), rng.integers(4, 900, n).astype(np.int64), bounds,
        rng.integers(5, 10_000, int(bounds[-1])).astype(np.int64), file, files,
    )  # fmt: skip
    merged = merged_columns(columns)
    assert len(merged) == len(np.unique(file))
    assert gates_holding([columns]) == gates_holding(columns.channels) == gates_holding(merged)
    assert fields(merged) == fields(merge_channel_handles(columns.channels))
