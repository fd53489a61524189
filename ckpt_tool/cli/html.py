"""Pictures of a checkpoint: one self-contained HTML file of Plotly figures (``--html FILE``).

- per exchange, a heatmap of in-flight bytes by upstream × downstream subtask (with a plan or
  schema; without, one per operator input gate and output partition, from the metadata);
- per keyed exchange, the key-group histogram with each downstream subtask's range marked;
- state sizes (keyed, operator, channel) per operator and subtask.

``rescale --html`` shows the same for the checkpoint before and after. Plotly's JavaScript is
embedded once, so the file opens without a network.

Names and paths come from an untrusted checkpoint: in the page's own HTML they are escaped, and
in the figures too, since Plotly draws its text as a subset of HTML (``<a href=...>`` would be a
live link, ``<b>`` bold): ``&``, ``<`` and ``>`` are given to it as entities, which it shows as the
characters themselves. Control characters are shown as escapes everywhere.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence
from typing import Optional

import numpy as np

from ckpt_tool.exchanges import ExchangeScan
from ckpt_tool.ops.inspect import INPUT, InspectReport
from ckpt_tool.rewrite import RescaleReport
from ckpt_tool.text import printable

STATE_KINDS = ("keyed", "operator", "channel")
NAMED_BANDS = 64  # subtasks whose key-group bands are named in a histogram at most
HEATMAP_SIDE = 256  # cells along a heatmap's axis at most: beyond, consecutive subtasks (or channels) are summed


def _text(value: str) -> str:
    """Text for Plotly, which reads tags and entities in it: shown literally."""
    return html.escape(printable(value), quote=False)


def _html(value: str) -> str:
    """Text for the page's own HTML."""
    return html.escape(printable(value))


def _figures(report: InspectReport) -> list:
    figures = [_state_sizes(report)]
    labels = {o.id: o.label for o in report.operators}
    if report.exchanges is not None:
        for scan in report.exchanges:
            if len(scan.scanned):
                figures.append(_exchange_heatmap(scan, labels))
                if scan.keyed:
                    figures.append(_key_group_histogram(scan, labels))
    else:
        figures += _channel_heatmaps(report)
    return figures


def _state_sizes(report: InspectReport):
    import plotly.graph_objects as go

    figure = go.Figure()
    bars = [(o.label, s) for o in report.operators for s in o.subtasks if not s.finished]
    for kind in STATE_KINDS:
        figure.add_bar(
            name=f"{kind} state",
            x=[[_text(label) for label, _ in bars], [f"#{s.index}" for _, s in bars]],
            y=[getattr(s.state_size, kind) for _, s in bars],
        )
    figure.update_layout(title="State size per operator and subtask (bytes)", barmode="stack", yaxis_title="bytes")
    return figure


