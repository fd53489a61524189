"""The HTML reports: self-contained pages whose plots real Chromium renders (Debian's package)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from catalog import COUNTJOB_SCHEMA, fixture_named

BASE = fixture_named("flink23-hashmap-p2")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def screenshot(page: Path, out: Path, height: int) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is installed by `make test`"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size=1400,{height}",
                "--virtual-time-budget=10000",
                f"--screenshot={out}",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


def plotted(png: Path) -> tuple[int, float]:
    """(colours in the picture, share of pixels that are not page white): a blank page has 1 and 0."""
    from PIL import Image

    image = Image.open(png).convert("RGB").resize((350, 600))
    pixels = np.frombuffer(image.tobytes(), dtype=np.uint8).reshape(-1, 3)
    return len(np.unique(pixels, axis=0)), float((pixels != 255).any(axis=1).mean())


def assert_self_contained(page: Path) -> None:
    text = page.read_text()
    assert "Plotly.newPlot" in text and text.count("plotly.js v") >= 1, "plotly.js is embedded"
    assert not re.search(r"<script[^>]+src=", text), "no script is loaded from elsewhere"


@pytest.mark.parametrize("with_schema", [False, True], ids=["metadata", "records"])
def test_inspect_html_renders_plots(ckpt, tmp_path, with_schema):
    page = tmp_path / "inspect.html"
    extra = ["--plan", BASE.plan, "--schema", str(COUNTJOB_SCHEMA)] if with_schema else []
    code, _, err = ckpt("inspect", str(BASE.checkpoint), "--html", str(page), *extra)
    assert code == 0, err
    assert_self_contained(page)
    titles = [json.loads(f'"{t}"') for t in re.findall(r'"title":\{"text":"([^"]+)"', page.read_text())]
    assert "State size per operator and subtask (bytes)" in titles
    if with_schema:
        assert any(t.startswith("Key-group histogram, exchange map-main") for t in titles)
        assert any(t.startswith("In-flight bytes, exchange map-main → slow-count") for t in titles)
    else:
        assert any(t.startswith("In-flight bytes, slow-count, input gate 0") for t in titles)
    screenshot(page, tmp_path / "inspect.png", 2400)
    colours, covered = plotted(tmp_path / "inspect.png")
    assert colours > 200 and covered > 0.25, (colours, covered)


def test_rescale_html_shows_before_and_after(ckpt, tmp_path):
    page = tmp_path / "rescale.html"
    destination = tmp_path / "out" / "job" / BASE.checkpoint.name
    code, _, err = ckpt(
        "rescale",
        str(BASE.checkpoint),
        str(destination),
        "-p",
        "3",
        "--plan",
        BASE.plan,
        "--schema",
        str(COUNTJOB_SCHEMA),
        "--html",
        str(page),
    )
    assert code == 0, err
    assert_self_contained(page)
    text = page.read_text()
    assert "<h2>Before: " in text and "<h2>After: " in text and "records 536 in, 536 out" in text
    screenshot(page, tmp_path / "rescale.png", 4000)
    colours, covered = plotted(tmp_path / "rescale.png")
    assert colours > 200 and covered > 0.25, (colours, covered)


def test_pictures_at_high_parallelism_stay_small_and_fast():
    """A job at parallelism p has p² channels: past 256 subtasks (or channels) an axis of a heatmap
    sums blocks of them, each named by its first, and the histogram's key-group bands are set at
    once (one by one, 256 took 23 s) and named only up to 64 subtasks."""
    from ckpt_tool.cli.html import _heatmap, _key_group_histogram
    from ckpt_tool.exchanges import ExchangeScan
    from ckpt_tool.records.keys import key_group_range
    from ckpt_tool.records.scan import ScanColumns
    from ckpt_tool.records.schema import Exchange

    down, up = np.meshgrid(np.arange(600), np.arange(300))
    values = (down * 1000 + up).reshape(-1)
    figure = _heatmap("t", down.reshape(-1), up.reshape(-1), values, "downstream subtask", "upstream subtask")
    heatmap = figure.data[0]
    assert list(heatmap.x) == list(range(0, 600, 3)) and list(heatmap.y) == list(range(0, 300, 2))
    z = np.array(heatmap.z)
    assert z.shape == (150, 200) and z.sum() == values.sum()
    assert z[1, 2] == sum(d * 1000 + u for d in (6, 7, 8) for u in (2, 3))
    assert figure.layout.title.text == "t (in blocks of 3 downstream subtasks × 2 upstream subtasks)"
    small = _heatmap("t", np.array([0, 1, 1]), np.array([0, 0, 2]), np.array([5, 6, 7]), "subtask", "channel")
    assert np.array(small.data[0].z).tolist() == [[5, 6], [0, 0], [0, 7]] and small.layout.title.text == "t"

    for parallelism, named in [(4, True), (4096, False)]:
        scan = ExchangeScan(
            Exchange("a" * 32, "b" * 32, key=("f0",)),
            ScanColumns.empty(),
            0,
            [key_group_range(4096, parallelism, i) for i in range(parallelism)],
            histogram=np.ones(4096, dtype=np.int64),
        )
        histogram = _key_group_histogram(scan, {})
        assert len(histogram.layout.shapes) == parallelism
        assert len(histogram.layout.annotations) == (parallelism if named else 0)
        assert histogram.layout.shapes[1].x0 == scan.subtask_key_groups[1].start - 0.5
