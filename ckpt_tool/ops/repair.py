"""``ckpt repair``: a copy in which every subtask holds only its own key groups' in-flight records,
each once (replicas left by a naive rescale or a checkpoint during recovery are kept once,
misplaced records move to the subtask owning their key group), or without the in-flight data
that flows into chosen operators (``--drop-in-flight``), reporting exactly what is dropped.
"""

from __future__ import annotations

from typing import Optional

from ckpt_tool.exchanges import check_output_mapping
from ckpt_tool.flink.plan import PlanVertex
from ckpt_tool.planning import plan_repair
from ckpt_tool.rewrite import RescaleReport, rewrite
from ckpt_tool.session import Session
from ckpt_tool.topology import check_new_topology


def repair(session: Session, dst: str, drop: list[str], target_plan: Optional[dict[str, PlanVertex]] = None) -> RescaleReport:
    """``target_plan``: the job's plan as it will be started (its chaining is checked as Flink checks it)."""
    plan = plan_repair(session.metadata, session.described_exchanges, drop, session.plan)
    check_new_topology(session, plan, target_plan, "its parallelism")
    check_output_mapping(session.checkpoint, plan.exchanges, session.engine, set(plan.rescaled + plan.dropped))
    return rewrite(session, dst, plan)
