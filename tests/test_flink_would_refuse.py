"""Checkpoints Flink's restore fails on, which ckpt refuses with Flink's reason (real Flink shows it
here). Found by restoring in Flink what ckpt had rescaled from randomly mutated metadata
(tests/flink_fuzz.py), where ckpt had given exit 0:

- a key group that is not where its keyed-state handle says: ``verify`` names it, ``rescale`` and
  ``repair`` refuse before writing;
- checkpoint properties naming a class, serialVersionUID or enum constant Flink does not have, or
  describing a class with flags Java refuses for Flink's class: refused as the metadata is read, as
  Flink's loader fails on them;
- a managed operator state whose name its handle's data holds no meta info for (Flink up to 1.18
  fails on it, from 1.19 restores that state empty): ``verify`` names it, ``rescale`` and ``repair``
  refuse before writing."""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
from pathlib import Path

import pytest

import flink_env
from catalog import ALL_FIXTURES, CLAIMED, fixture_named
from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.key_groups import key_group_problems
from ckpt_tool.flink.metadata import iter_stream_handles, read_metadata, write_metadata
from ckpt_tool.flink.model import (
    ByteStreamHandle,
    IncrementalKeyedHandle,
    KeyGroupsHandle,
    MergedChannelStateHandle,
    SegmentFileHandle,
)
from ckpt_tool.flink.operator_state import operator_state_problems
from ckpt_tool.writer import write_checkpoint

SLOW_COUNT = "slow-count"
FIXTURES = {  # where the hashmap backend's key groups are: inline in _metadata, a file, a file merging segment
    "inline": "flink23-hashmap-p2",
    "file": "flink23-maxp32768-p2",
    "segment": "flink23-filemerging-hashmap-p2",
}


def keyed_handle(metadata, operator: str = SLOW_COUNT, subtask: int = 0) -> KeyGroupsHandle:
    op = next(o for o in metadata.operators if o.name and operator in o.name)
    handle = next(s for s in op.subtasks if s.index == subtask).managed_keyed
    assert isinstance(handle, KeyGroupsHandle)
    return handle


def swap_first_two(handle: KeyGroupsHandle) -> str:
    handle.offsets[0], handle.offsets[1] = handle.offsets[1], handle.offsets[0]
    first = handle.start_key_group
    return f"key group {first} starts at byte {handle.offsets[0]}, where the state holds key group {first + 1}'s id"


def past_the_end(handle: KeyGroupsHandle) -> str:
    size = handle.delegate.size
    handle.offsets[-1] = size + 10
    return f"key group {handle.key_groups[-1]} starts at byte {size + 10}, outside its state's {size} bytes"


FAULTS = {"swapped": swap_first_two, "past-the-end": past_the_end}


def faulty_copy(tmp_path: Path, name: str, fault) -> tuple[Path, str, object]:
    fixture = fixture_named(name)
    job = tmp_path / "job"
    shutil.copytree(fixture.checkpoint.parent, job)
    checkpoint = job / fixture.checkpoint.name
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    expected = fault(keyed_handle(metadata))
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    return checkpoint, expected, fixture


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("where", list(FIXTURES))
def test_verify_names_the_key_group_and_rescale_refuses(ckpt, tmp_path, where, fault):
    checkpoint, expected, fixture = faulty_copy(tmp_path, FIXTURES[where], FAULTS[fault])
    code, out, _ = ckpt("verify", checkpoint, "--json")
    report = json.loads(out)
    assert code == 1 and report["status"] == "problems"
    (problem,) = [p for p in report["problems"] if p["check"] == "key-group-offsets"]
    flink_says = {"swapped": " (Flink: Unexpected key-group in restore.)", "past-the-end": " (Flink: position out of bounds)"}
    said = flink_says[fault] if fault == "swapped" or where == "inline" else ""  # a file's end: Flink's EOFException
    assert problem["message"] == "managed keyed state: " + expected + said
    assert SLOW_COUNT in problem["operator"] and problem["subtask"] == 0
    assert [c["status"] for c in report["checks"] if c["name"] != "key-group-offsets"].count("failed") == 0  # nothing else
    rescale_and_repair_refuse(ckpt, tmp_path, checkpoint, fixture, expected, "Flink's restore would fail on it: refused")


def rescale_and_repair_refuse(ckpt, tmp_path: Path, checkpoint: Path, fixture, expected: str, refused: str) -> None:
    """``rescale`` and ``repair`` each exit 2 with one line saying ``expected`` and ``refused``,
    before writing anything."""
    destination = tmp_path / "out" / "chk-1"
    inputs = ["--plan", fixture.plan, "--schema", fixture.schema, "--engine", "local"]
    for command in (["rescale", checkpoint, destination, "-p", "3"], ["repair", checkpoint, destination]):
        code, _, err = ckpt(*command, *inputs)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert expected in err and refused in err, err
        assert not destination.parent.exists()


def crafted_copy(tmp_path: Path, fixture, craft) -> tuple[Path, str]:
    """A copy of the fixture's job directory whose ``_metadata`` ``craft(metadata)`` altered, and
    what ``craft`` says ckpt will say of it."""
    job = tmp_path / "job"
    shutil.copytree(fixture.checkpoint.parent, job)
    checkpoint = job / fixture.checkpoint.name
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    expected = craft(metadata)
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    return checkpoint, expected


