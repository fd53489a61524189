"""What ckpt writes and prints from a hostile checkpoint (issue #26): generated files are data,
never code; names are shown literally; reports are never more readable than their source; large
records and many operators cost time proportional to their size.

The checkpoints are real Flink 2.3 ones (flink23-hashmap-p2: metadata v6, with uids and names)
whose ``_metadata`` is rewritten with ckpt's own writer: an operator's uid and name, a file's
name, a record added to a channel. Each case asserts the exit code, a one-line message, that
nothing ran, and that nothing was written outside the destination.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
import stat
import struct
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from catalog import fixture_named
from ckpt_tool.flink.channel_state import write_channel_state_file
from ckpt_tool.flink.metadata import iter_stream_handles, read_metadata, write_metadata
from ckpt_tool.flink.model import INPUT, ChannelStateHandle, RelativeFileHandle, WrittenFileHandle
from ckpt_tool.flink.operator_id import operator_id_of_uid
from ckpt_tool.records.keys import key_group_for_hash, long_hash, operator_index_for_key_group
from ckpt_tool.storage import io_for

BASE = fixture_named("flink23-hashmap-p2")
MAIN = "5ff73b99d0669153bf2feac805d152ac"  # map-main: sends to slow-count through a HASH exchange
SLOW = "0a6c3d247193df04622ad9b3b66741a5"
PLAN = BASE.plan
ENTRY_KEYS = {"upstream", "downstream", "gate", "partition", "partitioner", "type", "key"}
# Names a checkpoint may hold: markup, terminal sequences (CSI, OSC title, OSC 8 link), control
# characters, a bidi override, TOML and XML syntax, and a line that would be live TOML.
HOSTILE = [
    "[/x]",
    "[bold red]boom[/]",
    "[link=https://e.vil]click[/link]",
    "\x1b[2J\x1b[H",
    "\x1b]0;owned\x07",
    "\x1b]8;;https://e.vil\x07link\x1b]8;;\x07",
    "a\x01b\x00c\x7f\x9b",
    "\u202eevil\u2028",
    '"]\n[[exchange]]\ndownstream = "slow-count"\ndecoder = "builtins:exec"\n#',
    "'''\"\"\"\\",
    "<a href='https://e.vil'>x</a><script>alert(1)</script>",
]
RAW = ("\x1b", "\x07", "\x01", "\x00", "\x7f", "\x9b", "\u202e", "\u2028")  # never reach a terminal or a file


def typed_schema(tmp_path: Path, uid: str | None = None) -> str:
    """The CountJob schema, naming the operators by id (their uids are what the tests rewrite:
    map-main's id is then its uid's, ``main_id``)."""
    path = tmp_path / "typed.toml"
    path.write_text(
        f'[[exchange]]\nupstream = "{main_id(uid)}"\ndownstream = "{SLOW}"\ntype = "tuple<long,string>"\nkey = ["f0"]\n'
    )
    return str(path)


def main_id(uid: str | None) -> str:
    """map-main's id in a checkpoint ``craft`` made with this uid: Flink stores an operator's state
    under the id its uid hashes to (``verify``'s ``operator-ids``)."""
    return MAIN if uid is None else operator_id_of_uid(uid)


def craft(tmp_path: Path, uid=None, name=None, directory: str = "job", record_value: bytes | None = None) -> Path:
    """A copy of the fixture's job directory (named ``directory``) whose map-main has ``uid`` (and
    the id Flink gives it, ``main_id``) and ``name``, and whose channel map-main 0 -> slow-count 0
    holds one record of ``record_value`` (a StreamRecord with timestamp: tag 0, 8 bytes, the
    value); returns its checkpoint directory."""
    job = tmp_path / directory
    shutil.copytree(BASE.checkpoint.parent, job)
    checkpoint = job / BASE.checkpoint.name
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    main = metadata.operator(MAIN)
    if uid is not None:  # the state where Flink would put it for that uid
        main.uid, main.operator_id = uid, bytes.fromhex(main_id(uid))
    main.name = main.name if name is None else name
    if record_value is not None:
        add_record(checkpoint, metadata, b"\x00" + struct.pack(">q", 7) + record_value)
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    return checkpoint


def add_record(checkpoint: Path, metadata, element: bytes) -> None:
    """Put one stream element, alone, into input channel (gate 0, channel 0) of slow-count's subtask 0."""
    subtask = metadata.operator(SLOW).subtasks[0]
    stream = struct.pack(">i", len(element)) + element
    writer = write_channel_state_file(io_for(str(checkpoint)), str(checkpoint / "added-inflight"), [(0, stream)])
    placed = writer.placements[0]
    handle = ChannelStateHandle(
        INPUT, subtask.index, (0, 0), placed.offsets, placed.size, WrittenFileHandle("added-inflight", writer.size)
    )
    subtask.input_channels = [handle] + [h for h in subtask.channel_handles(INPUT) if h.info != (0, 0)]


def varint(n: int) -> bytes:
    """Flink's ``StringValue`` varint: 7 bits a byte, low bits first."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def string_value(key: int, text: str) -> bytes:
    """A Tuple2<Long,String> value as Flink serializes it (StringValue: length + 1, a varint per char)."""
    chars = text.encode("ascii") if text.isascii() else b"".join(varint(ord(c)) for c in text)
    return struct.pack(">q", key) + varint(len(text) + 1) + chars


def owned_key() -> int:
    """A key of slow-count's subtask 0 (so that an added record is where it belongs)."""
    return next(k for k in range(1000) if operator_index_for_key_group(128, 2, key_group_for_hash(long_hash(k), 128)) == 0)


def directory_for(hostile: str) -> str:
    """A directory name holding what a file system can hold of ``hostile``."""
    return "job" + "".join(c for c in hostile[:24] if c not in "/\x00" and not 0xD800 <= ord(c) <= 0xDFFF)


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def one_line_error(code: int, err: str, expected: str, exit_code: int = 2) -> None:
    assert code == exit_code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("ckpt: error: "), err
    assert expected in err, err


def assert_literal(*texts: str) -> None:
    for text in texts:
        assert not any(c in text for c in RAW), repr(text[:2000])


# --- generated schema files are data ----------------------------------------------------------------


@pytest.mark.parametrize("hostile", HOSTILE + ["lone \ud800 surrogate"], ids=range(len(HOSTILE) + 1))
@pytest.mark.parametrize("with_plan", [True, False], ids=["plan", "no-plan"])
def test_a_generated_schema_holds_only_what_ckpt_wrote(ckpt, tmp_path, hostile, with_plan):
    """Whatever the uid and name, ``ckpt schema`` writes TOML that loads to exactly its own keys,
    naming the operator so that it resolves, and loads as a schema as it is."""
    checkpoint = craft(tmp_path, uid=f"map-main{hostile}", name=f"name{hostile}", directory=directory_for(hostile))
    plan = ["--plan", PLAN] if with_plan else []
    code, out, err = ckpt("schema", str(checkpoint), *plan)
    assert code == 0, err
    assert_literal(out)
    document = tomllib.loads(out)
    assert set(document) == {"exchange"}
    entries = document["exchange"]
    assert all(set(entry) <= ENTRY_KEYS for entry in entries)
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    if with_plan:
        main = next(e for e in entries if e["downstream"] == "slow-count" and e["gate"] == 0)
        assert metadata.operator(main["upstream"]).id_hex == main_id(f"map-main{hostile}")
    skeleton = tmp_path / "skeleton.toml"
    skeleton.write_text(out)
    code, out, err = ckpt("inspect", str(checkpoint), "--schema", str(skeleton), *plan, "--json", "--engine", "local")
    assert code == 0, err


def test_the_schema_injection_chain_executes_nothing(ckpt, tmp_path):
    """The reported attack: a uid that ends its comment line and adds ``decoder = "builtins:exec"``,
    and a record whose value is Python. ``ckpt schema`` writes the uid as an escaped string, and a
    schema file saying ``builtins:exec`` (as the old generator wrote it) is refused in one line
    before anything is imported or called."""
    marker = tmp_path / "executed"
    payload = f"open({str(marker)!r}, 'w').write('the record ran')".encode()
    injected = 'map-main\ndecoder = "builtins:exec"\n#'
    checkpoint = craft(tmp_path, uid=injected, record_value=payload)
    before = files(tmp_path)

    code, out, err = ckpt("schema", str(checkpoint), "--plan", PLAN)
    assert code == 0, err
    [entry] = tomllib.loads(out)["exchange"]
    assert "decoder" not in entry and entry["upstream"] == injected  # the uid, as a string
    generated = tmp_path / "generated.toml"
    generated.write_text(out)
    code, _, err = ckpt("inspect", str(checkpoint), "--schema", str(generated), "--plan", PLAN, "--engine", "local")
    assert code == 0, err

    old_output = tmp_path / "old-generator.toml"  # the comment line as the old generator wrote it
    old_output.write_text(
        f'[[exchange]]\n# upstream (tail of its chain): uid "{injected}", name "map-main"\n'
        f'upstream = "{main_id(injected)}"\ndownstream = "{SLOW}"\n'
    )
    assert "decoder" in tomllib.loads(old_output.read_text())["exchange"][0]
    for plugins in ([], ["--plugin", "key_plugins"]):
        code, out, err = ckpt("inspect", str(checkpoint), "--schema", str(old_output), "--plan", PLAN, *plugins)
        one_line_error(code, err, "decoder 'builtins:exec': module builtins is not a plug-in named on the command line")
        assert out == ""
    code, _, err = ckpt("--plugin", "builtins", "inspect", str(checkpoint), "--schema", str(old_output))
    one_line_error(code, err, "--plugin builtins: a module of Python's standard library is never a plug-in")
    assert not marker.exists()
    assert {k: v for k, v in files(tmp_path).items() if k not in ("generated.toml", "old-generator.toml")} == before


def test_a_plugin_module_is_imported_only_when_named(ckpt, tmp_path, monkeypatch):
    """A decoder's module is imported only when named with --plugin: without it, its import-time
    code does not run; with it, the decoder gives the typed schema's key groups."""
    marker = tmp_path / "imported"
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "tripwire_keys.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\nfrom key_plugins import tuple2_long_key\n"
    )
    monkeypatch.syspath_prepend(str(plugins))
    schema = tmp_path / "plugin.toml"
    schema.write_text(f'[[exchange]]\nupstream = "{MAIN}"\ndownstream = "{SLOW}"\ndecoder = "tripwire_keys:tuple2_long_key"\n')
    inputs = [str(BASE.checkpoint), "--schema", str(schema), "--engine", "local", "--json"]

    code, out, err = ckpt("inspect", *inputs)
    one_line_error(code, err, "module tripwire_keys is not a plug-in named on the command line")
    code, out, err = ckpt("inspect", *inputs, "--plugin", "key_plugins")
    one_line_error(code, err, "module tripwire_keys is not a plug-in named on the command line (named: key_plugins)")
    assert not marker.exists() and "tripwire_keys" not in sys.modules

    code, out, err = ckpt("inspect", *inputs, "--plugin", "tripwire_keys")
    assert code == 0, err
    assert marker.exists()
    code, typed, err = ckpt("inspect", str(BASE.checkpoint), "--schema", typed_schema(tmp_path), "--engine", "local", "--json")
    assert code == 0, err
    [by_plugin], [by_type] = json.loads(out)["exchanges"], json.loads(typed)["exchanges"]
    assert by_plugin["key_group_histogram"] == by_type["key_group_histogram"] and by_plugin["records"] == by_type["records"]


