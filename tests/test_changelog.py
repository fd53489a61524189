"""The changelog state backend (state.changelog.enabled, file storage): a checkpoint Flink 2.3 wrote
with a materialized part and a non-empty changelog is shown as Flink reads it, verified, rescaled
2 -> 3 as Flink's ``ChangelogStateBackendHandle.getIntersection`` reassigns it, and real Flink
restores the rescale with the changelog backend on with the exact count. Its restores with the
backend off, of the rescale and of the repair, are its cell of the compatibility matrix
(tests/test_compat.py)."""

from __future__ import annotations

import json
import shutil

import pytest

import flink_env
from catalog import ALL_FIXTURES, fixture_named, tree_digest
from ckpt_tool.engine import LocalEngine
from ckpt_tool.flink.changelog import changelog_handles, read_change_set
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import ChangelogBackendHandle, ChangelogStreamHandle, KeyGroupsHandle
from ckpt_tool.ops.rescale import rescale
from ckpt_tool.records.keys import key_group_range
from ckpt_tool.session import Session

CHANGELOG = fixture_named("flink23-changelog-p2")
SLOW_COUNT = "0a6c3d247193df04622ad9b3b66741a5"
# The restoring job with the changelog backend on; Flink restores a changelog only in CLAIM mode
# ("does not support enforcing a full snapshot" in NO_CLAIM mode, for any checkpoint).
CHANGELOG_RESTORE = {
    "state.changelog.enabled": "true",
    "state.changelog.storage": "filesystem",
    "execution.state-recovery.claim-mode": "CLAIM",
}


def test_fixtures_name_their_feature():
    assert [f.name for f in ALL_FIXTURES if f.info.get("feature") == "changelog"] == ["flink23-changelog-p2"]


def test_inspect_shows_the_handles_flink_reads(ckpt):
    code, out, err = ckpt("inspect", "--json", str(CHANGELOG.checkpoint))
    assert code == 0, err
    operator = next(o for o in json.loads(out)["operators"] if o["id"] == SLOW_COUNT)
    shown = {s["index"]: s["changelog"] for s in operator["subtasks"]}
    for flink in CHANGELOG.expected["changelog"]:
        mine = shown[flink["subtask"]]
        for key in ("key_groups", "materialization_id", "checkpoint_id", "checkpointed_size"):
            assert mine[key] == flink[key], key
        assert [(m["kind"], m["key_groups"], m["bytes"]) for m in mine["materialized"]] == [
            (m["kind"], m["key_groups"], m["state_size"]) for m in flink["materialized"]
        ]
        assert [(c["kind"], c["key_groups"], c["bytes"], c["checkpointed_bytes"]) for c in mine["non_materialized"]] == [
            (c["kind"], c["key_groups"], c["state_size"], c["checkpointed_size"]) for c in flink["non_materialized"]
        ]
        files = [[(f["file"].rsplit("/", 1)[-1], f["offset"], f["bytes"]) for f in c["files"]] for c in mine["non_materialized"]]
        assert files == [[(f["name"], f["offset"], f["size"]) for f in c["files"]] for c in flink["non_materialized"]]
    assert all(s["changelog"] is None for o in json.loads(out)["operators"] if o["id"] != SLOW_COUNT for s in o["subtasks"])
    code, table, err = ckpt("inspect", str(CHANGELOG.checkpoint))
    assert code == 0 and "Changelog state backend per subtask" in table and "ChangelogStateHandleStreamImpl" in table


def test_change_sets_decode_as_flinks_reader_reads_them():
    """Non-empty changelog: ckpt's decoding of each change set counts what Flink's reader returns."""
    checkpoint = Checkpoint.open(str(CHANGELOG.checkpoint))
    counted = {}
    for _, subtask, _, handle in changelog_handles(checkpoint.metadata):
        sets = [read_change_set(checkpoint.handle_bytes(f), offset, "changelog") for f, offset in handle.handles_and_offsets]
        counted[subtask] = (sum(s.data_changes for s in sets), sum(s.metadata_changes for s in sets))
    flink = {s["subtask"]: s["non_materialized"][0] for s in CHANGELOG.expected["changelog"]}
    assert counted == {i: (c["data_changes"], c["metadata_changes"]) for i, c in flink.items()}
    assert all(data > 0 for data, _ in counted.values())


def test_verify_is_sound_and_finds_a_damaged_changelog(ckpt, tmp_path):
    code, out, err = ckpt("verify", str(CHANGELOG.checkpoint), "--plan", CHANGELOG.plan, "--schema", CHANGELOG.schema, "--json")
    assert code == 0 and json.loads(out)["status"] == "sound", err
    damaged = tmp_path / "copy"
    shutil.copytree(CHANGELOG.directory, damaged)
    changelog = next((damaged / CHANGELOG.info["checkpoint"]).parent.glob("dstl/*"))
    data = bytearray(changelog.read_bytes())
    data[1:5] = (1 << 30).to_bytes(4, "big")  # the first change set's number of key groups
    changelog.write_bytes(bytes(data))
    code, out, _ = ckpt("verify", str(damaged / CHANGELOG.info["checkpoint"]), "--json")
    report = json.loads(out)
    assert code != 0 and report["status"] == "unusable"
    assert [p["check"] for p in report["problems"]] == ["changelog"] and "number of key groups" in report["problems"][0][
        "message"
    ]


