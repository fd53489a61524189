"""What an operator sees: the installed command from anywhere, quiet and honest reports, readable tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from catalog import COUNTJOB_SCHEMA, fixture_named
from ckpt_tool.cli.output import RichOutput
from ckpt_tool.ops.inspect import inspect
from ckpt_tool.session import Session

BASE = fixture_named("flink23-hashmap-p2")
INPUTS = ["--plan", BASE.plan, "--schema", str(COUNTJOB_SCHEMA)]
CKPT = Path(sys.executable).parent / "ckpt"  # the console script pip installed


def run_installed(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The installed ckpt, by absolute path, from another directory, with no virtualenv activated."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    return subprocess.run([str(CKPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("engine", [[], ["--engine", "spark", "--spark-master", "local[2]"]], ids=["default", "spark"])
def test_installed_binary_runs_from_anywhere_and_quietly(tmp_path, engine):
    destination = tmp_path / "out" / "job" / BASE.checkpoint.name
    result = run_installed("rescale", str(BASE.checkpoint), str(destination), "-p", "3", "--json", *INPUTS, *engine, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", "Spark's start-up lines stay silent without --verbose"
    report = json.loads(result.stdout)
    assert report["records_out"] == report["records_in"] > 0
    assert report["engine"] == ("spark" if engine else "local")  # auto: a small checkpoint runs in-process


def test_dry_run_is_quick_in_process_and_shows_real_figures(ckpt, tmp_path):
    code, out, err = ckpt("rescale", str(BASE.checkpoint), str(tmp_path / "dry"), "-p", "3", "--dry-run", "--json", *INPUTS)
    assert code == 0, err
    report = json.loads(out)
    assert report["dry_run"] and report["estimated"] and report["engine"] == "local"
    assert report["records_in"] == 536 and report["records_out"] == 536 and not (tmp_path / "dry").exists()
    code, out, _ = ckpt("rescale", str(BASE.checkpoint), str(tmp_path / "dry"), "-p", "3", "--dry-run", *INPUTS)
    assert "536 out (estimated)" in out


def test_footer_counts_what_was_carried_and_dropped(ckpt, tmp_path):
    code, out, err = ckpt("rescale", str(BASE.checkpoint), str(tmp_path / "same"), "-p", "2", *INPUTS)
    assert code == 0, err
    assert "records 0 in, 0 out" in out and "carried unchanged 26 buffers" in out
    code, out, err = ckpt("repair", str(BASE.checkpoint), str(tmp_path / "dropped"), "--drop-in-flight", "slow-count", *INPUTS)
    assert code == 0, err
    assert "dropped 536 records" in out


@pytest.mark.parametrize("where", ["inside", "around", "file"])
def test_destinations_flink_would_delete_or_that_cannot_hold_a_checkpoint(ckpt, tmp_path, where):
    import shutil

    job = tmp_path / "job"
    shutil.copytree(BASE.checkpoint.parent, job)
    source = job / BASE.checkpoint.name
    destination = {"inside": source / "rescaled", "around": tmp_path, "file": tmp_path / "plain.txt"}[where]
    if where == "file":
        destination.write_text("x")
    code, out, err = ckpt("rescale", str(source), str(destination), "-p", "3", *INPUTS)
    message = {"inside": "is inside the source checkpoint", "around": "contains the source checkpoint", "file": "is a file"}
    assert code == 2 and message[where] in err and out == ""
    assert not (source / "rescaled").exists()


def test_verify_names_what_it_skipped_and_strict_fails_it(ckpt):
    code, out, _ = ckpt("verify", str(BASE.checkpoint), "--json")
    report = json.loads(out)
    assert code == 0 and report["status"] == "sound"
    assert "4 of 14 checks skipped" in report["summary"] and "needs --plan or --schema" in report["summary"]
    target = next(c for c in report["checks"] if c["name"] == "target-parallelism")
    assert target["skipped"] == "needs --target-parallelism N" and "None" not in target["description"]
    code, out, _ = ckpt("verify", str(BASE.checkpoint), "--json", "--strict")
    report = json.loads(out)
    assert code == 1 and report["status"] == "problems"
    assert {p["check"] for p in report["problems"]} == {"record-framing", "key-groups", "record-replicas", "target-parallelism"}
    code, out, _ = ckpt("verify", str(BASE.checkpoint), "--strict", "--target-parallelism", "3", *INPUTS)
    assert code == 0 and "status: sound" in out and "skipped" not in out.splitlines()[-1]


def test_names_and_figures_stay_readable_at_80_columns(capsys):
    report = inspect(Session.open(str(BASE.checkpoint), str(COUNTJOB_SCHEMA), BASE.plan, "local"))
    RichOutput(width=80).inspect(report)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    for op in report.operators:
        assert op.id in out and (op.name or "") in out
    assert "…" not in out
