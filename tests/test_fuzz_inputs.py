"""Mutated schema files, plans and compiled plans either load or are refused with exit code 2 and
one line (a CkptError), through the loading path the CLI uses; nothing else may escape."""

from __future__ import annotations

import copy
import json
import random
import tomllib
from pathlib import Path
from typing import Any

import pytest

from catalog import ALL_FIXTURES, fixture_named
from ckpt_tool.errors import EXIT_UNUSABLE_INPUT, CkptError
from ckpt_tool.records.schema import SchemaError
from ckpt_tool.session import Session

SCHEMA_CASES = 600
PLAN_CASES = 600
SQL_PLAN_CASES = 300
SQL_FIXTURE = fixture_named("flink23-sqltypes-p2")
# Values of every kind, put where a value was: the wrong type, out of range, or right by chance.
VALUES: list[Any] = [
    True, False, None, 0, 1, -1, 3, 2**31, 2**63, 0.5, float("nan"), "", "x", "HASH", "hash", "MAGIC",
    "slow-count", "f0", "tuple<long", "binary_row<k:string>", "no_such_module:f", "a:b:c", [], [True],
    [0, "f0"], ["f0", None], [[1]], {}, {"id": "x"}, {"nodes": []}, "\n", "ü" * 3, "2", 1e300, "REBALANCE", "avro",
    "map-main", "0a6c3d247193df04622ad9b3b66741a5", "key_plugins:tuple2_long_key",
]  # fmt: skip
CHARACTERS = '"[]{}=,.:<>#\\\n 0123456789aeAZ_-'


def typo(name: str, rng: random.Random) -> str:
    """``name`` with one letter dropped, doubled, swapped or changed."""
    i = rng.randrange(len(name)) if name else 0
    kind = rng.randrange(4)
    if kind == 0:
        return name[:i] + name[i + 1 :]
    if kind == 1:
        return name[:i] + name[i : i + 1] * 2 + name[i + 1 :]
    if kind == 2 and i + 1 < len(name):
        return name[:i] + name[i + 1] + name[i] + name[i + 2 :]
    return name[:i] + rng.choice("abcdefghijklmnopqrstuvwxyz") + name[i + 1 :]


def mutate_text(text: str, rng: random.Random) -> str:
    """Truncated, a character flipped, junk inserted, or a line dropped or doubled."""
    if not text:
        return rng.choice(CHARACTERS)
    i = rng.randrange(len(text))
    kind = rng.randrange(5)
    if kind == 0:
        return text[:i]
    if kind == 1:
        return text[:i] + rng.choice(CHARACTERS) + text[i + 1 :]
    if kind == 2:
        return text[:i] + "".join(rng.choice(CHARACTERS) for _ in range(rng.randrange(1, 6))) + text[i:]
    lines = text.splitlines(keepends=True)
    j = rng.randrange(len(lines))
    return "".join(lines[:j] + lines[j + 1 :]) if kind == 3 else "".join(lines[: j + 1] + lines[j:])


