"""ckpt rescale: real Flink restores the output with the exact count, records neither lost nor doubled."""

from __future__ import annotations

import json

import pytest

import flink_env
from catalog import COUNTJOB_SCHEMA, RESTORABLE, tree_digest
from ckpt_tool.engine import LocalEngine
from ckpt_tool.exchanges import scan_exchanges
from ckpt_tool.flink.metadata import PLAIN, channel_handle_form, merging_gains
from ckpt_tool.flink.model import OUTPUT
from ckpt_tool.ops.rescale import rescale
from ckpt_tool.planning import RescaleError
from ckpt_tool.session import Session

SCHEMA = str(COUNTJOB_SCHEMA)
TUPLE_JOB = [f for f in RESTORABLE if f.info.get("job_kind", "tuple") == "tuple"]
BASES = [f for f in TUPLE_JOB if not f.info.get("restored_from")]
# each step rescales the previous step's output (the first step the fixture itself)
CASES = (
    [(f, [3, 2]) for f in BASES]
    + [(f, [1, 4, 1]) for f in BASES]
    + [(f, [2]) for f in TUPLE_JOB if f.info.get("restored_from")]  # written by Flink at parallelism 3
    + [(f, [3]) for f in RESTORABLE if f.info.get("job_kind") in ("pojo", "sql", "sqltypes", "javatime", "updates")]
)


def session_of(uri, fixture, engine) -> Session:
    return Session.open(str(uri), fixture.schema, fixture.plan, engine)


def run_path(fixture, steps, tmp_path, engine):
    """Rescale the fixture along ``steps``, each step from the previous step's output."""
    current = fixture.checkpoint
    for number, parallelism in enumerate(steps):
        destination = tmp_path / f"step{number}-p{parallelism}" / "job" / current.name
        report = rescale(session_of(current, fixture, engine), str(destination), parallelism)
        current = destination
        yield parallelism, session_of(destination, fixture, LocalEngine()), report.as_dict()


@pytest.mark.flink
@pytest.mark.parametrize(
    "base, steps", CASES, ids=[f"{f.name}:{f.info['parallelism']}-{'-'.join(map(str, s))}" for f, s in CASES]
)
def test_rescaled_checkpoints_restore_with_exact_count(base, steps, tmp_path, spark, record_multiset):
    fixture = base
    info = fixture.info
    before_tree = tree_digest(fixture.directory)
    source = session_of(fixture.checkpoint, fixture, LocalEngine())
    fixture_metadata = source.metadata
    before = record_multiset(source)
    assert sum(before.values()) > 0
    for parallelism, rescaled, report in run_path(fixture, steps, tmp_path, spark):
        assert report["inflation"] == 1.0 and report["records_out"] == report["records_in"] == sum(before.values())
        assert record_multiset(rescaled) == before
        for scan in scan_exchanges(rescaled.checkpoint, rescaled.exchanges, LocalEngine()):
            if scan.keyed:
                assert scan.total("misplaced_records") == 0 and scan.duplicate_records == 0
        # output-side data was recovered on the downstream side
        assert not any(
            s.channel_handles(OUTPUT) for op in rescaled.metadata.operators for s in op.subtasks if op.parallelism == parallelism
        )
        # channel state is written as Flink wrote it (merged handles from Flink 2.1 on, plain ones
        # before), except that merged handles of one channel each are written plain (no larger)
        written, source = channel_handle_form(rescaled.metadata), channel_handle_form(fixture_metadata)
        assert written == source or (written == PLAIN and not merging_gains(rescaled.metadata))
        count = flink_env.restore_count(info["flink_version"], rescaled.checkpoint.uri, parallelism, backend=info["backend"])
        assert count == info["source_records"], f"restore at parallelism {parallelism}"
    assert tree_digest(fixture.directory) == before_tree, "the input checkpoint was modified"


@pytest.mark.flink
def test_flink_1_20_3_cannot_rescale_the_checkpoint_ckpt_rescales():
    """What the README says of Flink 1.20.3: restored as it is at another parallelism, the fixture
    fails (its rescale by ckpt restores, above, in the same Flink)."""
    fixture = next(f for f in BASES if f.name == "flink120-hashmap-p2")
    assert fixture.info["flink_version"] == "1.20.3"
    with pytest.raises(RuntimeError, match="Cannot get old subtasks from a descriptor that represents no state"):
        flink_env.restore_count("1.20.3", fixture.checkpoint, 3, backend=fixture.info["backend"], timeout=300)