# --- names are printed literally --------------------------------------------------------------------

NAME = "[/x][bold red]boom[/][link=https://e.vil]click[/link]\x1b[2J\x1b]0;owned\x07\x1b]8;;https://e.vil\x07L\x01\u202e"
SHOWN = "[/x][bold red]boom[/][link=https://e.vil]click[/link]\\x1b[2J\\x1b]0;owned\\x07\\x1b]8;;https://e.vil\\x07L\\x01\\u202e"


HOSTILE_UID = f"uid{NAME}"


def hostile_checkpoint(tmp_path: Path) -> Path:
    """map-main with the hostile name and uid, in a directory with a hostile name, and a
    channel-state file with a hostile name."""
    checkpoint = craft(tmp_path, uid=HOSTILE_UID, name=NAME, directory="job[bold]\x1b[2J\x01")
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    channel_file = next(
        h.delegate.relative_path
        for op in metadata.operators
        for s in op.subtasks
        for h in s.channel_handles(INPUT)
        if isinstance(h.delegate, RelativeFileHandle)
    )
    renamed = f"in[bold]\x1b]0;t\x07{channel_file}"
    for handle in iter_stream_handles(metadata):
        if isinstance(handle, RelativeFileHandle) and handle.relative_path == channel_file:
            handle.relative_path = renamed
    (checkpoint / channel_file).rename(checkpoint / renamed)
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    return checkpoint