def slots(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key or index) in a JSON-like document."""
    found: list[tuple[Any, Any]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in items:
        found.append((value, key))
        found += slots(child)
    return found


def mutate_document(document: Any, rng: random.Random, within: Any = None) -> Any:
    """One structural change at a random place (inside ``within``, where given): a key dropped,
    renamed with a typo or added, a value replaced by one of another kind, a text value garbled, an
    element doubled, or the whole document replaced."""
    places = slots(document if within is None else within)
    if not places or rng.random() < 0.03:
        return copy.deepcopy(rng.choice(VALUES))
    container, key = rng.choice(places)
    kind = rng.randrange(6)
    if kind == 0:
        del container[key]
    elif kind == 1 and isinstance(container, dict):
        container[typo(key, rng)] = container.pop(key)
    elif kind == 2 and isinstance(container, dict):
        container[typo(key, rng)] = copy.deepcopy(rng.choice(VALUES))
    elif kind == 3 and isinstance(container[key], str):
        container[key] = mutate_text(container[key], rng)
    elif kind == 4 and isinstance(container, list):
        container.insert(key, copy.deepcopy(container[key]))
    else:
        container[key] = copy.deepcopy(rng.choice(VALUES))
    return document


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # nan is TOML's too
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    return "null"  # TOML has no null: a user's mistake, a syntax error


def toml_text(document: Any) -> str:
    """A schema document as TOML: tables of tables as [[name]] blocks, everything else inline."""
    if not isinstance(document, dict):
        return f"exchange = {toml_value(document)}\n"
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in document.items() if not _array_of_tables(v)]
    for name, tables in document.items():
        if _array_of_tables(tables):
            for table in tables:
                lines += ["", f"[[{json.dumps(name)}]]"] + [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _array_of_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, dict) for t in value)


def loads_or_refuses(case: str, checkpoint: Path, **inputs: str | None) -> bool:
    """True when the session opens, False when it is refused as the CLI refuses unusable input
    (exit 2, one line); any other exception fails the test, naming the case."""
    try:
        with Session.open(str(checkpoint), engine="local", plugins=("key_plugins",), **inputs):
            return True
    except CkptError as exc:
        assert exc.exit_code == EXIT_UNUSABLE_INPUT, (case, str(exc))
        assert len(str(exc).splitlines()) == 1, (case, str(exc))
        return False
    except Exception as exc:
        files = "\n".join(Path(p).read_text(errors="replace") for p in inputs.values() if p)
        pytest.fail(f"{case}: {type(exc).__name__}: {exc}\n{files}")


COMPANION = {"schema": "plan", "plan": "schema", "sql_plan": "plan"}  # given with the fuzzed input half the time


def fuzz(tmp_path: Path, option: str, cases: int, seed: int, fixtures, original, parse, render, focus=None) -> None:
    """``cases`` mutations of the file ``original(fixture)`` reads, given as ``option``: textual, or
    1 to 3 structural changes of the parsed document (within ``focus(document, rng)`` where given),
    each opened as the CLI opens it. Both outcomes must occur."""
    rng = random.Random(seed)
    outcomes = {True: 0, False: 0}
    for case in range(cases):
        fixture = rng.choice(fixtures)
        text = original(fixture)
        if rng.random() < 0.3:
            text = mutate_text(text, rng)
        else:
            document = parse(text)
            for _ in range(rng.randint(1, 3)):
                document = mutate_document(document, rng, focus(document, rng) if focus else None)
            text = render(document)
        path = tmp_path / f"{option}-{case}"
        path.write_text(text)
        companion = COMPANION[option]
        inputs = {option: str(path), companion: getattr(fixture, companion) if rng.random() < 0.5 else None}
        outcomes[loads_or_refuses(f"{option} case {case} (seed {seed})", fixture.checkpoint, **inputs)] += 1
    assert outcomes[True] and outcomes[False], outcomes


def test_fuzzed_schemas(tmp_path):
    read = lambda fixture: Path(fixture.schema).read_text()
    fuzz(tmp_path, "schema", SCHEMA_CASES, 20261301, ALL_FIXTURES, read, tomllib.loads, toml_text)


def test_fuzzed_plans(tmp_path):
    read = lambda fixture: Path(fixture.plan).read_text()
    fuzz(tmp_path, "plan", PLAN_CASES, 20261302, ALL_FIXTURES, read, json.loads, json.dumps)


def exchange_parts(document: Any, rng: random.Random) -> Any:
    """Where a compiled plan's exchanges are told: mostly an exchange node or the edges."""
    if not isinstance(document, dict) or rng.random() < 0.2:
        return None
    nodes = document.get("nodes")
    exchanges = [n for n in nodes if isinstance(n, dict) and "exchange" in str(n.get("type"))] if isinstance(nodes, list) else []
    return rng.choice(exchanges + [document.get("edges")]) if exchanges else None


def test_fuzzed_compiled_plans(tmp_path):
    compiled = (SQL_FIXTURE.directory / "compiled-plan.json").read_text()
    read = lambda fixture: compiled
    fuzz(tmp_path, "sql_plan", SQL_PLAN_CASES, 20261303, [SQL_FIXTURE], read, json.loads, json.dumps, exchange_parts)


# --- the reported cases, and the CLI ------------------------------------------------------------