def test_offsets_flink_reads_without_an_id_are_bounded_and_in_order(tmp_path):
    """A canonical savepoint writes no id at a key group's offset, and 0 marks an empty key group
    (``FullSnapshotRestoreOperation``): a zeroed offset is not flagged; one past the data is, and
    so is one before the key group ahead of it (where Flink ran out of memory or hit the end of
    the file reading what it took for a key group)."""
    fixture = fixture_named("flink23-savepoint-canonical-p2")
    source = Checkpoint.open(str(fixture.checkpoint))
    handle = keyed_handle(source.metadata)
    written = [i for i, offset in enumerate(handle.offsets) if offset]  # 0: an empty key group
    assert handle.tag == 7 and len(written) > 3 and 0 in handle.offsets
    assert [handle.offsets[i] for i in written] == sorted(handle.offsets[i] for i in written)
    handle.offsets[written[0]] = 0
    assert list(key_group_problems(source)) == []
    behind = written[2]
    handle.offsets[behind] = handle.offsets[written[1]] - 1
    ((operator, subtask, message),) = key_group_problems(source)
    assert SLOW_COUNT in operator and subtask == 0
    assert message.startswith(f"managed keyed state: key group {handle.start_key_group + behind} starts at byte")
    assert "before the key group ahead of it" in message
    expected = past_the_end(handle)
    ((operator, subtask, message),) = key_group_problems(source)
    assert message == "managed keyed state: " + expected


@pytest.mark.flink
def test_flink_refuses_what_ckpt_refuses(ckpt, tmp_path):
    """Real Flink fails to restore a checkpoint whose key groups are swapped, with the reason ckpt gives."""
    fixture = fixture_named(FIXTURES["inline"])
    source = Checkpoint.open(str(fixture.checkpoint))
    metadata = copy.deepcopy(source.metadata)
    expected = swap_first_two(keyed_handle(metadata))
    checkpoint = tmp_path / "job" / fixture.checkpoint.name
    write_checkpoint(source, metadata, str(checkpoint), {})
    info = fixture.info
    with pytest.raises(RuntimeError, match="Unexpected key-group in restore"):
        flink_env.restore_count(info["flink_version"], checkpoint, info["parallelism"], backend=info["backend"], timeout=300)
    inputs = ["--plan", fixture.plan, "--schema", fixture.schema]
    code, _, err = ckpt("rescale", checkpoint, tmp_path / "out" / "chk-1", "-p", "3", *inputs)
    assert code == 2 and expected in err and "Unexpected key-group in restore" in err, err


PROPERTY_FAULTS = {  # (fixture, bytes of the properties, their replacement, ckpt's message)
    "enum-constant": (
        "flink23-hashmap-p2",
        b"FORWARD_BACKWARD",
        b"FORwARD_BACKWARD",
        "No enum constant org.apache.flink.runtime.checkpoint.SnapshotType.SharingFilesStrategy.FORwARD_BACKWARD",
    ),
    "savepoint-enum-constant": (
        "flink23-savepoint-canonical-p2",
        b"\x00\x04NONE",
        b"\x00\x04NONF",
        "No enum constant org.apache.flink.runtime.checkpoint.SavepointType.PostCheckpointAction.NONF",
    ),
    "class": (
        "flink23-savepoint-canonical-p2",
        b"checkpoint.SavepointType\xa0",
        b"checkpoint.SavepointTypf\xa0",
        "class org.apache.flink.runtime.checkpoint.SavepointTypf, which Flink does not have (Flink: ClassNotFoundException)",
    ),
    "serial-version": (
        "flink23-hashmap-p2",
        bytes.fromhex("d6de4f0305ae1d3a"),
        bytes.fromhex("d6de4f0305ae1d3b"),
        "class org.apache.flink.runtime.checkpoint.CheckpointType with serialVersionUID -2963844630364414661,"
        " not Flink's -2963844630364414662 (Flink: InvalidClassException)",
    ),
    "class-flags": (  # found by tests/flink_fuzz.py (seed 100)
        "flink23-hashmap-p2",
        bytes.fromhex("d6de4f0305ae1d3a") + b"\x02",
        bytes.fromhex("d6de4f0305ae1d3a") + b"\x06",
        "class org.apache.flink.runtime.checkpoint.CheckpointType: serializable and externalizable flags conflict"
        " (Flink: InvalidClassException)",
    ),
    "enum-flags": (
        "flink23-hashmap-p2",
        b"SharingFilesStrategy" + bytes(8) + b"\x12",
        b"SharingFilesStrategy" + bytes(8) + b"\x02",
        "class org.apache.flink.runtime.checkpoint.SnapshotType$SharingFilesStrategy: cannot bind non-enum descriptor"
        " to an enum class (Flink: InvalidClassException)",
    ),
    "externalizable": (
        "flink23-hashmap-p2",
        b"CheckpointProperties" + (2).to_bytes(8, "big") + b"\x02",
        b"CheckpointProperties" + (2).to_bytes(8, "big") + b"\x04",
        "class org.apache.flink.runtime.checkpoint.CheckpointProperties: Serializable incompatible with Externalizable"
        " (Flink: InvalidClassException)",
    ),
    "not-serializable": (
        "flink23-hashmap-p2",
        b"CheckpointProperties" + (2).to_bytes(8, "big") + b"\x02",
        b"CheckpointProperties" + (2).to_bytes(8, "big") + b"\x00",
        "class org.apache.flink.runtime.checkpoint.CheckpointProperties: class invalid for deserialization"
        " (Flink: InvalidClassException)",
    ),
}
# Flink's own words where it fails on them (Java's ObjectStreamClass)
FLINK_PROPERTY_ERRORS = {
    "enum-constant": r"No enum constant .*SharingFilesStrategy\.FORwARD_BACKWARD",
    "class-flags": "serializable and externalizable flags conflict",
    "enum-flags": "cannot bind non-enum descriptor to an enum class",
    "externalizable": "Serializable incompatible with Externalizable",
    "not-serializable": "class invalid for deserialization",
}