def test_rescale_intersects_as_flink_does(tmp_path):
    from ckpt_tool.ops.rescale import rescale
    from ckpt_tool.session import Session

    destination = tmp_path / "job" / CHANGELOG.checkpoint.name
    with Session.open(str(CHANGELOG.checkpoint), CHANGELOG.schema, CHANGELOG.plan, "local") as session:
        rescale(session, str(destination), 3)
    old = {
        s.index: s.managed_keyed
        for op in Checkpoint.open(str(CHANGELOG.checkpoint)).metadata.operators
        for s in op.subtasks
        if op.id_hex == SLOW_COUNT
    }
    new = next(op for op in Checkpoint.open(str(destination)).metadata.operators if op.id_hex == SLOW_COUNT)
    for subtask in new.subtasks:
        handle = subtask.managed_keyed
        wanted = key_group_range(128, 3, subtask.index)
        sources = [h for h in old.values() if max(h.key_groups.start, wanted.start) < min(h.key_groups.stop, wanted.stop)]
        assert isinstance(handle, ChangelogBackendHandle) and handle.key_groups == wanted
        assert handle.materialization_id == max(h.materialization_id for h in sources)
        assert all(isinstance(m, KeyGroupsHandle) and set(m.key_groups) <= set(wanted) for m in handle.materialized)
        assert sorted(g for m in handle.materialized for g in m.key_groups) == list(wanted)
        # each old changelog kept whole (its files and offsets), narrowed to the new key groups, sizes 0
        assert len(handle.non_materialized) == len(sources)
        for narrowed, source in zip(handle.non_materialized, sources):
            (whole,) = source.non_materialized
            assert isinstance(narrowed, ChangelogStreamHandle) and narrowed.handle_id != whole.handle_id
            assert [o for _, o in narrowed.handles_and_offsets] == [o for _, o in whole.handles_and_offsets]
            assert narrowed.key_groups == range(
                max(whole.key_groups.start, wanted.start), min(whole.key_groups.stop, wanted.stop)
            )
            assert (narrowed.state_size, narrowed.checkpointed_size) == (0, 0)


def test_metadata_v3_changelog_is_refused_in_one_line():
    from ckpt_tool.assign.keyed import KeyedStateError, reassign_keyed

    handles = [
        s.managed_keyed
        for op in Checkpoint.open(str(CHANGELOG.checkpoint)).metadata.operators
        for s in op.subtasks
        if op.id_hex == SLOW_COUNT
    ]
    with pytest.raises(
        KeyedStateError, match=r"^ckpt does not reassign the changelog state backend's state in metadata version 3"
    ):
        reassign_keyed(handles, 128, 3, 8, merge=lambda parts, wanted, index: None)


@pytest.mark.flink
def test_rescaled_restores_with_the_changelog_backend_on(tmp_path, record_multiset):
    info = CHANGELOG.info
    before_tree = tree_digest(CHANGELOG.directory)
    before = record_multiset(Session.open(str(CHANGELOG.checkpoint), CHANGELOG.schema, CHANGELOG.plan, LocalEngine()))
    destination = tmp_path / "job" / CHANGELOG.checkpoint.name
    with Session.open(str(CHANGELOG.checkpoint), CHANGELOG.schema, CHANGELOG.plan, "local") as session:
        report = rescale(session, str(destination), 3).as_dict()
    assert report["records_in"] == report["records_out"] == sum(before.values()) > 0
    assert tree_digest(CHANGELOG.directory) == before_tree, "the input was modified"
    conf = {**CHANGELOG_RESTORE, "state.changelog.dstl.dfs.base-path": str(tmp_path / "dstl")}
    assert flink_env.restore_count(info["flink_version"], destination, 3, conf, backend="hashmap") == info["source_records"]


def test_repair_keeps_the_changelog(ckpt, tmp_path):
    destination = tmp_path / "job" / CHANGELOG.checkpoint.name
    code, _, err = ckpt(
        "repair", str(CHANGELOG.checkpoint), str(destination), "--plan", CHANGELOG.plan, "--schema", CHANGELOG.schema, "--json"
    )
    assert code == 0, err
    repaired = Checkpoint.open(str(destination))
    assert [
        s.managed_keyed.non_materialized for op in repaired.metadata.operators for s in op.subtasks if op.id_hex == SLOW_COUNT
    ]