@pytest.mark.parametrize("width", [80, 160, 400])
def test_inspect_shows_every_name_literally(ckpt, tmp_path, capsys, width):
    """Tables (plain and stacked), exchange titles and the file column: markup stays text, control
    characters are escapes, and inspect completes (exit 0) instead of stopping at exit 3."""
    from ckpt_tool.cli.output import RichOutput
    from ckpt_tool.ops.inspect import inspect
    from ckpt_tool.session import Session

    checkpoint = hostile_checkpoint(tmp_path)
    code, out, err = ckpt(
        "inspect", str(checkpoint), "--plan", PLAN, "--schema", typed_schema(tmp_path, HOSTILE_UID), "--engine", "local"
    )
    assert code == 0, err
    with Session.open(str(checkpoint), typed_schema(tmp_path, HOSTILE_UID), PLAN, "local") as session:
        RichOutput(width=width).inspect(inspect(session))
    out += capsys.readouterr().out
    assert_literal(out, err)
    flat = "".join(line.strip() for line in out.splitlines())  # narrow tables fold long names
    assert SHOWN in flat and "in[bold]\\x1b]0;t\\x07" in flat


def test_rescale_repair_and_verify_show_names_literally(ckpt, tmp_path):
    checkpoint = hostile_checkpoint(tmp_path)
    inputs = ["--plan", PLAN, "--schema", typed_schema(tmp_path, HOSTILE_UID), "--engine", "local"]
    out_dir = tmp_path / "out"
    before = files(checkpoint.parent)
    for command, shown in (
        (["rescale", str(checkpoint), str(out_dir / "rescaled"), "-p", "3"], SHOWN),
        (["rescale", str(checkpoint), str(out_dir / "dry"), "-p", "3", "--dry-run"], SHOWN),
        (["repair", str(checkpoint), str(out_dir / "repaired")], SHOWN),
        (["verify", str(checkpoint)], "job[bold]\\x1b[2J\\x01"),
    ):
        code, out, err = ckpt(*command, *inputs)
        assert code == 0, (command, err)
        assert_literal(out, err)
        assert shown in "".join(line.strip() for line in out.splitlines()), command
    assert sorted(p.name for p in out_dir.iterdir()) == ["repaired", "rescaled"]
    assert files(checkpoint.parent) == before