def with_properties_changed(data: bytes, before: bytes, after: bytes) -> bytes:
    """``_metadata`` bytes with ``before`` (once in the checkpoint properties at their end) replaced."""
    properties = read_metadata(data).properties
    assert properties is not None and data.endswith(properties) and properties.count(before) == 1
    return data[: -len(properties)] + properties.replace(before, after)


@pytest.mark.parametrize("fault", list(PROPERTY_FAULTS))
def test_properties_flink_cannot_read_are_refused(ckpt, tmp_path, fault):
    name, before, after, message = PROPERTY_FAULTS[fault]
    fixture = fixture_named(name)
    changed = with_properties_changed(fixture.metadata_file.read_bytes(), before, after)
    with pytest.raises(CheckpointFormatError, match=re.escape(message)):
        read_metadata(changed)
    job = tmp_path / "job"
    shutil.copytree(fixture.checkpoint.parent, job)
    (job / fixture.checkpoint.name / "_metadata").write_bytes(changed)
    code, _, err = ckpt("inspect", job / fixture.checkpoint.name)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


@pytest.mark.flink
@pytest.mark.parametrize("fault", list(FLINK_PROPERTY_ERRORS))
def test_flink_fails_on_the_properties_ckpt_refuses(tmp_path, fault):
    name, before, after, _ = PROPERTY_FAULTS[fault]
    fixture = fixture_named(name)
    source = Checkpoint.open(str(fixture.checkpoint))
    checkpoint = tmp_path / "job" / fixture.checkpoint.name
    write_checkpoint(source, copy.deepcopy(source.metadata), str(checkpoint), {})  # where Flink reads it as it is
    metadata = checkpoint / "_metadata"
    metadata.write_bytes(with_properties_changed(metadata.read_bytes(), before, after))
    info = fixture.info
    with pytest.raises(RuntimeError, match=FLINK_PROPERTY_ERRORS[fault]):
        flink_env.restore_count(info["flink_version"], checkpoint, info["parallelism"], backend=info["backend"], timeout=300)


def moved_into_its_entry(handle: KeyGroupsHandle) -> str:
    """The second written key group's offset moved 3 bytes on, still before the next one."""
    written = [i for i, offset in enumerate(handle.offsets) if offset]
    i = written[1]
    handle.offsets[i] += 3
    assert handle.offsets[i] < handle.offsets[written[2]]
    return f"key group {handle.start_key_group + i} starts at byte {handle.offsets[i]}, where no entry of a state starts"


@pytest.mark.flink
def test_canonical_key_group_moved_in_order_is_refused_as_flink_fails_on_it(ckpt, tmp_path):
    """In the canonical format (no id at an offset) an offset moved inside its key group's data,
    still in order, starts no entry: Flink's restore reads a key or value past the key group."""
    checkpoint, expected, fixture = faulty_copy(tmp_path, "flink23-savepoint-canonical-p2", moved_into_its_entry)
    code, out, _ = ckpt("verify", checkpoint, "--json")
    (problem,) = [p for p in json.loads(out)["problems"] if p["check"] == "key-group-offsets"]
    assert code == 1 and problem["message"].startswith("managed keyed state: " + expected)
    inputs = ["--plan", fixture.plan, "--schema", fixture.schema, "--engine", "local"]
    code, _, err = ckpt("rescale", checkpoint, tmp_path / "out" / "chk-1", "-p", "3", *inputs)
    assert code == 2 and expected in err and "Flink's restore would fail on it: refused" in err, err
    info = fixture.info
    with pytest.raises(RuntimeError, match=r"EOFException|NegativeArraySizeException|OutOfMemoryError"):
        flink_env.restore_count(info["flink_version"], checkpoint, 3, backend=info["backend"], timeout=300)


@pytest.mark.flink
def test_rocksdb_full_checkpoint_of_flink115_passes_and_restores_rescaled(ckpt, tmp_path):
    """Flink 1.15's RocksDB full checkpoint holds the canonical format in the hashmap backend's
    handle type (12): no key group's id at its offset. ckpt had taken it for the hashmap backend's
    and refused it ("Unexpected key-group"). Its rescale to 3 merges two old subtasks' key groups
    into one file for the middle subtask (metadata v3 holds one keyed handle per subtask), where an
    empty key group's offset 0 had been taken for a key group's start (Flink: EOFException).
    Restored here by Flink 1.20.3, which CI has (Flink 1.15.4 restores it too: `make compat`)."""
    fixture = fixture_named("flink115-rocksdb-full-p2")
    source = Checkpoint.open(str(fixture.checkpoint))
    handles = [s.managed_keyed for op in source.metadata.operators for s in op.subtasks if s.managed_keyed]
    assert len(handles) == 2 and all(isinstance(h, KeyGroupsHandle) and h.tag == 12 for h in handles)
    assert all(0 in h.offsets for h in handles)  # empty key groups: the canonical format
    assert list(key_group_problems(source)) == []
    destination = tmp_path / "job" / "chk-1"
    inputs = ["--plan", fixture.plan, "--schema", fixture.schema, "--engine", "local"]
    code, _, err = ckpt("rescale", fixture.checkpoint, destination, "-p", "3", *inputs)
    assert code == 0, err
    info = fixture.info
    count = flink_env.restore_count("1.20.3", destination, 3, backend=info["backend"], timeout=300)
    assert count == info["source_records"]


