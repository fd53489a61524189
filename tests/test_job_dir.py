"""A job's checkpoint directory (…/<job-id>/) as CHECKPOINT: the newest complete chk-<n> is taken,
and ckpt says which; ``ckpt list`` shows the job's checkpoints, locally and on an object store."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from catalog import fixture_named
from ckpt_tool.flink.metadata import read_metadata, write_metadata

BASE = fixture_named("flink23-hashmap-p2")
INPUTS = ["--plan", BASE.plan, "--schema", BASE.schema]


def job_dir(tmp_path: Path) -> Path:
    """BASE's job directory with an older complete checkpoint beside its own (chk-<n-1>, a copy)
    and a newer one in progress (chk-<n+1>: a data file, no _metadata yet)."""
    job = tmp_path / "job"
    shutil.copytree(BASE.checkpoint.parent, job)
    number = int(BASE.checkpoint.name.split("-")[1])
    shutil.copytree(job / BASE.checkpoint.name, job / f"chk-{number - 1}")
    (job / f"chk-{number + 1}").mkdir()
    (job / f"chk-{number + 1}" / "partial").write_bytes(b"\0" * 1000)
    return job


def test_a_job_directory_stands_for_its_newest_complete_checkpoint(ckpt, tmp_path):
    job = job_dir(tmp_path)
    code, out, err = ckpt("inspect", "--json", job)
    assert code == 0, err
    assert err == f"ckpt: using {BASE.checkpoint.name}, the newest complete checkpoint of {job}\n"
    assert json.loads(out)["checkpoint_id"] == BASE.expected["checkpoint_id"]
    code, out, err = ckpt("rescale", job, tmp_path / "out" / "chk", "-p", "3", *INPUTS, "--engine", "local", "--json")
    assert code == 0, err
    assert err.startswith(f"ckpt: using {BASE.checkpoint.name}, the newest complete checkpoint of {job}")
    code, _, err = ckpt("verify", tmp_path / "out" / "chk", *INPUTS, "--engine", "local", "--target-parallelism", "3")
    assert code == 0, err


def test_list(ckpt, tmp_path):
    job = job_dir(tmp_path)
    number = int(BASE.checkpoint.name.split("-")[1])
    code, out, err = ckpt("list", "--json", job)
    assert code == 0 and err == "", err
    report = json.loads(out)
    assert report["newest_complete"] == BASE.checkpoint.name
    listed = {c["name"]: c for c in report["checkpoints"]}
    assert [c["name"] for c in report["checkpoints"]] == [f"chk-{number + 1}", f"chk-{number}", f"chk-{number - 1}"]
    partial = listed[f"chk-{number + 1}"]
    assert partial["complete"] is False and partial["directory_bytes"] == 1000 and partial["size_bytes"] is None
    newest = listed[BASE.checkpoint.name]
    assert newest["complete"] is True and newest["inflated"] is False
    expected_in_flight = sum(
        op["channel_state"][d]["bytes"] for op in BASE.expected["operators"] for d in ("input", "output", "upstream_output")
    )
    assert newest["in_flight_bytes"] == expected_in_flight
    expected_parallelism = sorted(op["parallelism"] for op in BASE.expected["operators"])
    assert sorted(newest["parallelism"].values()) == expected_parallelism
    assert newest["size_bytes"] >= newest["in_flight_bytes"] > 0
    code, out, err = ckpt("list", job)
    assert code == 0, err
    assert "newest complete checkpoint: " + BASE.checkpoint.name in out and "no (no _metadata)" in out


def test_list_savepoints(ckpt):
    savepoints = fixture_named("flink23-savepoint-native-p2").directory / "savepoints"
    code, out, err = ckpt("list", "--json", savepoints)
    assert code == 0, err
    report = json.loads(out)
    (savepoint,) = report["checkpoints"]
    assert savepoint["kind"] == "savepoint" and savepoint["complete"] and savepoint["name"].startswith("savepoint-")
    assert savepoint["checkpoint_id"] == fixture_named("flink23-savepoint-native-p2").expected["checkpoint_id"]
    assert report["newest_complete"] is None  # a savepoint is not a checkpoint the job directory form would take


def test_list_shows_replicated_channel_state(ckpt, tmp_path):
    """Channel-state handles another subtask of the operator holds too (as Flink's own rescale of an
    unaligned checkpoint assigns them) make a checkpoint look inflated."""
    job = job_dir(tmp_path)
    metadata_file = job / BASE.checkpoint.name / "_metadata"
    metadata = read_metadata(metadata_file.read_bytes())
    from ckpt_tool.flink.model import RelativeFileHandle

    def in_files(subtask) -> bool:
        return any(isinstance(h.delegate, RelativeFileHandle) for h in subtask.channel_handles("input"))

    op = next(op for op in metadata.operators if any(in_files(s) for s in op.subtasks))
    first = next(s for s in op.subtasks if in_files(s))
    second = next(s for s in op.subtasks if s is not first)
    second.input_channels = second.input_channels + [copy.deepcopy(h) for h in first.input_channels]
    metadata_file.write_bytes(write_metadata(metadata))
    code, out, err = ckpt("list", "--json", job)
    assert code == 0, err
    newest = next(c for c in json.loads(out)["checkpoints"] if c["name"] == BASE.checkpoint.name)
    assert newest["inflated"] is True and newest["replicated_handles"] == len(first.channel_handles("input"))


def test_not_a_job_directory(ckpt, tmp_path):
    code, out, err = ckpt("list", tmp_path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err == f"ckpt: error: {tmp_path} holds no chk-<n> or savepoint-* directories: give a job's checkpoint directory\n"
    code, _, err = ckpt("inspect", tmp_path)
    assert code == 2 and err == f"ckpt: error: {tmp_path} is not a checkpoint: it has no _metadata file\n"


@pytest.mark.parametrize("with_slash", [False, True])
def test_job_directory_on_an_object_store(ckpt, gcs_emulator, tmp_path, with_slash):
    from stores import GcsStore, upload_tree

    store = GcsStore("ckpt-jobs")
    job = job_dir(tmp_path)
    upload_tree(store, job, f"jobs/{with_slash}/job")
    uri = store.uri(f"jobs/{with_slash}/job") + ("/" if with_slash else "")
    code, out, err = ckpt("list", "--json", uri)
    assert code == 0, err
    assert json.loads(out)["newest_complete"] == BASE.checkpoint.name
    code, out, err = ckpt("inspect", "--json", uri)
    assert code == 0, err
    assert err == f"ckpt: using {BASE.checkpoint.name}, the newest complete checkpoint of {uri.rstrip('/')}\n"


def _replicas_channel_by_channel(metadata) -> int:
    """What ``ckpt list`` counts, from every channel as an object: per operator, direction, file and
    offsets, the subtasks holding them but one."""
    from ckpt_tool.ops.listing import _handle_key

    replicas = 0
    for op in metadata.operators:
        holders: dict[tuple, set[int]] = {}
        for s in op.subtasks:
            for direction in ("input", "output"):
                for h in s.channel_handles(direction):
                    key = _handle_key(h.delegate)
                    if key is not None and h.offsets:
                        holders.setdefault((direction, key, tuple(h.offsets)), set()).add(s.index)
        replicas += sum(len(held) - 1 for held in holders.values())
    return replicas


@pytest.mark.parametrize("copied", ["merged", "opened", "one buffer fewer"])
def test_replicas_are_counted_from_merged_handles_as_from_their_channels(fixture, copied):
    """``ckpt list`` compares channels as rows of offsets, a merged handle of alike channels read
    as one array (p=4,096 dense: 96 s and 8.3 GB → 5.6 s and 1 GB): the count its channels give,
    with a subtask's handles copied to the next as they are, opened up, or each missing a buffer."""
    from ckpt_tool.flink.metadata import merge_channel_handles
    from ckpt_tool.flink.model import ChannelStateHandle, MergedChannelStateHandle
    from ckpt_tool.ops.listing import _replicated_handles

    metadata = read_metadata(fixture.metadata_file.read_bytes())
    for op in metadata.operators:
        for first, second in zip(op.subtasks, op.subtasks[1:]):
            for direction in ("input", "output"):
                channels = first.channel_handles(direction)
                if copied == "one buffer fewer":
                    channels = [
                        ChannelStateHandle(ch.direction, second.index, ch.info, ch.offsets[1:], ch.state_size, ch.delegate)
                        for ch in channels
                    ]
                    added: list = (
                        merge_channel_handles(channels)
                        if any(isinstance(h, MergedChannelStateHandle) for h in first.input_channels)
                        else channels
                    )
                else:
                    added = copy.deepcopy(first.input_channels if direction == "input" else first.output_channels)
                    added = (
                        added
                        if copied == "merged"
                        else [ch for h in added for ch in (h.channels if isinstance(h, MergedChannelStateHandle) else [h])]
                    )
                if direction == "input":
                    second.input_channels = second.input_channels + added
                else:
                    second.output_channels = second.output_channels + added
    assert _replicated_handles(metadata) == _replicas_channel_by_channel(metadata)