def test_error_lines_show_names_literally_and_cut_long_values(ckpt, tmp_path):
    checkpoint = hostile_checkpoint(tmp_path)
    code, out, err = ckpt("rescale", str(checkpoint), str(tmp_path / "dst"), "--operator", f"uid{NAME}=300")
    one_line_error(code, err, f"operator uid{SHOWN}: parallelism 300 is above its max parallelism 128")
    assert out == ""
    code, out, err = ckpt("inspect", str(tmp_path / "no\x1b]0;such\x07\n[/x]"))
    one_line_error(code, err, "no\\x1b]0;such\\x07\\n[/x]")
    huge = tmp_path / "huge.toml"
    huge.write_text(f'[[exchange]]\ndownstream = "{"x" * 5_000_000}"\n')
    code, out, err = ckpt("inspect", str(checkpoint), "--schema", str(huge))
    assert out == ""
    one_line_error(code, err, "characters cut]")
    assert len(err) < 3000 and "is not in the checkpoint" in err
    assert not (tmp_path / "dst").exists()


def test_verify_keeps_its_exit_codes_and_writes_junit_that_parses(ckpt, tmp_path):
    """A control character in the checkpoint's path or an operator's name: verify still exits 0
    (sound) or 1 (problems), and its JUnit XML parses, showing the character as an escape."""
    checkpoint = hostile_checkpoint(tmp_path)
    inputs = ["--plan", PLAN, "--schema", typed_schema(tmp_path, HOSTILE_UID), "--engine", "local"]
    junit = tmp_path / "junit.xml"
    code, out, err = ckpt("verify", str(checkpoint), *inputs, "--junit", str(junit))
    assert code == 0, err
    suite = ET.parse(junit).getroot()
    assert "\\x1b[2J\\x01" in suite.find("properties/property").get("value")
    code, out, err = ckpt("verify", str(checkpoint), "--junit", str(junit), "--strict")  # problems: skipped checks fail
    assert code == 1, err
    assert_literal(out, err, junit.read_text())
    assert ET.parse(junit).getroot().get("failures") != "0"


