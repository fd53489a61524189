"""``ckpt repair``: a copy in which every subtask holds only its own key groups' in-flight records,
each once (replicas left by a naive rescale or a checkpoint during recovery are kept once,
misplaced records move to the subtask owning their key group), or without the in-flight data
that flows into chosen operators (``--drop-in-flight``), reporting exactly what is dropped.
"""

from __future__ import annotations

from ckpt_tool.planning import plan_repair
from ckpt_tool.rewrite import RescaleReport, rewrite
from ckpt_tool.session import Session


def repair(session: Session, dst: str, drop: list[str]) -> RescaleReport:
    return rewrite(session, dst, plan_repair(session.metadata, session.described_exchanges, drop))