RECOVERY = "flink23-ckpt-recovery-p3"  # every operator at 3: a rescale to 3 carries its channels


def carried_handle(metadata) -> MergedChannelStateHandle:
    """map-main's subtask 0 output handle (merged; its first channel is subpartition 0 of partition 0)."""
    handle = next(s for o in metadata.operators if o.name == "map-main" for s in o.subtasks if s.index == 0).output_channels[0]
    assert isinstance(handle, MergedChannelStateHandle) and handle.channels[0].info == (0, 0)
    return handle


def subpartition_outside(handle: MergedChannelStateHandle) -> str:
    """Its first channel's subpartition made 3 (Flink's serialized offsets: a count, then per channel
    its partition and subpartition, ...)."""
    handle.serialized_offsets = handle.serialized_offsets[:8] + (3).to_bytes(4, "big") + handle.serialized_offsets[12:]
    return "operator map-main subtask 0, output 0/3: no such channel: its partition has 3 subpartitions"


def partition_outside(handle: MergedChannelStateHandle) -> str:
    """Its first channel's result partition made 1, where map-main's vertex has one (found by
    tests/flink_fuzz.py, seed 100: partition 262,144)."""
    handle.serialized_offsets = handle.serialized_offsets[:4] + (1).to_bytes(4, "big") + handle.serialized_offsets[8:]
    return "operator map-main subtask 0, output 1/0: no such result partition: its vertex has 1 result partition in Flink's plan"


def buffer_past_the_file(handle: MergedChannelStateHandle) -> str:
    """Its last channel's last buffer moved past the end of its file (the offsets stay in order)."""
    last = handle.channels[-1]
    assert handle.serialized_offsets.endswith(last.offsets[-1].to_bytes(8, "big"))
    moved = handle.delegate.size + 100
    handle.serialized_offsets = handle.serialized_offsets[:-8] + moved.to_bytes(8, "big")
    gate, channel = last.info
    return f"operator map-main subtask 0, output {gate}/{channel}: {{file}}: buffer offset {moved} is outside the file"


CARRIED_FAULTS = {"subpartition": subpartition_outside, "partition": partition_outside, "buffer": buffer_past_the_file}


@pytest.mark.parametrize("fault", list(CARRIED_FAULTS))
def test_in_flight_data_carried_unchanged_is_proven_as_flink_reads_it(ckpt, tmp_path, fault):
    """A rescale to the same parallelism carries the channels of exchanges whose parallelism does
    not change without routing them (a repair reroutes this keyed exchange, to remove its
    replicas); a channel Flink's restore cannot read (found by tests/flink_fuzz.py) had been
    carried with exit 0."""
    checkpoint, expected, fixture = faulty_copy(tmp_path, RECOVERY, lambda metadata_handle: None)
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    handle = carried_handle(metadata)
    expected = CARRIED_FAULTS[fault](handle).format(file=Checkpoint.open(str(checkpoint)).location(handle.delegate))
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    inputs = ["--plan", fixture.plan, "--schema", fixture.schema, "--engine", "local"]
    destination = tmp_path / "out" / "chk-1"
    code, _, err = ckpt("rescale", checkpoint, destination, "-p", "3", *inputs)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"in-flight data kept as it was: {expected}" in err and "Flink's restore would fail on it: refused" in err, err
    assert not destination.parent.exists()
    code, out, _ = ckpt("verify", checkpoint, "--json", "--plan", fixture.plan)  # the plan says how many subpartitions
    report = json.loads(out)
    assert code == 2 and report["status"] == "unusable"
    (problem,) = report["problems"]
    assert (problem["operator"], problem["subtask"]) == ("map-main", 0)
    if fault == "buffer":
        gate, channel = handle.channels[-1].info
        assert problem["check"] == "channel-state" and problem["channel"] == f"output {gate}/{channel}"
    elif fault == "partition":
        assert problem["check"] == "channel-handles" and problem["channel"] == "output 1/0"
        assert problem["message"] == "no such result partition: its vertex has 1 result partition in Flink's plan"
    else:
        assert problem["check"] == "channel-handles" and problem["channel"] == "output 0/3"
        assert problem["message"].startswith("no such channel: its partition has 3 subpartitions")


def gate_outside(tmp_path: Path) -> tuple[Path, object]:
    """A copy of the recovery checkpoint whose slow-count subtask 0 names input gate 2 for its first
    channel, where its vertex has two input gates (the main and the small source)."""
    checkpoint, _, fixture = faulty_copy(tmp_path, RECOVERY, lambda metadata_handle: None)
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    op = next(o for o in metadata.operators if o.name == SLOW_COUNT)
    handle = next(s for s in op.subtasks if s.index == 0).input_channels[0]
    assert isinstance(handle, MergedChannelStateHandle) and handle.channels[0].info == (0, 0)
    handle.serialized_offsets = handle.serialized_offsets[:4] + (2).to_bytes(4, "big") + handle.serialized_offsets[8:]
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    return checkpoint, fixture


