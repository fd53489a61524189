"""The exchanges of a checkpoint as its inputs describe them: Flink's REST plan, a compiled SQL
plan and a schema file, merged (schema facts win over the compiled plan's, which win over the
plan's) and checked."""

from __future__ import annotations

from typing import Optional

from ckpt_tool.flink.model import CheckpointMetadata
from ckpt_tool.flink.plan import JobPlan
from ckpt_tool.records.schema import Exchange, check_partitions, load_schema, merge_exchanges, plan_exchanges
from ckpt_tool.records.sql_plan import sql_plan_exchanges


def load_exchanges(
    metadata: CheckpointMetadata,
    schema: Optional[str],
    plan: Optional[JobPlan],
    sql_plan: Optional[str] = None,
    unstated_ok: bool = False,
    notes: Optional[list[str]] = None,
    plugins: tuple[str, ...] = (),
) -> list[Exchange]:
    """The exchanges a plan, a compiled SQL plan and/or a schema file describe (schema facts win
    over the compiled plan's, which win over the plan's). ``unstated_ok``: see ``check_partitions``;
    ``plugins``: the modules named with --plugin, the only ones a schema's decoders may come from."""
    from_plan = plan_exchanges(plan) if plan else []
    if sql_plan:
        from_plan = merge_exchanges(from_plan, sql_plan_exchanges(sql_plan, metadata, notes), metadata)
    from_schema = load_schema(schema, metadata, plugins) if schema else []
    exchanges = merge_exchanges(from_plan, from_schema, metadata)
    check_partitions(exchanges, metadata, unstated_ok)
    return exchanges
