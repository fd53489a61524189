"""ckpt verify finds what is wrong, ckpt repair mends it, and real Flink agrees."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET

import pytest

import flink_env
from catalog import ALL_FIXTURES
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import INPUT, OUTPUT
from ckpt_tool.writer import write_checkpoint

BASE = next(f for f in ALL_FIXTURES if f.name == "flink23-hashmap-p2")
NAIVE = next(f for f in ALL_FIXTURES if f.info.get("naive_rescale"))
SLOW = "0a6c3d247193df04622ad9b3b66741a5"


def inputs(fixture):
    return ["--plan", fixture.plan, "--schema", fixture.schema]


def swapped_checkpoint(tmp_path):
    """BASE with slow-count's two subtasks' in-flight data exchanged: every record misplaced."""
    source = Checkpoint.open(str(BASE.checkpoint))
    metadata = copy.deepcopy(source.metadata)
    for op in metadata.operators:
        for s in op.subtasks:
            s.input_channels, s.output_channels = s.channel_handles(INPUT), s.channel_handles(OUTPUT)
    slow = metadata.operator(SLOW)
    first, second = slow.subtasks
    first.input_channels, second.input_channels = second.input_channels, first.input_channels
    for subtask in (first, second):
        for handle in subtask.input_channels:
            handle.subtask_index = subtask.index
    upstream = metadata.operator("5ff73b99d0669153bf2feac805d152ac")
    for s in upstream.subtasks:
        for handle in s.output_channels:
            handle.info = (handle.info[0], 1 - handle.info[1])
    destination = tmp_path / "swapped" / "job" / BASE.checkpoint.name
    write_checkpoint(source, metadata, str(destination), {})
    return destination


def verify_json(ckpt, checkpoint, fixture, *extra):
    code, out, err = ckpt("verify", str(checkpoint), "--json", "--engine", "local", *inputs(fixture), *extra)
    return code, json.loads(out) if out else None, err


def test_real_fixtures_are_sound(ckpt, captured, tmp_path):
    fixture = captured
    junit = tmp_path / "verify.xml"
    code, report, err = verify_json(ckpt, fixture.checkpoint, fixture, "--junit", str(junit))
    assert code == 0, err
    assert report["status"] == "sound" and not report["problems"]
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "0" and len(suite.findall("testcase")) == len(report["checks"])


def test_metadata_only_verify_and_target_parallelism(ckpt):
    code, out, _ = ckpt("verify", str(BASE.checkpoint), "--target-parallelism", "200")
    assert code == 1 and "above its max parallelism 128" in out
    code, out, _ = ckpt("verify", str(BASE.checkpoint), "--target-parallelism", "3", *inputs(BASE))
    assert code == 0 and "status: sound" in out


@pytest.mark.flink
def test_misplaced_records_are_found_and_repaired(ckpt, tmp_path):
    swapped = swapped_checkpoint(tmp_path)
    code, report, _ = verify_json(ckpt, swapped, BASE, "--junit", str(tmp_path / "bad.xml"))
    keyed = next(o for o in BASE.expected["keyed_operators"] if o["operator"] == SLOW)
    assert code == 1 and report["status"] == "problems"
    misplaced = sum(p["count"] for p in report["problems"] if p["check"] == "key-groups")
    assert misplaced == keyed["records"]
    placement = [p for p in report["problems"] if p["check"] == "key-groups"]
    assert all(p["operator"] == "slow-count" and p["subtask"] is not None for p in placement)
    assert ET.parse(tmp_path / "bad.xml").getroot().get("failures") == "1"

    repaired = tmp_path / "repaired" / "job" / BASE.checkpoint.name
    code, out, err = ckpt("repair", str(swapped), str(repaired), "--engine", "local", "--json", *inputs(BASE))
    assert code == 0, err
    assert json.loads(out)["records_out"] == keyed["records"]
    code, report, _ = verify_json(ckpt, repaired, BASE)
    assert code == 0 and report["status"] == "sound"
    # the real proof: Flink restores the repaired checkpoint with the exact count
    assert flink_env.restore_count("2.3.0", repaired, 2, backend="hashmap") == BASE.info["source_records"]


@pytest.mark.flink
def test_drop_in_flight_drops_exactly_what_it_reports(ckpt, tmp_path):
    destination = tmp_path / "dropped" / "job" / BASE.checkpoint.name
    code, out, err = ckpt(
        "repair",
        str(BASE.checkpoint),
        str(destination),
        "--engine",
        "local",
        "--json",
        "--drop-in-flight",
        "slow-count",
        *inputs(BASE),
    )
    assert code == 0, err
    dropped = sum(d["records"] for d in json.loads(out)["dropped"])
    keyed = next(o for o in BASE.expected["keyed_operators"] if o["operator"] == SLOW)
    assert dropped == keyed["records"]
    restored = Checkpoint.open(str(destination))
    assert not any(s.channel_handles(INPUT) for s in restored.metadata.operator(SLOW).subtasks)
    count = flink_env.restore_count("2.3.0", destination, 2, backend="hashmap")
    assert count == BASE.info["source_records"] - dropped


@pytest.mark.flink
def test_naive_rescale_replicas_found_and_repaired(ckpt, tmp_path):
    keyed = next(o for o in NAIVE.expected["keyed_operators"] if o["operator"] == SLOW)
    assert keyed["duplicate_records"] > 0
    # real Flink refuses to process it: a copied record outside its subtask's key groups fails the task
    with pytest.raises(RuntimeError, match="is not in KeyGroupRange"):
        flink_env.restore_count("2.3.0", NAIVE.checkpoint, 2, backend="hashmap", timeout=300)
    code, report, _ = verify_json(ckpt, NAIVE.checkpoint, NAIVE)
    assert code == 1
    replicas = sum(p["count"] for p in report["problems"] if p["check"] == "record-replicas")
    assert replicas == keyed["duplicate_records"]
    repaired = tmp_path / "repaired" / "job" / NAIVE.checkpoint.name
    code, out, err = ckpt("repair", str(NAIVE.checkpoint), str(repaired), "--engine", "local", "--json", *inputs(NAIVE))
    assert code == 0, err
    assert json.loads(out)["replicas_removed"] == keyed["duplicate_records"]
    code, report, _ = verify_json(ckpt, repaired, NAIVE)
    assert code == 0, report["problems"]
    assert flink_env.restore_count("2.3.0", repaired, 2, backend="hashmap") == NAIVE.info["source_records"]


def test_channel_state_check_reads_a_file_at_once_and_still_names_the_bad_channel(tmp_path):
    """``verify``'s channel-state check reads the handles of one file together (a job at parallelism
    p has p² of them): replicas are found across files and subtasks as handle by handle, and a
    handle whose buffers do not read is named alone, by its channel."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from generate import generate

    from ckpt_tool.flink.channel_state import BufferSource, ChannelStateReader
    from ckpt_tool.ops.verify import REPLICA_MIN_BUFFER_BYTES, _buffer_digests, check_channel_state

    checkpoint = tmp_path / "job" / "chk-3"
    generate(checkpoint, 6, 3_000_000, handles="plain")  # every channel a handle, a subtask's in one file
    cp = Checkpoint.open(str(checkpoint))
    assert [r.problems for r in check_channel_state(cp, True)] == [[], [], []]
    slow = cp.metadata.operator(SLOW)
    third, fourth = slow.subtasks[3], slow.subtasks[4]

    def generated(subtask) -> list:
        return [h for h in subtask.input_channels if h.delegate.relative_path == f"bench-inflight-{subtask.index}-0"]

    handles = generated(third)
    assert len(handles) >= 4
    with ChannelStateReader() as reader:  # together: the same digests as handle by handle
        apart = [d for h in handles for d in _buffer_digests(cp, reader, [h], INPUT, [], "slow", 3)]
        assert sorted(_buffer_digests(cp, reader, handles, INPUT, [], "slow", 3)) == sorted(apart)
        sources = [BufferSource.of(cp, h) for h in handles]
        together = reader.buffer_digests_together(sources, REPLICA_MIN_BUFFER_BYTES)  # in one pass, in file order
        assert together is not None and sorted(together) == sorted(apart)
        per_channel = len(apart) // len(handles)  # every generated channel of a subtask holds the same block
        assert per_channel > 1 and len(apart) == per_channel * len(handles)
    # a channel of subtask 4 holds the buffers of one of subtask 3's: replicas across two files
    at = fourth.input_channels.index(generated(fourth)[1])
    copied = fourth.input_channels[at] = copy.copy(fourth.input_channels[at])
    copied.delegate, copied.offsets = handles[0].delegate, handles[0].offsets
    buffers, _, replicas = check_channel_state(cp, True)
    assert buffers.problems == [] and [p.count for p in replicas.problems] == [per_channel]
    # a buffer outside its file: that channel alone is named, its file's other channels still read
    at = third.input_channels.index(handles[2])
    broken = third.input_channels[at] = copy.copy(handles[2])
    broken.offsets = (10**9,)
    buffers, _, replicas = check_channel_state(cp, True)
    assert [(p.subtask, p.channel) for p in buffers.problems] == [(3, f"input 0/{broken.info[1]}")]
    assert [p.count for p in replicas.problems] == [per_channel]


