"""A Table/SQL job with a regular JOIN and a mini-batch two-phase aggregation (job=sqljoin,
fixtures flink23-sqljoin-p2 and flink120-sqljoin-p2) through its compiled plan ALONE: no --plan,
no --schema. Every exchange is described (the two keyed inputs of the Join, the local
accumulators into the GlobalGroupAggregate, the REBALANCE into the p=1 sink), also with the plan
the same Flink compiled in another TableEnvironment (node ids 15..27 instead of 1..13); the
figures equal those of Flink's own reader (expected.json); Flink 2.3 and 1.20 restore the rescale
to 3 with the exact count; parallelism 1 is refused as the topology check says, and the way out
it offers is restored by Flink 1.20, which cannot restore the original checkpoint at 1 itself
(fixtures/README.md, *The SQL join job*)."""

from __future__ import annotations

import json
import tomllib
from collections import Counter

import pytest

from catalog import fixture_named

JOBS = [fixture_named("flink23-sqljoin-p2"), fixture_named("flink120-sqljoin-p2")]
PLANS = ["compiled-plan", "compiled-elsewhere"]
SINK = "6eccf9e73ac8dd9bff1e9eae54c4d268"  # Sink: counts[13], uid 13_sink (the same id on both versions)


def exchanges_of_the_job(job) -> set[tuple[str, str, int, str]]:
    """(upstream tail, downstream head, gate, ship strategy) of every exchange in operators.json."""
    vertices = {v["id"]: v for v in json.loads((job.directory / "operators.json").read_text())["vertices"]}
    return {
        (vertices[e["upstream_vertex"]]["operators"][-1]["id"], v["operators"][0]["id"], e["gate"], e["ship_strategy"])
        for v in vertices.values()
        for e in v["inputs"]
    }


def inspect(ckpt, job, *more: str) -> tuple[list[dict], str]:
    code, out, err = ckpt("inspect", str(job.checkpoint), *more, "--engine", "local", "--json")
    assert code == 0, err
    return json.loads(out)["exchanges"], err


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.name)
def test_the_compiled_plan_alone_describes_every_exchange_as_flinks_reader_counts_it(ckpt, job, plan):
    exchanges, err = inspect(ckpt, job, "--sql-plan", str(job.directory / f"{plan}.json"))
    got = {(e["upstream"], e["downstream"], e["gate"], e["partitioner"]): e for e in exchanges}
    assert set(got) == exchanges_of_the_job(job)  # the REBALANCE into the sink too
    assert sorted(e["partitioner"] for e in exchanges) == ["HASH", "HASH", "HASH", "REBALANCE"]
    # records per exchange as Flink's reader counts them, in-flight data on all but the finished users side
    reference = Counter()
    for channel in job.expected["logical_channels"]:
        reference[(channel["upstream"], channel["downstream"], channel["gate"])] += channel["records"]
    for (up, down, gate, _), exchange in got.items():
        assert exchange["records"] == reference[(up, down, gate)], exchange
        assert exchange["problem"] is None and exchange["partial_bytes"] == 0
    assert sum(e["records"] > 0 for e in exchanges) == 3
    for keyed in job.expected["keyed_operators"]:  # the Join, the GlobalGroupAggregate
        histogram: Counter = Counter()
        for exchange in exchanges:
            if exchange["downstream"] == keyed["operator"]:
                histogram.update({int(k): v for k, v in exchange["key_group_histogram"].items()})
        assert +histogram == Counter({int(k): v for k, v in keyed["key_group_histogram"].items()})
        assert keyed["misplaced_records"] == 0 and keyed["duplicate_records"] == 0
    assert {tuple(e["key"]) for e in exchanges if e["keyed"]} == {("uid",), ("name",)}
    # the local accumulators: the aggregate function's STRUCTURED accumulator, laid out as a nested row
    assert any(e["type"] == "binary_row<name:string,count1$0:bigint,slow_count$1:row<count:bigint>>" for e in exchanges)
    if plan == "compiled-elsewhere":
        assert "node ids differ from the job's by -14 (compiled in another TableEnvironment)" in err
        assert "21 -> 7, 22 -> 8, 24 -> 10, 25 -> 11, 26 -> 12, 27 -> 13" in err
    else:
        assert "matched by the structure" not in err


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.name)
def test_schema_from_the_compiled_plan_alone_is_complete(ckpt, job, tmp_path):
    code, out, err = ckpt("schema", str(job.checkpoint), "--sql-plan", str(job.directory / "compiled-elsewhere.json"))
    assert code == 0, err
    assert "# Every exchange is typed (nothing to fill in)" in out
    schema = tomllib.loads(out)["exchange"]
    assert len(schema) == 3  # every exchange holding in-flight data (the finished users side holds none)
    assert all(e["type"].startswith("binary_row<") and e["partitioner"] in ("HASH", "REBALANCE") for e in schema)
    assert sorted(tuple(e["key"]) for e in schema) == [(), ("name",), ("uid",)]
    # the printed schema alone describes the checkpoint as the compiled plan does
    path = tmp_path / "schema.toml"
    path.write_text(out)
    from_schema, _ = inspect(ckpt, job, "--schema", str(path))
    from_plan, _ = inspect(ckpt, job, "--sql-plan", str(job.directory / "compiled-plan.json"))
    held = [e for e in from_plan if e["records"]]
    assert [(e["upstream"], e["records"], e["type"]) for e in from_schema] == [
        (e["upstream"], e["records"], e["type"]) for e in held
    ]


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.name)
def test_parallelism_one_is_refused_and_nothing_written(ckpt, job, tmp_path):
    """At parallelism 1 the REBALANCE into the sink is FORWARD and chained, and it holds in-flight rows."""
    plan = str(job.directory / "compiled-plan.json")
    destination = tmp_path / "out"
    code, _, err = ckpt("rescale", str(job.checkpoint), str(destination), "-p", "1", "--sql-plan", plan, "--engine", "local")
    assert code == 2 and "Traceback" not in err
    # Flink 2.3 starts and loses the sink's in-flight rows, 1.20 fails (fixtures/README.md): not whole
    assert "Flink would not restore this checkpoint whole at the new parallelism" in err
    # the planner's uids name the operators on 1.20 too (the ids are their hashes), so no id is said to change
    assert "--drop-in-flight 13_sink" in err and "Cannot map" not in err
    assert not destination.exists()
    code, out, err = ckpt(
        "verify", str(job.checkpoint), "--target-parallelism", "1", "--sql-plan", plan, "--engine", "local", "--json"
    )
    assert code == 1, err
    (check,) = [c for c in json.loads(out)["checks"] if c["name"] == "target-parallelism"]
    assert check["status"] == "failed"


