"""One Output interface for the CLI, rendered as Rich tables or as JSON.

Every name, path and message in a table is shown literally: cells are Rich ``Text`` (never read
as markup, so ``[bold]`` or ``[link=...]`` in a uid stays text) with control and other unsafe
characters escaped (ckpt_tool.text), and very long values cut. Tables of up to ``RICH_ROWS``
rows are drawn by Rich; longer ones (100,000 operators) line by line in the same layout, without
styles, in time proportional to their cells (Rich costs about half a millisecond a row).
"""

from __future__ import annotations

import json
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Optional, Union

from rich.cells import cell_len, chop_cells
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ckpt_tool.flink.model import INPUT
from ckpt_tool.text import LINE_LIMIT, printable

if TYPE_CHECKING:  # the reports' modules load the record path (NumPy); a metadata-only inspect needs none
    from ckpt_tool.exchanges import ExchangeScan
    from ckpt_tool.ops.inspect import FilesSummary, InspectReport, OperatorSummary
    from ckpt_tool.ops.listing import ListReport
    from ckpt_tool.ops.verify import VerifyReport
    from ckpt_tool.rewrite import RescaleReport

HISTOGRAM_BUCKETS = 32
BAR_WIDTH = 40
RICH_ROWS = 200  # longer tables are written line by line (see the module's doc)

Cell = Union[str, Text]  # a str is shown literally; a Text is ckpt's own styled text


def literal(value: Cell) -> Text:
    """A cell as Text: a str with unsafe characters escaped and cut to a bounded length."""
    return value if isinstance(value, Text) else Text(printable(value, LINE_LIMIT))


def plain_table(title: Text, columns: list[Text], rows: list[list[Text]], widths: list[int], header: bool) -> list[str]:
    """Lines of a table exactly as Rich draws it with its default box (``HEAVY_HEAD``), no styles."""

    def line(left: str, fill: str, middle: str, right: str) -> str:
        return left + middle.join(fill * (w + 2) for w in widths) + right

    def cells(edge: str, values: list[Text]) -> str:
        return edge + edge.join(f" {v.plain}{' ' * (w - v.cell_len)} " for v, w in zip(values, widths)) + edge

    width = sum(widths) + 3 * len(widths) + 1
    lines = []
    if title.plain:
        left = (width - title.cell_len) // 2
        lines.append(" " * left + title.plain + " " * (width - left - title.cell_len))
    if header:
        lines += [line("┏", "━", "┳", "┓"), cells("┃", columns), line("┡", "━", "╇", "┩")]
    else:
        lines.append(line("┌", "─", "┬", "┐"))
    lines += [cells("│", row) for row in rows]
    lines.append(line("└", "─", "┴", "┘"))
    return lines


def plain_stacked(columns: list[Text], rows: list[list[Text]], width: int) -> list[str]:
    """Lines of the stacked view (one ``column value`` block per row) in Rich's layout, no styles;
    a value wider than the terminal is cut into lines of its width (Rich would wrap at words)."""
    label_width = max((c.cell_len for c in columns), default=0)
    room = max(1, width - label_width - 4)
    lines = []
    for row in rows:
        value_width = min(room, max((v.cell_len for v in row), default=0))
        for column, value in zip(columns, row):
            label = column.plain or "-"
            pieces = chop_cells(value.plain, room) if value.cell_len > room else [value.plain]
            for number, piece in enumerate(pieces):
                shown = label if number == 0 else ""
                lines.append(f" {shown}{' ' * (label_width - cell_len(shown))}  {piece}{' ' * (value_width - cell_len(piece))} ")
        lines.append("")
    return lines


class Output(ABC):
    @abstractmethod
    def inspect(self, report: InspectReport) -> None: ...

    @abstractmethod
    def rescale(self, report: RescaleReport) -> None: ...

    @abstractmethod
    def verify(self, report: VerifyReport) -> None: ...

    @abstractmethod
    def listing(self, report: ListReport) -> None: ...


