"""One Output interface for the CLI, rendered as Rich tables or as JSON."""

from __future__ import annotations

import json
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ckpt_tool.exchanges import ExchangeScan
from ckpt_tool.ops.inspect import INPUT, FilesSummary, InspectReport, OperatorSummary
from ckpt_tool.ops.verify import VerifyReport
from ckpt_tool.rewrite import RescaleReport

HISTOGRAM_BUCKETS = 32
BAR_WIDTH = 40


class Output(ABC):
    @abstractmethod
    def inspect(self, report: InspectReport) -> None: ...

    @abstractmethod
    def rescale(self, report: RescaleReport) -> None: ...

    @abstractmethod
    def verify(self, report: VerifyReport) -> None: ...


class JsonOutput(Output):
    """Each report's ``as_dict``: the documented, stable layout."""

    def _emit(self, value: dict) -> None:
        sys.stdout.write(json.dumps(value, indent=2) + "\n")

    def inspect(self, report: InspectReport) -> None:
        self._emit(report.as_dict())

    def rescale(self, report: RescaleReport) -> None:
        self._emit(report.as_dict())

    def verify(self, report: VerifyReport) -> None:
        self._emit(report.as_dict())


def human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"


def _buffers(totals) -> str:
    return f"{totals.buffers} buf, {human_bytes(totals.bytes)}"


