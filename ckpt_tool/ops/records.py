"""``ckpt records``: every in-flight record of the described exchanges, one Parquet row each
(the rows and their schema: ckpt_tool.records.export).

The work runs on the session's engine in tasks of a bounded byte budget (many logical channels
each; a job at parallelism p has p² of them): a task reads and frames its channels together, a
few MiB at a time, decodes their records and writes their rows to one part file in a private
directory beside the output, in row groups of up to ROWS_PER_GROUP rows; the driver then copies
the parts, row group by row group, into one file with one ``ParquetWriter``. Memory stays bounded
by a row group and the bytes read together, and a record of hundreds of MiB costs a small
multiple of its size.

The file holds every record value, so it is never more readable than the checkpoint
(ckpt_tool.output_files): it is written owner-only and given the checkpoint's permission bits
before it is renamed into place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ckpt_tool.engine import Engine, Progress
from ckpt_tool.engine.tasks import (
    LARGE_CHANNEL_BYTES,
    BatchRows,
    ChannelPieces,
    ChannelTable,
    ChannelTask,
    channel_tasks,
    framed_blocks,
    read_channel,
)
from ckpt_tool.errors import CkptError, naming
from ckpt_tool.flink.channel_state import ChannelStateReader, pointwise_channels
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.plan import POINTWISE_PARTITIONERS
from ckpt_tool.output_files import publish, report_mode
from ckpt_tool.records.batch import FramedChannels
from ckpt_tool.records.export import ROWS_PER_GROUP, Decoding, file_schema, joined_columns, record_columns, table, writer_options
from ckpt_tool.records.schema import Exchange


class ExportError(CkptError):
    """The records could not be written."""


@dataclass
class ExportContext:
    """What every batch of channels needs: the exchanges, their labels, the input channel of
    each pointwise (u, d), the value fields, the file's schema and the parts' directory."""

    exchanges: list[Exchange]
    labels: list[str]
    pointwise: dict[int, dict[tuple[int, int], int]]
    places: dict[int, str]
    schema: pa.Schema
    parts: str


def export_batch(channels: ChannelTable | list[ChannelTask], context: ExportContext) -> tuple[str, int]:
    """Write the records of a batch of logical channels (an engine task of a bounded byte budget,
    not a task per channel: a job at parallelism p has p² channels) to one part file, in row
    groups of up to ROWS_PER_GROUP rows; returns (part, rows). The channels of one exchange are
    read READ_TOGETHER_BYTES at a time (each file once for them all) and framed together, and
    their records decoded ROWS_PER_GROUP at a time, so that a channel of one record costs no more
    than a record (at p=4,096 sparse, 1.7 million channels hold 1.7 million records). Memory stays
    bounded by a row group's values and the bytes read together (a larger channel alone)."""
    descriptor, part = tempfile.mkstemp(prefix="part-", suffix=".parquet", dir=context.parts)
    os.close(descriptor)
    pending: list[dict[str, Any]] = []  # columns of records of one exchange
    held = rows = 0
    decodings: dict[int, Decoding] = {}
    with ChannelStateReader() as reader, pq.ParquetWriter(part, context.schema, **writer_options()) as writer:

        def flush() -> None:
            nonlocal held
            if pending:
                writer.write_table(table(joined_columns(pending), context.schema), ROWS_PER_GROUP)
                pending.clear()
                held = 0

        current = None
        for index, framed, upstream, downstream, parallelisms, before in _framed(BatchRows.of(channels), reader, context.labels):
            if index != current:
                flush()  # a row group's records are of one exchange (the same columns)
                current = index
            if index not in decodings:
                decodings[index] = Decoding(context.exchanges[index], context.places.get(index))
            exchange, label = context.exchanges[index], context.labels[index]
            pointwise = context.pointwise[index]
            input_channel = (
                np.array([pointwise.get(key, key[0]) for key in zip(upstream.tolist(), downstream.tolist())], dtype=np.int64)
                if pointwise
                else upstream
            )
            records = framed.records
            indices = np.flatnonzero(records.is_record)
            for first in range(0, len(indices), ROWS_PER_GROUP):
                chosen = indices[first : first + ROWS_PER_GROUP]
                channel = framed.channel[chosen]
                where: dict[str, Any] = {
                    "exchange": label,
                    "upstream_operator": exchange.upstream_id,
                    "downstream_operator": exchange.downstream_id,
                    "gate": exchange.gate,
                    "upstream_subtask": upstream[channel],
                    "downstream_subtask": downstream[channel],
                    "input_channel": input_channel[channel],
                }
                columns = record_columns(
                    records,
                    chosen,
                    chosen - framed.first[channel] + before,
                    where,
                    decodings[index],
                    *parallelisms,
                )
                count = len(chosen)
                if held and held + count > ROWS_PER_GROUP:
                    flush()
                pending.append(columns)
                held += count
                rows += count
            del records, framed  # gone once the next block is read (the generators hold them till then)
        flush()
    return part, rows


def _framed(
    rows: BatchRows, reader: ChannelStateReader, labels: list[str]
) -> Iterator[tuple[int, FramedChannels, np.ndarray, np.ndarray, tuple[int, int], int]]:
    """(exchange index, channels of it framed together, their upstream and downstream subtasks,
    the exchange's max parallelism and downstream parallelism, how many elements of a channel came
    before: 0 but in a piece of a large channel), a block of ``framed_blocks`` at a time; a channel
    of more than LARGE_CHANNEL_BYTES in pieces (``ChannelPieces``); where a block does not read or
    frame, its channels one by one, which raises the error that names the channel."""
    for block in framed_blocks(rows, reader, read_up_to=LARGE_CHANNEL_BYTES):
        index, start, stop = block.exchange_index, block.start, block.stop
        parallelisms = rows.parallelisms(start)
        if block.read is not None:
            yield index, block.read[0], rows.upstream[start:stop], rows.downstream[start:stop], parallelisms, 0
            continue
        for i, one in enumerate(rows.tasks(start, stop), start):
            with naming(f"{labels[index]}, channel {one.upstream_subtask} -> {one.downstream_subtask}"):
                if block.large:
                    try:
                        for piece, before in ChannelPieces.of(reader, one):
                            yield index, piece, rows.upstream[i : i + 1], rows.downstream[i : i + 1], parallelisms, before
                    except CkptError:
                        read_channel(reader, one)  # read whole, it names the element that does not read
                        raise
                    continue
                records = read_channel(reader, one)
            yield index, FramedChannels.of(records), rows.upstream[i : i + 1], rows.downstream[i : i + 1], parallelisms, 0


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
        # by downstream subtask, then upstream: the channels of a block of rows lie in few files
        # (a subtask's input state is one), not in one file per upstream subtask (at p=4,096 dense,
        # a block of 8 MiB had read from each of 4,096 files: 2.3 times the CPU)
        table_of_channels = channel_tasks(checkpoint, exchanges, by_downstream=True)
        context = ExportContext(
            exchanges,
            [checkpoint.metadata.exchange_label(e.upstream_id, e.downstream_id) for e in exchanges],
            {i: _input_channels(checkpoint, e) for i, e in enumerate(exchanges)},
            places,
            schema,
            parts,
        )
        written = engine.map_batches(
            lambda batch: export_batch(batch, context), table_of_channels, progress, table_of_channels.size
        )
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
    return ExportReport(out, records, len(table_of_channels), len(exchanges))
