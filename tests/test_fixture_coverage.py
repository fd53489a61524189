"""The committed fixtures cover what the format core must handle (issue #2, deliverable 5)."""

from __future__ import annotations

from collections import defaultdict

from catalog import ALL_FIXTURES
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import (
    ByteStreamHandle,
    ChangelogBackendHandle,
    IncrementalKeyedHandle,
    KeyGroupsHandle,
    MergedChannelStateHandle,
    SegmentFileHandle,
)


def channel_file_owners(checkpoint: Checkpoint) -> dict[str, set]:
    owners = defaultdict(set)
    for op in checkpoint.metadata.operators:
        for s in op.subtasks:
            for handle in s.input_channels + s.output_channels:
                location = checkpoint.location(handle.delegate)
                if location:
                    owners[location].add(s.index)
    return owners


def test_fixture_matrix_is_covered():
    seen = {(f.info["flink_version"], f.info["backend"]) for f in ALL_FIXTURES}
    assert {("2.3.0", "hashmap"), ("2.3.0", "rocksdb"), ("1.20.3", "hashmap"), ("1.20.3", "rocksdb")} <= seen
    assert any(f.info.get("restored_from") for f in ALL_FIXTURES), "a checkpoint taken during recovery"


def test_channel_state_file_sharing_follows_the_flag(captured):
    fixture = captured
    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    owners = channel_file_owners(checkpoint)
    if fixture.info.get("snapshot"):  # a savepoint or an aligned checkpoint: no channel-state file at all
        assert not owners
    elif fixture.info.get("feature") == "file-merging":  # segments of file merging's files: the flag does not apply
        delegates = [h.delegate for op in checkpoint.metadata.operators for s in op.subtasks for h in s.input_channels]
        assert owners and all(isinstance(d, SegmentFileHandle) for d in delegates)
    elif all(
        isinstance(h.delegate, ByteStreamHandle)
        for op in checkpoint.metadata.operators
        for s in op.subtasks
        for h in s.input_channels + s.output_channels
    ):  # so little in flight that every handle is inline (the sqljoin fixtures): no file to share
        assert not owners and fixture.info.get("job_kind") == "sqljoin"
    elif fixture.info["max_subtasks_per_channel_state_file"] == 1:
        assert all(len(subtasks) == 1 for subtasks in owners.values())
    else:
        assert any(len(subtasks) > 1 for subtasks in owners.values())


def test_backend_handles_and_finished_markers(captured):
    fixture = captured
    md = Checkpoint.open(str(fixture.checkpoint)).metadata
    keyed = [s.managed_keyed for op in md.operators for s in op.subtasks if s.managed_keyed]
    canonical = fixture.info.get("snapshot") == "savepoint-canonical"  # one keyed format for every backend
    # ForSt writes RocksDB's handles; RocksDB's full checkpoint of Flink 1.15 key-groups handles
    incremental = fixture.info["backend"] == "forst" or (fixture.info["backend"] == "rocksdb" and fixture.info["incremental"])
    kind = IncrementalKeyedHandle if incremental and not canonical else KeyGroupsHandle
    if fixture.info.get("feature") == "changelog":  # the backend's handles are the materialized part
        assert all(isinstance(h, ChangelogBackendHandle) for h in keyed)
        keyed = [m for h in keyed for m in h.materialized]
    assert keyed and all(isinstance(h, kind) for h in keyed)
    if fixture.info.get("k"):  # the jobs with a small second source, which finishes at once
        assert any(op.finished == "all" for op in md.operators)
    inputs = [h for op in md.operators for s in op.subtasks for h in s.input_channels]
    assert bool(inputs) != bool(fixture.info.get("snapshot"))  # savepoints and aligned checkpoints have none
    if inputs:
        assert any(isinstance(h, MergedChannelStateHandle) for h in inputs) == (md.version >= 6)
