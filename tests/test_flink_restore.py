"""Checkpoints written by ckpt are restored by real Flink with the exact count."""

from __future__ import annotations

import copy
import json

import pytest

import flink_env
from catalog import tree_digest
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.metadata import channel_handle_form, iter_stream_handles
from ckpt_tool.flink.model import FileHandle, RelativeFileHandle
from ckpt_tool.writer import write_checkpoint
from ckpt_tool.writer.claim import claimed

pytestmark = pytest.mark.flink


def test_relocated_checkpoint_restores_with_exact_count(restorable, tmp_path):
    fixture = restorable
    info = fixture.info
    before = tree_digest(fixture.directory)
    source = Checkpoint.open(str(fixture.checkpoint))
    destination = tmp_path / "restored-job" / fixture.checkpoint.name

    write_checkpoint(source, copy.deepcopy(source.metadata), str(destination), {})

    assert tree_digest(fixture.directory) == before, "the input checkpoint was modified"
    written = Checkpoint.open(str(destination))
    for before_handle, after in zip(iter_stream_handles(source.metadata), iter_stream_handles(written.metadata), strict=True):
        # every file handle now names a copy under a name of ckpt's own, holding the same bytes
        if isinstance(before_handle, (FileHandle, RelativeFileHandle)) and source.location(before_handle).startswith(
            str(fixture.checkpoint.parent)
        ):
            assert isinstance(after, RelativeFileHandle) and after.relative_path.startswith("ckpt-copy-")
            assert written.handle_bytes(after) == source.handle_bytes(before_handle)
    count = flink_env.restore_count(info["flink_version"], destination, info["parallelism"], backend=info["backend"])
    assert count == info["source_records"]


REFERENCE_KEYS = ("checkpoint_id", "metadata_version", "operators", "logical_channels", "changelog")


def test_java_reference_figures_are_current(ci_fixture):
    assert_reference_current(ci_fixture)


def assert_reference_current(fixture, keys: tuple[str, ...] = REFERENCE_KEYS) -> None:
    """Re-run the Java reference reader (Flink's own classes) on the committed fixture: the
    figures in its expected.json, for ``keys``."""
    result = flink_env.run_java(
        fixture.info["flink_version"],
        "ReferenceReader",
        [str(fixture.checkpoint), str(fixture.directory / "operators.json")],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    live = json.loads(result.stdout)
    for key in keys:
        assert live.get(key) == fixture.expected.get(key), key


def rewrite_channel_state(source: Checkpoint, directory):
    """New metadata whose in-flight data lives in channel-state files written by ckpt's writer
    (one file per subtask, one plain handle per channel, the buffers cut anew at 4 KiB), and the
    names of those files, already in ``directory``."""
    import copy

    from ckpt_tool.flink.channel_state import BufferSource, ChannelStateReader, write_channel_state_file
    from ckpt_tool.flink.model import INPUT, OUTPUT, ChannelStateHandle, WrittenFileHandle
    from ckpt_tool.storage import io_for

    metadata = copy.deepcopy(source.metadata)
    written = set()
    with ChannelStateReader() as reader:
        for op in metadata.operators:
            for subtask in op.subtasks:
                handles = [(d, h) for d in (INPUT, OUTPUT) for h in subtask.channel_handles(d)]
                if not handles:
                    continue
                name = f"rewritten-channel-state-{op.id_hex}-{subtask.index}"
                pieces = [(i, reader.payload(BufferSource.of(source, h))) for i, (_, h) in enumerate(handles)]
                writer = write_channel_state_file(io_for(str(directory)), str(directory / name), pieces, 4096)
                delegate = WrittenFileHandle(name, writer.size)
                rewritten = {INPUT: [], OUTPUT: []}
                for i, (direction, old) in enumerate(handles):
                    placed = writer.placements[i]
                    rewritten[direction].append(
                        ChannelStateHandle(direction, subtask.index, old.info, placed.offsets, placed.size, delegate)
                    )
                subtask.input_channels, subtask.output_channels = rewritten[INPUT], rewritten[OUTPUT]
                written.add(name)
    return metadata, frozenset(written)


def test_channel_state_written_by_ckpt_restores_with_exact_count(restorable, tmp_path, record_multiset):
    from ckpt_tool.session import Session

    fixture = restorable
    info = fixture.info
    source = Checkpoint.open(str(fixture.checkpoint))
    destination = tmp_path / "rewritten-job" / fixture.checkpoint.name
    with claimed(str(destination)) as claim:  # the run that writes the channel-state files holds the destination
        metadata, written = rewrite_channel_state(source, destination)
        write_checkpoint(source, metadata, str(destination), {}, already_written=written, claim=claim)
    # one file per subtask: from Flink 2.1 on, one merged handle per subtask and direction holds all its channels
    form = channel_handle_form(source.metadata)
    written_metadata = Checkpoint.open(str(destination)).metadata
    assert channel_handle_form(written_metadata) == form
    if form == "merged":
        subtasks = [s for op in written_metadata.operators for s in op.subtasks]
        assert all(len(s.input_channels) <= 1 and len(s.output_channels) <= 1 for s in subtasks)

    def records(uri):
        return record_multiset(Session.open(str(uri), fixture.schema, fixture.plan))

    assert records(destination) == records(fixture.checkpoint)
    count = flink_env.restore_count(info["flink_version"], destination, info["parallelism"], backend=info["backend"])
    assert count == info["source_records"]
