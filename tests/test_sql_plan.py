"""``--sql-plan``: exchanged row types and keys from the compiled plan Flink wrote for the
fixture's own job (flink23-sqltypes-p2: DECIMAL, TIMESTAMP, TIMESTAMP_LTZ, ARRAY, MAP, ROW columns
and a composite GROUP BY key), matched to operators by the node ids in their names or, without
names (Flink 1.x metadata), by the planner's uids."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from catalog import ALL_FIXTURES
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.records.flink_types import FlinkTypeError, flink_type
from ckpt_tool.records.sql_plan import SqlPlanError, sql_plan_exchanges

FIXTURE = next(f for f in ALL_FIXTURES if f.name == "flink23-sqltypes-p2")
PLAN = FIXTURE.directory / "compiled-plan.json"
# The same INSERT compiled by real Flink 2.3 in a fresh TableEnvironment after other statements
# (fixtures/java/CompileElsewhere.java): node ids 9..13 where the job's are 1..5.
ELSEWHERE = FIXTURE.directory / "compiled-elsewhere.json"


def test_exchanges_from_the_compiled_plan():
    metadata = Checkpoint.open(str(FIXTURE.checkpoint)).metadata
    exchange, sink = sql_plan_exchanges(str(PLAN), metadata)
    keyed = next(e for e in FIXTURE.info["exchanges"] if e["ship_strategy"] == "HASH")
    assert exchange.downstream_id == keyed["downstream_operator"] and exchange.partitioner == "HASH"
    assert exchange.key == ("user_name", "region", "bucket")
    assert exchange.record_type.startswith("binary_row<user_name:string,region:char(4),bucket:decimal(20,2),")
    assert "ltz:timestamp_ltz(3)" in exchange.record_type and "arr:array<int>" in exchange.record_type
    # the sink at parallelism 1: the rebalance from the constraint enforcer to the writer, which no
    # exchange node shows, typed with the sink's input rows
    rebalanced = next(e for e in FIXTURE.info["exchanges"] if e["ship_strategy"] == "REBALANCE")
    assert (sink.upstream_id, sink.downstream_id, sink.partitioner) == (
        "fbb6c44fbe07a6557b07113b83a89e16",  # 5_constraint-validator
        rebalanced["downstream_operator"],
        "REBALANCE",
    )
    assert sink.record_type.startswith("binary_row<user_name:string,region:char(4)") and not sink.keyed


def test_without_names_operators_are_found_by_the_planners_uids():
    metadata = Checkpoint.open(str(FIXTURE.checkpoint)).metadata
    named = sql_plan_exchanges(str(PLAN), metadata)
    for op in metadata.operators:  # as metadata v3/v4 (Flink 1.x) stores them
        op.name = op.uid = None
    assert sql_plan_exchanges(str(PLAN), metadata) == named


@pytest.mark.parametrize("with_plan", [True, False], ids=["plan", "no-plan"])
def test_inspect_with_the_sql_plan_equals_flinks_reader(ckpt, with_plan):
    plan = ["--plan", str(FIXTURE.directory / "plan.json")] if with_plan else []
    code, out, err = ckpt("inspect", str(FIXTURE.checkpoint), "--sql-plan", str(PLAN), *plan, "--engine", "local", "--json")
    assert code == 0, err
    (keyed,) = [e for e in json.loads(out)["exchanges"] if e["keyed"]]
    (want,) = FIXTURE.expected["keyed_operators"]
    assert keyed["records"] == want["records"] > 0
    assert Counter({int(k): v for k, v in keyed["key_group_histogram"].items()}) == Counter(
        {int(k): v for k, v in want["key_group_histogram"].items()}
    )
    assert keyed["misplaced_records"] == want["misplaced_records"] == 0


def test_schema_skeleton_with_the_sql_plan_is_typed(ckpt):
    code, out, err = ckpt(
        "schema", str(FIXTURE.checkpoint), "--sql-plan", str(PLAN), "--plan", str(FIXTURE.directory / "plan.json")
    )
    assert code == 0, err
    assert 'key = ["user_name", "region", "bucket"]' in out and 'type = "binary_row<user_name:string' in out


def test_a_compiled_plan_of_another_job_is_refused(ckpt):
    other = next(f for f in ALL_FIXTURES if f.name == "flink23-sql-p2")
    code, _, err = ckpt("inspect", str(other.checkpoint), "--sql-plan", str(PLAN), "--engine", "local")
    assert code == 2 and "Traceback" not in err
    assert "does not fit this checkpoint: no operator of node 2, node 4 (exchange node 3" in err, err


@pytest.mark.parametrize(
    "text, converted",
    [
        ("ROW<`a` VARCHAR(2147483647) NOT NULL, `b` DECIMAL(38, 18)>", "binary_row<a:string,b:decimal(38,18)>"),
        ("TIMESTAMP(3) WITH LOCAL TIME ZONE", "timestamp_ltz(3)"),
        ("TIMESTAMP(3) *ROWTIME*", "timestamp(3)"),
        ("MAP<VARCHAR(2) NOT NULL, ARRAY<BIGINT>>", "map<varchar(2),array<bigint>>"),
        ("MULTISET<STRING>", "multiset<string>"),
        ("ROW<`x` ROW<`y` BINARY(3)>>", "binary_row<x:row<y:binary(3)>>"),
    ],
)
def test_flink_type_strings(text, converted):
    assert flink_type(text) == converted


def test_flink_types_ckpt_does_not_lay_out():
    with pytest.raises(FlinkTypeError, match="RAW"):
        flink_type("RAW('java.lang.Object', 'AAA=')")


def test_unreadable_compiled_plan(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text('{"nodes": 3}')
    with pytest.raises(SqlPlanError, match="cannot read compiled plan"):
        sql_plan_exchanges(str(bad), Checkpoint.open(str(FIXTURE.checkpoint)).metadata)


@pytest.mark.flink
def test_the_compiled_plan_alone_rescales_and_flink_restores_it(ckpt, tmp_path):
    """No --plan, no --schema: every exchange (the rebalance into the p=1 sink too) comes from the
    compiled plan, the job's own or the one compiled in another TableEnvironment (the same
    rescale); Flink 2.3 restores the rescaled checkpoint with the exact count."""
    import flink_env

    reports = []
    for plan in (PLAN, ELSEWHERE):
        destination = tmp_path / plan.stem / "job" / FIXTURE.checkpoint.name
        code, out, err = ckpt(
            "rescale",
            str(FIXTURE.checkpoint),
            str(destination),
            "-p",
            "3",
            "--sql-plan",
            str(plan),
            "--engine",
            "local",
            "--json",
        )
        assert code == 0, err
        assert ("matched by the structure of its nodes" in err) == (plan == ELSEWHERE)
        reports.append(json.loads(out))
    report = reports[-1]
    assert report["records_out"] == report["records_in"] > 0
    assert {e["partitioner"] for e in report["exchanges"]} == {"HASH", "REBALANCE"}
    assert reports[0]["exchanges"] == report["exchanges"]
    info = FIXTURE.info
    assert flink_env.restore_count(info["flink_version"], destination, 3, job="sqltypes", n=info["n"]) == info["source_records"]


def shifted_plan(tmp_path, shift: int = 15):
    """The fixture's compiled plan as another TableEnvironment numbers it: the same nodes, every id
    ``shift`` higher (16..20 for 1..5)."""
    document = json.loads(PLAN.read_text())
    for node in document["nodes"]:
        node["id"] += shift
    for edge in document["edges"]:
        edge["source"] += shift
        edge["target"] += shift
    path = tmp_path / "compiled-elsewhere.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_a_plan_compiled_in_another_table_environment_is_matched_by_structure(ckpt, tmp_path):
    metadata = Checkpoint.open(str(FIXTURE.checkpoint)).metadata
    notes: list[str] = []
    elsewhere = shifted_plan(tmp_path)
    assert sql_plan_exchanges(elsewhere, metadata, notes) == sql_plan_exchanges(str(PLAN), metadata)
    assert notes and "node ids differ from the job's by -15" in notes[0]
    for op in metadata.operators:  # as metadata v3/v4 (Flink 1.x) stores them: by the planner's uids
        op.name = op.uid = None
    assert sql_plan_exchanges(elsewhere, metadata) == sql_plan_exchanges(str(PLAN), metadata)
    code, out, err = ckpt("schema", str(FIXTURE.checkpoint), "--sql-plan", elsewhere)
    assert code == 0 and "matched by the structure of its nodes" in err and 'upstream = "5_constraint-validator"' in out
    # shifted onto another job's nodes of other kinds: still refused
    other = next(f for f in ALL_FIXTURES if f.name == "flink23-sql-p2")
    code, _, err = ckpt("inspect", str(other.checkpoint), "--sql-plan", elsewhere, "--engine", "local")
    assert code == 2 and "does not fit this checkpoint" in err


def test_a_plan_compiled_by_flink_in_another_table_environment(ckpt):
    """Not shifted by hand: Flink 2.3 numbered the nodes of the same INSERT 9..13 in a fresh
    TableEnvironment that had planned other statements first."""
    assert [n["id"] for n in json.loads(ELSEWHERE.read_text())["nodes"]] == [9, 10, 11, 12, 13]
    metadata = Checkpoint.open(str(FIXTURE.checkpoint)).metadata
    notes: list[str] = []
    assert sql_plan_exchanges(str(ELSEWHERE), metadata, notes) == sql_plan_exchanges(str(PLAN), metadata)
    assert len(notes) == 1 and "node ids differ from the job's by -8" in notes[0]
    assert "(plan node -> the job's: 10 -> 2, 11 -> 3, 12 -> 4, 13 -> 5)" in notes[0]
    code, out, err = ckpt("schema", str(FIXTURE.checkpoint), "--sql-plan", str(ELSEWHERE))
    assert code == 0 and "matched by the structure of its nodes" in err, err
    assert 'key = ["user_name", "region", "bucket"]' in out and 'upstream = "5_constraint-validator"' in out