def test_an_input_gate_past_the_plans_is_named_and_refused(ckpt, tmp_path):
    checkpoint, fixture = gate_outside(tmp_path)
    expected = "no such input gate: its vertex has 2 input gates in Flink's plan"
    inputs = ["--plan", fixture.plan, "--schema", fixture.schema, "--engine", "local"]
    code, _, err = ckpt("rescale", checkpoint, tmp_path / "out" / "chk-1", "-p", "3", *inputs)
    assert code == 2 and f"operator slow-count subtask 0, input 2/0: {expected}" in err, err
    code, out, _ = ckpt("verify", checkpoint, "--json", "--plan", fixture.plan)
    (problem,) = json.loads(out)["problems"]
    assert code == 2 and (problem["check"], problem["channel"], problem["message"]) == ("channel-handles", "input 2/0", expected)
    code, out, _ = ckpt("verify", checkpoint, "--json")  # without the plan, gate 2 may exist
    assert code == 0, out


def test_verify_names_a_negative_channel_index(ckpt, tmp_path):
    checkpoint, _, _ = faulty_copy(tmp_path, RECOVERY, lambda metadata_handle: None)
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    handle = carried_handle(metadata)
    offsets = handle.serialized_offsets  # its first channel's subpartition made -1
    handle.serialized_offsets = offsets[:8] + (-1).to_bytes(4, "big", signed=True) + offsets[12:]
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    code, out, _ = ckpt("verify", checkpoint, "--json")
    report = json.loads(out)
    assert code == 2 and report["status"] == "unusable"
    (problem,) = report["problems"]
    assert problem["check"] == "channel-handles" and problem["channel"] == "output 0/-1"
    assert problem["message"] == "no such channel: a negative index" and problem["operator"] == "map-main"


@pytest.mark.flink
@pytest.mark.parametrize("fault, index, length", [("subpartition", 3, 3), ("partition", 1, 1), ("gate", 2, 2)])
def test_flink_fails_on_the_subpartition_ckpt_refuses(tmp_path, fault, index, length):
    if fault == "gate":
        checkpoint, fixture = gate_outside(tmp_path)
        metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    else:
        checkpoint, _, fixture = faulty_copy(tmp_path, RECOVERY, lambda metadata_handle: None)
        metadata = read_metadata((checkpoint / "_metadata").read_bytes())
        CARRIED_FAULTS[fault](carried_handle(metadata))
        (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    staged = tmp_path / "staged" / checkpoint.name  # its files copied where the new metadata names them
    write_checkpoint(Checkpoint.open(str(checkpoint)), metadata, str(staged), {})
    info = fixture.info
    with pytest.raises(RuntimeError, match=f"ArrayIndexOutOfBoundsException: Index {index} out of bounds for length {length}"):
        flink_env.restore_count(info["flink_version"], staged, 3, backend=info["backend"], timeout=300)


def test_carried_buffers_on_an_object_store_are_bounded_without_a_download(ckpt, tmp_path, s3_endpoint):
    """On S3 a carried buffer is checked against its file's recorded size (reading each carried
    byte would download them all): one past it is refused as on local disk."""
    import boto3

    checkpoint, _, fixture = faulty_copy(tmp_path, RECOVERY, lambda metadata_handle: None)
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    handle = carried_handle(metadata)
    expected = buffer_past_the_file(handle)
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="carried")
    for path in checkpoint.parent.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), "carried", f"job/{path.relative_to(checkpoint.parent)}")
    uri = f"s3://carried/job/{checkpoint.name}"
    expected = expected.format(file=Checkpoint.open(uri).location(handle.delegate))
    inputs = ["--plan", fixture.plan, "--schema", fixture.schema, "--engine", "local"]
    code, _, err = ckpt("rescale", uri, tmp_path / "out" / "chk-1", "-p", "3", *inputs)
    assert code == 2 and f"in-flight data kept as it was: {expected}" in err, err


def test_a_segment_scope_flink_does_not_have_is_refused_as_the_metadata_is_read(ckpt, tmp_path):
    """Flink reads a file-merging segment's scope as ``CheckpointedStateScope.values()[int]`` (two
    values): another int fails its loader (found by tests/flink_fuzz.py on
    ``flink23-filemerging-rocksdb-p2``, where ckpt's rescale had copied the segment and exited 0)."""
    fixture = fixture_named("flink23-filemerging-rocksdb-p2")
    data = fixture.metadata_file.read_bytes()
    metadata = read_metadata(data)
    segment = next(h for h in iter_stream_handles(metadata) if isinstance(h, SegmentFileHandle))
    segment.scope = 72
    job = tmp_path / "job"
    shutil.copytree(fixture.checkpoint.parent, job)
    (job / fixture.checkpoint.name / "_metadata").write_bytes(write_metadata(metadata))
    code, _, err = ckpt("inspect", job / fixture.checkpoint.name)
    message = "segment scope 72 is none of Flink's (0 EXCLUSIVE, 1 SHARED; Flink: ArrayIndexOutOfBoundsException)"
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_a_rocksdb_file_name_holding_a_nul_is_refused_as_the_metadata_is_read(ckpt, tmp_path):
    """RocksDB's restore names each downloaded state file by its handle's local path; Java refuses a
    NUL in a file name (``InvalidPathException: Nul character not allowed``), where ckpt had carried
    it with exit 0 (found by tests/flink_fuzz.py on ``flink23-rocksdb-savepoint-native-p2``)."""
    fixture = fixture_named("flink23-rocksdb-p2")
    metadata = read_metadata(fixture.metadata_file.read_bytes())
    keyed = [s.managed_keyed for o in metadata.operators for s in o.subtasks]
    handle = next(h for h in keyed if isinstance(h, IncrementalKeyedHandle))
    item = (handle.shared + handle.private)[0]
    item.local_path = "\x00" + item.local_path[1:]
    job = tmp_path / "job"
    shutil.copytree(fixture.checkpoint.parent, job)
    (job / fixture.checkpoint.name / "_metadata").write_bytes(write_metadata(metadata))
    code, _, err = ckpt("inspect", job / fixture.checkpoint.name)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "local path holds a NUL character" in err, err


