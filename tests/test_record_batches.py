"""The record path in one pass over many channels (an engine task's) equals the path channel by
channel: framing, scan figures, routing (pieces, their order and the counters), and the errors,
which name the channel and the element as before."""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

from catalog import fixture_named
from ckpt_tool.engine.tasks import (
    ChannelPieces,
    ReadWindows,
    RouteTask,
    channel_tasks,
    key_groups_of,
    read_channel,
    read_framed,
    read_whole_records,
    route_tasks,
    scan_batch,
    scan_channel,
    scan_in_pieces,
)
from ckpt_tool.errors import CkptError
from ckpt_tool.flink.channel_state import ChannelStateReader
from ckpt_tool.records.batch import KeyGroups, frame_channel, frame_channels
from ckpt_tool.records.route import (
    NotTogether,
    RouteCounters,
    RouteSpec,
    route_channel_in_pieces,
    route_together,
    route_upstream,
)
from ckpt_tool.records.scan import ScanColumns
from ckpt_tool.session import Session

FIXTURES = ["flink23-hashmap-p2", "flink23-naive-p2", "flink23-sql-p2", "flink23-pojo-p2", "flink23-recovery-p3"]


def element(rng: random.Random) -> bytes:
    tag = rng.choice([0, 1, 1, 1, 2])  # with timestamp, record, watermark
    body = bytes([tag]) + (rng.randbytes(8) if tag != 1 else b"") + rng.randbytes(rng.randrange(0 if tag == 2 else 1, 12))
    if tag == 2:
        body = body[:9]
    return struct.pack(">i", len(body)) + body


def test_frame_channels_equals_frame_channel_of_each():
    rng = random.Random(28)
    for _ in range(200):
        streams = []
        for _ in range(rng.randrange(0, 8)):
            stream = b"".join(element(rng) for _ in range(rng.randrange(0, 6)))
            streams.append(stream[: rng.randrange(0, len(stream) + 1)] if rng.random() < 0.3 else stream)
        framed = frame_channels(streams)
        assert len(framed.trailing) == len(streams)
        for k, stream in enumerate(streams):
            one = frame_channel(stream)
            part = framed.part(k, k + 1)
            base = framed.bounds[k]
            assert (part.records.starts - base).tolist() == one.starts.tolist()
            assert (part.records.ends - base).tolist() == one.ends.tolist()
            assert part.records.tags.tolist() == one.tags.tolist()
            assert int(part.trailing[0]) == one.trailing and set(part.channel.tolist()) <= {0}


def session_of(name: str) -> Session:
    fixture = fixture_named(name)
    return Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan)


def session_named(name: str, tmp_path: Path) -> Session:
    """``session_of`` the fixture; "NAME keyed by note": with a schema keyed by a field that is not
    the job's key (a string like the real one)."""
    if not name.endswith(" keyed by note"):
        return session_of(name)
    fixture = fixture_named(name.split()[0])
    schema = tmp_path / "schema.toml"
    schema.write_text(Path(fixture.schema).read_text().replace('key = ["name"]', 'key = ["note"]'))
    return Session.open(str(fixture.checkpoint), str(schema), fixture.plan)


