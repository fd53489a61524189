"""A job restored in CLAIM mode (fixtures/flink23-rocksdb-claim-p2: Flink 2.3, RocksDB incremental):
its checkpoint references SST files of the job it was restored from, in that job's ``shared/``
directory beside its own, by absolute path. The fixture keeps both job directories side by side, as
a copy of the whole checkpoints directory does. ckpt reads the other job's files there (not where
Flink first wrote them, which does not exist here), its figures are those of Flink's own classes,
and real Flink restores ckpt's rescale and repair of it with the exact count, reading those files
where ckpt found them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import boto3
import pytest
from test_channels_fixtures import assert_channels_match_flink
from test_flink_restore import REFERENCE_KEYS, assert_reference_current

import flink_env
from catalog import CLAIMED
from ckpt_tool.errors import EXIT_UNUSABLE_INPUT
from ckpt_tool.flink.checkpoint import Checkpoint

(CLAIM,) = CLAIMED


def _remove_where_flink_wrote() -> Path:
    """Nothing at the paths Flink wrote (the generator's scratch directory, which a restore of the
    fixture stages): the checkpoints directory Flink wrote."""
    original = Path(CLAIM.info["original_job_dir"]).parent
    if original.exists():
        shutil.rmtree(original)
    return original


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """The fixture's checkpoints directory copied to ``tmp_path``, with nothing at the paths Flink
    wrote: the copy's checkpoint."""
    _remove_where_flink_wrote()
    copy = tmp_path / "checkpoints"
    shutil.copytree(CLAIM.directory, copy)
    return copy / CLAIM.info["checkpoint"]


def test_the_checkpoint_references_the_files_of_the_job_it_was_restored_from():
    checkpoint = Checkpoint.open(str(CLAIM.checkpoint))
    files = checkpoint.referenced_files()
    for other in CLAIM.info["claimed_job_dirs"]:
        beside = str(CLAIM.directory / other) + "/shared/"
        assert any(f.startswith(beside) for f in files), f"no file of {other} is referenced"
        written = f"{Path(CLAIM.info['original_job_dir']).parent}/{other}/"
        assert written.encode() in CLAIM.metadata_file.read_bytes()  # Flink wrote the other job's path
    assert not list(checkpoint.file_problems())


def test_its_logical_channels_are_those_flinks_classes_count():
    assert_channels_match_flink(CLAIM)


def test_verify_reads_the_other_jobs_files_beside_the_copy(ckpt, elsewhere: Path):
    code, out, _ = ckpt("verify", elsewhere, "--plan", CLAIM.plan, "--schema", CLAIM.schema, "--json")
    report = json.loads(out)
    assert code == 0 and report["status"] == "sound", report
    files = {c["name"]: c for c in report["checks"]}["files"]
    assert files["status"] == "passed" and files["problems"] == 0


def test_without_the_other_job_beside_it_the_missing_files_are_named(ckpt, tmp_path: Path):
    original = _remove_where_flink_wrote()
    job = tmp_path / "only" / CLAIM.checkpoint.parent.name
    shutil.copytree(CLAIM.checkpoint.parent, job)
    code, _, err = ckpt("rescale", job / CLAIM.checkpoint.name, tmp_path / "out", "-p", "3", "--plan", CLAIM.plan)
    assert code == EXIT_UNUSABLE_INPUT
    assert f"{original}/{CLAIM.info['claimed_job_dirs'][0]}/shared/" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "_metadata").exists()


@pytest.mark.parametrize("command", ["rescale", "repair"])
def test_flink_restores_ckpts_output_reading_the_other_jobs_files_where_ckpt_found_them(ckpt, elsewhere: Path, command):
    out = elsewhere.parent.parent.parent / f"{command}-out"
    args = ["-p", "3"] if command == "rescale" else []
    code, _, err = ckpt(command, elsewhere, out, *args, "--plan", CLAIM.plan, "--schema", CLAIM.schema)
    assert code == 0, err
    beside = [str(elsewhere.parent.parent / other) + "/" for other in CLAIM.info["claimed_job_dirs"]]
    files = Checkpoint.open(str(out)).referenced_files()
    assert any(f.startswith(tuple(beside)) for f in files)
    assert all(f.startswith((str(out) + "/", *beside)) for f in files), files
    parallelism = 3 if command == "rescale" else CLAIM.info["parallelism"]
    count = flink_env.restore_count(CLAIM.info["flink_version"], out, parallelism, backend="rocksdb", job="tuple")
    assert count == CLAIM.info["source_records"]


def test_on_s3_the_other_jobs_files_are_read_beside_and_referenced_there(ckpt, s3_endpoint):
    """The checkpoints directory uploaded to S3 (moto's server): ``verify`` reads the other job's
    files beside the checkpoint's job directory, and the rescale written to S3 references them
    there, where ``verify`` of it finds them."""
    _remove_where_flink_wrote()
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="claim")
    for path in CLAIM.directory.rglob("*"):
        if path.is_file() and path.parent != CLAIM.directory:
            client.upload_file(str(path), "claim", f"checkpoints/{path.relative_to(CLAIM.directory)}")
    source = f"s3://claim/checkpoints/{CLAIM.info['checkpoint']}"
    code, out, _ = ckpt("verify", source, "--plan", CLAIM.plan, "--schema", CLAIM.schema, "--json")
    assert code == 0 and json.loads(out)["status"] == "sound", out
    output = "s3://claim/rescaled/job/chk-1"
    code, _, err = ckpt("rescale", source, output, "-p", "3", "--plan", CLAIM.plan, "--schema", CLAIM.schema, "--engine", "local")
    assert code == 0, err
    files = Checkpoint.open(output).referenced_files()
    beside = tuple(f"s3://claim/checkpoints/{other}/shared/" for other in CLAIM.info["claimed_job_dirs"])
    assert any(f.startswith(beside) for f in files)
    assert all(f.startswith((output + "/", *beside)) for f in files), files
    code, out, _ = ckpt("verify", output, "--json")
    assert code == 0 and json.loads(out)["status"] == "sound", out


def test_java_reference_figures_are_current():
    """Flink's own classes (the Java reference reader) on the committed fixture, with nothing at
    the paths Flink wrote, give the figures in expected.json."""
    _remove_where_flink_wrote()
    assert_reference_current(CLAIM, REFERENCE_KEYS + ("keyed_operators",))