# where the source's reader state is: inline in _metadata, a file merging segment, a savepoint's file
OPERATOR_STATE_FIXTURES = {
    "inline": "flink23-hashmap-p2",
    "segment": "flink23-filemerging-hashmap-p2",
    "file": "flink23-savepoint-native-p2",
}
RENAMED = "SourceReederState"  # as tests/flink_fuzz.py found it (seed 80, flink113-hashmap-p2): exit 0 before


def reader_states(metadata) -> list:
    """Each source subtask's (index, reader-state handle)."""
    found = [
        (subtask.index, subtask.managed_operator)
        for op in metadata.operators
        for subtask in op.subtasks
        if subtask.managed_operator is not None
        and subtask.managed_operator.states
        and subtask.managed_operator.states[0].name == "SourceReaderState"
    ]
    assert found
    return found


def rename_reader_state(metadata) -> tuple[list[int], str]:
    """Each source subtask's reader state renamed in its handle's map (its data unchanged)."""
    found = reader_states(metadata)
    for _, handle in found:
        handle.states[0].name = RENAMED
    return [index for index, _ in found], (
        f'managed operator state "{RENAMED}" has no meta info in its handle\'s data (Flink up to 1.18:'
        f' "Found state without corresponding meta info: {RENAMED}"; from 1.19 Flink restores the state'
        " of that meta info empty)"
    )


def partition_past_the_end(metadata) -> tuple[list[int], str]:
    """Each source subtask's reader-state partition moved 10 bytes past its handle's data (the
    message is the first subtask's: every handle of a fixture's source has the same size)."""
    found = reader_states(metadata)
    for _, handle in found:
        handle.states[0].offsets = [handle.delegate.size + 10]
    size = found[0][1].delegate.size
    said = " (Flink: position out of bounds)" if isinstance(found[0][1].delegate, ByteStreamHandle) else ""
    return [index for index, _ in found], (
        f'managed operator state "SourceReaderState" has a partition at byte {size + 10}, outside its'
        f" handle's {size} bytes of data{said}"
    )


OPERATOR_STATE_FAULTS = {"renamed": rename_reader_state, "past-the-end": partition_past_the_end}


def test_every_fixture_names_only_states_its_data_holds():
    """No real handle is flagged: Flink writes every state's meta info into every handle."""
    for fixture in ALL_FIXTURES + CLAIMED:
        assert list(operator_state_problems(Checkpoint.open(str(fixture.checkpoint)))) == [], fixture.name


@pytest.mark.parametrize("fault", list(OPERATOR_STATE_FAULTS))
@pytest.mark.parametrize("where", list(OPERATOR_STATE_FIXTURES))
def test_an_operator_state_flink_cannot_restore_is_named_and_refused(ckpt, tmp_path, where, fault):
    fixture = fixture_named(OPERATOR_STATE_FIXTURES[where])
    job = tmp_path / "job"
    shutil.copytree(fixture.checkpoint.parent, job)
    checkpoint = job / fixture.checkpoint.name
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    subtasks, expected = OPERATOR_STATE_FAULTS[fault](metadata)
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    code, out, _ = ckpt("verify", checkpoint, "--json")
    report = json.loads(out)
    problems = [p for p in report["problems"] if p["check"] == "operator-state"]
    assert code == 1 and [p["subtask"] for p in problems] == subtasks
    assert all(p["message"] == expected and p["operator"] == "source-main" for p in problems), problems
    assert [c["status"] for c in report["checks"] if c["name"] != "operator-state"].count("failed") == 0
    rescale_and_repair_refuse(ckpt, tmp_path, checkpoint, fixture, expected, "Flink would not restore it: refused")


@pytest.mark.flink
def test_flink_fails_on_or_loses_the_operator_state_ckpt_refuses(tmp_path):
    """Real Flink 2.3 fails on a reader-state partition past its data ("position out of bounds"),
    and restores a renamed reader state empty, without an error: the sources lose their splits and
    the job counts other records than its own (Flink 1.13 to 1.18 fail on it instead, "Found state
    without corresponding meta info", as tests/flink_fuzz.py found on Flink 1.13)."""
    fixture = fixture_named(OPERATOR_STATE_FIXTURES["inline"])
    source = Checkpoint.open(str(fixture.checkpoint))
    info = fixture.info
    assert info["flink_version"] == "2.3.0"
    for fault in OPERATOR_STATE_FAULTS:
        metadata = copy.deepcopy(source.metadata)
        OPERATOR_STATE_FAULTS[fault](metadata)
        checkpoint = tmp_path / fault / "job" / fixture.checkpoint.name
        write_checkpoint(source, metadata, str(checkpoint), {})
        restore = functools.partial(
            flink_env.restore_count, info["flink_version"], checkpoint, info["parallelism"], backend=info["backend"], timeout=300
        )
        if fault == "renamed":
            count = restore()
            assert count != info["source_records"], count
        else:
            with pytest.raises(RuntimeError, match="position out of bounds"):
                restore()


# --- an operator's state under another id than its uid's ----------------------------------------

OTHER_ID = "0123456789abcdef0123456789abcdef"


