"""Checkpoints written by ckpt are restored by real Flink with the exact count."""

from __future__ import annotations

import hashlib
import json

import pytest

import flink_env
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.metadata import iter_stream_handles
from ckpt_tool.flink.model import FileHandle
from ckpt_tool.writer import relocate

pytestmark = pytest.mark.flink


def tree_digest(directory) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def test_relocated_checkpoint_restores_with_exact_count(restorable, tmp_path):
    fixture = restorable
    info = fixture.info
    before = tree_digest(fixture.directory)
    source = Checkpoint.open(str(fixture.checkpoint))
    destination = tmp_path / "restored-job" / fixture.checkpoint.name

    relocate(source, str(destination))

    assert tree_digest(fixture.directory) == before, "the input checkpoint was modified"
    if not any(isinstance(h, FileHandle) for h in iter_stream_handles(source.metadata)):
        # nothing but relative and inline handles: the metadata is carried over unchanged
        assert (destination / "_metadata").read_bytes() == fixture.metadata_file.read_bytes()
    count = flink_env.restore_count(
        info["flink_version"], destination, info["parallelism"], backend=info["backend"]
    )
    assert count == info["source_records"]


def test_java_reference_figures_are_current(ci_fixture):
    """Re-run the Java reference reader (Flink's own classes) on the committed fixture."""
    fixture = ci_fixture
    result = flink_env.run_java(
        fixture.info["flink_version"],
        "ReferenceReader",
        [str(fixture.checkpoint), str(fixture.directory / "operators.json")],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    live = json.loads(result.stdout)
    for key in ("checkpoint_id", "metadata_version", "operators", "logical_channels"):
        assert live[key] == fixture.expected[key], key


def rewrite_channel_state(source: Checkpoint):
    """New metadata whose in-flight data lives in files written by ckpt: one file per subtask,
    one plain (unmerged) handle per channel, buffers copied one by one."""
    import copy

    from ckpt_tool.flink.channel_state import ChannelStateFileBuilder, read_buffers
    from ckpt_tool.flink.model import INPUT, OUTPUT, ChannelStateHandle, RelativeFileHandle

    metadata = copy.deepcopy(source.metadata)
    files: dict[str, bytes] = {}
    for op in metadata.operators:
        for subtask in op.subtasks:
            channels = {d: subtask.channel_handles(d) for d in (INPUT, OUTPUT)}
            if not any(channels.values()):
                continue
            name = f"ckpt-channel-state-{op.id_hex}-{subtask.index}"
            builder = ChannelStateFileBuilder()
            handle = RelativeFileHandle(name, 0)
            rewritten = {}
            for direction, handles in channels.items():
                rewritten[direction] = []
                for old in handles:
                    offsets, size = builder.add(read_buffers(source, old))
                    rewritten[direction].append(
                        ChannelStateHandle(direction, subtask.index, old.info, offsets, size, handle)
                    )
            subtask.input_channels, subtask.output_channels = rewritten[INPUT], rewritten[OUTPUT]
            files[name] = builder.getvalue()
            handle.size = len(files[name])
    return metadata, files


def test_channel_state_written_by_ckpt_restores_with_exact_count(restorable, tmp_path):
    fixture = restorable
    from ckpt_tool.flink.channel_state import logical_channels
    from ckpt_tool.records.framing import split_records
    from ckpt_tool.writer import write_checkpoint

    info = fixture.info
    source = Checkpoint.open(str(fixture.checkpoint))
    metadata, files = rewrite_channel_state(source)
    destination = tmp_path / "rewritten-job" / fixture.checkpoint.name
    write_checkpoint(source, metadata, str(destination), files)

    rewritten = Checkpoint.open(str(destination))
    for channel in fixture.expected["logical_channels"]:
        if not (channel["input_buffers"] or channel["output_buffers"]):
            continue
        up = rewritten.metadata.operator(channel["upstream"])
        down = rewritten.metadata.operator(channel["downstream"])
        [stitched] = [
            c for c in logical_channels(up, down, channel.get("gate", 0), channel.get("partition", 0))
            if (c.upstream_subtask, c.downstream_subtask) == (channel["upstream_subtask"], channel["downstream_subtask"])
        ]
        inputs, outputs = stitched.buffers(rewritten)
        elements = channel["records"] + channel.get("watermarks", 0) + channel.get("other_elements", 0)
        assert len(split_records(inputs + outputs).records) == elements

    count = flink_env.restore_count(
        info["flink_version"], destination, info["parallelism"], backend=info["backend"]
    )
    assert count == info["source_records"]
