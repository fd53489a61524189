"""File merging (FLIP-306, execution.checkpointing.file-merging.enabled): checkpoints Flink 2.3 and
1.20 wrote with the hashmap and RocksDB backends, whose keyed, operator and channel state are
segments of shared physical files. ckpt reads them as Flink reads them, rescales (2 -> 3) and repairs
them, and real Flink of the same version and backend, with file merging on, restores the output,
moved to another directory, with the exact count."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest

import flink_env
from catalog import FILE_MERGING, tree_digest
from ckpt_tool.assign.operator_state import split_elements
from ckpt_tool.engine import LocalEngine
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.metadata import OPERATOR_STATE, SEGMENT_OPERATOR_STATE, iter_stream_handles
from ckpt_tool.flink.model import (
    ByteStreamHandle,
    EmptySegmentFileHandle,
    IncrementalKeyedHandle,
    KeyGroupsHandle,
    OperatorStateHandle,
    RelativeFileHandle,
    SegmentFileHandle,
)
from ckpt_tool.ops.repair import repair
from ckpt_tool.ops.rescale import rescale
from ckpt_tool.session import Session

FILE_MERGING_ON = {"execution.checkpointing.file-merging.enabled": "true"}
OPERATOR_KEYS = ("id", "parallelism", "max_parallelism", "finished", "channel_state")
# Flink's names of ckpt's handle classes
KEYED_CLASSES = {KeyGroupsHandle: "KeyGroupsStateHandle", IncrementalKeyedHandle: "IncrementalRemoteKeyedStateHandle"}
FLINK_NAMES = {
    ByteStreamHandle: "ByteStreamStateHandle",
    SegmentFileHandle: "SegmentFileStateHandle",
    EmptySegmentFileHandle: "EmptySegmentFileStateHandle",
}


def keyed_files(handle) -> list:
    """A keyed handle's stream handles, as Flink's ``streamSubHandles`` lists them."""
    if isinstance(handle, KeyGroupsHandle):
        return [handle.delegate]
    return [handle.meta, *(item.handle for item in handle.shared + handle.private)]


def operator_handles(metadata) -> list[OperatorStateHandle]:
    return [s.managed_operator for op in metadata.operators for s in op.subtasks if s.managed_operator]


def operator_elements(checkpoint: Checkpoint) -> Counter:
    """Every operator-state element (state name, bytes) of a checkpoint, as a multiset."""
    elements: Counter = Counter()
    for handle in operator_handles(checkpoint.metadata):
        _, by_name = split_elements(checkpoint.handle_bytes(handle.delegate), handle)
        elements.update((name, item) for name, items in by_name.items() for item in items)
    return elements


def test_every_backend_on_both_ci_versions():
    assert {(f.info["flink_version"], f.info["backend"]) for f in FILE_MERGING} == {
        (v, b) for v in ("2.3.0", "1.20.3") for b in ("hashmap", "rocksdb")
    }


def test_state_is_in_segments_as_flink_reads_it(file_merging):
    fixture = file_merging
    """Keyed, operator and channel state are segments; the handle classes are those Flink's
    reader names (expected.json, from Flink's own classes)."""
    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    # Flink wrote absolute paths under /tmp; each is read from the fixture's own copy
    assert all(uri.startswith(str(fixture.directory) + "/") for uri in checkpoint.referenced_files())
    metadata = checkpoint.metadata
    flink = fixture.expected["state_handles"]
    keyed = [s.managed_keyed for op in metadata.operators for s in op.subtasks if s.managed_keyed]
    assert dict(Counter(KEYED_CLASSES[type(h)] for h in keyed)) == flink["managed_keyed"]
    operator = operator_handles(metadata)
    assert {h.tag for h in operator} == {SEGMENT_OPERATOR_STATE}
    assert Counter(h.is_empty for h in operator) == Counter(
        {
            True: flink["managed_operator"]["EmptyFileMergingOperatorStreamStateHandle"],
            False: flink["managed_operator"]["FileMergingOperatorStreamStateHandle"],
        }
    )
    files = Counter(f"keyed {FLINK_NAMES[type(f)]}" for h in keyed for f in keyed_files(h))
    files.update(f"operator {FLINK_NAMES[type(h.delegate)]}" for h in operator)
    assert dict(files) == flink["files"]
    assert all(isinstance(h.delegate, EmptySegmentFileHandle) == h.is_empty for h in operator)
    channels = [h.delegate for op in metadata.operators for s in op.subtasks for h in s.input_channels + s.output_channels]
    assert channels and all(isinstance(d, SegmentFileHandle) for d in channels)


def test_inspect_and_verify_match_flink(file_merging, ckpt):
    fixture = file_merging
    code, out, err = ckpt("inspect", "--json", str(fixture.checkpoint))
    assert code == 0, err
    got = json.loads(out)
    want = {o["id"]: {k: o[k] for k in OPERATOR_KEYS} for o in fixture.expected["operators"]}
    assert {o["id"]: {k: o[k] for k in OPERATOR_KEYS} for o in got["operators"]} == want
    assert got["checkpoint_id"] == fixture.expected["checkpoint_id"]
    args = ("verify", str(fixture.checkpoint), "--plan", fixture.plan, "--schema", fixture.schema, "--target-parallelism", "3")
    code, out, err = ckpt(*args, "--json")
    assert code == 0, err
    assert json.loads(out)["status"] == "sound"


def rewritten_and_moved(fixture, operation: str, tmp_path, record_multiset):
    """Rescale (2 -> 3) or repair the fixture with ckpt, check what the output holds, move it to
    another directory and return where it is now."""
    before_tree = tree_digest(fixture.directory)
    before = record_multiset(Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan, LocalEngine()))
    written = tmp_path / "written" / "job" / fixture.checkpoint.name
    with Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan, "local") as source:
        report = rescale(source, str(written), 3) if operation == "rescale" else repair(source, str(written), [])
    report = report.as_dict()
    assert report["records_in"] == report["records_out"] == sum(before.values()) > 0
    moved = tmp_path / "moved" / "elsewhere" / fixture.checkpoint.name
    moved.parent.mkdir(parents=True)
    shutil.move(written, moved)
    output = Session.open(str(moved), fixture.schema, fixture.plan, LocalEngine())
    assert record_multiset(output) == before
    # every segment became a file of ckpt's own, referenced relative to the output (so it could be
    # moved), and no operator handle names the source's file-merging directories any more
    assert not any(isinstance(h, SegmentFileHandle) for h in iter_stream_handles(output.metadata))
    assert all(
        h.relative_path.startswith("ckpt-") for h in iter_stream_handles(output.metadata) if isinstance(h, RelativeFileHandle)
    )
    assert {h.tag for h in operator_handles(output.metadata)} == {OPERATOR_STATE}
    assert operator_elements(output.checkpoint) == operator_elements(Checkpoint.open(str(fixture.checkpoint)))
    assert tree_digest(fixture.directory) == before_tree, "the input was modified"
    return moved