def _heatmap(title: str, x: np.ndarray, y: np.ndarray, values: np.ndarray, x_title: str, y_title: str):
    """Values summed by (x, y); past ``HEATMAP_SIDE`` subtasks or channels on an axis (a job at
    parallelism p has p² channels), in blocks of consecutive ones, each named by its first."""
    import plotly.graph_objects as go

    columns = int(x.max(initial=0)) + 1
    rows = int(y.max(initial=0)) + 1
    x_block, y_block = -(-columns // HEATMAP_SIDE), -(-rows // HEATMAP_SIDE)
    width, height = -(-columns // x_block), -(-rows // y_block)
    cells = (y // y_block) * width + x // x_block
    # summed as floats: exact below 2**53 bytes
    z = np.bincount(cells, weights=values, minlength=width * height).astype(np.int64).reshape(height, width)
    blocks = x_block > 1 or y_block > 1
    if blocks:
        title += f" (in blocks of {x_block} {x_title}s × {y_block} {y_title}s)"
    figure = go.Figure(
        go.Heatmap(
            z=z.tolist(),
            x=list(range(0, columns, x_block)),
            y=list(range(0, rows, y_block)),
            colorscale="Viridis",
            colorbar={"title": "bytes"},
            hovertemplate="%{y} → %{x}: %{z} bytes<extra></extra>",
        )
    )
    ticks = {} if blocks else {"xaxis_dtick": 1, "yaxis_dtick": 1}
    figure.update_layout(title=_text(title), xaxis_title=x_title, yaxis_title=y_title, **ticks)
    return figure


def _exchange_heatmap(scan: ExchangeScan, labels: dict[str, str]):
    exchange = scan.exchange
    columns = scan.scanned.columns  # summed by (downstream, upstream): in any order
    name = f"{labels.get(exchange.upstream_id or '', '?')} → {labels.get(exchange.downstream_id, '?')}"
    title = f"In-flight bytes, exchange {name} (gate {exchange.gate}, {scan.partitioner or '?'})"
    return _heatmap(
        title,
        columns["downstream_subtask"].astype(np.int64),
        columns["upstream_subtask"].astype(np.int64),
        columns["bytes"],
        "downstream subtask",
        "upstream subtask",
    )


def _channel_heatmaps(report: InspectReport) -> list:
    """Without a plan: per operator, in-flight bytes by subtask × input channel (per gate) and by
    subtask × subpartition (per output partition)."""
    grids: dict[tuple[str, str, int], list[tuple[np.ndarray, ...]]] = defaultdict(list)
    labels = {}
    for o in report.operators:
        for s in o.subtasks:
            for direction, (firsts, seconds, sizes) in s.channel_arrays().items():
                for index in np.unique(firsts).tolist():
                    mine = firsts == index
                    labels[(o.id, direction, index)] = o.label
                    grids[(o.id, direction, index)].append((np.full(int(mine.sum()), s.index), seconds[mine], sizes[mine]))
    figures = []
    for (op_id, direction, index), parts in sorted(grids.items()):
        side = f"gate {index}" if direction == INPUT else f"partition {index}"
        what = "input channel" if direction == INPUT else "subpartition"
        title = f"In-flight bytes, {labels[(op_id, direction, index)]}, {direction} {side}"
        subtasks, channels, sizes = (np.concatenate(column) for column in zip(*parts))
        figures.append(_heatmap(title, subtasks, channels, sizes, "subtask", what))
    return figures


def _key_group_histogram(scan: ExchangeScan, labels: dict[str, str]):
    import plotly.graph_objects as go

    histogram = scan.key_group_histogram
    groups = sorted(histogram)
    figure = go.Figure(go.Bar(x=groups, y=[histogram[g] for g in groups], name="records"))
    # each subtask's key groups as a band, set at once (``add_vrect`` one by one took time
    # quadratic in the subtasks: 23 s for 256), named where there are few enough to read
    owned = scan.subtask_key_groups
    bands = [
        {
            "fillcolor": "LightSalmon" if index % 2 else "LightSkyBlue",
            "line": {"width": 0},
            "opacity": 0.25,
            "type": "rect",
            "x0": groups.start - 0.5,
            "x1": groups.stop - 0.5,
            "xref": "x",
            "y0": 0,
            "y1": 1,
            "yref": "y domain",
        }
        for index, groups in enumerate(owned)
    ]
    names = [
        {
            "showarrow": False,
            "text": f"subtask {index}",
            "x": groups.start - 0.5,
            "xanchor": "left",
            "xref": "x",
            "y": 1,
            "yanchor": "top",
            "yref": "y domain",
        }
        for index, groups in enumerate(owned)
    ]
    figure.update_layout(shapes=bands, annotations=names if len(owned) <= NAMED_BANDS else [])
    exchange = scan.exchange
    name = f"{labels.get(exchange.upstream_id or '', '?')} → {labels.get(exchange.downstream_id, '?')}"
    figure.update_layout(
        title=_text(f"Key-group histogram, exchange {name}, with each subtask's key groups"),
        xaxis_title="key group",
        yaxis_title="records",
    )
    return figure


def _page(title: str, sections: Sequence[tuple[Optional[str], list]], summary: str = "") -> str:
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_html(title)}</title></head>",
        "<body style='font-family: sans-serif; margin: 2em'>",
        f"<h1>{_html(title)}</h1>",
    ]
    if summary:
        parts.append(f"<p>{_html(summary)}</p>")
    first = True
    for heading, figures in sections:
        if heading:
            parts.append(f"<h2>{_html(heading)}</h2>")
        for figure in figures:
            parts.append(figure.to_html(full_html=False, include_plotlyjs=first, default_height="480px"))
            first = False
    parts.append("</body></html>")
    return "\n".join(parts)


def inspect_html(report: InspectReport, checkpoint: str) -> str:
    return _page(f"ckpt inspect {checkpoint}", [(None, _figures(report))])


def rescale_html(before: InspectReport, after: Optional[InspectReport], report: RescaleReport, src: str, dst: str) -> str:
    """Before and after; a dry run has only a before."""
    from ckpt_tool.cli.output import rescale_footer

    sections = [(f"Before: {src}", _figures(before))]
    if after is not None:
        sections.append((f"After: {dst}", _figures(after)))
    return _page(f"ckpt rescale {src} → {dst}", sections, rescale_footer(report))


def write_html(path: str, page: str, mode: int) -> None:
    """The page, never more readable than the checkpoint it shows (ckpt_tool.output_files)."""
    from ckpt_tool.output_files import write_report

    write_report(path, page, mode)
