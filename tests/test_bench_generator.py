"""The benchmark's generated checkpoints are valid: real Flink restores a small one exactly."""

import json
import sys
from pathlib import Path

import pytest

import flink_env

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from generate import generate


@pytest.mark.flink
def test_generated_checkpoint_restores_with_exact_count(tmp_path):
    checkpoint = tmp_path / "job" / "chk-3"
    info = generate(checkpoint, 3, 1_500_000)
    assert info["generated_records"] > 5000
    assert json.loads((tmp_path / "job" / "chk-3.json").read_text()) == info
    # written as Flink 2.3 writes them: each subtask's channels of one file in one merged handle
    from ckpt_tool.flink.checkpoint import Checkpoint
    from ckpt_tool.flink.model import MergedChannelStateHandle

    slow = Checkpoint.open(str(checkpoint)).metadata.operator("slow-count")
    merged = [h for s in slow.subtasks for h in s.input_channels]
    assert info["handles"] == "merged" and all(isinstance(h, MergedChannelStateHandle) for h in merged)
    assert {h.delegate.relative_path for h in merged} >= {f"bench-inflight-{i}-0" for i in range(3)}
    assert flink_env.restore_count("2.3.0", checkpoint, 3, backend="hashmap") == info["expected_count"]


@pytest.mark.flink
@pytest.mark.parametrize("old, new, total", [(4, 3, 2_000_000), (8, 2, 6_000_000)])
def test_generated_checkpoint_rescaled_as_the_benchmark_does_restores_exactly(tmp_path, old, new, total):
    """The benchmark's path in small: P=4 -> 3 through ckpt's route tasks, then a Flink restore.
    And 8 -> 2: new channels of many buffers each, streamed: the route tasks' pieces (an old
    channel and a target each) go to the writer a target at a time (``Pieces.by_target``), as in
    a large rescale down."""
    from generate import FIXTURE, SCHEMA

    from ckpt_tool.flink.channel_state import BUFFER_SIZE
    from ckpt_tool.ops.rescale import rescale
    from ckpt_tool.session import Session

    source = tmp_path / "src" / "job" / "chk-3"
    info = generate(source, old, total)
    target = tmp_path / "out" / "job" / "chk-3"
    session = Session.open(str(source), str(SCHEMA), str(FIXTURE / "plan.json"), "local")
    report = rescale(session, str(target), new).as_dict()
    assert report["inflation"] == 1.0 and report["records_in"] >= info["generated_records"]
    if new == 2:
        assert info["channel_state_bytes"] / (new * new) > 8 * BUFFER_SIZE  # no new channel fits one buffer
    assert flink_env.restore_count("2.3.0", target, new, backend="hashmap") == info["expected_count"]


@pytest.mark.parametrize("handles", [None, "plain"])
def test_sparse_channels_from_the_large_max_parallelism_fixture(tmp_path, handles):
    """Above p=128 the generator starts from flink23-maxp4096-p2; sparse fills one channel in ten,
    every subtask owns a key, and the metadata reads back channel by channel. Its channel handles
    are merged as the fixture's (one per subtask and file), or plain where asked."""
    from generate import LARGE_FIXTURE, filled

    from ckpt_tool.flink.checkpoint import Checkpoint
    from ckpt_tool.flink.metadata import channel_handle_form
    from ckpt_tool.flink.model import INPUT, MergedChannelStateHandle

    checkpoint = tmp_path / "job" / "chk-3"
    info = generate(checkpoint, 12, 200_000, channels="sparse", base=LARGE_FIXTURE, handles=handles)
    assert (info["max_parallelism"], info["channels"], info["base"]) == (4096, "sparse", "flink23-maxp4096-p2")
    metadata = Checkpoint.open(str(checkpoint)).metadata
    assert channel_handle_form(metadata) == info["handles"] == (handles or "merged")
    slow = metadata.operator("slow-count")
    generated = {(h.info[1], s.index) for s in slow.subtasks for h in s.channel_handles(INPUT) if h.info[0] == 0}
    wanted = {(u, d) for u in range(12) for d in range(12) if filled(u, d, 12, "sparse")}
    assert wanted <= generated and len(wanted) == 15
    if handles is None:  # one merged handle per subtask and file: bench-inflight-<subtask>-0 holds all its generated channels
        for s in slow.subtasks:
            files = [h.delegate.relative_path for h in s.input_channels if isinstance(h, MergedChannelStateHandle)]
            assert len(files) == len(set(files))