class JsonOutput(Output):
    """Each report's ``as_dict``: the documented, stable layout; without ``channel_rows``,
    ``inspect``'s lists of single channels are null (``--summary``)."""

    def __init__(self, channel_rows: bool = True) -> None:
        self.channel_rows = channel_rows

    def _emit(self, value: dict) -> None:
        # indented for a person at a terminal; compact otherwise (Python's encoder is several times
        # faster without indentation, which counts for checkpoints with thousands of handles)
        sys.stdout.write(json.dumps(value, indent=2 if sys.stdout.isatty() else None) + "\n")

    def inspect(self, report: InspectReport) -> None:
        if sys.stdout.isatty() or not self.channel_rows:
            self._emit(report.as_dict(channel_rows=self.channel_rows))
            return
        from ckpt_tool.ops.inspect import write_json

        # written subtask by subtask: the text of a job at parallelism 4,096 lists 16 million channels
        write_json(report.as_dict(streamed=True), sys.stdout.write)
        sys.stdout.write("\n")

    def rescale(self, report: RescaleReport) -> None:
        self._emit(report.as_dict())

    def verify(self, report: VerifyReport) -> None:
        self._emit(report.as_dict())

    def listing(self, report: ListReport) -> None:
        self._emit(report.as_dict())


CHANNEL_ROWS = 1000  # channel handles listed one per row in text; beyond, one row per subtask
# the figures of an exchange's rows after the two that say which channels a row is
FIGURE_COLUMNS = ("input_buffers", "output_buffers", "bytes", "records", "watermarks", "other_elements", "misplaced_records")


