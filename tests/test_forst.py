"""ForSt (state.backend.type=forst, Flink 2.x): a checkpoint Flink 2.3 wrote with in-flight data is
read as Flink reads it (the generic fixture tests), and ckpt's rescale of it (2 -> 3) keeps every
in-flight record once. Real Flink restores that rescale and a repair with the exact count: the
ForSt cell of the compatibility matrix (tests/test_compat.py)."""

from __future__ import annotations

from catalog import fixture_named, tree_digest
from ckpt_tool.engine import LocalEngine
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import IncrementalKeyedHandle
from ckpt_tool.ops.rescale import rescale
from ckpt_tool.session import Session

FORST = fixture_named("flink23-forst-p2")


def test_forst_keyed_state_is_rocksdb_handles():
    metadata = Checkpoint.open(str(FORST.checkpoint)).metadata
    keyed = [s.managed_keyed for op in metadata.operators for s in op.subtasks if s.managed_keyed]
    assert len(keyed) == 2 and all(isinstance(h, IncrementalKeyedHandle) for h in keyed)
    flink = {o["id"]: o["handles"]["managed_keyed"] for o in FORST.expected["operators"]}
    assert sum(flink.values()) == len(keyed)


def test_forst_rescale_keeps_every_record_once(tmp_path, record_multiset):
    before_tree = tree_digest(FORST.directory)
    before = record_multiset(Session.open(str(FORST.checkpoint), FORST.schema, FORST.plan, LocalEngine()))
    assert sum(before.values()) > 0
    destination = tmp_path / "job" / FORST.checkpoint.name
    with Session.open(str(FORST.checkpoint), FORST.schema, FORST.plan, "local") as session:
        report = rescale(session, str(destination), 3).as_dict()
    assert report["records_in"] == report["records_out"] == sum(before.values())
    assert record_multiset(Session.open(str(destination), FORST.schema, FORST.plan, LocalEngine())) == before
    assert tree_digest(FORST.directory) == before_tree, "the input was modified"