def test_html_names_are_text_not_links_or_scripts(ckpt, tmp_path):
    """Plotly draws its text as a subset of HTML: a name ``<a href=...>`` would be a live link. The
    page holds it as entities, which Plotly shows as the characters."""
    name = "<a href='https://e.vil/'>go</a><b>bold</b><script>alert(1)</script><img src=x onerror=alert(1)>"
    checkpoint = craft(tmp_path, uid=name, name=name, directory="job<script>")
    page = tmp_path / "report.html"
    for schema in ([], ["--plan", PLAN, "--schema", typed_schema(tmp_path, name)]):
        code, _, err = ckpt("inspect", str(checkpoint), "--html", str(page), *schema, "--engine", "local")
        assert code == 0, err
        text = page.read_text()
        assert "e.vil" in text  # the name is there, as text
        for live in ("<a href='https://e.vil", "<b>bold", "<script>alert", "<img src=x", "\\u003ca href", "\\u003cscript"):
            assert live not in text, live
        assert "&lt;a href='https:" in text and "&lt;script&gt;alert(1)" in text  # in Plotly's JSON, / is \\u002f
    chromium = shutil.which("chromium")
    if chromium:  # the rendered page: the name is text, and no link, script or image came of it
        dom = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
        assert "e.vil" in dom and "&lt;script&gt;alert(1)" in dom
        assert not re.search(r"<a [^>]*e\.vil", dom) and not re.search(r"<img [^>]*src=.?x", dom)
        assert "<script>alert(1)" not in dom and "<b>bold" not in dom


# --- reports are never more readable than their source ----------------------------------------------


def chmod_tree(root: Path, file_mode: int, dir_mode: int) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(dir_mode if path.is_dir() else file_mode)


@pytest.mark.parametrize("source_mode", [0o600, 0o644])
def test_reports_are_no_more_readable_than_the_checkpoint(ckpt, tmp_path, source_mode):
    checkpoint = craft(tmp_path)
    chmod_tree(checkpoint.parent, source_mode, 0o700 if source_mode == 0o600 else 0o755)
    previous = os.umask(0o022)
    try:
        reports = tmp_path / "reports"
        reports.mkdir()
        inputs = ["--plan", PLAN, "--schema", typed_schema(tmp_path), "--engine", "local"]
        victim = tmp_path / "victim"
        victim.write_text("not a report")
        victim.chmod(0o600)
        (reports / "verify.xml").symlink_to(victim)  # a link planted where a report goes: replaced, not followed
        commands = [
            ["records", str(checkpoint), "--out", str(reports / "records.parquet")],
            ["inspect", str(checkpoint), "--html", str(reports / "inspect.html")],
            ["verify", str(checkpoint), "--junit", str(reports / "verify.xml")],
            ["rescale", str(checkpoint), str(tmp_path / "dst"), "-p", "3", "--html", str(reports / "rescale.html")],
        ]
        for command in commands:
            code, _, err = ckpt(*command, *inputs)
            assert code == 0, (command, err)
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.lstat().st_mode) for p in reports.iterdir()}
    assert modes == dict.fromkeys(["records.parquet", "inspect.html", "verify.xml", "rescale.html"], source_mode)
    assert victim.read_text() == "not a report" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert pq.read_table(reports / "records.parquet").num_rows > 0
    assert not [p for p in reports.iterdir() if p.name.startswith(".")]  # no temporary left


