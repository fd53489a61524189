"""What a checkpoint holds, as the stable dictionary behind ``ckpt inspect`` (and its ``--json``).

Without a schema or plan only ``_metadata`` is read (and referenced files are checked to exist).
Channel-state ``bytes`` are buffer payloads without their 4-byte length fields. With a schema
and/or plan, the records of every described exchange are scanned by an engine (in-process for
small checkpoints, Spark for large ones; both give the same figures).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict
from typing import Optional

from ckpt_tool.engine import Progress, duplicates_per_exchange
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.javaser import read_java_object
from ckpt_tool.flink.metadata import iter_stream_handles
from ckpt_tool.flink.model import (
    INPUT,
    OUTPUT,
    ByteStreamHandle,
    ChangelogBackendHandle,
    IncrementalKeyedHandle,
    KeyGroupsHandle,
    OperatorState,
)
from ckpt_tool.records.keys import key_group_range
from ckpt_tool.records.scan import channel_tasks
from ckpt_tool.records.schema import Exchange

# Metadata v3-v6 store no upstream output-buffer state of their own: Flink 2.3 builds it at
# restore time from the upstream's output state (recover-output-on-downstream), so on disk it is
# always empty. The key stays in the output so that readers can rely on all three directions.
UPSTREAM_OUTPUT = "upstream_output"
SMALL_FILE_BYTES = 128 * 1024


def _channel_totals(op: OperatorState, direction: str) -> dict:
    handles = [h for s in op.subtasks for h in s.channel_handles(direction)]
    return {
        "buffers": sum(h.buffer_count for h in handles),
        "bytes": sum(h.payload_bytes for h in handles),
    }


def _keyed_size(handle) -> int:
    if handle is None:
        return 0
    if isinstance(handle, KeyGroupsHandle):
        return handle.delegate.size if handle.delegate else 0
    if isinstance(handle, IncrementalKeyedHandle):
        parts = [handle.meta] + [p.handle for p in handle.shared + handle.private]
        return sum(p.size for p in parts if p is not None)
    if isinstance(handle, ChangelogBackendHandle):
        return sum(_keyed_size(h) for h in handle.materialized + handle.non_materialized)
    return getattr(handle, "state_size", 0)


def _state_sizes(op: OperatorState) -> dict:
    live = [s for s in op.subtasks if not s.finished]
    return {
        "keyed": sum(_keyed_size(s.managed_keyed) + _keyed_size(s.raw_keyed) for s in live),
        "operator": sum(h.delegate.size for s in live for h in (s.managed_operator, s.raw_operator) if h and h.delegate),
        "channel": sum(h.state_size for s in live for h in s.input_channels + s.output_channels),
    }


def _subtasks(checkpoint: Checkpoint, op: OperatorState) -> list[dict]:
    result = []
    for s in op.subtasks:
        channels = []
        for direction in (INPUT, OUTPUT):
            for h in s.channel_handles(direction):
                channels.append({
                    "direction": direction,
                    "gate" if direction == INPUT else "partition": h.info[0],
                    "channel" if direction == INPUT else "subpartition": h.info[1],
                    "buffers": h.buffer_count,
                    "bytes": h.payload_bytes,
                    "file": checkpoint.location(h.delegate),
                })
        result.append({"index": s.index, "finished": s.finished, "channels": channels})
    return result


def operator_summary(checkpoint: Checkpoint, op: OperatorState) -> dict:
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
        "state_size": _state_sizes(op),
        "subtasks": _subtasks(checkpoint, op),
    }


def files_summary(checkpoint: Checkpoint) -> dict:
    """Files the metadata references (sizes as recorded), inline state, and shared channel files."""
    sizes: dict[str, int] = {}
    inline = 0
    for handle in iter_stream_handles(checkpoint.metadata):
        location = checkpoint.location(handle)
        if location is None:
            inline += handle.size if isinstance(handle, ByteStreamHandle) else 0
        else:
            sizes[location] = max(sizes.get(location, 0), handle.size)
    owners: dict[str, set] = defaultdict(set)
    for op in checkpoint.metadata.operators:
        for s in op.subtasks:
            for h in s.input_channels + s.output_channels:
                location = checkpoint.location(h.delegate)
                if location:
                    owners[location].add((op.id_hex, s.index))
    values = sorted(sizes.values())
    return {
        "count": len(values),
        "bytes": sum(values),
        "min_bytes": values[0] if values else 0,
        "median_bytes": int(statistics.median(values)) if values else 0,
        "max_bytes": values[-1] if values else 0,
        "small_files": sum(v < SMALL_FILE_BYTES for v in values),
        "small_file_limit_bytes": SMALL_FILE_BYTES,
        "inline_bytes": inline,
        "channel_state_files": len(owners),
        "shared_channel_state_files": [
            {"file": f, "subtasks": len(o)} for f, o in sorted(owners.items()) if len(o) > 1
        ],
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


def exchanges_summary(
    checkpoint: Checkpoint, exchanges: list[Exchange], engine, progress: Progress = None
) -> list[dict]:
    """Records per channel, key-group histograms, misplaced and duplicate records per exchange."""
    tasks = channel_tasks(checkpoint, exchanges)
    results, holders = engine.scan(tasks, exchanges, progress)
    duplicates = duplicates_per_exchange(holders)
    by_exchange = defaultdict(list)
    for stats in results:
        by_exchange[stats.exchange_index].append(stats)
    summaries = []
    for index, exchange in enumerate(exchanges):
        channels = sorted(by_exchange[index], key=lambda s: (s.upstream_subtask, s.downstream_subtask))
        downstream = checkpoint.metadata.operator(exchange.downstream_id)
        histogram = Counter()
        for stats in channels:
            histogram.update(stats.key_groups)
        keyed = exchange.keyed
        summaries.append({
            "upstream": exchange.upstream_id,
            "downstream": exchange.downstream_id,
            "gate": exchange.gate,
            "partition": exchange.partition,
            "partitioner": exchange.partitioner or ("HASH" if keyed else None),
            "type": exchange.record_type,
            "key": list(exchange.key) if exchange.key else None,
            "keyed": keyed,
            "records": sum(s.records for s in channels),
            "watermarks": sum(s.watermarks for s in channels),
            "other_elements": sum(s.other_elements for s in channels),
            "bytes": sum(s.bytes for s in channels),
            "partial_bytes": sum(s.trailing_bytes for s in channels),
            "misplaced_records": sum(s.misplaced_records for s in channels) if keyed else None,
            "duplicate_records": duplicates.get(index, 0) if keyed else None,
            "key_group_histogram": {str(k): histogram[k] for k in sorted(histogram)} if keyed else None,
            "subtask_key_groups": [
                [r.start, r.stop - 1]
                for r in (
                    key_group_range(downstream.max_parallelism, downstream.parallelism, i)
                    for i in range(downstream.parallelism)
                )
            ] if keyed else None,
            "channels": [
                {
                    "upstream_subtask": s.upstream_subtask,
                    "downstream_subtask": s.downstream_subtask,
                    "input_buffers": s.input_buffers,
                    "output_buffers": s.output_buffers,
                    "bytes": s.bytes,
                    "records": s.records,
                    "watermarks": s.watermarks,
                    "other_elements": s.other_elements,
                    "partial_bytes": s.trailing_bytes,
                    "misplaced_records": s.misplaced_records if keyed else None,
                }
                for s in channels
            ],
        })
    return summaries


def summarize(
    checkpoint: Checkpoint,
    exchanges: Optional[list[Exchange]] = None,
    engine=None,
    progress: Progress = None,
) -> dict:
    md = checkpoint.metadata
    summary = {
        "checkpoint_id": md.checkpoint_id,
        "metadata_version": md.version,
        "properties": properties_summary(md.properties),
        "master_states": [{"name": m.name, "version": m.version, "bytes": len(m.payload)} for m in md.master_states],
        "operators": [operator_summary(checkpoint, op) for op in md.operators],
        "files": files_summary(checkpoint),
    }
    if exchanges is not None:
        summary["engine"] = engine.name
        summary["exchanges"] = exchanges_summary(checkpoint, exchanges, engine, progress)
    return summary


def channel_state_bytes(checkpoint: Checkpoint) -> int:
    return sum(
        h.payload_bytes for op in checkpoint.metadata.operators for s in op.subtasks
        for d in (INPUT, OUTPUT) for h in s.channel_handles(d)
    )