def _file_name(location: Optional[str]) -> str:
    return location.rsplit("/", 1)[-1] if location else "inline"


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
    """Tables on a terminal. A table too wide for the terminal is shown stacked, one block of
    ``column: value`` lines per row, so that names and figures stay whole at 80 columns."""

    def __init__(self, width: Optional[int] = None) -> None:
        # Piped output is not squeezed into Rich's default 80 columns.
        self.console = Console(width=width or (None if sys.stdout.isatty() else 160))

    def _show(self, title: str, columns: list[str], rows: Sequence[Sequence[Cell]], header: bool = True) -> None:
        caption, heads = literal(title), [literal(c) for c in columns]
        cells = [[literal(v) for v in row] for row in rows]
        widths = [max([h.cell_len if header else 0] + [row[i].cell_len for row in cells]) for i, h in enumerate(heads)]
        natural = sum(widths) + 3 * len(widths) + 1  # Rich's box: a border and a space either side of each cell
        if natural <= self.console.width:
            if len(cells) > RICH_ROWS:
                self._write(plain_table(caption, heads, cells, widths, header))
                return
            table = Table(title=caption if caption.plain else None, show_header=header)
            for column in heads:
                table.add_column(column, no_wrap=True)
            for row in cells:
                table.add_row(*row)
            self.console.print(table)
            return
        self.console.print(Text(caption.plain, style="bold"))
        if len(cells) > RICH_ROWS:
            self._write(plain_stacked(heads, cells, self.console.width))
            return
        for row in cells:
            stacked = Table(show_header=False, box=None, padding=(0, 1))
            stacked.add_column(style="dim", no_wrap=True)
            stacked.add_column(overflow="fold")
            for column, value in zip(heads, row):
                stacked.add_row(column if column.plain else Text("-"), value)
            self.console.print(stacked)
            self.console.print()

    def _write(self, lines: list[str]) -> None:
        """Lines written as they are (already literal), past Rich's per-line rendering."""
        self.console.file.write("\n".join(lines) + "\n")
        self.console.file.flush()

    def _line(self, *parts: Cell) -> None:
        """One line of literal text and ckpt's own styled words."""
        self.console.print(Text.assemble(*(literal(p) for p in parts)))

    def inspect(self, report: InspectReport) -> None:
        self._summary(report)
        self._operators(report.operators)
        self._channels(report.operators)
        self._changelog(report.operators)
        self._files(report.files)
        names = {o.id: o.label for o in report.operators}
        max_parallelism = {o.id: o.max_parallelism for o in report.operators}
        for exchange in report.exchanges or []:
            self._exchange(exchange, names, max_parallelism.get(exchange.exchange.downstream_id, 128))
        for problem in report.problems:
            self._line(Text("problem:", style="red"), " ", problem)

    def _summary(self, report: InspectReport) -> None:
        ops = report.operators
        rows = [["checkpoint id", str(report.checkpoint_id)], ["metadata version", str(report.metadata_version)]]
        props = report.properties
        if props:
            retained = "retained" if not props.get("discard_cancelled") else "discarded"
            detail = props.get("savepoint_format") or props["sharing_files_strategy"]
            rows.append(["type", f"{props['checkpoint_type']} ({detail}, {retained} on cancel)"])
        rows.append(["operators", f"{len(ops)} ({sum(o.finished == 'all' for o in ops)} finished)"])
        for direction in ("input", "output"):
            buffers = sum(o.channel_state[direction].buffers for o in ops)
            size = sum(o.channel_state[direction].bytes for o in ops)
            rows.append([f"{direction} channel state", f"{buffers} buffers, {human_bytes(size)}"])
        if report.engine:
            rows.append(["record scan", report.engine])
        self._show("Checkpoint", ["", ""], rows, header=False)

    def _operators(self, ops: list[OperatorSummary]) -> None:
        columns = [
            "operator (uid)",
            "id",
            "parallelism / max",
            "finished",
            "keyed state",
            "operator state",
            "input channels",
            "output channels",
        ]
        rows = [
            [
                f"{o.name or '?'}" + (f" ({o.uid})" if o.uid else ""),
                o.id,
                f"{o.parallelism} / {o.max_parallelism}",
                o.finished,
                human_bytes(o.state_size.keyed),
                human_bytes(o.state_size.operator),
                _buffers(o.channel_state["input"]),
                _buffers(o.channel_state["output"]),
            ]
            for o in ops
        ]
        self._show("Operators", columns, rows)

    def _channels(self, ops: list[OperatorSummary]) -> None:
        """One row per channel handle, or, past ``CHANNEL_ROWS`` of them (a job at parallelism p
        has up to p² per exchange), one row per subtask and direction (``--json`` lists each),
        summed from the handles without opening them."""
        totals = [(o, s, s.channel_totals()) for o in ops for s in o.subtasks]
        count = sum(t.channels for _, _, by_direction in totals for t in by_direction.values())
        if not count:
            return
        if count <= CHANNEL_ROWS:
            rows = []
            for o, s, _ in totals:
                for ch in s.channels:
                    if ch.direction == INPUT:
                        where = f"gate {ch.info[0]}, channel {ch.info[1]}"
                    else:
                        where = f"partition {ch.info[0]}, subpartition {ch.info[1]}"
                    size = human_bytes(ch.bytes)
                    rows.append([o.label, str(s.index), ch.direction, where, str(ch.buffers), size, _file_name(ch.file)])
            columns = ["operator", "subtask", "direction", "channel", "buffers", "bytes", "file"]
            self._show("Channel state per subtask and channel", columns, rows)
            return
        per_subtask = []
        for o, s, by_direction in totals:
            for direction, t in by_direction.items():
                names = sorted({_file_name(f) for f in t.files})
                shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                row = [o.label, str(s.index), direction, str(t.channels), str(t.buffers), human_bytes(t.bytes), shown]
                per_subtask.append(row)
        columns = ["operator", "subtask", "direction", "channels", "buffers", "bytes", "files"]
        self._show(f"Channel state per subtask ({count} channels; --json lists each)", columns, per_subtask)

    def _changelog(self, ops: list[OperatorSummary]) -> None:
        rows = []
        for o in ops:
            for s in o.subtasks:
                changelog = s.changelog
                if changelog is None:
                    continue
                parts = [("materialized", p) for p in changelog.materialized]
                parts += [("changelog", p) for p in changelog.non_materialized]
                for part, handle in parts:
                    files = ", ".join(
                        (f["file"].rsplit("/", 1)[-1] if f["file"] else "inline") + (f" @{f['offset']}" if f["offset"] else "")
                        for f in handle.files
                    )
                    rows.append(
                        [
                            o.label,
                            str(s.index),
                            "{}-{} (materialization {})".format(*changelog.key_groups, changelog.materialization_id),
                            part,
                            handle.kind,
                            "{}-{}".format(*handle.key_groups),
                            human_bytes(handle.bytes),
                            files or "-",
                        ]
                    )
        if rows:
            columns = ["operator", "subtask", "key groups", "part", "handle", "handle key groups", "bytes", "files"]
            self._show("Changelog state backend per subtask", columns, rows)

    def _files(self, files: FilesSummary) -> None:
        sizes = " / ".join(human_bytes(v) for v in (files.min_bytes, files.median_bytes, files.max_bytes))
        rows = [
            ["referenced files", f"{files.count} ({human_bytes(files.bytes)})"],
            ["size min / median / max", sizes],
            [f"small files (< {human_bytes(files.small_file_limit_bytes)})", str(files.small_files)],
            ["inline state in _metadata", human_bytes(files.inline_bytes)],
            ["channel-state files", str(files.channel_state_files)],
        ]
        rows += [["  shared by subtasks", f"{f.rsplit('/', 1)[-1]}: {n}"] for f, n in files.shared_channel_state_files]
        self._show("Files", ["", ""], rows, header=False)

    def _exchange(self, scan: ExchangeScan, names: dict, max_parallelism: int) -> None:
        exchange = scan.exchange
        up = names.get(exchange.upstream_id, "?") if exchange.upstream_id else "?"
        title = f"Exchange {up} → {names.get(exchange.downstream_id, '?')} (gate {exchange.gate}, {scan.partitioner or '?'})"
        if scan.problem:
            self._line(f"{title}: ", Text("not readable", style="red"), f": {scan.problem}")
            return
        count = len(scan.scanned)
        if not count:
            self._line(f"{title}: no in-flight data")
            return
        if count <= CHANNEL_ROWS:  # a row per channel
            figures = scan.figures.columns
            named = {"upstream": figures["upstream_subtask"], "downstream": figures["downstream_subtask"]}
        else:  # a job at parallelism p has p² channels: a row per downstream subtask
            figures = scan.per_downstream()
            named = {"downstream": figures["downstream_subtask"], "channels": figures["channels"]}
            title += f", per downstream subtask ({count} channels; --json lists each)"
        first, second = (column.tolist() for column in named.values())
        values = {name: figures[name].tolist() for name in FIGURE_COLUMNS}
        columns = [*named, "buffers in/out", "bytes", "records", "watermarks", "other", "misplaced"]
        rows = [
            [
                str(first[i]),
                str(second[i]),
                f"{values['input_buffers'][i]} / {values['output_buffers'][i]}",
                human_bytes(values["bytes"][i]),
                str(values["records"][i]),
                str(values["watermarks"][i]),
                str(values["other_elements"][i]),
                str(values["misplaced_records"][i]) if scan.keyed else "-",
            ]
            for i in range(len(first))
        ]
        self._show(title, columns, rows)
        line = (
            f"records {scan.total('records')}, watermarks {scan.total('watermarks')}, "
            f"other elements {scan.total('other_elements')}"
        )
        if scan.keyed:
            line += f", misplaced {scan.total('misplaced_records')}, duplicates {scan.duplicate_records}"
        self._line(line)
        if scan.keyed:
            rows = [[label, str(count), bar] for label, count, bar in histogram_rows(scan.key_group_histogram, max_parallelism)]
            self._show("Key-group histogram", ["key groups", "records", ""], rows)

    def rescale(self, report: RescaleReport) -> None:
        title = "Rescale plan (dry run: nothing written)" if report.dry_run else "Rescale"
        if report.operators:
            rows = [[o.name or o.uid or "?", o.id, f"{o.parallelism[0]} → {o.parallelism[1]}"] for o in report.operators]
            self._show(f"{title}: operators", ["operator", "id", "parallelism"], rows)
        out = "records out (estimate)" if report.estimated else "records out"
        columns = [
            "exchange",
            "partitioner",
            "records in",
            out,
            "bytes in",
            "bytes out",
            "inflation",
            "replicas removed",
            "non-records dropped",
        ]
        rows = [
            [
                e.name,
                e.partitioner,
                str(e.records_in),
                str(e.records_out),
                human_bytes(e.bytes_in),
                "-" if report.estimated else human_bytes(e.bytes_out),
                f"{e.inflation:.2f}",
                str(e.replicas_removed),
                str(e.non_records_dropped),
            ]
            for e in report.exchanges
        ]
        if rows:
            self._show("In-flight data rerouted, per exchange", columns, rows)
        if report.dropped:
            rows = [
                [d.name, str(d.buffers), human_bytes(d.bytes), str(d.records), str(d.watermarks), str(d.other_elements)]
                for d in report.dropped
            ]
            self._show("In-flight data dropped", ["exchange", "buffers", "bytes", "records", "watermarks", "other"], rows)
        self._line(rescale_footer(report))

    def verify(self, report: VerifyReport) -> None:
        style = {"passed": "green", "failed": "red", "skipped": "dim"}
        rows: list[list[Cell]] = [
            [c.name, Text(c.status, style=style[c.status]), str(len(c.problems)), c.skipped or c.description]
            for c in report.checks
        ]
        self._show(f"Verify {report.checkpoint}", ["check", "status", "problems", "what it checks"], rows)
        problems = [p for c in report.checks for p in c.problems]
        if problems:
            columns = ["check", "operator", "subtask", "channel", "count", "problem"]
            rows = [
                [
                    p.check,
                    escape(p.operator or ""),
                    "" if p.subtask is None else str(p.subtask),
                    p.channel or "",
                    str(p.count),
                    escape(p.message),  # Flink's names and messages hold brackets
                ]
                for p in problems
            ]
            self._show("Problems", columns, rows)
        self._line(f"status: {report.summary}")

    def listing(self, report: ListReport) -> None:
        from rich.markup import escape

        rows = []
        for c in report.checkpoints:
            if not c.complete:
                state = "no (no _metadata)"
            elif c.error:
                state = f"unreadable: {c.error}"
            else:
                state = "yes"
            inflated = "-" if c.inflated is None else (f"yes ({c.replicated_handles} replicated handles)" if c.inflated else "no")
            rows.append(
                [
                    escape(c.name),
                    "-" if c.checkpoint_id is None else str(c.checkpoint_id),
                    escape(state),
                    human_bytes(c.size if c.size is not None else c.directory_bytes),
                    "-" if c.in_flight is None else human_bytes(c.in_flight),
                    escape(_parallelism(c.parallelism)),
                    inflated,
                ]
            )
        columns = ["checkpoint", "id", "complete", "size", "in-flight", "parallelism", "inflated"]
        self._show(escape(f"Checkpoints of {report.job_dir}"), columns, rows)
        newest = report.newest_complete
        self.console.print(f"newest complete checkpoint: {escape(newest.name) if newest else 'none'}", highlight=False)


