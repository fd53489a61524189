"""The job graph Flink builds at the new parallelisms, and the restores it refuses because of it.

A job started at a new parallelism gets a new job graph, built by Flink's rules:

* an edge the job gives no partitioner becomes FORWARD where both ends have one parallelism, else
  REBALANCE (``StreamGraph#createActualEdge``); so a REBALANCE edge between operators of different
  parallelisms may be one the job never asked for, and turns FORWARD once the parallelisms agree;
* a FORWARD edge is chained where both ends have one parallelism, the downstream operator has
  this one input, and chaining strategy, slot sharing group and max parallelism allow it
  (``StreamingJobGraphGenerator#isChainable``). The plan does not show the last three, so ckpt
  assumes they allow it (``--target-plan``, the job's plan as it will be started, says for sure);
* an operator without a uid gets an id hashed from its place in the graph: how many of its
  outputs are chained and the ids of its inputs (``StreamGraphHasherV2#generateDeterministicHash``),
  so its id, and that of every uid-less operator after it, changes when one of its outputs
  becomes chained.

Then Flink's restore refuses:

* state of an operator whose id is not in the new program (``Checkpoints#loadAndValidateCheckpoint``:
  "Cannot map checkpoint/savepoint state for operator ... to the new program");
* input channel state on a chained operator other than the chain's head, output channel state on
  one other than its tail (``StateAssignmentOperation#checkForUnsupportedToplogyChanges``: "Cannot
  recover from unaligned checkpoint when topology changes, such that data exchanges with
  persisted data are now chained."). Flink runs that check only where the chain's head (tail) or
  a neighbouring chain holds channel state of that side; elsewhere it starts and silently loses
  the data. ckpt refuses both, before anything is written.

The in-flight data of the exchange that becomes chained can be dropped explicitly
(``--drop-in-flight`` of its downstream operator), with a report of what was dropped.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from ckpt_tool.exchanges import record_counter
from ckpt_tool.flink.model import INPUT, OUTPUT, CheckpointMetadata, OperatorState, gates_holding
from ckpt_tool.flink.operator_id import operator_id_of_uid
from ckpt_tool.flink.plan import JobPlan, PlanVertex
from ckpt_tool.planning import RescaleError, RescalePlan
from ckpt_tool.session import Session

SILENT_LOSS = "Flink would start and silently lose it."
CHAINED = (
    "Cannot recover from unaligned checkpoint when topology changes, such that data exchanges with persisted data are "
    "now chained."
)
# A changed id that holds only if the operator has no uid, which metadata before v5 cannot tell.
MAY_HAVE = "may have "
NOT_MAPPED = (
    "Cannot map checkpoint/savepoint state for operator {id} to the new program, because the operator is not available "
    "in the new program."
)


@dataclass
class _Vertex:
    """A chain of the job as it ran: its operators (head first, those known) and inputs."""

    id: str  # the head operator's id
    label: str
    members: list[str]
    tail: Optional[str]
    inputs: list[tuple[str, Optional[str]]] = field(default_factory=list)  # (upstream vertex, partitioner)
    inputs_complete: bool = True  # False without a plan: the schema names only some exchanges
    names: list[str] = field(default_factory=list)  # chain names, head first (with a plan)


@dataclass
class Link:
    """An edge between two chains that is chained in the new job graph."""

    upstream: str  # vertex id
    downstream: str
    certain: bool
    why: str


@dataclass
class TargetGraph:
    """The job graph at the new parallelisms, as far as it matters to the restore."""

    vertices: dict[str, _Vertex]
    links: list[Link]
    changed_ids: dict[str, str]  # operator id -> why Flink gives it another id

    def chains(self) -> list[list[str]]:
        """The new chains of more than one old chain: vertex ids, upstream first."""
        parent = {v: v for v in self.vertices}

        def root(v: str) -> str:
            while parent[v] != v:
                v = parent[v]
            return v

        for link in self.links:
            parent[root(link.downstream)] = root(link.upstream)
        groups: dict[str, list[str]] = {}
        for v in self.vertices:
            groups.setdefault(root(v), []).append(v)
        linked_down = {link.downstream for link in self.links}
        result = []
        for members in groups.values():
            if len(members) > 1:
                result.append(sorted(members, key=lambda v: v in linked_down))
        return result


def _vertices(metadata: CheckpointMetadata, job_plan: Optional[JobPlan], exchanges) -> dict[str, _Vertex]:
    if job_plan is not None:
        return {
            vid: _Vertex(
                vid,
                metadata.label(vid) if metadata.label(vid) != "?" else v.label,
                list(v.members),
                v.tail,
                [(e.upstream, e.partitioner) for e in sorted(v.inputs, key=lambda e: e.gate)],
                True,
                list(v.chain),
            )
            for vid, v in job_plan.vertices.items()
        }
    # no plan: each operator its own chain, the exchanges of --schema/--sql-plan its inputs
    vertices = {op.id_hex: _Vertex(op.id_hex, op.label, [op.id_hex], op.id_hex, [], False) for op in metadata.operators}
    for exchange in exchanges:
        if exchange.upstream_id in vertices and exchange.downstream_id in vertices:
            partitioner = exchange.partitioner or ("HASH" if exchange.keyed else None)
            vertices[exchange.downstream_id].inputs.append((exchange.upstream_id, partitioner))
    return vertices


def derive_links(
    vertices: dict[str, _Vertex], old: dict[str, int], new: dict[str, int], target_plan: Optional[dict[str, PlanVertex]]
) -> list[Link]:
    """The edges between chains that are chained at the new parallelisms."""
    if target_plan is not None:
        return _links_of_target(vertices, target_plan)
    links = []
    for vertex in vertices.values():
        for upstream, partitioner in vertex.inputs:
            if upstream not in vertices or new.get(upstream) != new.get(vertex.id):
                continue
            if len(vertex.inputs) > 1:
                continue  # an operator with several inputs is never chained to one of them
            was_apart = old.get(upstream) != old.get(vertex.id)
            if partitioner == "REBALANCE" and was_apart:
                why = (
                    f"REBALANCE may be Flink's choice for an edge without a partitioner, made only because the two ran at "
                    f"parallelisms {old.get(upstream)} and {old.get(vertex.id)}; at one parallelism it is FORWARD and chained"
                )
            elif partitioner is None and was_apart:
                why = "its partitioner is not known; an edge without one is FORWARD and chained at one parallelism"
            else:
                continue  # an explicit partitioner, or apart for another reason that stays
            if not vertex.inputs_complete:
                why += " (without --plan ckpt cannot tell whether the downstream operator has other inputs)"
            links.append(Link(upstream, vertex.id, False, why))
    return links


def _links_of_target(vertices: dict[str, _Vertex], target: dict[str, PlanVertex]) -> list[Link]:
    """The edges the target plan chains: the downstream chain's head is no longer a head there
    but sits in one chain with the upstream chain's operators."""
    heads = set(target)
    links = []
    for vertex in vertices.values():
        if vertex.id in heads:
            continue
        name = vertex.names[0] if vertex.names else None
        holder = next((t for t in target.values() if name and name in t.chain[1:]), None)
        if holder is None:
            continue
        for upstream, _ in vertex.inputs:
            up = vertices.get(upstream)
            if up and (up.id == holder.id or (up.names and up.names[-1] in holder.chain)):
                links.append(Link(upstream, vertex.id, True, f"--target-plan chains them in {holder.label}"))
    return links


