"""Logical channels stitched by ckpt hold exactly the records Flink's own deserializer finds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from ckpt_tool.engine.channels import ChannelTable
from ckpt_tool.engine.tasks import channel_tasks, read_channel
from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.channel_state import ChannelStateReader, pointwise_channels
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import INPUT, OUTPUT, ChannelStateHandle, OperatorState
from ckpt_tool.records.schema import Exchange


def exchanges(fixture):
    """(upstream id, downstream id, gate, partition) of every exchange the reference decoded."""
    channels = fixture.expected["logical_channels"]
    return sorted({(c["upstream"], c["downstream"], c.get("gate", 0), c.get("partition", 0)) for c in channels})


def test_fixture_has_input_and_output_channel_state(inflight):
    fixture = inflight
    channels = fixture.expected["logical_channels"]
    assert any(c["input_buffers"] for c in channels) and any(c["output_buffers"] for c in channels)


def test_records_per_logical_channel_match_flink(fixture):
    assert_channels_match_flink(fixture)


def assert_channels_match_flink(fixture) -> None:
    """Every logical channel ckpt stitches holds the buffers and elements the Java reference
    reader counted in it (Flink's own classes, expected.json), whole, and no channel is missed."""
    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    expected = {
        (c["upstream"], c["downstream"], c.get("gate", 0), c["upstream_subtask"], c["downstream_subtask"]): c
        for c in fixture.expected["logical_channels"]
    }
    seen = set()
    described = exchanges(fixture)
    tasks = channel_tasks(checkpoint, [Exchange(up, down, gate, partition) for up, down, gate, partition in described])
    with ChannelStateReader() as reader:
        for task in tasks:
            up, down, gate, _ = described[task.exchange_index]  # two gates of one receiver may share a sender
            key = (up, down, gate, task.upstream_subtask, task.downstream_subtask)
            want = expected[key]
            records = read_channel(reader, task)
            assert records.trailing == 0, key
            buffers = (sum(len(s.offsets) for s in task.inputs), sum(len(s.offsets) for s in task.outputs))
            elements = want["records"] + want.get("watermarks", 0) + want.get("other_elements", 0)
            assert (*buffers, len(records.tags)) == (want["input_buffers"], want["output_buffers"], elements), key
            seen.add(key)
    assert seen == {k for k, c in expected.items() if c["input_buffers"] or c["output_buffers"]}


@dataclass
class LogicalChannel:
    """The in-flight data of one logical channel u -> d of an exchange."""

    upstream_subtask: int
    downstream_subtask: int
    input_handles: list[ChannelStateHandle] = field(default_factory=list)
    output_handles: list[ChannelStateHandle] = field(default_factory=list)


def logical_channels(
    upstream: Optional[OperatorState],
    downstream: Optional[OperatorState],
    gate: int = 0,
    partition: int = 0,
    pointwise: bool = False,
) -> list[LogicalChannel]:
    """Pair the input state of ``downstream`` (gate ``gate``) with the output state of
    ``upstream`` (partition ``partition``), one LogicalChannel per (u, d) that holds data.

    On an all-to-all edge the input channel index is the upstream subtask index and the
    subpartition index the downstream subtask index; on a pointwise edge (forward, rescale) the
    links of :func:`pointwise_channels` say which is which."""
    channels: dict[tuple[int, int], LogicalChannel] = {}
    by_input: Callable[[int, int], Optional[int]] = lambda d, c: c
    by_output: Callable[[int, int], Optional[int]] = lambda u, s: s
    if pointwise and upstream is not None and downstream is not None:
        links = pointwise_channels(upstream.parallelism, downstream.parallelism)
        inputs = {(d, c): u for u, d, c, _ in links}
        outputs = {(u, s): d for u, d, _, s in links}
        by_input = lambda d, c: inputs.get((d, c))
        by_output = lambda u, s: outputs.get((u, s))

    def channel(u: Optional[int], d: Optional[int], handle: ChannelStateHandle) -> LogicalChannel:
        found = channels.get((u, d))  # type: ignore[arg-type]
        if found is None:  # made only where new (a job at parallelism p has up to p² of them)
            if u is None or d is None:
                raise CheckpointFormatError(
                    f"channel {handle.info} of subtask {handle.subtask_index} does not exist on this pointwise edge"
                )
            found = channels[(u, d)] = LogicalChannel(u, d)
        return found

    for subtask in downstream.subtasks if downstream else ():
        d = subtask.index
        for handle in subtask.channels_on(INPUT, gate):
            channel(by_input(d, handle.info[1]), d, handle).input_handles.append(handle)
    for subtask in upstream.subtasks if upstream else ():
        u = subtask.index
        for handle in subtask.channels_on(OUTPUT, partition):
            channel(u, by_output(u, handle.info[1]), handle).output_handles.append(handle)
    return [channels[key] for key in sorted(channels)]


def _reference_tasks(checkpoint, described) -> list:
    """The channels as ``logical_channels`` pairs them, handle objects and all: what the columns
    of a ``ChannelTable`` must make, channel by channel."""
    from ckpt_tool.flink.channel_state import BufferSource
    from ckpt_tool.flink.plan import POINTWISE_PARTITIONERS

    metadata, result = checkpoint.metadata, []
    for index, exchange in enumerate(described):
        down = metadata.operator(exchange.downstream_id)
        up = metadata.operator(exchange.upstream_id) if exchange.upstream_id else None
        pointwise = exchange.partitioner in POINTWISE_PARTITIONERS
        for ch in logical_channels(up, down, exchange.gate, exchange.partition, pointwise):
            result.append(
                (
                    index,
                    ch.upstream_subtask,
                    ch.downstream_subtask,
                    down.max_parallelism,
                    down.parallelism,
                    [_plain(BufferSource.of(checkpoint, h)) for h in ch.input_handles],
                    [_plain(BufferSource.of(checkpoint, h)) for h in ch.output_handles],
                    sum(h.state_size for h in ch.input_handles + ch.output_handles),
                )
            )
    return result


def _plain(source) -> tuple:
    return (source.location, source.inline, source.segment, list(source.offsets), source.beneath)


def _made(task) -> tuple:
    fields = (task.exchange_index, task.upstream_subtask, task.downstream_subtask, task.max_parallelism, task.parallelism)
    return (*fields, [_plain(s) for s in task.inputs], [_plain(s) for s in task.outputs], task.size)


def test_channel_table_makes_the_channels_logical_channels_pairs(fixture):
    """Every fixture (plain and merged handles, several gates, pointwise edges): the columns make
    the same channels, sources and offsets as pairing the handle objects, and a table's parts and
    its takes make the same tasks."""
    import numpy as np

    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    described = [Exchange(up, down, gate, partition) for up, down, gate, partition in exchanges(fixture)]
    table = channel_tasks(checkpoint, described)
    reference = _reference_tasks(checkpoint, described)
    assert [_made(t) for t in table] == reference
    assert [_made(t) for t in table.part(0, len(table))] == reference
    assert [_made(t) for t in table.tasks(0, len(table))] == reference
    middle = len(table) // 2
    parts = [table.part(0, middle), table.take(np.arange(0)), table.part(middle, len(table))]
    assert [_made(t) for t in ChannelTable.concatenate(parts)] == reference
    # a part lists only the files its sources name, as a take does
    for part in (parts[0], parts[2], table.part(1, max(1, len(table) - 1))):
        assert sorted(set(part.source_file.tolist())) == list(range(len(part.files)))
    # slices share the table's files, and joined again keep them (as a route batch takes its tasks)
    cuts = [0, len(table) // 3, len(table) // 3, 2 * len(table) // 3, len(table)]
    slices = [table.slice(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    assert [_made(t) for piece in slices for t in piece] == reference
    assert all(piece.files is table.files for piece in slices if len(piece))
    assert [_made(t) for t in ChannelTable.concatenate([p for p in slices if len(p)])] == reference
    backwards = np.arange(len(table))[::-1]
    assert [_made(t) for t in table.take(backwards)] == reference[::-1]
    assert [_made(t) for t in table.take(np.arange(len(table)) % 2 == 0)] == reference[::2]
    # built by downstream subtask (as a scan reads them): the same channels, in (exchange, d, u) order
    by_downstream = sorted(reference, key=lambda t: (t[0], t[2], t[1]))
    assert [_made(t) for t in channel_tasks(checkpoint, described, by_downstream=True)] == by_downstream


def test_channel_table_of_a_generated_job_at_parallelism_24(tmp_path):
    """p² channels: merged handles read as columns (dense, one in ten, and merged handles whose
    channels list different numbers of buffers), and plain ones, make what the handles pair."""
    import sys
    from pathlib import Path

    import numpy as np

    from ckpt_tool.engine.tasks import scan_batch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from generate import FIXTURE, SCHEMA, generate

    from ckpt_tool.session import Session

    for channels, handles, size in (("dense", "merged", 600_000), ("sparse", "merged", 6_000_000), ("dense", "plain", 600_000)):
        checkpoint = tmp_path / channels / handles / "job" / "chk-3"
        generate(checkpoint, 24, size, channels=channels, handles=handles)
        with Session.open(str(checkpoint), str(SCHEMA), str(FIXTURE / "plan.json"), "local") as session:
            table = channel_tasks(session.checkpoint, session.exchanges)
            assert len(table) >= (24 * 24 if channels == "dense" else 24 * 24 // 10)
            reference = _reference_tasks(session.checkpoint, session.exchanges)
            assert [_made(t) for t in table] == reference
            by_downstream = channel_tasks(session.checkpoint, session.exchanges, by_downstream=True)
            assert [_made(t) for t in by_downstream] == sorted(reference, key=lambda t: (t[0], t[2], t[1]))
            # an engine task's table is scanned from its columns: the figures of scanning its tasks
            for part in (table, table.part(3, len(table) - 5), table.take(np.arange(len(table))[::-1])):
                assert_same_scan(scan_batch(part, session.exchanges), scan_batch(part.tasks(0, len(part)), session.exchanges))


def assert_same_scan(one, other) -> None:
    assert one.columns.keys() == other.columns.keys()
    for name in one.columns:
        assert one.columns[name].tolist() == other.columns[name].tolist(), name
    assert one.histograms.keys() == other.histograms.keys()
    for index in one.histograms:
        assert one.histograms[index].tolist() == other.histograms[index].tolist()
    assert one.misplaced() == other.misplaced()
    assert one.columns["records"].sum() > 0


def test_a_tables_used_files_are_renumbered_as_unique_would():
    """``ChannelTable.take`` renumbers the files its rows use by marking them (thousands of files
    against millions of sources), as ``np.unique(..., return_inverse=True)`` would."""
    import numpy as np

    from ckpt_tool.engine.channels import _used

    rng = np.random.default_rng(7)
    for rows, files in [(0, 3), (1, 1), (50, 7), (20_000, 4096)]:
        indexes = rng.integers(0, files, rows).astype(np.int32)
        used, renumbered = _used(indexes, files)
        expected_used, expected = np.unique(indexes, return_inverse=True)
        assert used.tolist() == expected_used.tolist() and renumbered.tolist() == expected.reshape(-1).tolist()