def move_operator(metadata, uid: str = "source-main") -> str:
    """The state of the operator with ``uid`` moved under another id, its uid kept."""
    op = next(o for o in metadata.operators if o.uid == uid)
    expected = op.id_hex
    op.operator_id = bytes.fromhex(OTHER_ID)
    return (
        f"its state is under operator id {OTHER_ID}, but Flink gives the operator with uid '{uid}' the id"
        f" {expected} (the uid's hash) and maps state by id (Flink: Cannot map checkpoint/savepoint state for"
        f" operator {OTHER_ID} to the new program)"
    )


def test_every_operator_with_a_uid_is_under_its_uids_id():
    """Flink writes each operator's state under the id its uid hashes to: no fixture's operator is
    flagged, and every Flink 2.x fixture stores uids."""
    from ckpt_tool.flink.uids import uid_problems

    with_uids = 0
    for fixture in ALL_FIXTURES + CLAIMED:
        metadata = Checkpoint.open(str(fixture.checkpoint)).metadata
        assert list(uid_problems(metadata)) == [], fixture.name
        with_uids += any(op.uid for op in metadata.operators)
    assert with_uids >= 10


def test_an_operator_under_another_id_than_its_uids_is_named_and_refused(ckpt, tmp_path):
    """``verify`` names the operator (exit 1), ``rescale`` and ``repair`` refuse it (exit 2): the
    fuzzer's altered id of a chained operator, which ckpt had rescaled with exit 0."""
    fixture = fixture_named("flink23-hashmap-p2")
    checkpoint, expected = crafted_copy(tmp_path, fixture, move_operator)
    code, out, _ = ckpt("verify", checkpoint, "--json")
    report = json.loads(out)
    problems = [p for p in report["problems"] if p["check"] == "operator-ids"]
    assert code == 1 and [(p["operator"], p["message"]) for p in problems] == [("source-main", expected)], problems
    rescale_and_repair_refuse(ckpt, tmp_path, checkpoint, fixture, expected, "Flink would not restore it: refused")


def test_an_operator_without_state_under_another_id_is_not_named():
    """Flink skips the empty state of an id no operator of the job has: ``timestamps-main`` holds
    no state, and its id altered is no problem."""
    from ckpt_tool.flink.uids import uid_problems

    metadata = copy.deepcopy(Checkpoint.open(str(fixture_named("flink23-hashmap-p2").checkpoint)).metadata)
    move_operator(metadata, "timestamps-main")
    assert list(uid_problems(metadata)) == []
    move_operator(metadata, "source-main")
    assert [label for label, _ in uid_problems(metadata)] == ["source-main"]


@pytest.mark.flink
def test_flink_fails_on_an_operator_under_another_id_than_its_uids(tmp_path):
    """Real Flink 2.3 refuses the checkpoint ckpt refuses (it maps state by id, and no operator of
    the job has the id source-main's state is under), and restores the one where a stateless
    operator's id was altered, with the exact count."""
    fixture = fixture_named("flink23-hashmap-p2")
    source = Checkpoint.open(str(fixture.checkpoint))
    info = fixture.info
    for uid in ("source-main", "timestamps-main"):
        metadata = copy.deepcopy(source.metadata)
        move_operator(metadata, uid)
        checkpoint = tmp_path / uid / "job" / fixture.checkpoint.name
        write_checkpoint(source, metadata, str(checkpoint), {})
        restore = functools.partial(
            flink_env.restore_count, info["flink_version"], checkpoint, info["parallelism"], backend=info["backend"], timeout=300
        )
        if uid == "source-main":
            with pytest.raises(RuntimeError, match=f"Cannot map checkpoint/savepoint state for operator {OTHER_ID}"):
                restore()
        else:
            assert restore() == info["source_records"]


@pytest.mark.parametrize("directory", ["task_owned_dir", "shared_dir"])
def test_a_file_merging_directory_holding_a_nul_is_refused_as_the_metadata_is_read(ckpt, tmp_path, directory):
    """A file-merging operator-state handle names its task-owned and shared directories; Flink's
    restore fails on one whose path holds NULs (``URISyntaxException: Relative path in absolute
    URI``), where ckpt had rescaled it with exit 0 (tests/flink_fuzz.py, seed 94)."""
    fixture = fixture_named("flink23-filemerging-rocksdb-p2")
    metadata = read_metadata(fixture.metadata_file.read_bytes())
    handles = [s.managed_operator for o in metadata.operators for s in o.subtasks if s.managed_operator is not None]
    handle = next(h for h in handles if getattr(h, directory))
    setattr(handle, directory, "\x00\x01" + getattr(handle, directory)[2:])
    job = tmp_path / "job"
    shutil.copytree(fixture.checkpoint.parent, job)
    (job / fixture.checkpoint.name / "_metadata").write_bytes(write_metadata(metadata))
    code, _, err = ckpt("inspect", job / fixture.checkpoint.name)
    what = {"task_owned_dir": "task-owned directory", "shared_dir": "shared directory"}[directory]
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"{what} holds a NUL character" in err, err


# --- the operators of one chain at different max parallelisms ----------------------------------


def mix_max_parallelism(metadata, uid: str = "up-final-filter", value: int = 129) -> str:
    """The max parallelism of the operator with ``uid`` set to ``value`` (its chain's others kept),
    as the fuzzer's seed 96 altered it; returns the message ckpt gives."""
    op = next(o for o in metadata.operators if o.uid == uid)
    op.max_parallelism = value
    return "the operators of one chain have different max parallelisms (up-slow-count 128, up-final-filter 129)"