@pytest.mark.flink
@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.name)
def test_the_compiled_plan_alone_rescales_to_three_and_flink_restores_it(ckpt, job, tmp_path):
    """The job's own plan and the one compiled elsewhere write the same checkpoint; Flink restores it exactly."""
    import flink_env

    written = []
    for plan in PLANS:
        destination = tmp_path / plan / "job" / job.checkpoint.name
        code, out, err = ckpt(
            "rescale", str(job.checkpoint), str(destination), "-p", "3", "--sql-plan", str(job.directory / f"{plan}.json"),
            "--engine", "local", "--json",
        )  # fmt: skip
        assert code == 0, err
        report = json.loads(out)
        assert report["records_out"] == report["records_in"] > 0
        written.append(report["exchanges"])
    assert written[0] == written[1] and [e["partitioner"] for e in written[0]] == ["HASH", "HASH", "REBALANCE"]
    info = job.info
    count = flink_env.restore_count(info["flink_version"], destination, 3, job="sqljoin", n=info["n"])
    assert count == info["source_records"]


@pytest.mark.flink
def test_flink_120_restores_at_one_what_ckpt_wrote_with_the_sink_rows_dropped(ckpt, tmp_path):
    """Flink 1.20 fails on the original checkpoint at parallelism 1 (fixtures/README.md); the way out
    ckpt's refusal offers, dropping the sink exchange's rows, is restored with the exact count."""
    import flink_env

    job = JOBS[1]
    destination = tmp_path / "job" / job.checkpoint.name
    code, out, err = ckpt(
        "rescale", str(job.checkpoint), str(destination), "-p", "1", "--sql-plan", str(job.directory / "compiled-plan.json"),
        "--drop-in-flight", SINK, "--engine", "local", "--json",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["records_out"] == report["records_in"] > 0
    info = job.info
    assert flink_env.restore_count(info["flink_version"], destination, 1, job="sqljoin", n=info["n"]) == info["source_records"]


def test_a_plan_without_names_does_not_guess_the_join_chains_tail():
    """Flink 1.20's metadata names no operator. Calc[3] holds output state and fits both the chain
    it ends and the Join's chain (both at parallelism 2 into parallelism 2), whose tail,
    LocalGroupAggregate[10], holds none: it is the tail of neither for sure, so neither is set, and
    the schema's sender stands (the Join's chain was given Calc[3], refusing the fixture's schema)."""
    from ckpt_tool.flink.checkpoint import Checkpoint
    from ckpt_tool.flink.plan import load_job_plan

    job = JOBS[1]
    plan = load_job_plan(job.plan, Checkpoint.open(str(job.checkpoint)).metadata)
    join_chain = "838214c2d0011d16604947ef42fbe75b"
    assert plan.vertices[join_chain].tail is None
    assert plan.vertices["7d6ee49eeb39bca22576de138f570bf8"].tail == "8c30f62f255d30da4eefb041339003cf"  # ConstraintEnforcer[13]