def _has_uid(op: OperatorState, names: list[str], metadata: CheckpointMetadata) -> Optional[bool]:
    """Whether the job gave the operator a uid: True, False, or None where it cannot be told."""
    if op.uid:
        return True
    if any(name and op.id_hex == operator_id_of_uid(name) for name in [op.name, *names]):
        return True
    return False if metadata.version >= 5 else None


def changed_ids(
    metadata: CheckpointMetadata,
    vertices: dict[str, _Vertex],
    links: list[Link],
    target_plan: Optional[dict[str, PlanVertex]],
) -> dict[str, str]:
    """Operators whose id Flink derives anew in the new job graph, with why."""
    ops = {op.id_hex: op for op in metadata.operators}
    names: dict[str, list[str]] = {}
    for vertex in vertices.values():
        if vertex.names and len(vertex.names) == len(vertex.members):
            for op_id, name in zip(vertex.members, vertex.names):
                names.setdefault(op_id, []).append(name)
        elif vertex.names:
            names.setdefault(vertex.id, []).append(vertex.names[0])
    consumers: dict[str, list[str]] = {}
    for vertex in vertices.values():
        for upstream, _ in vertex.inputs:
            consumers.setdefault(upstream, []).append(vertex.id)

    changed: dict[str, str] = {}

    def uidless(op_id: str) -> bool:
        op = ops.get(op_id)
        return op is not None and _has_uid(op, names.get(op_id, []), metadata) is not True

    def maybe(op_id: str) -> str:
        """ "may have " where the metadata cannot tell whether the operator has a uid (before 2.0)."""
        return "" if _has_uid(ops[op_id], names.get(op_id, []), metadata) is False else MAY_HAVE

    def spread(vertex_id: str, start: int, why: str) -> None:
        """From member ``start`` of the chain on, every uid-less operator's id changes with its input's."""
        vertex = vertices[vertex_id]
        for op_id in vertex.members[start:]:
            if not uidless(op_id) or op_id in changed:
                return
            changed[op_id] = maybe(op_id) + why
        if len(vertex.members) > 1 and vertex.tail not in vertex.members[start:]:
            return  # the chain's middle is not known: the change cannot be followed further
        for consumer in consumers.get(vertex_id, []):
            spread(consumer, 0, why)

    for link in links:
        source = vertices[link.upstream]
        pair = f"{source.label} and {vertices[link.downstream].label} are chained"
        tail = source.tail
        if tail and uidless(tail):
            why = f"{maybe(tail)}no uid: Flink hashes its id from its place in the job graph, which changes when {pair}"
            changed.setdefault(tail, why)
            for consumer in consumers.get(link.upstream, []):
                spread(consumer, 0, f"no uid, and its input's id changes ({pair})")
    if target_plan is not None:
        for op_id in [op_id for op_id in changed if op_id in target_plan]:
            del changed[op_id]  # the target plan has a chain headed by it: its id stays
        target_heads = {t.chain[0]: t_id for t_id, t in target_plan.items() if t.chain}
        for vertex in vertices.values():
            head_name = vertex.names[0] if vertex.names else ""
            if head_name in target_heads and target_heads[head_name] != vertex.id:
                changed.setdefault(vertex.id, f"--target-plan gives {vertex.label} the id {target_heads[head_name]}")
    return changed


