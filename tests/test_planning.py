"""Planning a rescale: edges one by one, FLIP-147 markers as Flink checks them, plans in every form."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from catalog import fixture_named
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.finished import finished_state_problem
from ckpt_tool.flink.model import SubtaskState
from ckpt_tool.flink.plan import JobPlan, PlanEdge, PlanError, PlanVertex, load_job_plan
from ckpt_tool.planning import RescaleError, plan_rescale
from ckpt_tool.records.batch import frame_channel
from ckpt_tool.records.described import load_exchanges
from ckpt_tool.records.route import RouteCounters, RouteSpec, route_upstream
from ckpt_tool.records.schema import Exchange

BASE = fixture_named("flink23-hashmap-p2")
SOURCE_MAIN = ("b5b685896ae600a7445abe76c18f003d", "16bff260012cd60417e15f46df63ed85", "5ff73b99d0669153bf2feac805d152ac")


def plan_of(*vertices: tuple[str, list[tuple[str, str]]]) -> JobPlan:
    """A plan of one-operator vertices: (id, [(upstream id, partitioner)])."""
    return JobPlan(
        {
            vid: PlanVertex(vid, 2, vid, [vid], [PlanEdge(up, gate, p) for gate, (up, p) in enumerate(inputs)], vid, [vid])
            for vid, inputs in vertices
        }
    )


@pytest.mark.parametrize(
    "markers, edges, message",
    [
        ({"s": "partial", "k": "none"}, "HASH", None),  # a source may be partially finished at any parallelism
        ({"s": "all", "k": "partial"}, "HASH", None),
        (
            {"s": "none", "k": "partial"},
            "HASH",
            "predeceased with running or partially finished ones and connected "
            "via the ALL_TO_ALL edges. Task vertex k(k) has a all running predecessor",
        ),
        ({"s": "partial", "k": "partial"}, "REBALANCE", "has a partially finished predecessor"),
        ({"s": "partial", "k": "partial"}, "FORWARD", None),  # pointwise: partially finished is enough
        ({"s": "none", "k": "partial"}, "RESCALE", "predeceased with all running ones. Task vertex k(k) has a all running"),
        ({"s": "partial", "k": "all"}, "FORWARD", "fully finished vertices predeceased with the ones not fully finished"),
    ],
)
def test_finished_markers_as_flink_checks_them(markers, edges, message):
    plan = plan_of(("s", []), ("k", [("s", edges)]))
    problem = finished_state_problem(plan, markers.get)
    assert problem == message if message is None else message in problem


def test_mixed_finished_states_in_one_vertex():
    plan = JobPlan({"v": PlanVertex("v", 2, "a<br/>+- b<br/>", ["a", "b"], [], "b", ["a", "b"])})
    problem = finished_state_problem(plan, {"a": "partial", "b": "none"}.get)
    assert "Can not restore vertex a -> b(v) which contain mixed operator finished state" in problem


def partially_finished(checkpoint: Checkpoint):
    """The fixture's metadata with source-main's chain finished in subtask 1 (FLIP-147)."""
    metadata = copy.deepcopy(checkpoint.metadata)
    for op_id in SOURCE_MAIN:
        op = metadata.operator(op_id)
        op.subtasks = [s for s in op.subtasks if s.index != 1] + [SubtaskState(1, finished=True)]
    return metadata


def test_partially_finished_source_is_rescaled_not_refused():
    checkpoint = Checkpoint.open(str(BASE.checkpoint))
    metadata = partially_finished(checkpoint)
    job_plan = load_job_plan(BASE.plan, metadata)
    exchanges = load_exchanges(metadata, BASE.schema, job_plan)
    plan = plan_rescale(metadata, 3, {}, exchanges, job_plan)
    assert all(plan.new[op_id] == 3 for op_id in SOURCE_MAIN)


def test_overrides_apply_to_the_whole_chain_and_must_agree():
    checkpoint = Checkpoint.open(str(BASE.checkpoint))
    job_plan = load_job_plan(BASE.plan, checkpoint.metadata)
    exchanges = load_exchanges(checkpoint.metadata, BASE.schema, job_plan)
    plan = plan_rescale(checkpoint.metadata, None, {"slow-count": 3}, exchanges, job_plan)
    assert plan.new[checkpoint.metadata.operator("final-filter").id_hex] == 3
    with pytest.raises(RescaleError, match="chained together"):
        plan_rescale(checkpoint.metadata, None, {"slow-count": 3, "final-filter": 4}, exchanges, job_plan)


@pytest.mark.parametrize("wrap", [lambda p: p, lambda p: {"plan": p}, lambda p: {"jid": p["jid"], "name": "x", "plan": p}])
def test_plan_in_every_published_form(tmp_path, wrap):
    document = json.loads((BASE.directory / "plan.json").read_text())
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(wrap(document)))
    metadata = Checkpoint.open(str(BASE.checkpoint)).metadata
    assert set(load_job_plan(str(path), metadata).vertices) == {n["id"] for n in document["nodes"]}


def test_plan_of_another_job_is_refused_naming_it(tmp_path):
    metadata = Checkpoint.open(str(BASE.checkpoint)).metadata
    other = fixture_named("flink23-sql-p2")
    with pytest.raises(PlanError, match="is not the plan of this checkpoint's job"):
        load_job_plan(other.plan, metadata)
    document = json.loads((BASE.directory / "plan.json").read_text())
    document["nodes"][0]["id"] = "00" * 16
    (tmp_path / "plan.json").write_text(json.dumps(document))
    with pytest.raises(PlanError, match="vertices not in the checkpoint: 0000"):
        load_job_plan(str(tmp_path / "plan.json"), metadata)
    (tmp_path / "plan.json").write_text('{"plan": 3}')
    with pytest.raises(PlanError, match="no 'nodes'"):
        load_job_plan(str(tmp_path / "plan.json"), metadata)


def elements(*values: bytes) -> bytes:
    return b"".join(len(v).to_bytes(4, "big") + v for v in values)


@pytest.mark.parametrize(
    "partitioner, targets", [("GLOBAL", [0, 0, 0, 0]), ("SHUFFLE", [1, 2, 0, 1]), ("REBALANCE", [1, 2, 0, 1])]
)
def test_unkeyed_partitioners_route_as_flink_would(partitioner, targets):
    records = frame_channel(elements(*(b"\x01" + bytes([i]) for i in range(4))))
    spec = RouteSpec(Exchange("u", "d", partitioner=partitioner), 2, 3, 128)
    routed = list(route_upstream([(1, records)], spec, None, RouteCounters()))
    placed = {target: framed for target, framed, _ in routed}
    for index, target in enumerate(targets):
        assert elements(b"\x01" + bytes([index])) in placed[target]
    assert sum(count for *_, count in routed) == 4 and np.unique(targets).size == len(placed)