def test_replicas_among_alike_channels_are_counted_as_one_array():
    """Channels of one buffer each (a job at high parallelism), merged, some at offsets another
    subtask holds as merged or as plain handles: the count their channels give."""
    from ckpt_tool.flink.metadata import merge_channel_handles
    from ckpt_tool.flink.model import ChannelStateHandle, RelativeFileHandle
    from ckpt_tool.ops.listing import _replicated_handles

    metadata = read_metadata(BASE.metadata_file.read_bytes())
    op = next(op for op in metadata.operators if len(op.subtasks) >= 2)
    first, second = op.subtasks[:2]
    file, other = RelativeFileHandle("in-flight", 10_000), RelativeFileHandle("other", 10_000)

    def channels(subtask, offsets, delegate=file):
        return [ChannelStateHandle("input", subtask, (0, c), (o,), 20, delegate) for c, o in enumerate(offsets)]

    first.input_channels = merge_channel_handles(channels(first.index, range(5, 805, 8)))  # 100 channels
    second.input_channels = (
        merge_channel_handles(channels(second.index, range(5, 405, 8)))  # 50 of them again, merged
        + channels(second.index, range(805, 405, -8))  # 49 of the other 50 again, plain, and one at 805
        + merge_channel_handles(channels(second.index, range(5, 805, 8), other))  # the same offsets, another file
    )
    assert _replicated_handles(metadata) == _replicas_channel_by_channel(metadata) == 99