BASE = fixture_named("flink23-hashmap-p2")
ENTRY = '[[exchange]]\nupstream = "map-main"\ndownstream = "slow-count"\ntype = "tuple<long,string>"\n'


@pytest.mark.parametrize(
    "text, message",
    [
        (
            ENTRY + 'partitoner = "HASH"\nkey = ["f0"]\n',
            "exchange 1: unknown key 'partitoner' (did you mean 'partitioner'?); allowed: name,",
        ),
        (ENTRY + "key = true\n", "exchange 1: key must be a field name or position, or a list of them"),
        (ENTRY + "key = [true]\n", "exchange 1: key must be"),
        (ENTRY + "key = [-1]\n", "exchange 1: key must be"),
        (ENTRY + "gate = true\n", "exchange 1: gate must be an integer from 0 to 2147483647, not true"),
        (ENTRY + "partition = -1\n", "exchange 1: partition must be an integer"),
        (ENTRY + "gate = 2147483648\n", "exchange 1: gate must be an integer"),
        (ENTRY + "partitioner = 1\n", "exchange 1: partitioner must be a string, not 1"),
        (ENTRY + 'partitioner = "HASHED"\n', "exchange 1: unknown partitioner 'HASHED'; known: HASH,"),
        (ENTRY.replace('"tuple<long,string>"', "3"), "exchange 1: type must be a string, not 3"),
        (ENTRY.replace("tuple<long,string>", "tuple<long,"), "exchange 1: record type 'tuple<long,' ends too early"),
        (ENTRY + 'decoder = "no colon"\n', 'exchange 1: decoder must be a "module:function" string'),
        (ENTRY + 'decoder = "os:sep"\n', "exchange 1: decoder 'os:sep': module os is not a plug-in named on the command line"),
        (ENTRY + 'decoder = "builtins:exec"\n', "decoder 'builtins:exec': module builtins is not a plug-in named on the command"),
        (ENTRY + 'key = ["f0"]\ndecoder = "key_plugins:tuple2_long_key"\n', "key and decoder exclude each other"),
        (ENTRY + 'avro_schema = "event.avsc"\n', 'exchange 1: avro_schema is for records of type = "avro"'),
        (ENTRY.replace("type", "# type") + 'key = ["f0"]\n', "exchange 1: key needs the record type"),
        (ENTRY.replace("tuple<long,string>", ""), "exchange 1: record type '' ends too early"),
        (
            ENTRY + "[[exchange]]\n" + ENTRY[13:] + "gate = 0\n",
            "exchange 2: the same exchange (downstream and gate) as exchange 1",
        ),
        (ENTRY.replace("[[exchange]]", "[[exchanges]]"), "unknown top-level key 'exchanges' (did you mean 'exchange'?)"),
        (ENTRY.replace("[[exchange]]", "[exchange]"), "exchange must be an array of tables, [[exchange]], not {"),
        ("exchange = [3]\n", "exchange 1: an exchange must be a table, not 3"),
        (ENTRY + "gate = \n", "(at line 5, column 8)"),
        (
            ENTRY.replace('"slow-count"', '"slow\\ncount"'),
            "exchange 1: downstream operator 'slow\\ncount' is not in the checkpoint",
        ),
    ],
)
def test_malformed_schema_is_refused_naming_file_and_entry(tmp_path, text, message):
    assert message in refusal(tmp_path, BASE, "schema", text, SchemaError)


def refusal(tmp_path: Path, fixture, option: str, text: str, error: type[CkptError] = CkptError) -> str:
    """The message with which the session refuses ``text`` given as ``option``: an ``error``,
    exit code 2, one line naming the file."""
    path = tmp_path / f"{option}-input"
    path.write_text(text)
    with pytest.raises(error) as refused:
        Session.open(str(fixture.checkpoint), engine="local", **{option: str(path)})
    message = str(refused.value)
    assert refused.value.exit_code == EXIT_UNUSABLE_INPUT and len(message.splitlines()) == 1, message
    assert str(path) in message, message
    return message


def edited(path: Path | str, change) -> str:
    """The JSON file at ``path``, changed."""
    document = json.loads(Path(path).read_text())
    change(document)
    return json.dumps(document)