def channel_records(uri, fixture) -> dict:
    """Each channel's records (bytes joined, in order) by exchange, upstream and downstream subtask."""
    from ckpt_tool.engine.tasks import channel_tasks, read_channel
    from ckpt_tool.flink.channel_state import ChannelStateReader

    session = session_of(uri, fixture, LocalEngine())
    out = {}
    with ChannelStateReader() as reader:
        for task in channel_tasks(session.checkpoint, session.described_exchanges):
            records = read_channel(reader, task)
            chosen = records.is_record
            out[(task.exchange_index, task.upstream_subtask, task.downstream_subtask)] = bytes(records.framed(chosen))
    return out


@pytest.mark.flink
def test_a_large_channel_is_routed_a_piece_at_a_time_and_restores(tmp_path, monkeypatch):
    """A rescale to parallelism 1 makes one channel of all the in-flight data; a rescale or a
    ``repair`` of that output routes it a piece of PIECE_BUFFERS buffers at a time (above
    LARGE_CHANNEL_BYTES), not read whole. Forced here on every channel, a buffer at a time: each
    new channel holds the records, in the order, of the channel routed whole, the repaired copy
    is the same bytes, and real Flink restores the rescaled one with the exact count."""
    from ckpt_tool.engine import tasks
    from ckpt_tool.ops.repair import repair

    fixture = next(f for f in BASES if f.name == "flink23-hashmap-p2")
    one = tmp_path / "one" / "job" / fixture.checkpoint.name
    rescale(session_of(fixture.checkpoint, fixture, LocalEngine()), str(one), 1)
    outputs = {}
    for pieces in (False, True):
        if pieces:
            monkeypatch.setattr(tasks, "LARGE_CHANNEL_BYTES", 1)
            monkeypatch.setattr(tasks, "PIECE_BUFFERS", 1)
        rescaled = tmp_path / f"p3-{pieces}" / "job" / one.name
        repaired = tmp_path / f"repaired-{pieces}" / "job" / one.name
        report = rescale(session_of(one, fixture, LocalEngine()), str(rescaled), 3).as_dict()
        assert report["records_out"] == report["records_in"] > 0
        report = repair(session_of(one, fixture, LocalEngine()), str(repaired), []).as_dict()
        assert report["records_out"] == report["records_in"] > 0
        outputs[pieces] = (rescaled, repaired)
    (rescaled, repaired), (whole_rescaled, whole_repaired) = outputs[True], outputs[False]
    assert channel_records(rescaled, fixture) == channel_records(whole_rescaled, fixture)
    assert tree_digest(repaired.parent) == tree_digest(whole_repaired.parent)
    info = fixture.info
    assert flink_env.restore_count(info["flink_version"], rescaled, 3, backend=info["backend"]) == info["source_records"]


def test_repeated_rescales_keep_inflation_at_one(tmp_path, record_multiset):
    fixture = BASES[0]
    before = record_multiset(session_of(fixture.checkpoint, fixture, LocalEngine()))
    for _, rescaled, report in run_path(fixture, [1, 4, 1, 4, 1, 4], tmp_path, LocalEngine()):
        assert report["inflation"] == 1.0
        assert record_multiset(rescaled) == before


def test_refuses_forward_exchange_with_inflight_data(tmp_path):
    fixture = BASES[0]
    schema = tmp_path / "forward.toml"
    schema.write_text(COUNTJOB_SCHEMA.read_text().replace('partitioner = "HASH"', 'partitioner = "FORWARD"', 1))
    with pytest.raises(RescaleError, match="forward exchange pairs subtasks one to one"):
        rescale(Session.open(str(fixture.checkpoint), str(schema)), str(tmp_path / "out"), 3)


@pytest.mark.parametrize(
    "args, message",
    [
        (["-p", "129"], "above its max parallelism 128"),
        (["-p", "3", "--operator", "nope=2"], "no such operator"),
        ([], "give --parallelism N"),
    ],
)
def test_cli_refusals(ckpt, tmp_path, args, message):
    fixture = BASES[0]
    code, _, err = ckpt("rescale", str(fixture.checkpoint), str(tmp_path / "out"), "--engine", "local", "--schema", SCHEMA, *args)
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_cli_refuses_unknown_exchange(ckpt, tmp_path):
    code, _, err = ckpt("rescale", str(BASES[0].checkpoint), str(tmp_path / "out"), "-p", "3", "--engine", "local")
    assert code == 2 and "no exchange in --plan/--schema describes" in err