@pytest.mark.parametrize("name", FIXTURES)
def test_scan_batch_equals_scan_channel_of_each(name):
    session = session_of(name)
    exchanges = session.described_exchanges
    tasks = sorted(channel_tasks(session.checkpoint, exchanges), key=lambda t: (t.exchange_index, t.downstream_subtask))
    assert tasks
    together = scan_batch(tasks, exchanges)
    one_by_one = ScanColumns.of_scans([scan_channel(t, exchanges[t.exchange_index]) for t in tasks])
    assert {k: v.tolist() for k, v in together.columns.items()} == {k: v.tolist() for k, v in one_by_one.columns.items()}
    assert together.histograms.keys() == one_by_one.histograms.keys()
    for index, counts in one_by_one.histograms.items():
        assert np.trim_zeros(together.histograms[index], "b").tolist() == counts.tolist()
    assert together.misplaced() == one_by_one.misplaced()


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("buffers", [1, 3])
def test_a_channel_in_pieces_holds_its_elements_in_order(name, buffers):
    """``ChannelPieces`` (what a scan and ``ckpt records`` read a large channel by): the pieces'
    elements, each at its index in the channel, are the channel's, read whole; its bytes and its
    cut record at the end too."""
    session = session_of(name)
    tasks = channel_tasks(session.checkpoint, session.described_exchanges)
    with ChannelStateReader() as reader:
        for t in tasks:
            whole = read_channel(reader, t)
            pieces = ChannelPieces.of(reader, t, buffers)
            elements: list = []
            for framed, before in pieces:
                assert before == len(elements) and framed.trailing.tolist() == [0]
                records = framed.records
                elements += [(records.element(i), int(records.tags[i])) for i in range(len(records.starts))]
            assert elements == [(whole.element(i), int(whole.tags[i])) for i in range(len(whole.starts))]
            assert (pieces.bytes, pieces.trailing) == (len(whole.data), whole.trailing)


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("buffers", [1, 2])
def test_a_channel_scanned_in_pieces_has_the_figures_of_it_scanned_whole(name, buffers):
    """A large channel (a rescale to parallelism 1 makes one of all the in-flight data) is scanned
    a few buffers at a time, a record cut between two pieces carried into the next: every figure,
    key-group count and misplaced holding is the channel's own, scanned whole; here with a piece
    of one or two buffers, so that records are cut between nearly every two."""
    session = session_of(name)
    exchanges = session.described_exchanges
    tasks = channel_tasks(session.checkpoint, exchanges)
    assert tasks
    with ChannelStateReader() as reader:
        for t in tasks:
            exchange = exchanges[t.exchange_index]
            try:
                whole = ScanColumns.of_scans([scan_channel(t, exchange, reader=reader)])
            except CkptError:
                with pytest.raises(CkptError):
                    scan_in_pieces(reader, t, exchange, t.exchange_index, t.max_parallelism, t.parallelism, buffers)
                continue
            pieces = scan_in_pieces(reader, t, exchange, t.exchange_index, t.max_parallelism, t.parallelism, buffers)
            assert {k: v.tolist() for k, v in pieces.columns.items()} == {k: v.tolist() for k, v in whole.columns.items()}
            assert pieces.histograms.keys() == whole.histograms.keys()
            for index, counts in whole.histograms.items():
                assert np.trim_zeros(pieces.histograms[index], "b").tolist() == counts.tolist()
            assert pieces.holdings.tolist() == whole.holdings.tolist()


def typed_route_tasks(session: Session, new_parallelism: int) -> Iterator[tuple[RouteTask, RouteSpec, Optional[KeyGroups]]]:
    """The route tasks of the session's exchanges of a known record type to ``new_parallelism``,
    each with its exchange's route spec and key groups."""
    exchanges = [e for e in session.described_exchanges if e.record_type or e.decoder]
    if not exchanges:
        pytest.skip("no typed exchange")
    metadata = session.checkpoint.metadata
    specs = [
        RouteSpec(e, new_parallelism, new_parallelism, metadata.operator(e.downstream_id).max_parallelism, "x") for e in exchanges
    ]
    for task in route_tasks(session.checkpoint, exchanges, specs):
        spec = specs[task.exchange_index]
        yield task, spec, key_groups_of(spec.exchange, spec.max_parallelism)


