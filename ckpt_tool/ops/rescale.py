"""``ckpt rescale``: a checkpoint for a new parallelism, restorable by Flink without replicating
or filtering in-flight data (seed 000 §4.1, done offline).

The plan (ckpt_tool.planning) says which operators change parallelism and which exchanges'
in-flight records are rerouted; the rewrite (ckpt_tool.rewrite) reassigns keyed and operator
state as Flink would, routes the records on the session's engine, proves the output and writes it.
"""

from __future__ import annotations

from typing import Optional

from ckpt_tool.planning import plan_rescale
from ckpt_tool.rewrite import RescaleReport, rewrite
from ckpt_tool.session import Session


def rescale(
    session: Session,
    dst: str,
    parallelism: Optional[int],
    overrides: Optional[dict[str, int]] = None,
    dry_run: bool = False,
) -> RescaleReport:
    """Write to ``dst`` the session's checkpoint for the new parallelism (nothing with ``dry_run``)."""
    plan = plan_rescale(session.metadata, parallelism, overrides or {}, session.described_exchanges, session.plan)
    return rewrite(session, dst, plan, dry_run)
