"""The ckpt command: inspect output against Flink's figures, and clean errors on bad input."""

from __future__ import annotations

import json
import shutil

import pytest

from catalog import ALL_FIXTURES, COUNTJOB_SCHEMA
from ckpt_tool import __version__

OPERATOR_KEYS = ("id", "uid", "name", "parallelism", "max_parallelism", "finished", "channel_state")


def test_version_and_help(ckpt):
    code, out, _ = ckpt("--version")
    assert code == 0 and __version__ in out
    code, out, _ = ckpt("--help")
    assert code == 0 and "inspect" in out


def test_inspect_json_matches_flink(ckpt, fixture):
    code, out, err = ckpt("inspect", "--json", str(fixture.checkpoint))
    assert code == 0, err
    got = json.loads(out)
    assert got["checkpoint_id"] == fixture.expected["checkpoint_id"]
    assert got["metadata_version"] == fixture.expected["metadata_version"]
    want = {op["id"]: {k: op[k] for k in OPERATOR_KEYS} for op in fixture.expected["operators"]}
    assert {op["id"]: {k: op[k] for k in OPERATOR_KEYS} for op in got["operators"]} == want


def test_inspect_tables(ckpt, fixture):
    code, out, _ = ckpt("inspect", str(fixture.checkpoint))
    assert code == 0
    assert "Operators" in out and str(fixture.expected["checkpoint_id"]) in out


def test_inspect_accepts_the_metadata_file_and_file_uri(ckpt):
    fixture = ALL_FIXTURES[0]
    for target in (str(fixture.metadata_file), "file://" + str(fixture.checkpoint)):
        code, out, _ = ckpt("inspect", "--json", target)
        assert code == 0 and json.loads(out)["checkpoint_id"] == fixture.expected["checkpoint_id"]


@pytest.fixture
def broken(tmp_path):
    """A writable copy of a fixture's job directory, and its checkpoint directory."""
    from catalog import fixture_named

    fixture = fixture_named("flink115-hashmap-p2")  # the CountJob schema fits it (both sources)
    job_dir = fixture.checkpoint.parent
    shutil.copytree(job_dir, tmp_path / job_dir.name)
    return tmp_path / job_dir.name / fixture.checkpoint.name


def assert_clean_error(code: int, out: str, err: str, fragment: str) -> None:
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckpt: error: "), err
    assert "Traceback" not in err
    assert fragment in lines[0]


def test_not_a_checkpoint(ckpt, tmp_path):
    assert_clean_error(*ckpt("inspect", str(tmp_path)), "is not a checkpoint")


def test_wrong_magic(ckpt, broken):
    data = bytearray((broken / "_metadata").read_bytes())
    data[0] ^= 0xFF
    (broken / "_metadata").write_bytes(bytes(data))
    assert_clean_error(*ckpt("inspect", str(broken)), "magic number")


def test_unsupported_version(ckpt, broken):
    data = bytearray((broken / "_metadata").read_bytes())
    data[4:8] = (2).to_bytes(4, "big")  # MetadataV2Serializer (Flink 1.9, 1.10)
    (broken / "_metadata").write_bytes(bytes(data))
    assert_clean_error(*ckpt("inspect", str(broken)), "version 2; supported versions are 3, 4, 5, 6")


@pytest.mark.parametrize("keep", [0, 3, 7, 20, 61, 200, 0.5, 0.9])
def test_truncated_metadata(ckpt, broken, keep):
    data = (broken / "_metadata").read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep
    (broken / "_metadata").write_bytes(data[:cut])
    code, out, err = ckpt("inspect", str(broken))
    assert_clean_error(code, out, err, "")
    assert "truncated" in err or "not a Flink checkpoint" in err or "missing checkpoint properties" in err


def test_missing_channel_state_file(ckpt, broken):
    from ckpt_tool.flink.checkpoint import Checkpoint

    checkpoint = Checkpoint.open(str(broken))
    victim = next(u for u in checkpoint.referenced_files() if not u.endswith("_metadata"))
    shutil.os.remove(victim)
    # inspect is the tool for diagnosing such a checkpoint: everything readable is shown, then exit 2
    code, out, err = ckpt("inspect", str(broken))
    assert_clean_error(code, "", err, "is missing")
    # the problem's line may wrap (the victim's path is long under a test worker's tmp directory)
    assert "Operators" in out and f"problem:{victim}ismissing" in "".join(out.split())
    code, out, err = ckpt("inspect", "--json", str(broken), "--schema", str(COUNTJOB_SCHEMA))
    report = json.loads(out)
    assert code == 2 and report["operators"] and any("is missing" in p for p in report["problems"])
    assert any(e["problem"] for e in report["exchanges"]), "the exchange reading the missing file says so"


