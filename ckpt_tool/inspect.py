"""What a checkpoint holds, as the stable dictionary behind ``ckpt inspect`` (and its ``--json``).

Metadata only: nothing but ``_metadata`` is read. Channel-state ``bytes`` are buffer payloads
without their 4-byte length fields; Flink's handle sizes include those, one per buffer.
"""

from __future__ import annotations

import re

from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.javaser import read_java_object
from ckpt_tool.flink.model import INPUT, OUTPUT, OperatorState

# Metadata v3-v6 store no upstream output-buffer state of their own: Flink 2.3 builds it at
# restore time from the upstream's output state (recover-output-on-downstream), so on disk it is
# always empty. The key stays in the output so that readers can rely on all three directions.
UPSTREAM_OUTPUT = "upstream_output"


def _channel_totals(op: OperatorState, direction: str) -> dict:
    handles = [h for s in op.subtasks for h in s.channel_handles(direction)]
    return {
        "buffers": sum(h.buffer_count for h in handles),
        "bytes": sum(h.payload_bytes for h in handles),
    }


def operator_summary(op: OperatorState) -> dict:
    return {
        "id": op.id_hex,
        "uid": op.uid,
        "name": op.name,
        "parallelism": op.parallelism,
        "max_parallelism": op.max_parallelism,
        "finished": op.finished,
        "channel_state": {
            INPUT: _channel_totals(op, INPUT),
            OUTPUT: _channel_totals(op, OUTPUT),
            UPSTREAM_OUTPUT: {"buffers": 0, "bytes": 0},
        },
    }


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def properties_summary(raw: bytes | None) -> dict | None:
    """CheckpointProperties (metadata v4+) with snake_case keys; None for older versions."""
    if raw is None:
        return None
    decoded = read_java_object(raw)
    snapshot_type = decoded.get("checkpointType") or {}
    summary = {_snake(k): v for k, v in decoded.items() if isinstance(v, bool)}
    summary["checkpoint_type"] = snapshot_type.get("name")
    summary["sharing_files_strategy"] = snapshot_type.get("sharingFilesStrategy")
    return summary


def summarize(checkpoint: Checkpoint) -> dict:
    md = checkpoint.metadata
    return {
        "checkpoint_id": md.checkpoint_id,
        "metadata_version": md.version,
        "properties": properties_summary(md.properties),
        "master_states": [{"name": m.name, "version": m.version, "bytes": len(m.payload)} for m in md.master_states],
        "operators": [operator_summary(op) for op in md.operators],
    }