def test_inspect_text_sums_channels_per_subtask_past_a_thousand(tmp_path, ckpt):
    """At parallelism 40 dense the keyed exchange has 1,600 channel handles: the text report sums
    them per subtask and direction (``--json`` still lists each), under the thousand-row limit."""
    checkpoint = tmp_path / "job" / "chk-3"
    generate(checkpoint, 40, 400_000)
    code, out, err = ckpt("inspect", str(checkpoint))
    assert code == 0, err
    assert "Channel state per subtask (" in out and "channels; --json lists each)" in out
    assert "Channel state per subtask and channel" not in out
    code, out, err = ckpt("inspect", str(checkpoint), "--json")
    listed = sum(len(s["channels"]) for o in json.loads(out)["operators"] for s in o["subtasks"])
    assert code == 0 and listed > 1000
    assert f"({listed} channels; --json lists each)" in ckpt("inspect", str(checkpoint))[1]

    # with the records: the keyed exchange's 1,600 channels as a row per downstream subtask
    from generate import FIXTURE, SCHEMA

    from ckpt_tool.ops.inspect import inspect
    from ckpt_tool.session import Session

    inputs = ("--plan", str(FIXTURE / "plan.json"), "--schema", str(SCHEMA))
    code, out, err = ckpt("inspect", str(checkpoint), *inputs)
    assert code == 0, err
    assert "(gate 0, HASH), per downstream subtask (1600 channels; --json lists each)" in " ".join(out.split())
    with Session.open(str(checkpoint), str(SCHEMA), str(FIXTURE / "plan.json"), "local") as session:
        scan = next(e for e in inspect(session).exchanges or [] if len(e.figures) == 1600)
    rows = scan.as_dict()["channels"]
    sums = scan.per_downstream()
    assert sums["downstream_subtask"].tolist() == list(range(40)) and sums["channels"].tolist() == [40] * 40
    for name, key in [
        ("records", "records"),
        ("bytes", "bytes"),
        ("input_buffers", "input_buffers"),
        ("trailing_bytes", "partial_bytes"),
    ]:
        assert sums[name].tolist() == [sum(r[key] for r in rows if r["downstream_subtask"] == d) for d in range(40)]


def test_records_of_many_channels_are_written_in_few_row_groups(tmp_path):
    """`ckpt records` runs in engine tasks of a bounded byte budget, not a task and a part file per
    logical channel (16.8 million at p=4,096 dense): at p=40 dense, 1,600 channels come out in a
    few row groups, every record once, in channel order (by downstream subtask, then upstream: a
    downstream subtask's input channels lie in one file, which a block of them reads once)."""
    import pyarrow.parquet as pq
    from generate import FIXTURE, SCHEMA

    from ckpt_tool.engine import LocalEngine
    from ckpt_tool.ops.records import export_records
    from ckpt_tool.session import Session

    checkpoint = tmp_path / "job" / "chk-3"
    info = generate(checkpoint, 40, 400_000)
    out = tmp_path / "records.parquet"
    with Session.open(str(checkpoint), str(SCHEMA), str(FIXTURE / "plan.json"), LocalEngine(2)) as session:
        report = export_records(session.checkpoint, session.described_exchanges, session.engine, str(out))
    rows = pq.read_table(out, columns=["exchange", "upstream_subtask", "downstream_subtask", "element_index"]).to_pylist()
    assert report.records == len(rows) >= info["generated_records"] and report.channels >= 1600
    assert pq.ParquetFile(out).num_row_groups <= 16
    exchanges = [r["exchange"] for r in rows]
    assert exchanges == sorted(exchanges, key=exchanges.index)  # each exchange's rows together
    for exchange in set(exchanges):
        order = [(r["downstream_subtask"], r["upstream_subtask"], r["element_index"]) for r in rows if r["exchange"] == exchange]
        assert order == sorted(set(order))  # by (downstream, upstream): each file read once a block; each record once


def test_the_scale_bench_reads_a_commands_output_through_a_pipe_and_counts_it():
    """bench/scale.py's ``timed`` counts what a command prints, read as a consumer reads it (not
    taken into a file's pages, which on a small VM cost more than the command), and a command that
    also writes much to stderr does not stall on a full pipe."""
    from scale import timed

    printing = "import sys; sys.stdout.write('x' * 5_000_000); sys.stderr.write('e' * 300_000)"
    result = timed([sys.executable, "-c", printing])
    assert result["out_mb"] == 5.0
    assert result["cpu_s"] >= result["sys_s"] >= 0 and result["wall_s"] > 0
    with pytest.raises(RuntimeError, match=r"exit code 3: e+$"):
        timed([sys.executable, "-c", "import sys; sys.stderr.write('e' * 10); sys.exit(3)"])