def setting(path: str, value: Any):
    """A change setting ``document[a][b]...`` for ``path`` "a.b...", or deleting it for ``...``."""
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]

    def change(document: Any) -> None:
        for part in parents:
            document = document[part]
        if value is ...:
            del document[last]
        else:
            document[last] = value

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (setting("nodes", {}), "no 'nodes'"),
        (setting("nodes", []), "has no nodes"),
        (setting("nodes.1", "x"), 'nodes[1] must be an object, not "x"'),
        (setting("nodes.1.id", 7), "nodes[1].id must be a string, not 7"),
        (setting("nodes.1.id", ...), "'nodes[1].id' is required"),
        (setting("nodes.1.parallelism", 0), "nodes[1].parallelism must be an integer from 1 to 32768, not 0"),
        (setting("nodes.1.parallelism", True), "nodes[1].parallelism must be an integer from 1 to 32768, not true"),
        (setting("nodes.1.parallelism", "2"), 'nodes[1].parallelism must be an integer from 1 to 32768, not "2"'),
        (setting("nodes.1.description", ["x"]), "nodes[1].description must be a string"),
        (setting("nodes.1.inputs", {}), "nodes[1].inputs must be a list, not {}"),
        (setting("nodes.1.inputs.0", None), "nodes[1].inputs[0] must be an object, not null"),
        (setting("nodes.1.inputs.1.ship_strategy", 3), "nodes[1].inputs[1].ship_strategy must be a string, not 3"),
        (setting("nodes.1.inputs.1.num", 1.0), "nodes[1].inputs[1].num must be an integer from 0 to 2147483647, not 1.0"),
        (setting("nodes.1.inputs.1.id", ...), "'nodes[1].inputs[1].id' is required"),
        (lambda d: d["nodes"].append(d["nodes"][0]), "nodes[4] is vertex 4e1fa7f1daef7532e6d29e9a5d40d939 again"),
    ],
)
def test_malformed_plan_is_refused_naming_file_and_fault(tmp_path, change, message):
    assert message in refusal(tmp_path, BASE, "plan", edited(BASE.plan, change))


@pytest.mark.parametrize(
    "change, message",
    [
        (setting("nodes.2.outputType", ...), "exchange node 3: 'outputType' is required"),
        (setting("nodes.2.outputType", {"type": "MAP"}), "exchange node 3: cannot read outputType: KeyError: 'keyType'"),
        (setting("nodes.2.inputProperties.0.requiredDistribution.keys", [0, 99]), "exchange node 3: key 99 is not a column"),
        (setting("nodes.2.inputProperties.0.requiredDistribution.keys", "f0"), "requiredDistribution.keys must be a list"),
        (setting("edges.1.source", "2"), 'edges[1].source must be an integer from 0 to 2147483647, not "2"'),
        (setting("nodes.2.id", True), "nodes[2].id must be an integer from 0 to 2147483647, not true"),
    ],
)
def test_malformed_compiled_plan_is_refused(tmp_path, change, message):
    compiled = SQL_FIXTURE.directory / "compiled-plan.json"
    assert message in refusal(tmp_path, SQL_FIXTURE, "sql_plan", edited(compiled, change))


def test_malformed_schema_and_plan_through_the_cli(ckpt, tmp_path):
    schema, plan = tmp_path / "s.toml", tmp_path / "p.json"
    schema.write_text(ENTRY + "key = true\n")
    plan.write_text(edited(BASE.plan, setting("nodes.1.inputs", [7])))
    for given in (["--schema", schema], ["--plan", plan], ["--schema", BASE.schema, "--plan", plan]):
        code, out, err = ckpt("inspect", BASE.checkpoint, *given, "--engine", "local")
        assert code == 2 and out == "", (given, out, err)
        assert len(err.splitlines()) == 1 and err.startswith("ckpt: error: "), err
    code, _, err = ckpt("rescale", BASE.checkpoint, tmp_path / "out", "-p", "3", "--schema", schema, "--plan", BASE.plan)
    assert code == 2 and err.startswith("ckpt: error: schema ") and "key must be" in err, err
    assert not (tmp_path / "out").exists()