def routed_whole(reader, channels: list, spec: RouteSpec, keys, counters: RouteCounters) -> list | CkptError:
    """``route_upstream`` of the channels (of one upstream subtask), each read whole; or the
    error it refuses them with."""
    try:
        decoded = [(t.downstream_subtask, read_whole_records(reader, t, "x", spec.exchange, keys)) for t in channels]
        return list(route_upstream(decoded, spec, keys, counters, channels[0].upstream_subtask, channels[0].parallelism))
    except CkptError as exc:
        return exc


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("new_parallelism", [1, 3])
def test_route_together_equals_route_upstream(name, new_parallelism):
    session = session_of(name)
    compared = refused = 0
    with ChannelStateReader() as reader:
        for task, spec, keys in typed_route_tasks(session, new_parallelism):
            for upstream, same in groupby(task.channels, key=lambda t: t.upstream_subtask):
                channels = list(same)
                old = RouteCounters()
                expected = routed_whole(reader, channels, spec, keys, old)
                new = RouteCounters()
                framed = read_framed(reader, channels)
                downstreams = np.array([t.downstream_subtask for t in channels])
                try:
                    got = route_together(framed, downstreams, spec, keys, new, upstream, channels[0].parallelism)
                except (CkptError, NotTogether) as exc:  # route_task then routes them channel by channel
                    assert isinstance(exc, NotTogether) or isinstance(expected, CkptError)
                    assert new == RouteCounters()  # nothing counted
                    refused += 1
                    continue
                assert not isinstance(expected, CkptError)
                assert list(got) == expected and new == old
                compared += 1
    assert compared + refused
    if name == "flink23-naive-p2":  # replicas: found channel by channel
        assert refused


@pytest.mark.parametrize("name", FIXTURES + ["flink23-pojo-p2 keyed by note"])
@pytest.mark.parametrize("new_parallelism", [1, 3])
@pytest.mark.parametrize("buffers", [1, 2])
def test_a_channel_routed_in_pieces_equals_it_routed_whole(name, new_parallelism, buffers, tmp_path):
    """An upstream subtask's one large channel (a rescale to parallelism 1 makes one of all the
    in-flight data; ``repair`` or a rescale of that output routes it) is routed a piece at a time:
    each new subtask gets the same records in the same order, the counters are the same, and a
    channel ``route_upstream`` refuses (here by a key that is not the job's, a string like the
    real one) is refused with the same message; here every channel, alone, with pieces of one or
    two buffers, so that records are cut between nearly every two."""
    session = session_named(name, tmp_path)
    compared = refused = 0
    with ChannelStateReader() as reader:
        for task, spec, keys in typed_route_tasks(session, new_parallelism):
            for t in task.channels:
                old, new = RouteCounters(), RouteCounters()
                expected = routed_whole(reader, [t], spec, keys, old)
                pieces = ChannelPieces.of(reader, t, buffers)
                try:
                    got = [
                        routed
                        for part in route_channel_in_pieces(
                            pieces, t.downstream_subtask, spec, keys, new, t.upstream_subtask, t.parallelism
                        )
                        for routed in part
                    ]
                except CkptError as exc:
                    assert isinstance(expected, CkptError) and str(exc) == str(expected)
                    refused += 1
                    continue
                assert not isinstance(expected, CkptError) and pieces.trailing == 0
                assert by_target(got) == by_target(expected) and new == old
                compared += 1
    assert compared if name in FIXTURES else refused


def by_target(routed: list) -> dict:
    """Each target's records (bytes joined, in order) and their count."""
    joined: dict = {}
    for target, data, count in routed:
        known = joined.setdefault(target, [b"", 0])
        known[0] += bytes(data)
        known[1] += count
    return joined


def framed_streams(framed) -> list:
    """Each channel of framed channels: its bytes, its elements' starts (from its own first byte)
    and tags, and its cut record's bytes."""
    records = framed.records
    out = []
    for k in range(len(framed.trailing)):
        start, stop = int(framed.bounds[k]), int(framed.bounds[k + 1])
        first, last = int(framed.first[k]), int(framed.first[k + 1])
        out.append(
            (
                bytes(records.data[start:stop]),
                (records.starts[first:last] - start).tolist(),
                records.tags[first:last].tolist(),
                int(framed.trailing[k]),
            )
        )
    return out