def test_verbose_shows_traceback(ckpt, tmp_path):
    code, _, err = ckpt("--verbose", "inspect", str(tmp_path))
    assert code == 2 and "Traceback" in err


def test_unknown_handle_type_names_tag_operator_and_subtask(ckpt, tmp_path):
    """A handle type ckpt does not know exits 2, naming its tag and the operator and subtask
    holding it (here: the keyed state of slow-count's subtask 1 in Flink 2.3's checkpoint)."""
    from catalog import fixture_named
    from ckpt_tool.flink.metadata import read_metadata, write_metadata

    fixture = fixture_named("flink23-hashmap-p2")
    job_dir = fixture.checkpoint.parent
    shutil.copytree(job_dir, tmp_path / job_dir.name)
    target = tmp_path / job_dir.name / fixture.checkpoint.name
    metadata = read_metadata(fixture.metadata_file.read_bytes())
    operator = next(op for op in metadata.operators if op.uid == "slow-count")
    keyed = next(s for s in operator.subtasks if s.index == 1).managed_keyed
    assert keyed is not None
    keyed.tag = 99  # written as the handle's type byte, followed by its unchanged body
    (target / "_metadata").write_bytes(write_metadata(metadata))
    assert_clean_error(
        *ckpt("inspect", str(target)),
        f"unknown keyed state handle type tag 99 in operator {operator.id_hex} "
        f'(uid "slow-count", name "{operator.name}") subtask 1',
    )


def test_newer_metadata_version_is_refused_naming_it(ckpt, broken):
    data = bytearray((broken / "_metadata").read_bytes())
    data[4:8] = (7).to_bytes(4, "big")  # the next version a newer Flink would write
    (broken / "_metadata").write_bytes(bytes(data))
    code, out, err = ckpt("verify", str(broken))
    assert_clean_error(code, out, err, "metadata version 7 (newer than this ckpt knows")
    assert "supported versions are 3, 4, 5, 6" in err


def test_inspect_json_is_written_subtask_by_subtask_with_the_same_text(fixture):
    """`inspect --json` writes each operator's subtasks one at a time (a job at parallelism 4,096
    lists 16 million channels): the text is json.dumps's of the whole report."""
    from ckpt_tool.ops.inspect import inspect, write_json
    from ckpt_tool.session import Session

    with Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan) as session:
        report = inspect(session)
    pieces: list[str] = []
    write_json(report.as_dict(streamed=True), pieces.append)
    assert "".join(pieces) == json.dumps(report.as_dict())


def test_inspect_json_summary_is_the_full_report_without_its_channel_rows(ckpt):
    """`inspect --json --summary` leaves out the rows of single channels (p² of them at
    parallelism p): every subtask's and exchange's ``channels`` is null, all else is the same."""
    from catalog import fixture_named

    fixture = fixture_named("flink23-maxp4096-p2")
    args = ("inspect", "--json", fixture.checkpoint, "--plan", fixture.plan, "--schema", COUNTJOB_SCHEMA)
    code, out, err = ckpt(*args)
    assert code == 0, err
    full = json.loads(out)
    assert any(s["channels"] for o in full["operators"] for s in o["subtasks"])
    assert any(e["channels"] for e in full["exchanges"]) and any(e["records"] for e in full["exchanges"])
    for operator in full["operators"]:
        for subtask in operator["subtasks"]:
            subtask["channels"] = None
    for exchange in full["exchanges"]:
        exchange["channels"] = None
    code, out, err = ckpt(*args, "--summary")
    assert code == 0, err
    assert out == json.dumps(full) + "\n"  # the same keys in the same order
    code, out, err = ckpt("inspect", fixture.checkpoint, "--summary")  # the tables have no such rows
    assert code == 2 and out == "" and "--summary applies to --json" in err


def test_channel_totals_sum_the_channels_without_opening_handles(fixture):
    """`inspect` past a thousand channels shows a row per subtask and direction, summed from the
    handles (merged ones unopened: 23 s to 1.8 s at p=4,096 dense): the sums of its channels."""
    from ckpt_tool.ops.inspect import inspect
    from ckpt_tool.session import Session

    with Session.open(str(fixture.checkpoint)) as session:
        report = inspect(session)
    for operator in report.operators:
        for subtask in operator.subtasks:
            expected: dict[str, tuple] = {}
            for ch in subtask.channels:
                channels, buffers, size, files = expected.get(ch.direction, (0, 0, 0, frozenset()))
                expected[ch.direction] = (channels + 1, buffers + ch.buffers, size + ch.bytes, files | {ch.file})
            totals = subtask.channel_totals()
            assert {d: (t.channels, t.buffers, t.bytes, frozenset(t.files)) for d, t in totals.items()} == expected
