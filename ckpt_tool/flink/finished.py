"""FLIP-147 finished markers as Flink checks them at restore (``VertexFinishedStateChecker``).

A vertex is all running, partially finished (some subtasks finished) or fully finished. Flink
refuses to restore a job whose checkpoint has

1. a vertex whose operators are not all in the same finished state;
2. a fully finished vertex with a predecessor that is not fully finished;
3. a partially finished vertex with an ALL_TO_ALL predecessor that is not fully finished, or a
   POINTWISE predecessor that is all running (ALL_TO_ALL wins where one predecessor has both).

The messages are Flink's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

from ckpt_tool.flink.plan import JobPlan, PlanVertex

ALL_RUNNING, PARTIALLY_FINISHED, FULLY_FINISHED = "ALL_RUNNING", "PARTIALLY_FINISHED", "FULLY_FINISHED"
_BY_MARKER = {"none": ALL_RUNNING, "partial": PARTIALLY_FINISHED, "all": FULLY_FINISHED}


def _vertex_name(vertex: PlanVertex) -> str:
    return " -> ".join(vertex.chain) if vertex.chain else vertex.id


def finished_state_problem(plan: JobPlan, marker_of: Callable[[str], Optional[str]]) -> Optional[str]:
    """Flink's reason to refuse the restore, or None. ``marker_of(operator id)`` is the operator's
    finished marker (``none``, ``partial``, ``all``; None for an operator without state)."""
    states: dict[str, str] = {}
    for vertex in plan.vertices.values():
        found = {_BY_MARKER[marker_of(op) or "none"] for op in vertex.members}
        if len(found) != 1:
            return (
                f"Can not restore vertex {_vertex_name(vertex)}({vertex.id}) which contain mixed operator finished "
                f"state: {sorted(found)}"
            )
        states[vertex.id] = found.pop()
    for vertex in plan.vertices.values():
        state = states[vertex.id]
        if state == FULLY_FINISHED:
            if any(states[edge.upstream] != FULLY_FINISHED for edge in vertex.inputs):
                return (
                    "Illegal JobGraph modification. Cannot run a program with fully finished vertices predeceased "
                    f"with the ones not fully finished. Task vertex {_vertex_name(vertex)}({vertex.id}) has a "
                    "predecessor not fully finished"
                )
        elif state == PARTIALLY_FINISHED:
            pointwise: dict[str, bool] = {}
            for edge in vertex.inputs:
                pointwise[edge.upstream] = pointwise.get(edge.upstream, True) and edge.pointwise
            for upstream, only_pointwise in pointwise.items():
                before = states[upstream]
                if not only_pointwise and before != FULLY_FINISHED:
                    kind = "all running" if before == ALL_RUNNING else "partially finished"
                    return (
                        "Illegal JobGraph modification. Cannot run a program with partially finished vertices "
                        "predeceased with running or partially finished ones and connected via the ALL_TO_ALL edges. "
                        f"Task vertex {_vertex_name(vertex)}({vertex.id}) has a {kind} predecessor"
                    )
                if only_pointwise and before == ALL_RUNNING:
                    return (
                        "Illegal JobGraph modification. Cannot run a program with partially finished vertices "
                        f"predeceased with all running ones. Task vertex {_vertex_name(vertex)}({vertex.id}) has a "
                        "all running predecessor"
                    )
    return None