def target_graph(
    metadata: CheckpointMetadata,
    job_plan: Optional[JobPlan],
    plan: RescalePlan,
    target_plan: Optional[dict[str, PlanVertex]] = None,
) -> TargetGraph:
    vertices = _vertices(metadata, job_plan, plan.exchanges)
    links = derive_links(vertices, plan.old, plan.new, target_plan)
    return TargetGraph(vertices, links, changed_ids(metadata, vertices, links, target_plan))


# --- which operators hold what after the rewrite ------------------------------------------------


def _other_state(op: OperatorState) -> bool:
    """Keyed, operator or coordinator state: what Flink must map to an operator of the new program."""
    return op.coordinator_state is not None or any(
        s.managed_operator or s.raw_operator or s.managed_keyed or s.raw_keyed for s in op.subtasks if not s.finished
    )


class StateAfter:
    """The channel state each operator holds in the checkpoint ckpt would write: kept handles,
    and the records of rerouted exchanges (``records_of``: an exchange index -> its record count,
    asked only where it matters; non-record elements are not carried)."""

    def __init__(self, metadata: CheckpointMetadata, plan: RescalePlan, records_of: Callable[[int], int]):
        self.metadata, self.plan, self.records_of = metadata, plan, records_of
        replaced = plan.rescaled + plan.dropped
        self.replaced: dict[str, set[tuple[Optional[str], int]]] = {
            INPUT: {(plan.exchanges[i].downstream_id, plan.exchanges[i].gate) for i in replaced},
            OUTPUT: {(plan.exchanges[i].upstream_id, plan.exchanges[i].partition) for i in replaced},
        }

    def kept(self, op: OperatorState, direction: str) -> bool:
        """Whether ``op`` keeps handles of ``direction`` that the rewrite leaves as they are."""
        return any(
            (op.id_hex, gate) not in self.replaced[direction]
            for s in op.subtasks
            if not s.finished
            for gate in gates_holding(s.input_channels if direction == INPUT else s.output_channels)
        )

    def routed_in(self, op_id: str) -> list[int]:
        """Indexes of rerouted exchanges into ``op_id`` that carry records."""
        return [i for i in self.plan.rescaled if self.plan.exchanges[i].downstream_id == op_id and self.records_of(i)]

    def holds(self, op: OperatorState, direction: str) -> bool:
        return self.kept(op, direction) or (direction == INPUT and bool(self.routed_in(op.id_hex)))

    def holds_any(self, op: OperatorState) -> bool:
        return _other_state(op) or self.holds(op, INPUT) or self.holds(op, OUTPUT)