def test_cli_dry_run_writes_nothing_and_existing_destination_is_refused(ckpt, tmp_path):
    fixture = BASES[0]
    common = ["--engine", "local", "--schema", SCHEMA, "--plan", str(fixture.directory / "plan.json"), "-p", "3"]
    code, out, err = ckpt("rescale", str(fixture.checkpoint), str(tmp_path / "dry"), "--dry-run", "--json", *common)
    assert code == 0, err
    report = json.loads(out)
    assert report["dry_run"] and report["files_written"] == 0 and not (tmp_path / "dry").exists()
    code, out, err = ckpt("rescale", str(fixture.checkpoint), str(tmp_path / "real"), *common)
    assert code == 0, err
    assert "inflation 1.00" in out and (tmp_path / "real" / "_metadata").exists()
    code, _, err = ckpt("rescale", str(fixture.checkpoint), str(tmp_path / "real"), *common)
    assert code == 2 and "already exists" in err


@pytest.mark.flink
def test_merged_key_group_files_restore(tmp_path, monkeypatch):
    """The metadata-v3 path (Flink 1.15: no changelog handle) merges key-group files; forced here on
    a 1.20 checkpoint so that CI's Flink proves the merged files."""
    import ckpt_tool.rewrite as rewrite_module

    monkeypatch.setattr(rewrite_module, "CHANGELOG_HANDLE_SINCE", 99)
    fixture = next(f for f in BASES if f.name == "flink120-hashmap-p2")
    for parallelism, rescaled, _ in run_path(fixture, [1], tmp_path, LocalEngine()):
        keyed = [s.managed_keyed for op in rescaled.metadata.operators for s in op.subtasks if s.managed_keyed]
        assert keyed and all(type(h).__name__ == "KeyGroupsHandle" for h in keyed)
        count = flink_env.restore_count(fixture.info["flink_version"], rescaled.checkpoint.uri, parallelism, backend="hashmap")
        assert count == fixture.info["source_records"]


# Flink's MiniCluster at parallelism 128 needs more network buffers than its default 64 MiB: every
# input gate of 128 channels takes its exclusive buffers at once.
LARGE_PARALLELISM_CONF = {"taskmanager.memory.network.min": "512mb", "taskmanager.memory.network.max": "512mb"}


@pytest.mark.flink
def test_rescale_to_parallelism_128_at_max_parallelism_32768_restores(tmp_path):
    """A rescale across large key-group ranges (32,768 key groups, 256 per subtask at p=128): Flink's
    own classes (fixtures/java/ReferenceReader.java) find every in-flight record once, in its key
    group's subtask, and real Flink 2.3 restores it with the exact count."""
    from catalog import fixture_named

    fixture = fixture_named("flink23-maxp32768-p2")
    info, parallelism = fixture.info, 128
    destination = tmp_path / "p128" / "job" / fixture.checkpoint.name
    report = rescale(session_of(fixture.checkpoint, fixture, LocalEngine()), str(destination), parallelism).as_dict()
    keyed = fixture.expected["keyed_operators"][0]
    assert report["inflation"] == 1.0 and report["records_out"] == report["records_in"] >= keyed["records"] > 0

    operators = str(fixture.directory / "operators.json")
    result = flink_env.run_java(info["flink_version"], "ReferenceReader", [str(destination), operators])
    assert result.returncode == 0, result.stderr[-2000:]
    after = next(k for k in json.loads(result.stdout)["keyed_operators"] if k["operator"] == keyed["operator"])
    assert (after["parallelism"], after["max_parallelism"]) == (parallelism, 32768)
    assert after["records"] == keyed["records"] and after["misplaced_records"] == after["duplicate_records"] == 0
    assert [s["key_groups"] for s in after["subtasks"]] == [[256 * i, 256 * i + 255] for i in range(parallelism)]

    count = flink_env.restore_count(
        info["flink_version"], destination, parallelism, LARGE_PARALLELISM_CONF, backend=info["backend"]
    )
    assert count == info["source_records"]