def test_buffer_copies_are_counted_as_by_their_holders():
    """The buffer-replicas check's count, grouped at once (``_Holders``), is the one of a set of
    holders per digest and direction: each digest's holders but one. Digests shared across the
    directions, held twice by one subtask, given one owner or one per digest."""
    import random

    from ckpt_tool.ops.verify import _Holders

    rng = random.Random(7)
    pool = [rng.randbytes(16) for _ in range(40)]
    for _ in range(200):
        holders, expected = _Holders(), {}
        for _ in range(rng.randrange(6)):
            direction = rng.choice((INPUT, OUTPUT))
            found = [rng.choice(pool) for _ in range(rng.randrange(30))]
            owners = rng.randrange(5) if rng.random() < 0.5 else [rng.randrange(5) for _ in found]
            holders.add(found, owners, direction)
            for at, digest in enumerate(found):
                owner = owners if isinstance(owners, int) else owners[at]
                expected.setdefault(digest + direction.encode(), set()).add(owner)
        assert holders.copies() == sum(len(owners) - 1 for owners in expected.values())


def test_merged_handles_read_as_columns_give_the_digests_of_their_channels(tmp_path):
    """`verify` reads a subtask's merged handles as columns where their channels list as many
    buffers: the same buffer digests as checking channel by channel, on every fixture and on a
    generated p=24 job; a subtask holding a channel twice is left to the channel-by-channel check."""
    import sys
    from pathlib import Path

    from ckpt_tool.flink.channel_state import BufferSource, ChannelStateReader
    from ckpt_tool.ops.verify import REPLICA_MIN_BUFFER_BYTES, _buffer_digests, _merged_digests

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from generate import generate

    generated = tmp_path / "job" / "chk-3"
    generate(generated, 24, 2_000_000, channels="dense")
    read_as_columns = 0
    for checkpoint in [Checkpoint.open(str(f.checkpoint)) for f in ALL_FIXTURES] + [Checkpoint.open(str(generated))]:
        for op in checkpoint.metadata.operators:
            for s in op.subtasks:
                for direction in (INPUT, OUTPUT):
                    with ChannelStateReader() as reader:
                        merged = _merged_digests(checkpoint, reader, s, direction)
                        if merged is None:
                            continue
                        found, in_files = merged  # those in whole local files: read file by file later
                        for handle, offsets in in_files:
                            source = BufferSource.in_delegate(checkpoint, handle.delegate, offsets.tolist())
                            found += reader.buffer_digests_together([source], REPLICA_MIN_BUFFER_BYTES) or []
                        problems: list = []
                        handles = s.channel_handles(direction)
                        each = _buffer_digests(checkpoint, reader, handles, direction, problems, op.label, s.index)
                    assert sorted(found) == sorted(each) and not problems
                    read_as_columns += 1
    assert read_as_columns >= 24
    subtask = next(s for op in Checkpoint.open(str(generated)).metadata.operators for s in op.subtasks if s.input_channels)
    subtask.input_channels = subtask.input_channels + subtask.input_channels[:1]
    with ChannelStateReader() as reader:
        assert _merged_digests(Checkpoint.open(str(generated)), reader, subtask, INPUT) is None