# --- the check ----------------------------------------------------------------------------------


def check_topology(
    metadata: CheckpointMetadata,
    job_plan: Optional[JobPlan],
    plan: RescalePlan,
    records_of: Callable[[int], int],
    target_plan: Optional[dict[str, PlanVertex]] = None,
    target: str = "the new parallelism",
) -> TargetGraph:
    """Refuse (``RescaleError``, Flink's reason first) a rewrite whose output Flink would not
    restore, or would restore losing in-flight data, because the job graph changes."""
    graph = target_graph(metadata, job_plan, plan, target_plan)
    if not graph.links and not graph.changed_ids:
        return graph
    after = StateAfter(metadata, plan, records_of)
    ops = {op.id_hex: op for op in metadata.operators}
    problems: list[str] = []
    if_uidless: list[str] = []  # reasons that hold only if an operator has no uid (metadata before v5)
    drop: set[str] = set()
    for op in metadata.operators:  # in Flink's order: the metadata's
        why = graph.changed_ids.get(op.id_hex)
        if why is None or not after.holds_any(op):
            continue
        op_id = op.id_hex
        (if_uidless if why.startswith(MAY_HAVE) else problems).append(f"{NOT_MAPPED.format(id=op_id)} ({op.label} {why})")
        if not _other_state(op):
            drop.update(_exchanges_of(after, op))
        else:
            drop.add("")  # keyed or operator state: dropping in-flight data does not help
    for chain in graph.chains():
        problems += _chain_problems(graph, chain, ops, after, drop)
    # the reasons that are certain first: Flink gives the first it finds, which a guess must not displace
    problems += if_uidless
    if not problems:
        return graph
    uncertain = [link for link in graph.links if not link.certain]
    reasons = "; ".join(
        f"{graph.vertices[link.upstream].label} -> {graph.vertices[link.downstream].label}: {link.why}" for link in graph.links
    )
    whole = " whole" if problems[0].endswith(SILENT_LOSS) else ""  # Flink would start, without that data
    message = f"Flink would not restore this checkpoint{whole} at {target}: {problems[0]}"
    if len(problems) > 1:
        message += " Also: " + " ".join(problems[1:])
    message += f" Chained in the new job graph: {reasons}."
    if drop and "" not in drop:
        flags = " ".join(f"--drop-in-flight {shlex.quote(metadata.label(d))}" for d in sorted(drop))
        message += f" Dropping that in-flight data makes it restorable: {flags} (the dropped records are reported)."
    if uncertain:
        message += (
            " If the job keeps these apart (an explicit partitioner, disableChaining, another slot sharing group), "
            "pass --target-plan with the job's plan at the new parallelism."
        )
    raise RescaleError(message)