@pytest.mark.parametrize("name", ["flink23-hashmap-p2", "flink23-recovery-p3"])
def test_a_batch_read_a_window_at_a_time_frames_as_read_whole(name):
    """A route batch larger than its read window (a rescale of a job at p=4,096 to parallelism 1
    is one batch of all its channels) is read a window at a time, each from the first row asked
    for: every upstream subtask's channels, asked for in order as the route tasks ask, frame as
    the batch read whole does, whatever the window's bytes."""
    session = session_of(name)
    exchanges = [e for e in session.described_exchanges if e.record_type or e.decoder]
    metadata = session.checkpoint.metadata
    specs = [RouteSpec(e, 1, 1, metadata.operator(e.downstream_id).max_parallelism, "x") for e in exchanges]
    table = route_tasks(session.checkpoint, exchanges, specs).table
    upstream = table.upstream.astype(np.int64) + (table.exchange_index.astype(np.int64) << 32)
    cuts = np.flatnonzero(np.diff(upstream, prepend=-1)).tolist() + [len(table)]
    groups = list(zip(cuts[:-1], cuts[1:]))
    assert len(groups) > 1
    with ChannelStateReader() as reader:
        whole = read_framed(reader, table)
        for budget in (1, int(table.size.max()), int(table.size.sum()) // 3 + 1, 1 << 40):
            windows, starts = ReadWindows(reader, table, budget), set()
            for a, b in groups:
                assert framed_streams(windows.part(a, b)) == framed_streams(whole.part(a, b))
                starts.add(windows.start)
            if budget < int(table.size.sum()) // 2:
                assert len(starts) > 1  # read in several windows
            else:
                assert starts == {0}


def test_a_corrupt_channel_is_named_as_before(tmp_path):
    """An engine task over several channels, one of them corrupt: the error names that channel
    and its element, as the scan of that channel alone does."""
    import shutil

    fixture = fixture_named("flink23-hashmap-p2")
    copy = tmp_path / "chk"
    shutil.copytree(fixture.checkpoint, copy)
    session = Session.open(str(copy), fixture.schema, fixture.plan)
    exchanges = session.described_exchanges
    tasks = sorted(channel_tasks(session.checkpoint, exchanges), key=lambda t: (t.exchange_index, t.downstream_subtask))
    corrupt = next(t for t in tasks[1:] if t.inputs and t.inputs[0].location and t.inputs[0].offsets)
    path = corrupt.inputs[0].location.removeprefix("file://")
    with open(path, "r+b") as file:
        file.seek(corrupt.inputs[0].offsets[0] + 4)
        file.write(struct.pack(">i", -5))  # the channel's first record length: negative
    with pytest.raises(CkptError) as alone:
        scan_channel(corrupt, exchanges[corrupt.exchange_index])
    with pytest.raises(CkptError) as together:
        scan_batch(tasks, exchanges)
    assert "negative record length" in str(alone.value)
    assert str(together.value) == str(alone.value)


def test_replica_copies_are_the_records_held_by_several_subtasks_found_at_once():
    """``_replica_copies`` (a repair of an inflated checkpoint: millions of copies) groups the
    suspect records of an upstream subtask's channels by digest at once. Per record it gives what
    the definition says, record by record on the bytes: a copy where several old subtasks hold the
    same record (in key groups several of them hold), dropped where its holder is not the lowest;
    the same record twice in one channel is not a copy of itself; the counters agree."""
    from ckpt_tool.records.route import _replica_copies

    rng = random.Random(47)
    dropped = 0
    for _ in range(150):
        pool = [bytes([1]) + rng.randbytes(rng.randrange(1, 6)) for _ in range(rng.randrange(1, 12))]
        channels, groups = [], []
        for downstream in sorted(rng.sample(range(8), rng.randrange(1, 6))):
            bodies = [rng.choice(pool) for _ in range(rng.randrange(0, 10))]
            stream = b"".join(struct.pack(">i", len(body)) + body for body in bodies)
            channels.append((downstream, frame_channel(stream)))
            groups.append(np.array([pool.index(body) % 3 + (downstream % 2) * 2 for body in bodies], dtype=np.int64))
        counters = RouteCounters()
        copies, drops = _replica_copies(channels, groups, counters)
        holders: dict[int, set[int]] = {}  # key group -> subtasks holding it
        for (downstream, _), g in zip(channels, groups):
            for group in g.tolist():
                holders.setdefault(group, set()).add(downstream)
        if all(len(h) < 2 for h in holders.values()):
            assert copies == [None] * len(channels) and counters == RouteCounters()
            continue
        found: dict[bytes, set[int]] = {}  # suspect record -> subtasks holding it
        for (downstream, records), g in zip(channels, groups):
            for index, group in enumerate(g.tolist()):
                if len(holders[group]) > 1:
                    found.setdefault(records.element(index), set()).add(downstream)
        removed = 0
        for ((downstream, records), g), copy, drop in zip(zip(channels, groups), copies, drops):
            for index, group in enumerate(g.tolist()):
                held = found.get(records.element(index), set()) if len(holders[group]) > 1 else set()
                assert bool(copy[index]) == (len(held) > 1)
                assert bool(drop[index]) == (len(held) > 0 and min(held) != downstream)
                removed += bool(drop[index])
        assert counters.replicas_found == sum(len(h) - 1 for h in found.values())
        assert counters.replicas_removed == removed
        dropped += removed
    assert dropped > 100  # the cases hold copies


def test_records_that_share_a_digest_but_differ_are_refused_not_dropped():
    """Copies are found by xxh3-128 digests, which crafted input can make collide: before a record
    is dropped as a copy, it is compared byte for byte with the record it copies; where they differ,
    ckpt refuses the checkpoint rather than drop a record."""
    from ckpt_tool.errors import CheckpointFormatError
    from ckpt_tool.records.route import _check_copies_equal

    bodies = [b"\x01first", b"\x01other"]  # the same length: only their bytes differ
    channels = [(d, frame_channel(struct.pack(">i", len(body)) + body)) for d, body in enumerate(bodies)]
    found = [(np.array([0]), b"\x07" * 16), (np.array([0]), b"\x07" * 16)]  # the same digest, as a collision gives
    order, first, group, subtasks = np.array([0, 1]), np.array([True, False]), np.array([0, 0]), np.array([2])
    with pytest.raises(CheckpointFormatError, match="same xxh3-128 digest"):
        _check_copies_equal(channels, found, order, first, group, subtasks)
    same = [(d, frame_channel(struct.pack(">i", 6) + b"\x01first")) for d in range(2)]
    _check_copies_equal(same, found, order, first, group, subtasks)  # equal bytes: copies indeed


def generated_session(tmp_path: Path, channels: str) -> Session:
    """A checkpoint at p=40 of many small channels (bench/generate.py), as a rescale at high
    parallelism meets them."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from generate import FIXTURE, SCHEMA, generate

    checkpoint = tmp_path / f"generated-{channels}"
    generate(checkpoint, 40, 300_000, channels=channels)
    return Session.open(str(checkpoint), str(SCHEMA), str(FIXTURE / "plan.json"))


def routed_batches(session: Session, new_parallelism: int, dst: Path, monkeypatch, at_once: bool) -> tuple[list, dict, int]:
    """``route_batch`` of the session's route tasks in batches of about eight, into ``dst``: what
    each task's result holds, each file's bytes, and how many batches were routed at once."""
    from ckpt_tool.engine import tasks as engine_tasks

    exchanges = [e for e in session.described_exchanges if e.record_type or e.decoder]
    metadata = session.checkpoint.metadata
    specs = [
        RouteSpec(e, new_parallelism, new_parallelism, metadata.operator(e.downstream_id).max_parallelism, "x") for e in exchanges
    ]
    tasks = list(route_tasks(session.checkpoint, exchanges, specs))
    real, made = engine_tasks.routed_at_once, [0]

    def counted(*args):
        result = real(*args) if at_once else None
        made[0] += result is not None
        return result

    monkeypatch.setattr(engine_tasks, "routed_at_once", counted)
    dst.mkdir()
    results = []
    for start in range(0, len(tasks), 8):
        for r in engine_tasks.route_batch(tasks[start : start + 8], specs, str(dst)):
            p = r.placed
            columns = (p.subtask.tolist(), p.size.tolist(), p.records.tolist(), p.digests, p.offsets.tolist(), p.bounds.tolist())
            results.append((r.exchange_index, r.new_channel, r.file_name, r.file_size, columns, r.counters))
    monkeypatch.setattr(engine_tasks, "routed_at_once", real)
    return results, {f.name: f.read_bytes() for f in dst.iterdir()}, made[0]


@pytest.mark.parametrize("name", FIXTURES + ["generated sparse", "generated dense"])
@pytest.mark.parametrize("new_parallelism", [1, 3, 57])
@pytest.mark.parametrize("chunk", [None, 1, 3000])
def test_a_batch_routed_at_once_equals_each_task_routed(name, new_parallelism, chunk, tmp_path, monkeypatch):
    """The route tasks of an engine task, routed in one pass over all their records
    (``routed_at_once``: a rescale at p=4,096 has thousands of small tasks), write the same file
    and give each task the same placements, digests and counters as each task routed on its own,
    whether the file is laid out in one piece or a task or a few at a time (``chunk`` bytes).
    Where an upstream subtask's channels may hold copies (``flink23-naive-p2``), the pass declines
    and every task is routed on its own, which finds them."""
    from ckpt_tool.engine import tasks as engine_tasks

    if chunk is not None:
        monkeypatch.setattr(engine_tasks, "AT_ONCE_CHUNK_BYTES", chunk)
    if name.startswith("generated"):
        session = generated_session(tmp_path, name.split()[1])
    else:
        session = session_of(name)
    expected = routed_batches(session, new_parallelism, tmp_path / "alone", monkeypatch, at_once=False)
    got = routed_batches(session, new_parallelism, tmp_path / "at-once", monkeypatch, at_once=True)
    assert got[:2] == expected[:2]
    if name.startswith("generated") and new_parallelism == 57:  # (to 1 and 3 its new channels fill buffers)
        assert got[2] > 0
    if name == "flink23-naive-p2":
        assert got[2] == 0


@pytest.mark.parametrize("name", FIXTURES + ["flink23-pojo-p2 keyed by note"])
def test_upstream_subtasks_judged_together_as_each_alone(name, tmp_path):
    """``together_key_groups`` of several upstream subtasks' channels at once declines exactly
    where one of them, judged alone, declines (copies of records, or records outside their
    holder's key groups record by record: here by a key that is not the job's)."""
    from ckpt_tool.records.route import together_key_groups

    session = session_named(name, tmp_path)
    decided = 0
    with ChannelStateReader() as reader:
        for task, spec, keys in typed_route_tasks(session, 3):
            if keys is None:
                continue
            table = task.channels
            old_parallelism = int(table.parallelism[task.exchange_index])
            upstream = table.upstream.astype(np.int64)
            cuts = np.flatnonzero(np.diff(upstream, prepend=-1)).tolist() + [len(table)]
            alone = []
            for a, b in zip(cuts[:-1], cuts[1:]):
                try:
                    framed = read_framed(reader, table, a, b)
                    alone.append(together_key_groups(framed, table.downstream[a:b], spec, keys, old_parallelism))
                except NotTogether:
                    alone.append(None)
                except CkptError:
                    alone = []
                    break
            if not alone:
                continue
            framed = read_framed(reader, table)
            try:
                groups = together_key_groups(framed, table.downstream, spec, keys, old_parallelism, upstream)
            except NotTogether:
                groups = None
            if any(g is None for g in alone):
                assert groups is None
            else:
                assert groups is not None and groups.tolist() == np.concatenate(alone).tolist()
            decided += 1
    assert decided
