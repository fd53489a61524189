"""Savepoints (canonical and native format; hashmap, and RocksDB on 2.3) and aligned checkpoints
written by real Flink 2.3 and 1.20: ckpt inspects and verifies them as Flink reads them. Real Flink
restores ckpt's rescale (2 -> 3) and repair of each, moved to another directory, with the exact
count: their cells of the compatibility matrix (tests/test_compat.py)."""

from __future__ import annotations

import json

from catalog import COUNTJOB_SCHEMA, SNAPSHOTS
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.metadata import SAVEPOINT_KEY_GROUPS, iter_stream_handles
from ckpt_tool.flink.model import FileHandle, IncrementalKeyedHandle, KeyGroupsHandle

OPERATOR_KEYS = ("id", "parallelism", "max_parallelism", "finished", "channel_state")


def test_every_kind_is_there_for_both_ci_versions():
    kinds = {(f.info["flink_version"], f.info["snapshot"]) for f in SNAPSHOTS}
    for version in ("2.3.0", "1.20.3"):
        assert {(version, k) for k in ("savepoint-canonical", "savepoint-native", "aligned-checkpoint")} <= kinds


def test_inspect_matches_flink(snapshot, ckpt):
    code, out, err = ckpt("inspect", "--json", str(snapshot.checkpoint))
    assert code == 0, err
    got = json.loads(out)
    want = {o["id"]: {k: o[k] for k in OPERATOR_KEYS} for o in snapshot.expected["operators"]}
    assert {o["id"]: {k: o[k] for k in OPERATOR_KEYS} for o in got["operators"]} == want
    assert got["checkpoint_id"] == snapshot.expected["checkpoint_id"]
    # no channel state, as Flink's own reader says
    assert not any(o["channel_state"][d]["buffers"] for o in snapshot.expected["operators"] for d in ("input", "output"))
    kind = snapshot.info["snapshot"]
    if kind.startswith("savepoint-"):
        assert got["properties"]["checkpoint_type"] == "Savepoint"
        assert got["properties"]["savepoint_format"] == kind.removeprefix("savepoint-").upper()
    else:
        assert got["properties"]["checkpoint_type"] == "Checkpoint" and got["properties"]["savepoint_format"] is None


def test_state_handles_are_those_flink_reads(snapshot):
    """Handle counts per operator equal Flink's; a canonical savepoint's keyed state is Flink's
    savepoint key-groups handle, a savepoint references its files relative to itself."""
    metadata = Checkpoint.open(str(snapshot.checkpoint)).metadata
    flink = {o["id"]: o["handles"] for o in snapshot.expected["operators"]}
    for op in metadata.operators:
        keyed = [s.managed_keyed for s in op.subtasks if s.managed_keyed]
        operator = [s.managed_operator for s in op.subtasks if s.managed_operator]
        assert (len(keyed), len(operator)) == (flink[op.id_hex]["managed_keyed"], flink[op.id_hex]["managed_operator"])
        canonical = snapshot.info["snapshot"] == "savepoint-canonical"
        for handle in keyed:
            # a canonical savepoint has the same keyed format for every backend; else the backend's own
            kind = IncrementalKeyedHandle if snapshot.info["backend"] == "rocksdb" and not canonical else KeyGroupsHandle
            assert isinstance(handle, kind)
            assert (getattr(handle, "tag", None) == SAVEPOINT_KEY_GROUPS) == canonical
    if snapshot.info["snapshot"].startswith("savepoint-"):
        assert not any(isinstance(h, FileHandle) for h in iter_stream_handles(metadata))


def test_verify_is_sound(snapshot, ckpt):
    code, out, err = ckpt(
        "verify",
        str(snapshot.checkpoint),
        "--plan",
        snapshot.plan,
        "--schema",
        str(COUNTJOB_SCHEMA),
        "--target-parallelism",
        "3",
        "--json",
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["status"] == "sound"
    assert all(check["status"] == "passed" for check in report["checks"])
