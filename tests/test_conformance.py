"""One conformance cell per topology on Flink 2.3 (`make conformance` runs the whole grid on 2.3 and 1.20)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from conformance import CI_CELLS, FLIP547_VERSION, CellFailure, Conformance

pytestmark = pytest.mark.flink


@pytest.fixture(scope="module")
def conformance():
    with tempfile.TemporaryDirectory(prefix="ckpt-conformance-") as tmp:
        yield Conformance(FLIP547_VERSION, Path(tmp))


@pytest.mark.parametrize("topology, old, new", CI_CELLS, ids=[f"{t}-{o}-{n}" for t, o, n in CI_CELLS])
def test_cell(conformance, topology, old, new):
    """Real Flink writes the checkpoint under backpressure, ckpt rescales it as a user would, Flink's
    classes find every record where it belongs, and Flink restores it with every record exactly once."""
    try:
        conformance.cell(topology, old, new)
    except CellFailure as failure:
        pytest.fail(str(failure))


@pytest.mark.parametrize("topology, old, new", CI_CELLS, ids=[f"{t}-{o}-{n}" for t, o, n in CI_CELLS])
def test_cell_flip547(conformance, topology, old, new):
    """The column "2.3 FLIP-547": ckpt's output of the same cell (shared with test_cell) restored
    by Flink 2.3 with checkpointing during recovery and output recovered on the downstream side,
    with every record exactly once."""
    try:
        conformance.cell(topology, old, new, flip547=True)
    except CellFailure as failure:
        pytest.fail(str(failure))


def output_side_only(source, sink: str, upstream: str, destination: Path) -> None:
    """``source`` with the sink's in-flight input moved to the front of its upstream's output
    state for the same logical channels, and the sink's then empty subtask state dropped: the same
    in-flight records, but a stateless sink without subtask state in the metadata, as Flink writes
    it when the data still waits in the upstream's output buffers."""
    import copy

    from ckpt_tool.flink.channel_state import BufferSource, ChannelStateReader, write_channel_state_file
    from ckpt_tool.flink.checkpoint import Checkpoint
    from ckpt_tool.flink.model import INPUT, OUTPUT, ChannelStateHandle, WrittenFileHandle
    from ckpt_tool.storage import io_for
    from ckpt_tool.writer import write_checkpoint

    checkpoint = Checkpoint.open(str(source.checkpoint))
    metadata = copy.deepcopy(checkpoint.metadata)
    sink_state, up_state = metadata.operator(sink), metadata.operator(upstream)
    streams: dict[tuple[int, int], bytes] = {}
    written = set()
    with ChannelStateReader() as reader:
        for s in sink_state.subtasks:
            assert not (s.managed_keyed or s.managed_operator or s.channel_handles(OUTPUT)), "a stateless sink"
            for h in s.channel_handles(INPUT):
                streams[(h.info[1], s.index)] = reader.payload(BufferSource.of(checkpoint, h))
        for s in up_state.subtasks:
            kept = []
            for h in s.channel_handles(OUTPUT):
                if h.info[0] == 0:
                    key = (s.index, h.info[1])
                    streams[key] = streams.get(key, b"") + reader.payload(BufferSource.of(checkpoint, h))
                else:
                    kept.append(h)
            pieces = [(d, data) for (u, d), data in sorted(streams.items()) if u == s.index]
            if pieces:
                name = f"moved-output-{s.index}"
                writer = write_channel_state_file(io_for(str(destination)), str(destination / name), pieces, 4096)
                written.add(name)
                delegate = WrittenFileHandle(name, writer.size)
                kept += [
                    ChannelStateHandle(OUTPUT, s.index, (0, d), writer.placements[d].offsets, writer.placements[d].size, delegate)
                    for d, _ in pieces
                ]
            s.input_channels, s.output_channels = s.channel_handles(INPUT), kept
    sink_state.subtasks = []
    write_checkpoint(checkpoint, metadata, str(destination), {}, already_written=frozenset(written))


def test_stateless_sink_without_subtask_state(conformance):
    """The case users hit: the sink at parallelism 1 has no subtask state at all, its in-flight
    data waits in the upstream's output buffers, and the upstream is rescaled (3 -> 5). The derived
    checkpoint is first restored as it is (Flink accepts it and counts exactly), then rescaled."""
    from conformance import Capture

    source = conformance.capture("stateless_sink", 3)
    ids = {op["uid"]: op["id"] for v in source.graph["vertices"] for op in v["operators"]}
    derived = conformance.work / "output-side-only" / source.checkpoint.parent.name / source.checkpoint.name
    output_side_only(source, ids["sink"], ids["per-region"], derived)
    reading = conformance.read(derived, source.plan.parent / "graph.json")
    assert reading["operators"][ids["sink"]]["subtask_states"] == 0
    moved = Capture(derived, source.graph, source.plan, source.log, reading)
    conformance.cell("stateless_sink", 3, 3, moved, "-derived")  # Flink itself restores it exactly
    conformance.cell("stateless_sink", 3, 5, moved, "-derived")


def test_chain_through_a_checkpoint_taken_during_recovery(conformance):
    """ckpt rescales 2 -> 3; Flink 2.3 restores that with FLIP-547 on and completes a checkpoint
    while restored in-flight records are still in flight; ckpt rescales that checkpoint 3 -> 2;
    Flink restores it with FLIP-547 on: every id exactly once over the three runs."""
    from conformance import CHAIN

    try:
        held = conformance.chain(*CHAIN)
    except CellFailure as failure:
        pytest.fail(str(failure))
    assert 0 < held["still_in_flight"] <= held["restored_in_flight"]
