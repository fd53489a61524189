"""Flink's job plan, as the REST API returns it, matched to a checkpoint's operators.

``GET /jobs/<id>/plan`` answers ``{"plan": {...}}``; the job details (``GET /jobs/<id>``) and the
History Server's archive hold the same object under ``"plan"``; ``JsonPlanGenerator`` writes it
bare. Its nodes are job vertices: a vertex's id is the id of the head operator of its chain, its
description names the chained operators (``head<br/>+- next<br/>``), and each input names the
upstream vertex, the input number (the gate of the consuming task) and the ship strategy (the
partitioner: HASH, REBALANCE, SHUFFLE, GLOBAL, FORWARD, RESCALE, BROADCAST, CUSTOM).

Input-channel state belongs to the head operator of the consuming vertex, result-subpartition
state to the tail operator of the producing one, so the tails are looked up in the metadata:
by name where the metadata has names (v5+), else by what fits (see ``_tails``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

from ckpt_tool.errors import CheckpointFormatError
from ckpt_tool.flink.model import UPPER_BOUND_MAX_PARALLELISM, CheckpointMetadata, GateFigures, OperatorState, handle_gates
from ckpt_tool.flink.uids import refuse_mismatched_uids
from ckpt_tool.input_files import LIST, NON_NEGATIVE, OBJECT, STRING, Expected, InputFileError, checked, checked_key

POINTWISE_PARTITIONERS = ("FORWARD", "RESCALE")
PARALLELISM = Expected(
    f"an integer from 1 to {UPPER_BOUND_MAX_PARALLELISM}",
    lambda value: type(value) is int and 1 <= value <= UPPER_BOUND_MAX_PARALLELISM,
)


class PlanError(InputFileError):
    """A plan file that cannot be read or does not fit the checkpoint."""


@dataclass
class PlanEdge:
    """An input of a vertex: its gate, the producing vertex and the partitioner."""

    upstream: str
    gate: int
    partitioner: str

    @property
    def pointwise(self) -> bool:
        """POINTWISE in Flink's DistributionPattern; every other partitioner is ALL_TO_ALL."""
        return self.partitioner in POINTWISE_PARTITIONERS


@dataclass
class PlanVertex:
    id: str  # the id of the chain's head operator
    parallelism: int
    description: str
    chain: list[str]  # operator names, head first (from the description)
    inputs: list[PlanEdge] = field(default_factory=list)
    tail: Optional[str] = None  # id of the chain's last operator, where the metadata tells it
    members: list[str] = field(default_factory=list)  # ids of the chain's operators the metadata tells

    @property
    def label(self) -> str:
        return self.chain[0] if self.chain else self.id


@dataclass
class JobPlan:
    vertices: dict[str, PlanVertex]

    def vertex_of(self, operator_id: str) -> Optional[PlanVertex]:
        for vertex in self.vertices.values():
            if operator_id in vertex.members:
                return vertex
        return None


def read_plan_document(path: str) -> dict:
    """The plan object of a file holding Flink's plan in any of its published forms."""
    try:
        with open(path) as f:
            document: Any = json.load(f)
    except (OSError, ValueError, RecursionError) as exc:
        raise PlanError(f"cannot read plan {path}: {exc}") from exc
    while isinstance(document, dict) and "nodes" not in document and isinstance(document.get("plan"), dict):
        document = document["plan"]  # REST /jobs/<id>/plan, /jobs/<id>, History Server archive
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), list):
        raise PlanError(f"cannot read plan {path}: no 'nodes' (expected Flink's job plan, e.g. from GET /jobs/<job-id>/plan)")
    if not document["nodes"]:
        raise PlanError(f"plan {path} has no nodes")
    return document


def load_job_plan(path: str, metadata: CheckpointMetadata) -> JobPlan:
    """Read a plan file and match its vertices to the checkpoint's operators."""
    vertices = _read_vertices(path, "plan")
    _check_matches(path, vertices, metadata)
    for vertex in vertices.values():
        vertex.members = _members(vertex, metadata)
    tails = _tails(vertices, metadata)
    for vertex_id, tail in tails.items():
        vertices[vertex_id].tail = tail
        if tail and tail not in vertices[vertex_id].members:
            vertices[vertex_id].members.append(tail)
    return JobPlan(vertices)


