"""Rescales of metadata version 3 (Flink 1.15), which holds one keyed handle per subtask: where a new
subtask takes key groups of several old ones, ckpt merges their blocks into one new file.

A rescaled checkpoint's handles are views of part of an old file (its offsets list only some of
the file's key groups, the first past blocks of others). Rescaling such a checkpoint again had been
refused ("describe their states differently": each view's bytes before its first offset were taken
for the file's header); blocks are now cut where the file's next key group starts, as all the old
handles list them together. Real Flink restores each output with the exact count."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import flink_env
from catalog import fixture_named
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.metadata import read_metadata, write_metadata
from ckpt_tool.flink.model import KeyGroupsHandle

FORMATS = {"hashmap": "flink115-hashmap-p2", "canonical": "flink115-rocksdb-full-p2"}


def keyed_sizes(checkpoint: Path) -> list[int]:
    metadata = Checkpoint.open(str(checkpoint)).metadata
    handles = [s.managed_keyed for op in metadata.operators for s in op.subtasks if s.managed_keyed]
    assert handles and all(isinstance(h, KeyGroupsHandle) for h in handles)
    return [h.delegate.size for h in handles]


def rescaled(ckpt, fixture, source: Path, destination: Path, parallelism: int) -> Path:
    inputs = ["--plan", fixture.plan, "--schema", fixture.schema, "--engine", "local"]
    code, _, err = ckpt("rescale", source, destination, "-p", str(parallelism), *inputs)
    assert code == 0, err
    return destination


def without_keyed_state(source: Path, destination: Path, subtask: int) -> Path:
    """A copy whose keyed operator's ``subtask`` has no keyed state (a subtask that registered none)."""
    shutil.copytree(source, destination)
    metadata = read_metadata((destination / "_metadata").read_bytes())
    state = next(s for op in metadata.operators for s in op.subtasks if s.managed_keyed and s.index == subtask)
    state.managed_keyed = None
    (destination / "_metadata").write_bytes(write_metadata(metadata))
    return destination


@pytest.mark.flink
@pytest.mark.parametrize("form", list(FORMATS))
def test_a_rescaled_checkpoint_rescales_again_and_restores(ckpt, tmp_path, form):
    fixture = fixture_named(FORMATS[form])
    six = rescaled(ckpt, fixture, fixture.checkpoint, tmp_path / "p6" / "chk-1", 6)
    two = rescaled(ckpt, fixture, six, tmp_path / "p2" / "chk-1", 2)
    # each new subtask's file is its old one again: the blocks are cut where the next key group starts
    assert keyed_sizes(two) == keyed_sizes(fixture.checkpoint)
    info = fixture.info
    assert flink_env.restore_count("1.20.3", two, 2, backend=info["backend"], timeout=300) == info["source_records"]


def test_hashmap_key_groups_no_old_subtask_holds_are_refused(ckpt, tmp_path):
    """The hashmap backend's file has a block for every key group; a merged file cannot leave some
    out, as Flink (with one handle per old subtask) can."""
    fixture = fixture_named(FORMATS["hashmap"])
    six = rescaled(ckpt, fixture, fixture.checkpoint, tmp_path / "p6" / "chk-1", 6)
    gap = without_keyed_state(six, tmp_path / "gap" / "chk-1", 1)
    inputs = ["--plan", fixture.plan, "--schema", fixture.schema, "--engine", "local"]
    code, _, err = ckpt("rescale", gap, tmp_path / "out" / "chk-1", "-p", "2", *inputs)
    assert code == 2 and "takes 21 of them (from 22) from no old subtask's keyed state" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.flink
def test_canonical_key_groups_no_old_subtask_holds_restore_as_flink_restores_them(ckpt, tmp_path):
    """The canonical format writes offset 0 for an empty key group: the gap is left empty, and
    Flink counts the same records in ckpt's output (1.20.3) as in its own rescale of the input (2.3:
    1.20.3 fails to rescale it, "Cannot get old subtasks from a descriptor that represents no state",
    as in the README's "Flink versions"; 1.15.4 counts the same, by hand)."""
    fixture = fixture_named(FORMATS["canonical"])
    six = rescaled(ckpt, fixture, fixture.checkpoint, tmp_path / "p6" / "chk-1", 6)
    gap = without_keyed_state(six, tmp_path / "gap" / "chk-1", 1)
    two = rescaled(ckpt, fixture, gap, tmp_path / "p2" / "chk-1", 2)
    backend = fixture.info["backend"]
    flinks = flink_env.restore_count("2.3.0", gap, 2, backend=backend, timeout=300)
    assert flinks < fixture.info["source_records"]  # the dropped subtask's counts are gone
    assert flink_env.restore_count("1.20.3", two, 2, backend=backend, timeout=300) == flinks