@pytest.mark.flink
@pytest.mark.parametrize("operation", ["rescale", "repair"])
def test_output_restores_with_exact_count(file_merging, operation, tmp_path, record_multiset):
    fixture = file_merging
    info = fixture.info
    moved = rewritten_and_moved(fixture, operation, tmp_path, record_multiset)
    parallelism = 3 if operation == "rescale" else info["parallelism"]
    count = flink_env.restore_count(info["flink_version"], moved, parallelism, FILE_MERGING_ON, backend=info["backend"])
    assert count == info["source_records"]


@pytest.mark.parametrize("command", ["inspect", "verify", "rescale", "repair"])
def test_truncated_physical_file_is_refused(ckpt, tmp_path, command):
    """A physical file shorter than a segment in it: exit 2 and one line (verify: the report says
    unusable), nothing written."""
    fixture = next(f for f in FILE_MERGING if f.info["flink_version"] == "2.3.0" and f.info["backend"] == "hashmap")
    job = tmp_path / "job"
    shutil.copytree(fixture.checkpoint.parent, job)
    checkpoint = job / fixture.checkpoint.name
    segments = [h for h in iter_stream_handles(Checkpoint.open(str(checkpoint)).metadata) if isinstance(h, SegmentFileHandle)]
    last = max(segments, key=lambda h: h.start + h.size)
    with open(Checkpoint.open(str(checkpoint)).file_location(last), "r+b") as physical:
        physical.truncate(last.start + last.size - 1)
    destination = tmp_path / "out"
    inputs = ["--engine", "local", "--schema", fixture.schema, "--plan", fixture.plan]
    args = {
        "inspect": ["inspect", checkpoint],
        "verify": ["verify", checkpoint, "--engine", "local"],
        "rescale": ["rescale", checkpoint, destination, "-p", "3", *inputs],
        "repair": ["repair", checkpoint, destination, *inputs],
    }[command]
    code, out, err = ckpt(*args)
    assert code == 2, (out, err)
    assert "Traceback" not in err + out
    if command == "verify" and out:
        assert "unusable" in out and "ends at" in out
    else:
        assert len(err.strip().splitlines()) == 1 and err.startswith("ckpt: error: ")
    assert not destination.exists()