def chain_max_parallelism_problems(plan: JobPlan, metadata: CheckpointMetadata) -> Iterator[tuple[str, str]]:
    """(chain, message) for each chain of the plan whose operators the checkpoint holds with
    different max parallelisms. Flink writes every operator of a job vertex with the vertex's
    (``DefaultCheckpointPlan``, ``PendingCheckpoint``), and its restore adopts each operator's in
    turn as the vertex's where it may (``StateAssignmentOperation#checkParallelismPreconditions``),
    then assigns the vertex's keyed state and filters its in-flight records by the key groups of
    whichever came last: state written at one max parallelism would be read at another."""
    operators = {op.id_hex: op for op in metadata.operators}
    for vertex in plan.vertices.values():
        # the chain's operators for sure: its head, and the others by name (a tail found by what fits
        # the metadata, where it holds no names, may be another chain's)
        members = [
            operators[m] for m in vertex.members if m in operators and (m == vertex.id or operators[m].name in vertex.chain)
        ]
        if len({op.max_parallelism for op in members}) > 1:
            listed = ", ".join(f"{op.label} {op.max_parallelism}" for op in members)
            yield (
                vertex.label,
                f"the operators of one chain have different max parallelisms ({listed}), which Flink never writes "
                "(a chain has one); its restore would assign the chain's keyed state and in-flight records by the key "
                "groups of one of them (Flink: KeyGroupRange{...} does not contain key group ...)",
            )


def refuse_mixed_max_parallelism(plan: Optional[JobPlan], metadata: CheckpointMetadata) -> None:
    """Raise, naming the chain, where its operators have different max parallelisms."""
    for label, message in chain_max_parallelism_problems(plan, metadata) if plan else ():
        raise CheckpointFormatError(f"chain {label}: {message}; Flink would not restore it: refused")


def load_target_plan(path: str) -> dict[str, PlanVertex]:
    """The plan of the job as it will be started (``--target-plan``): its vertices by id, not
    matched to the checkpoint (an operator without a uid may have another id there)."""
    return _read_vertices(path, "target plan")


def _read_vertices(path: str, what: str) -> dict[str, PlanVertex]:
    """A plan file's vertices by id, each checked; a vertex id given twice is refused."""
    vertices: dict[str, PlanVertex] = {}
    for index, node in enumerate(read_plan_document(path)["nodes"]):
        try:
            vertex = _vertex(node, f"nodes[{index}]")
        except PlanError as exc:
            raise PlanError(f"{what} {path}: {exc}") from None
        if vertex.id in vertices:
            raise PlanError(f"{what} {path}: nodes[{index}] is vertex {vertex.id} again")
        vertices[vertex.id] = vertex
    return vertices


def _check_matches(path: str, vertices: dict[str, PlanVertex], metadata: CheckpointMetadata) -> None:
    """Every vertex of the plan is an operator of the checkpoint, and every input names a vertex."""
    known = {op.id_hex for op in metadata.operators}
    unknown = [v for v in vertices.values() if v.id not in known]
    if unknown:
        refuse_mismatched_uids(metadata)  # a vertex missing because its state is under another id than its uid's
    if unknown and len(unknown) == len(vertices):
        raise PlanError(f"plan {path} is not the plan of this checkpoint's job: none of its vertices is in the checkpoint")
    if unknown:
        listed = ", ".join(f"{v.id} ({v.label})" for v in unknown)
        raise PlanError(f"plan {path}: vertices not in the checkpoint: {listed}")
    for vertex in vertices.values():
        for edge in vertex.inputs:
            if edge.upstream not in vertices:
                raise PlanError(f"plan {path}: vertex {vertex.label} reads from {edge.upstream}, which the plan lacks")