# --- large records and many operators ---------------------------------------------------------------


def count_calls(function) -> int:
    """Python function calls (and calls into C) while ``function`` runs: a measure of work that
    does not depend on the machine's load."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        function()
    finally:
        sys.setprofile(None)
    return count


def many_operators(tmp_path: Path, count: int) -> Path:
    """The fixture with ``count`` more operators (no state), each with a uid and a name."""
    checkpoint = craft(tmp_path, directory=f"job-{count}")
    metadata = read_metadata((checkpoint / "_metadata").read_bytes())
    rng = random.Random(count)
    template = metadata.operator(MAIN)
    for i in range(count):
        extra = type(template)(rng.randbytes(16), 2, 128, f"operator number {i}", f"op-{i}")
        metadata.operators.append(extra)
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    return checkpoint


def test_inspect_tables_cost_work_proportional_to_their_rows(tmp_path, capsys):
    """1,000 and 4,000 operators: the work per operator row stays small and constant (Rich drew
    each stacked row as a table of its own, about 5,000 calls a row; 100,000 operators took 134 s)."""
    from ckpt_tool.cli.main import main

    def inspect(checkpoint: Path) -> None:
        try:
            main(["inspect", str(checkpoint)])
        except SystemExit as exc:
            assert exc.code in (0, None)

    small, large = many_operators(tmp_path, 1000), many_operators(tmp_path, 4000)
    work = {n: count_calls(lambda c=c: inspect(c)) for n, c in ((1000, small), (4000, large))}
    out = capsys.readouterr().out
    assert "operator number 3999 (op-3999)" in out
    per_row = (work[4000] - work[1000]) / 3000
    assert per_row < 1000, work
    assert work[4000] < 4.5 * work[1000], work  # linear: four times the rows, at most about four times the work


def test_a_large_table_is_drawn_as_rich_draws_it():
    """Tables above RICH_ROWS rows are written line by line, in Rich's own layout."""
    from rich.console import Console
    from rich.table import Table

    from ckpt_tool.cli.output import RICH_ROWS, RichOutput

    rows = [[f"op [b]{i}[/b] 日本\x1b", str(i * 7), "ü" * (i % 5)] for i in range(RICH_ROWS + 50)]
    for header in (True, False):
        ours = RichOutput(200)
        ours.console = Console(file=io.StringIO(), width=200)
        ours._show("Operators", ["operator", "n", "x"], rows, header)
        table = Table(title="Operators", show_header=header)
        for column in ("operator", "n", "x"):
            table.add_column(column, no_wrap=True)
        for row in rows:
            table.add_row(*[c.replace("[", "\\[").replace("\x1b", "\\x1b") for c in row])
        rich = Console(file=io.StringIO(), width=200)
        rich.print(table)
        assert ours.console.file.getvalue() == rich.file.getvalue()


def big_record_checkpoint(tmp_path: Path, text: str) -> Path:
    return craft(tmp_path, directory="big", record_value=string_value(owned_key(), text))