def test_every_chain_flink_wrote_has_one_max_parallelism():
    """Flink writes every operator of a job vertex with the vertex's max parallelism: no fixture
    with a plan has a chain flagged."""
    from ckpt_tool.flink.plan import chain_max_parallelism_problems, load_job_plan

    chained = 0
    for fixture in ALL_FIXTURES + CLAIMED:
        if not fixture.plan:
            continue
        metadata = Checkpoint.open(str(fixture.checkpoint)).metadata
        plan = load_job_plan(str(fixture.plan), metadata)
        assert list(chain_max_parallelism_problems(plan, metadata)) == [], fixture.name
        chained += any(len(v.members) > 1 for v in plan.vertices.values())
    assert chained >= 10


def test_a_chain_at_two_max_parallelisms_is_named_and_refused(ckpt, tmp_path):
    """``verify`` names the chain (its ``parallelism`` check: the checkpoint is unusable, exit 2),
    ``rescale`` and ``repair`` refuse it (exit 2): the fuzzer's altered max parallelism of a
    chained operator (seed 96), which ckpt had rescaled with exit 0 into a checkpoint Flink fails on."""
    fixture = fixture_named("flink23-updates-p2")
    checkpoint, expected = crafted_copy(tmp_path, fixture, mix_max_parallelism)
    code, out, _ = ckpt("verify", checkpoint, "--plan", fixture.plan, "--json")
    report = json.loads(out)
    problems = [(p["check"], p["operator"]) for p in report["problems"]]
    assert code == 2 and problems == [("parallelism", "up-slow-count")], report["problems"]
    assert expected in report["problems"][0]["message"]
    code, out, _ = ckpt("verify", checkpoint, "--json")  # without a plan the chains are not known
    assert code == 0, out
    rescale_and_repair_refuse(ckpt, tmp_path, checkpoint, fixture, expected, "Flink would not restore it: refused")


@pytest.mark.flink
def test_flink_fails_on_a_chain_at_two_max_parallelisms(tmp_path):
    """Real Flink 2.3 fails to restore the checkpoint ckpt refuses: it takes the chain's max
    parallelism from its operators' state one after another, and reads the keyed state written at
    128 by the key groups of 129."""
    fixture = fixture_named("flink23-updates-p2")
    source = Checkpoint.open(str(fixture.checkpoint))
    info = fixture.info
    metadata = copy.deepcopy(source.metadata)
    mix_max_parallelism(metadata)
    checkpoint = tmp_path / "job" / fixture.checkpoint.name
    write_checkpoint(source, metadata, str(checkpoint), {})
    with pytest.raises(RuntimeError, match=r"KeyGroupRange\{startKeyGroup=\d+, endKeyGroup=\d+\} does not contain key group"):
        flink_env.restore_count(info["flink_version"], checkpoint, 3, backend=info["backend"], timeout=300)


# --- a keyed handle's key-group range -----------------------------------------------------------


def mis_range(metadata, fault: str) -> str:
    """slow-count's subtask 0 keyed handle given an empty key-group range (a count below 1, as the
    fuzzer's seed 97 altered it) or subtask 1's range (none of its own); returns what ckpt says."""
    handle = next(o for o in metadata.operators if o.uid == SLOW_COUNT).subtasks[0].managed_keyed
    if fault == "empty":
        handle.num_key_groups = -83886016
        return "managed keyed state: its key-group range (from 0, -83886016 key groups) is empty"
    handle.start_key_group = 64
    return "managed keyed state: its key groups 64..127 are none of the subtask's own 0..63"


@pytest.mark.parametrize("fault", ["empty", "foreign"])
def test_a_keyed_handle_outside_its_subtasks_key_groups_is_named_and_refused(ckpt, tmp_path, fault):
    """``verify`` names the handle (``key-group-offsets``, exit 1), ``rescale`` and
    ``repair`` refuse it (exit 2): Flink assigns keyed state by the handle's range, and ckpt had
    rescaled the empty one with exit 0, state lost (fuzz seed 97: 58,898 of 60,010 restored)."""
    fixture = fixture_named("flink23-rocksdb-p2")
    checkpoint, expected = crafted_copy(tmp_path, fixture, lambda metadata: mis_range(metadata, fault))
    code, out, _ = ckpt("verify", checkpoint, "--json")
    problems = [p for p in json.loads(out)["problems"] if p["check"] == "key-group-offsets"]
    assert code == 1 and [(p["operator"], p["subtask"]) for p in problems] == [(SLOW_COUNT, 0)], problems
    assert problems[0]["message"].startswith(expected), problems
    rescale_and_repair_refuse(ckpt, tmp_path, checkpoint, fixture, expected, "Flink's restore would fail on it: refused")


@pytest.mark.flink
def test_flink_loses_the_state_of_a_keyed_handle_with_an_empty_range(tmp_path):
    """Real Flink 2.3 restores the checkpoint ckpt refuses at its own parallelism exactly (it keeps
    each subtask's handles there), and at a new one with state lost: no subtask gets the handle."""
    fixture = fixture_named("flink23-rocksdb-p2")
    source = Checkpoint.open(str(fixture.checkpoint))
    info = fixture.info
    metadata = copy.deepcopy(source.metadata)
    mis_range(metadata, "empty")
    checkpoint = tmp_path / "job" / fixture.checkpoint.name
    write_checkpoint(source, metadata, str(checkpoint), {})
    restore = functools.partial(flink_env.restore_count, info["flink_version"], checkpoint, backend=info["backend"], timeout=300)
    assert restore(info["parallelism"]) == info["source_records"]
    assert restore(3) < info["source_records"]