def _rescaled_generated(ckpt, tmp_path, parallelism: int, in_flight: int, new_parallelism: int, **shape) -> Checkpoint:
    """A checkpoint generated from the base (bench/generate.py, of ``shape``), rescaled by ckpt
    (the local engine), and found sound by the channel-state check."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from generate import generate

    from ckpt_tool.ops.verify import check_channel_state

    source = tmp_path / "job" / "chk-3"
    generate(source, parallelism, in_flight, **shape)
    rescaled = tmp_path / "out" / "chk-3"
    code, _, err = ckpt("rescale", str(source), str(rescaled), "-p", str(new_parallelism), "--engine", "local", *inputs(BASE))
    assert code == 0, err
    cp = Checkpoint.open(str(rescaled))
    assert [r.problems for r in check_channel_state(cp, True)] == [[], [], []]
    return cp


def test_channel_state_check_reads_a_file_shared_by_subtasks_at_once(ckpt, tmp_path):
    """ckpt's rescale writes the new channels of an engine task's route tasks into one file, for
    all subtasks (plain handles here: a handle per channel): ``verify`` reads each file once for
    all subtasks, finds a buffer two subtasks reference in one file as a replica, and names a
    handle that does not read alone."""
    from ckpt_tool.ops.verify import check_channel_state

    cp = _rescaled_generated(ckpt, tmp_path, 6, 3_000_000, 4, handles="plain")
    slow = cp.metadata.operator(SLOW)
    by_file: dict = {}
    for s in slow.subtasks:
        for h in s.input_channels:
            if h.offsets:
                by_file.setdefault(h.delegate.relative_path, []).append((s, h))
    shared = next(members for members in by_file.values() if len({s.index for s, _ in members}) >= 2)
    (first_subtask, first), (second_subtask, second) = shared[0], next(m for m in shared if m[0] is not shared[0][0])
    assert first_subtask.index != second_subtask.index
    # the second subtask's channel references the first's buffers, in the same file: replicas
    at = second_subtask.input_channels.index(second)
    copied = second_subtask.input_channels[at] = copy.copy(second)
    copied.offsets, copied.state_size = first.offsets, first.state_size
    buffers, _, replicas = check_channel_state(cp, True)
    assert buffers.problems == [] and replicas.problems and replicas.problems[0].count >= 1
    # a buffer outside the shared file: that channel alone is named
    copied.offsets = (10**9,)
    buffers, _, _ = check_channel_state(cp, True)
    assert [(p.subtask, p.channel) for p in buffers.problems] == [(second_subtask.index, f"input 0/{second.info[1]}")]


def test_merged_handles_in_a_file_shared_by_subtasks_are_read_at_once(ckpt, tmp_path):
    """ckpt's rescale writes the new channels of an engine task's route tasks into one file, for all
    subtasks, and for Flink 2.1+ each subtask holds a merged handle per file: ``verify`` reads each
    file once for all subtasks, finds a buffer two subtasks reference in it as a replica, and names
    a channel that does not read alone."""
    from ckpt_tool.flink.channel_state import ChannelStateReader
    from ckpt_tool.flink.metadata import merge_channel_handles
    from ckpt_tool.flink.model import MergedChannelStateHandle
    from ckpt_tool.ops.verify import _merged_digests, check_channel_state

    cp = _rescaled_generated(ckpt, tmp_path, 24, 2_000_000, 18, channels="dense")  # small channels: each new one a buffer
    slow = cp.metadata.operator(SLOW)
    assert all(isinstance(h, MergedChannelStateHandle) for s in slow.subtasks for h in s.input_channels)
    with ChannelStateReader() as reader:  # read as columns, file by file across the subtasks
        merged = _merged_digests(cp, reader, slow.subtasks[1], INPUT)
        assert merged is not None and not merged[0] and len(merged[1]) >= 2
    first_subtask, second_subtask = slow.subtasks[0], slow.subtasks[1]
    first = next(h for h in first_subtask.input_channels if h.channel_count > 1)
    second = next(h for h in second_subtask.input_channels if h.delegate.relative_path == first.delegate.relative_path)
    theirs, mine = first.channels, second.channels
    victim = next(c for c in mine if len(c.offsets) == len(theirs[0].offsets))

    def replace(offsets, state_size) -> None:
        changed = [copy.copy(c) for c in mine]
        at = mine.index(victim)
        changed[at].offsets, changed[at].state_size = offsets, state_size
        handles = second_subtask.input_channels
        handles[handles.index(next(h for h in handles if h.delegate is second.delegate))] = merge_channel_handles(changed)[0]

    # a channel of the second subtask references the first's buffers, in the same file: replicas
    replace(theirs[0].offsets, theirs[0].state_size)
    buffers, _, replicas = check_channel_state(cp, True)
    assert buffers.problems == [] and replicas.problems and replicas.problems[0].count >= 1
    # a buffer outside the shared file: that channel alone is named
    replace((10**9,), victim.state_size)
    buffers, _, _ = check_channel_state(cp, True)
    assert [(p.subtask, p.channel) for p in buffers.problems] == [(second_subtask.index, f"input 0/{victim.info[1]}")]


@pytest.mark.flink
def test_a_repair_of_ckpt_output_copies_the_file_it_carries_under_a_name_of_its_own(ckpt, tmp_path):
    """A rescale's output names its routed files as a repair of it names its own
    (``ckpt-inflight-<operator>-<gate>-<channel>``). The repair of flink23-sideout-p2 rescaled to 3
    routes some of that file's channels again and carries 6 buffers of it unchanged: the carried
    handles had been taken for the repair's own file of the same name, so the output referenced
    the new file (148,056 bytes) as the old one (163,584) with exit 0, and Flink failed on it
    (EOFException). A source's file is now always copied (``WrittenFileHandle``: the run's own
    files)."""
    fixture = next(f for f in ALL_FIXTURES if f.name == "flink23-sideout-p2")
    rescaled = tmp_path / "p3" / "job" / "chk-1"
    code, _, err = ckpt("rescale", fixture.checkpoint, rescaled, "-p", "3", "--engine", "local", *inputs(fixture))
    assert code == 0, err
    repaired = tmp_path / "repaired" / "job" / "chk-1"
    code, out, err = ckpt("repair", rescaled, repaired, "--json", "--engine", "local", *inputs(fixture))
    assert code == 0, err
    assert json.loads(out)["carried"]["buffers"] > 0
    shared = {p.name for p in rescaled.iterdir()} & {p.name for p in repaired.iterdir()} - {"_metadata"}
    assert shared and all((repaired / name).stat().st_size != (rescaled / name).stat().st_size for name in shared)
    code, report, err = verify_json(ckpt, repaired, fixture)
    assert code == 0 and report["status"] == "sound", err
    info = fixture.info
    assert flink_env.restore_count(info["flink_version"], repaired, 3, backend=info["backend"]) == info["source_records"]


def test_the_first_channel_outside_its_gate_is_found_as_by_each_channel():
    """``ChannelBounds.first_outside`` (the check of every merged handle's channels) names the
    first channel ``problem`` names, with one gate (no sort) and with several, on random channels."""
    import numpy as np

    from ckpt_tool.channel_bounds import ChannelBounds
    from ckpt_tool.records.schema import Exchange

    bounds = ChannelBounds({"up0": 3, "up1": 5, "down": 4}, [Exchange("up0", "down", 0), Exchange("up1", "down", 1)])
    random = np.random.default_rng(28)
    for case in range(300):
        count = int(random.integers(1, 40))
        gates = np.full(count, case % 2) if case % 3 else random.integers(0, 3 if case % 5 == 0 else 2, count)
        channels = random.integers(-1 if case % 7 == 0 else 0, 6, count)
        for kind in (np.int64, ">i4"):  # as columns, and as a merged handle's big-endian fields
            want = next((i for i in range(count) if bounds.problem("down", INPUT, int(gates[i]), int(channels[i]))), None)
            assert bounds.first_outside("down", INPUT, gates.astype(kind), channels.astype(kind)) == want, case