@pytest.mark.parametrize("text", ["x" * (8 << 20), "ü日" * (1 << 18)], ids=["ascii-8MiB", "non-ascii-1.5MiB"])
def test_a_large_record_is_exported_with_work_independent_of_its_size(tmp_path, text):
    """One record of several MiB: a few thousand calls in all (a call per character cost 120 s for
    200 MiB), and the value comes out whole."""
    from ckpt_tool.engine import LocalEngine
    from ckpt_tool.ops.records import export_records
    from ckpt_tool.session import Session

    checkpoint = big_record_checkpoint(tmp_path, text)
    out = tmp_path / "records.parquet"
    with Session.open(str(checkpoint), typed_schema(tmp_path), PLAN, LocalEngine()) as session:
        work = count_calls(lambda: export_records(session.checkpoint, session.described_exchanges, session.engine, str(out)))
    assert work < 100_000, work
    values = pq.read_table(out, columns=["value", "value_size", "downstream_subtask", "element_index"]).to_pylist()
    [big] = [r for r in values if r["value_size"] > 1 << 20]
    assert big["value"]["f1"] == text and big["value"]["f0"] == owned_key()
    assert big["downstream_subtask"] == 0 and big["element_index"] == 0


def test_a_200_mib_record_through_ckpt_records(tmp_path):
    """The reported case, as the installed command runs it: exit 0, the record whole, and memory
    a small multiple of the record (it took 2.5 GB)."""
    size = 200 << 20
    checkpoint = big_record_checkpoint(tmp_path, "r" * size)
    out = tmp_path / "records.parquet"
    # The peak of this process (VmHWM: ru_maxrss would count the forking test process) and of the
    # worker processes it forks.
    measure = (
        "import re, resource, sys\nfrom ckpt_tool.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
        "except SystemExit as exc:\n    code = exc.code\nelse:\n    code = 0\n"
        "own = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
        "peak = max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "print(code, peak * 1024, file=sys.stderr)\n"
    )
    args = ["records", str(checkpoint), "--plan", PLAN, "--schema", typed_schema(tmp_path), "--out", str(out), "--json"]
    run = subprocess.run([sys.executable, "-c", measure, *args], capture_output=True, text=True, timeout=600)
    code, peak = map(int, run.stderr.split()[-2:])
    assert code == 0, run.stderr
    assert json.loads(run.stdout)["records"] > 1
    assert peak < 6 * size, f"peak RSS {peak >> 20} MiB for a {size >> 20} MiB record"
    table = pq.ParquetFile(out)
    sizes = table.read(columns=["value_size"]).column(0).to_pylist()
    assert max(sizes) == 8 + len(varint(size + 1)) + size  # f0, the string's length, its characters


def test_long_strings_decode_as_the_unit_by_unit_reader_does():
    """The NumPy path for long non-ASCII strings against the varint-per-unit loop, on random
    units (surrogate halves, overlong varints, strings cut short) and chunk sizes."""
    from ckpt_tool.records.types import serializers
    from ckpt_tool.records.types.binary import RecordDecodeError
    from ckpt_tool.records.types.serializers import ValueReader

    def unit_by_unit(data: bytes):
        reader = ValueReader(data)
        count = reader.varint() - 1
        return reader._units(count).decode("utf-16-be", "surrogatepass"), reader.pos

    rng = random.Random(26)
    chunk = serializers.STRING_CHUNK_UNITS
    try:
        for case in range(80):
            count = rng.choice([4096, 5000, 20000])
            units = [
                rng.choice([rng.randrange(0x80), rng.randrange(0x10000), rng.randrange(0xD800, 0xE000), rng.randrange(1 << 22)])
                for _ in range(count)
            ]
            body = b"".join(varint(u) for u in units)
            if rng.random() < 0.2:
                body, count = body + b"\xff\xff\xff\xff\x01", count + 1  # a unit of five bytes
            if rng.random() < 0.2:
                body = body[: rng.randrange(len(body))]
            data = varint(count + 1) + body + b"next"
            serializers.STRING_CHUNK_UNITS = rng.choice([97, 1000, 1 << 20])
            try:
                expected = unit_by_unit(data)
            except RecordDecodeError:
                expected = None
            reader = ValueReader(data)
            try:
                got = (reader.string(), reader.pos)
            except RecordDecodeError:
                got = None
            assert got == expected, case
    finally:
        serializers.STRING_CHUNK_UNITS = chunk
