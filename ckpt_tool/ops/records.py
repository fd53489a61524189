"""``ckpt records``: every in-flight record of the described exchanges, one Parquet row each
(the rows and their schema: ckpt_tool.records.export).

The work runs on the session's engine, one task per logical channel: a task decodes its channel
and writes its rows to a part file in a private directory beside the output; the driver then
copies the parts, row group by row group, into one file with one ``ParquetWriter``. Memory stays
bounded by a channel, and a record of hundreds of MiB costs a small multiple of its size.

The file holds every record value, so it is never more readable than the checkpoint
(ckpt_tool.output_files): it is written owner-only and given the checkpoint's permission bits
before it is renamed into place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from ckpt_tool.engine import Engine, Progress
from ckpt_tool.engine.tasks import ChannelTask, channel_tasks, read_channel
from ckpt_tool.errors import CkptError, naming
from ckpt_tool.flink.channel_state import ChannelStateReader, pointwise_channels
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.plan import POINTWISE_PARTITIONERS
from ckpt_tool.output_files import publish, report_mode
from ckpt_tool.records.export import ROWS_PER_GROUP, channel_columns, file_schema, table, writer_options
from ckpt_tool.records.schema import Exchange


class ExportError(CkptError):
    """The records could not be written."""


@dataclass
class ExportTask:
    channel: ChannelTask
    exchange: Exchange
    label: str
    input_channel: int
    value_field: Optional[str]  # "" for the value column itself, a field of it, or None (raw bytes)
    part: str


def export_channel(task: ExportTask, schema: pa.Schema) -> tuple[str, int]:
    """Write one logical channel's records to ``task.part``; returns (part, rows)."""
    channel, exchange = task.channel, task.exchange
    where: dict[str, Any] = {
        "exchange": task.label,
        "upstream_operator": exchange.upstream_id,
        "downstream_operator": exchange.downstream_id,
        "gate": exchange.gate,
        "upstream_subtask": channel.upstream_subtask,
        "downstream_subtask": channel.downstream_subtask,
        "input_channel": task.input_channel,
    }
    with naming(f"{task.label}, channel {channel.upstream_subtask} -> {channel.downstream_subtask}"):
        with ChannelStateReader() as reader:  # the files' maps go once the channel is read
            records = read_channel(reader, channel)
        columns = channel_columns(records, exchange, task.value_field, where, channel.max_parallelism, channel.parallelism)
    del records  # the channel's bytes go before the values are converted, the values before they are encoded
    rows = table(columns, schema)
    pq.write_table(rows, task.part, row_group_size=ROWS_PER_GROUP, **writer_options())
    return task.part, rows.num_rows


@dataclass
class ExportReport:
    path: str
    records: int
    channels: int
    exchanges: int

    def as_dict(self) -> dict:
        return {"file": self.path, "records": self.records, "channels": self.channels, "exchanges": self.exchanges}


def _input_channels(checkpoint: Checkpoint, exchange: Exchange) -> dict[tuple[int, int], int]:
    """(u, d) -> the input channel of d that u feeds, on pointwise edges (else it is u)."""
    if exchange.partitioner not in POINTWISE_PARTITIONERS or not exchange.upstream_id:
        return {}
    up = checkpoint.metadata.operator(exchange.upstream_id).parallelism
    down = checkpoint.metadata.operator(exchange.downstream_id).parallelism
    return {(u, d): c for u, d, c, _ in pointwise_channels(up, down)}


def export_records(
    checkpoint: Checkpoint, exchanges: list[Exchange], engine: Engine, out: str, progress: Progress = None
) -> ExportReport:
    """Write every in-flight record of ``exchanges`` to the Parquet file ``out`` (a local path)."""
    if not exchanges:
        raise ExportError("no exchange to export: give --plan, --sql-plan and/or --schema")
    schema, places = file_schema(exchanges)
    directory = os.path.dirname(os.path.abspath(out)) or "."
    if not os.path.isdir(directory):
        raise ExportError(f"cannot write {out}: {directory} is not a directory")
    mode = report_mode(checkpoint)
    parts = tempfile.mkdtemp(prefix=".ckpt-records-", dir=directory)  # owner-only
    try:
        tasks = []
        pointwise = {i: _input_channels(checkpoint, e) for i, e in enumerate(exchanges)}
        for number, channel in enumerate(channel_tasks(checkpoint, exchanges)):
            exchange = exchanges[channel.exchange_index]
            key = (channel.upstream_subtask, channel.downstream_subtask)
            tasks.append(
                ExportTask(
                    channel,
                    exchange,
                    checkpoint.metadata.exchange_label(exchange.upstream_id, exchange.downstream_id),
                    pointwise[channel.exchange_index].get(key, channel.upstream_subtask),
                    places.get(channel.exchange_index),
                    os.path.join(parts, f"part-{number:06d}.parquet"),
                )
            )
        written = engine.map(lambda task: export_channel(task, schema), tasks, progress, [t.channel.size for t in tasks])
        records = 0
        temporary = os.path.join(parts, "all.parquet")
        with pq.ParquetWriter(temporary, schema, **writer_options()) as writer:
            for part, count in written:
                records += count
                source = pq.ParquetFile(part)
                for group in range(source.num_row_groups):
                    writer.write_table(source.read_row_group(group))
                source.close()
                os.unlink(part)  # a part's disk space goes as soon as it is copied
        publish(temporary, out, mode)
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from exc
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    return ExportReport(out, records, len(tasks), len(exchanges))