def histogram_rows(histogram: dict[int, int], max_parallelism: int) -> list[tuple[str, int, str]]:
    """Key groups in at most HISTOGRAM_BUCKETS ranges: (label, records, bar)."""
    width = max(1, -(-max_parallelism // HISTOGRAM_BUCKETS))
    buckets: dict[int, int] = {}
    for key_group, count in histogram.items():
        buckets[int(key_group) // width] = buckets.get(int(key_group) // width, 0) + count
    peak = max(buckets.values(), default=0)
    rows = []
    for bucket in range(-(-max_parallelism // width)):
        count = buckets.get(bucket, 0)
        low, high = bucket * width, min(max_parallelism, (bucket + 1) * width) - 1
        bar = "█" * (round(BAR_WIDTH * count / peak) if peak else 0)
        rows.append((f"{low}-{high}" if high > low else str(low), count, bar))
    return rows


class RichOutput(Output):
    def __init__(self) -> None:
        # Piped output is not squeezed into Rich's default 80 columns.
        self.console = Console(width=None if sys.stdout.isatty() else 160)

    def inspect(self, report: InspectReport) -> None:
        self._summary(report)
        self._operators(report.operators)
        self._channels(report.operators)
        self._files(report.files)
        names = {o.id: o.label for o in report.operators}
        max_parallelism = {o.id: o.max_parallelism for o in report.operators}
        for exchange in report.exchanges or []:
            self._exchange(exchange, names, max_parallelism.get(exchange.exchange.downstream_id, 128))

    def _summary(self, report: InspectReport) -> None:
        ops = report.operators
        head = Table(title="Checkpoint", show_header=False)
        head.add_row("checkpoint id", str(report.checkpoint_id))
        head.add_row("metadata version", str(report.metadata_version))
        props = report.properties
        if props:
            retained = "retained" if not props.get("discard_cancelled") else "discarded"
            head.add_row("type", f"{props['checkpoint_type']} ({props['sharing_files_strategy']}, {retained} on cancel)")
        head.add_row("operators", f"{len(ops)} ({sum(o.finished == 'all' for o in ops)} finished)")
        for direction in ("input", "output"):
            buffers = sum(o.channel_state[direction].buffers for o in ops)
            size = sum(o.channel_state[direction].bytes for o in ops)
            head.add_row(f"{direction} channel state", f"{buffers} buffers, {human_bytes(size)}")
        if report.engine:
            head.add_row("record scan", report.engine)
        self.console.print(head)

    def _operators(self, ops: list[OperatorSummary]) -> None:
        table = Table(title="Operators")
        table.add_column("operator (uid)", overflow="fold")
        table.add_column("id", no_wrap=True)
        for column in ("parallelism", "finished", "keyed", "operator", "input state", "output state"):
            table.add_column(column, no_wrap=True)
        for o in ops:
            table.add_row(
                f"{o.name or '?'}" + (f" ({o.uid})" if o.uid else ""),
                o.id,
                f"{o.parallelism} / {o.max_parallelism}",
                o.finished,
                human_bytes(o.state_size.keyed),
                human_bytes(o.state_size.operator),
                _buffers(o.channel_state["input"]),
                _buffers(o.channel_state["output"]),
            )
        self.console.print(table)

    def _channels(self, ops: list[OperatorSummary]) -> None:
        table = Table(title="Channel state per subtask and channel")
        for column in ("operator", "subtask", "direction", "channel", "buffers", "bytes", "file"):
            table.add_column(column, overflow="fold")
        for o in ops:
            for s in o.subtasks:
                for ch in s.channels:
                    if ch.direction == INPUT:
                        where = f"gate {ch.info[0]}, channel {ch.info[1]}"
                    else:
                        where = f"partition {ch.info[0]}, subpartition {ch.info[1]}"
                    file = ch.file.rsplit("/", 1)[-1] if ch.file else "inline"
                    table.add_row(
                        o.name or o.id[:8], str(s.index), ch.direction, where, str(ch.buffers), human_bytes(ch.bytes), file
                    )
        if table.row_count:
            self.console.print(table)

    def _files(self, files: FilesSummary) -> None:
        table = Table(title="Files", show_header=False)
        table.add_row("referenced files", f"{files.count} ({human_bytes(files.bytes)})")
        table.add_row(
            "size min / median / max", " / ".join(human_bytes(v) for v in (files.min_bytes, files.median_bytes, files.max_bytes))
        )
        table.add_row(f"small files (< {human_bytes(files.small_file_limit_bytes)})", str(files.small_files))
        table.add_row("inline state in _metadata", human_bytes(files.inline_bytes))
        table.add_row("channel-state files", str(files.channel_state_files))
        for file, subtasks in files.shared_channel_state_files:
            table.add_row("  shared by subtasks", f"{file.rsplit('/', 1)[-1]}: {subtasks}")
        self.console.print(table)

    def _exchange(self, scan: ExchangeScan, names: dict, max_parallelism: int) -> None:
        exchange = scan.exchange
        up = names.get(exchange.upstream_id, "?") if exchange.upstream_id else "?"
        title = f"Exchange {up} → {names.get(exchange.downstream_id, '?')} (gate {exchange.gate}, {scan.partitioner or '?'})"
        if not scan.channels:
            self.console.print(f"{title}: no in-flight data")
            return
        table = Table(title=title)
        for column in ("upstream", "downstream", "buffers in/out", "bytes", "records", "watermarks", "other", "misplaced"):
            table.add_column(column, no_wrap=True)
        for ch in scan.channels:
            table.add_row(
                str(ch.upstream_subtask),
                str(ch.downstream_subtask),
                f"{ch.input_buffers} / {ch.output_buffers}",
                human_bytes(ch.bytes),
                str(ch.records),
                str(ch.watermarks),
                str(ch.other_elements),
                str(ch.misplaced_records) if scan.keyed else "-",
            )
        self.console.print(table)
        line = (
            f"records {scan.total('records')}, watermarks {scan.total('watermarks')}, "
            f"other elements {scan.total('other_elements')}"
        )
        if scan.keyed:
            line += f", misplaced {scan.total('misplaced_records')}, duplicates {scan.duplicate_records}"
            self.console.print(line)
            histogram = Table(title="Key-group histogram", show_header=True)
            histogram.add_column("key groups", no_wrap=True)
            histogram.add_column("records", justify="right")
            histogram.add_column("", no_wrap=True)
            for label, count, bar in histogram_rows(scan.key_group_histogram, max_parallelism):
                histogram.add_row(label, str(count), bar)
            self.console.print(histogram)
        else:
            self.console.print(line)

    def rescale(self, report: RescaleReport) -> None:
        title = "Rescale plan (dry run: nothing written)" if report.dry_run else "Rescale"
        if report.operators:
            ops = Table(title=f"{title}: operators")
            for column in ("operator", "id", "parallelism"):
                ops.add_column(column, no_wrap=True)
            for o in report.operators:
                ops.add_row(o.name or o.uid or "?", o.id, f"{o.parallelism[0]} → {o.parallelism[1]}")
            self.console.print(ops)
        table = Table(title="In-flight data per exchange")
        for column in (
            "exchange",
            "partitioner",
            "records in",
            "records out",
            "bytes in",
            "bytes out",
            "inflation",
            "replicas removed",
            "non-records dropped",
        ):
            table.add_column(column, no_wrap=True)
        for e in report.exchanges:
            table.add_row(
                e.name,
                e.partitioner,
                str(e.records_in),
                str(e.records_out),
                human_bytes(e.bytes_in),
                human_bytes(e.bytes_out),
                f"{e.inflation:.2f}",
                str(e.replicas_removed),
                str(e.non_records_dropped),
            )
        if report.exchanges:
            self.console.print(table)
        if report.dropped:
            dropped = Table(title="In-flight data dropped")
            for column in ("exchange", "buffers", "bytes", "records", "watermarks", "other"):
                dropped.add_column(column, no_wrap=True)
            for d in report.dropped:
                dropped.add_row(
                    d.name, str(d.buffers), human_bytes(d.bytes), str(d.records), str(d.watermarks), str(d.other_elements)
                )
            self.console.print(dropped)
        self.console.print(
            f"records {report.records_in} in, {report.records_out} out, inflation {report.inflation:.2f}, "
            f"replicas removed {report.replicas_removed}, files written {report.files_written}"
        )

    def verify(self, report: VerifyReport) -> None:
        table = Table(title=f"Verify {report.checkpoint}")
        for column in ("check", "status", "problems", "what it checks"):
            table.add_column(column)
        style = {"passed": "green", "failed": "red", "skipped": "dim"}
        for c in report.checks:
            table.add_row(c.name, f"[{style[c.status]}]{c.status}[/]", str(len(c.problems)), c.description)
        self.console.print(table)
        problems = [p for c in report.checks for p in c.problems]
        if problems:
            listing = Table(title="Problems")
            for column in ("check", "operator", "subtask", "channel", "count", "problem"):
                listing.add_column(column, overflow="fold")
            for p in problems:
                listing.add_row(
                    p.check,
                    p.operator or "",
                    "" if p.subtask is None else str(p.subtask),
                    p.channel or "",
                    str(p.count),
                    p.message,
                )
            self.console.print(listing)
        self.console.print(f"status: {report.status}")


def output_for(as_json: bool) -> Output:
    return JsonOutput() if as_json else RichOutput()


@contextmanager
def progress_bar(description: str, enabled: bool = True) -> Iterator[Optional[Callable[[int, int], None]]]:
    """A Rich progress bar on a terminal (stderr); elsewhere no bar and a None callback."""
    if not (enabled and sys.stderr.isatty()):
        yield None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