def _vertex(node: Any, where: str) -> PlanVertex:
    """The plan node at ``where`` (``nodes[2]``), every field checked."""
    checked(node, OBJECT, PlanError, where)
    description = checked_key(node, "description", STRING, PlanError, "", where)
    vertex = PlanVertex(
        checked_key(node, "id", STRING, PlanError, within=where),
        checked_key(node, "parallelism", PARALLELISM, PlanError, within=where),
        description,
        _chain_names(description),
    )
    for number, edge in enumerate(checked_key(node, "inputs", LIST, PlanError, [], where)):
        at = f"{where}.inputs[{number}]"
        checked(edge, OBJECT, PlanError, at)
        upstream = checked_key(edge, "id", STRING, PlanError, within=at)
        gate = checked_key(edge, "num", NON_NEGATIVE, PlanError, 0, at)
        vertex.inputs.append(PlanEdge(upstream, gate, checked_key(edge, "ship_strategy", STRING, PlanError, "HASH", at).upper()))
    return vertex


def _chain_names(description: str) -> list[str]:
    if "<br/>" not in description:  # Flink 1.14 and older: "head -&gt; next -&gt; tail"
        return [part.strip() for part in re.split(r" -(?:&gt;|>) ", description) if part.strip()]
    return [re.sub(r"^[\s+\-]*", "", part).strip() for part in description.split("<br/>") if part.strip()]


def _members(vertex: PlanVertex, metadata: CheckpointMetadata) -> list[str]:
    """The chain's operators the metadata can tell: the head by id, the others by name (v5+)."""
    members = [vertex.id]
    for name in vertex.chain[1:]:
        found = [op.id_hex for op in metadata.operators if op.name == name and op.parallelism == vertex.parallelism]
        if len(found) == 1 and found[0] not in members:
            members.append(found[0])
    return members


def _output_fits(op: OperatorState, parallelism: int, downstream_parallelism: int) -> bool:
    """Could ``op`` be the tail of a vertex of ``parallelism`` feeding ``downstream_parallelism``?"""
    if op.parallelism != parallelism:
        return False
    # the highest subpartition from the handles: a job at parallelism p holds p² output channels
    highest = -1
    for s in op.subtasks:
        for partition in handle_gates(s.output_channels):
            highest = max(highest, GateFigures().add(s.output_channels, partition).highest)
    return 0 <= highest < downstream_parallelism


def _tails(vertices: dict[str, PlanVertex], metadata: CheckpointMetadata) -> dict[str, Optional[str]]:
    """The id of the last operator of each vertex's chain, where it can be told.

    By name where the metadata has names (v5+); else a vertex whose chain is one operator is its
    own tail; else, among the operators with output state, the one that alone fits the vertex
    (same parallelism, subpartitions within every downstream's parallelism) once the others
    are placed. Unknown tails stay None. A tail need not hold output state, so an operator that
    is the only fit of two vertices belongs to neither for sure (a SQL join's chain and the chain
    before it, both at one parallelism, one of them holding nothing in flight): both stay None.
    A vertex whose head has finished (FLIP-147) holds no output state and claims none.
    """
    consumers: dict[str, list[int]] = {}
    for vertex in vertices.values():
        for edge in vertex.inputs:
            consumers.setdefault(edge.upstream, []).append(vertex.parallelism)
    tails: dict[str, Optional[str]] = {}
    for vertex_id, vertex in vertices.items():
        names = vertex.chain
        by_name = [op.id_hex for op in metadata.operators if names and op.name == names[-1]]
        if by_name:
            tails[vertex_id] = by_name[0]
        elif len(names) <= 1:
            tails[vertex_id] = vertex_id
        else:
            tails[vertex_id] = None
    finished = {op.id_hex for op in metadata.operators if op.finished == "all"}
    progress = True
    while progress:
        progress = False
        taken = {t for t in tails.values() if t}
        only_fit: dict[str, list[str]] = {}  # operator -> the open vertices it is the only fit of
        for vertex_id, tail in tails.items():
            if tail or vertex_id not in consumers or vertex_id in finished:
                continue
            fits = [
                op.id_hex
                for op in metadata.operators
                if op.id_hex not in taken
                and (op.id_hex == vertex_id or op.id_hex not in vertices)
                and _output_fits(op, vertices[vertex_id].parallelism, min(consumers[vertex_id]))
            ]
            if len(fits) == 1:
                only_fit.setdefault(fits[0], []).append(vertex_id)
        for op_id, claimants in only_fit.items():
            if len(claimants) == 1:
                tails[claimants[0]] = op_id
                progress = True
                break
    return tails
