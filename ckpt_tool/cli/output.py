"""One Output interface for the CLI, rendered as Rich tables or as JSON."""

from __future__ import annotations

import json
import sys
from abc import ABC, abstractmethod

from rich.console import Console
from rich.table import Table


class Output(ABC):
    @abstractmethod
    def inspect(self, summary: dict) -> None: ...


class JsonOutput(Output):
    def _emit(self, value: dict) -> None:
        sys.stdout.write(json.dumps(value, indent=2, sort_keys=False) + "\n")

    def inspect(self, summary: dict) -> None:
        self._emit(summary)


def _human_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"


class RichOutput(Output):
    def __init__(self) -> None:
        # Piped output is not squeezed into Rich's default 80 columns.
        self.console = Console(width=None if sys.stdout.isatty() else 160)

    def inspect(self, summary: dict) -> None:
        ops = summary["operators"]
        totals = {
            d: (sum(o["channel_state"][d]["buffers"] for o in ops), sum(o["channel_state"][d]["bytes"] for o in ops))
            for d in ("input", "output")
        }
        head = Table(title="Checkpoint", show_header=False)
        head.add_row("checkpoint id", str(summary["checkpoint_id"]))
        head.add_row("metadata version", str(summary["metadata_version"]))
        props = summary.get("properties")
        if props:
            retained = "retained" if not props.get("discard_cancelled") else "discarded"
            head.add_row("type", f"{props['checkpoint_type']} ({props['sharing_files_strategy']}, {retained} on cancel)")
        head.add_row("operators", str(len(ops)))
        for direction, (buffers, size) in totals.items():
            head.add_row(f"{direction} channel state", f"{buffers} buffers, {_human_bytes(size)}")
        self.console.print(head)

        table = Table(title="Operators")
        table.add_column("operator (uid)", overflow="fold")
        table.add_column("id", no_wrap=True)
        for column in ("parallelism", "finished", "input state", "output state"):
            table.add_column(column, no_wrap=True)
        for o in ops:
            cs = o["channel_state"]
            table.add_row(
                f"{o['name'] or '?'}" + (f" ({o['uid']})" if o["uid"] else ""),
                o["id"],
                f"{o['parallelism']} / {o['max_parallelism']}",
                o["finished"],
                f"{cs['input']['buffers']} buf, {_human_bytes(cs['input']['bytes'])}",
                f"{cs['output']['buffers']} buf, {_human_bytes(cs['output']['bytes'])}",
            )
        self.console.print(table)


def output_for(as_json: bool) -> Output:
    return JsonOutput() if as_json else RichOutput()