def _exchanges_of(after: StateAfter, op: OperatorState) -> set[str]:
    """The downstream operators of the exchanges whose in-flight data ``op`` would hold."""
    plan = after.plan
    found = set()
    for s in op.subtasks:
        for direction in (INPUT, OUTPUT):
            for gate in gates_holding(s.input_channels if direction == INPUT else s.output_channels):
                if (op.id_hex, gate) not in after.replaced[direction]:
                    for e in plan.exchanges:
                        if (direction == INPUT and (e.downstream_id, e.gate) == (op.id_hex, gate)) or (
                            direction == OUTPUT and (e.upstream_id, e.partition) == (op.id_hex, gate)
                        ):
                            found.add(e.downstream_id)
                            break
                    else:
                        found.add("")
    for i in after.routed_in(op.id_hex):
        found.add(plan.exchanges[i].downstream_id)
    return found


def _chain_problems(
    graph: TargetGraph, chain: list[str], ops: dict[str, OperatorState], after: StateAfter, drop: set[str]
) -> list[str]:
    vertices = graph.vertices
    linked_down = {link.downstream for link in graph.links}
    linked_up = {link.upstream for link in graph.links}
    head = next(v for v in chain if v not in linked_down)
    ends = [v for v in chain if v not in linked_up]
    members = [m for v in chain for m in vertices[v].members if m in ops]
    inputs = [m for m in members if m != head and after.holds(ops[m], INPUT)]
    tails = {vertices[v].tail for v in ends}
    now_inside = {vertices[v].tail for v in chain if v in linked_up}  # tails whose output is chained now

    def not_the_tail(m: str) -> bool:
        if len(tails) > 1:
            return True  # several ends: which one Flink takes for the tail is not known
        return m in now_inside or (None not in tails and m not in tails)

    outputs = [m for m in members if after.holds(ops[m], OUTPUT) and not_the_tail(m)]
    problems = []
    label = " + ".join(vertices[v].label for v in chain)
    for side, holders, checked in (
        ("input", inputs, _input_check_runs(graph, chain, head, ops, after)),
        ("output", outputs, _output_check_runs(graph, chain, ends, ops, after)),
    ):
        if not holders:
            continue
        listed = ", ".join(holders)
        names = ", ".join(ops[m].label for m in holders)
        if checked:
            problems.append(f"{CHAINED} The following operators contain channel state: [{listed}] ({names}; chain {label}).")
        else:
            problems.append(
                f"in the new chain {label}, {names} would hold {side} channel state that only a chain's "
                f"{'head' if side == 'input' else 'tail'} may hold; {SILENT_LOSS}"
            )
        for m in holders:
            drop.update(_exchanges_of(after, ops[m]))
    return problems


def _input_check_runs(graph: TargetGraph, chain: list[str], head: str, ops, after: StateAfter) -> bool:
    """Flink checks a chain's input side where its head holds input state or a chain feeding it
    holds output state (``TaskStateAssignment#hasInputState``, ``#hasUpstreamOutputStates``)."""
    if head in ops and after.holds(ops[head], INPUT):
        return True
    feeding = {u for u, _ in graph.vertices[head].inputs}
    return any(
        graph.vertices[u].tail in ops and after.holds(ops[graph.vertices[u].tail], OUTPUT) for u in feeding if u in graph.vertices
    )


def _output_check_runs(graph: TargetGraph, chain: list[str], ends: list[str], ops, after: StateAfter) -> bool:
    for end in ends:
        tail = graph.vertices[end].tail
        if tail in ops and after.holds(ops[tail], OUTPUT):
            return True
        for vertex in graph.vertices.values():
            if (
                vertex.id not in chain
                and any(u == end for u, _ in vertex.inputs)
                and vertex.id in ops
                and after.holds(ops[vertex.id], INPUT)
            ):
                return True
    return False


def check_new_topology(
    session: Session,
    plan: RescalePlan,
    target_plan: Optional[dict[str, PlanVertex]] = None,
    target: str = "the new parallelism",
) -> TargetGraph:
    """``check_topology`` for a session: the records of rerouted exchanges are counted on its engine
    where they matter (an exchange that carries only watermarks leaves no channel state)."""
    records_of = record_counter(session.checkpoint, plan.exchanges, session.engine)
    return check_topology(session.metadata, session.plan, plan, records_of, target_plan, target)