def _parallelism(parallelism: dict[str, int]) -> str:
    """``2 (all 9 operators)``, or the most common one and the operators that differ: ``2; print=1``."""
    if not parallelism:
        return "-"
    values = list(parallelism.values())
    common = max(set(values), key=values.count)
    others = [f"{name}={n}" for name, n in parallelism.items() if n != common]
    if not others:
        return f"{common} (all {len(values)} operators)"
    return f"{common}; " + ", ".join(others)


def rescale_footer(report: RescaleReport) -> str:
    """One line: what was rerouted, carried and dropped, written, and where it ran."""
    estimate = " (estimated)" if report.estimated else ""
    parts = [
        f"records {report.records_in} in, {report.records_out} out{estimate}, inflation {report.inflation:.2f}, "
        f"replicas removed {report.replicas_removed}"
    ]
    if report.carried_buffers:
        parts.append(f"carried unchanged {report.carried_buffers} buffers ({human_bytes(report.carried_bytes)})")
    if report.dropped:
        parts.append(f"dropped {sum(d.records for d in report.dropped)} records")
    parts.append(f"files written {report.files_written}")
    parts.append(f"engine {report.engine}")
    return "; ".join(parts)


def output_for(as_json: bool, channel_rows: bool = True) -> Output:
    return JsonOutput(channel_rows) if as_json else RichOutput()


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
