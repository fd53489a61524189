"""``ckpt rescale``: a checkpoint for a new parallelism, restorable by Flink without replicating
or filtering in-flight data (seed 000 §4.1, done offline).

The plan (ckpt_tool.planning) says which operators change parallelism and which exchanges'
in-flight records are rerouted; the rewrite (ckpt_tool.rewrite) reassigns keyed and operator
state as Flink would, routes the records on the session's engine, proves the output and writes it.
"""

from __future__ import annotations

from typing import Optional

from ckpt_tool.exchanges import check_output_mapping
from ckpt_tool.flink.plan import PlanVertex
from ckpt_tool.planning import plan_rescale
from ckpt_tool.rewrite import RescaleReport, rewrite
from ckpt_tool.session import Session
from ckpt_tool.topology import check_new_topology


def rescale(
    session: Session,
    dst: str,
    parallelism: Optional[int],
    overrides: Optional[dict[str, int]] = None,
    dry_run: bool = False,
    drop: Optional[list[str]] = None,
    target_plan: Optional[dict[str, PlanVertex]] = None,
) -> RescaleReport:
    """Write to ``dst`` the session's checkpoint for the new parallelism (nothing with ``dry_run``).
    ``drop``: operators whose incoming in-flight data is dropped and reported; ``target_plan``: the
    job's plan as it will be started, else ckpt derives the new job graph from the plan."""
    plan = plan_rescale(session.metadata, parallelism, overrides or {}, session.described_exchanges, session.plan, drop)
    check_new_topology(session, plan, target_plan)
    check_output_mapping(session.checkpoint, plan.exchanges, session.engine, set(plan.rescaled + plan.dropped))
    return rewrite(session, dst, plan, dry_run)
