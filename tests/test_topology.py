"""The job graph at the new parallelism, checked as Flink checks it before a restore (ckpt_tool.topology).

Both SQL fixtures hold in-flight records on the REBALANCE exchange into their p=1 sink. At
parallelism 1 that edge is FORWARD and chained: Flink 2.3 refuses the job graph's new chain
(flink23-sqltypes-p2, whose operators have uids) or the new id of the sink without a uid
(flink23-sql-p2). ckpt refuses both with Flink's own words, writing nothing; what Flink says of
the checkpoint ckpt would have written is asserted on real Flink, and the way out ckpt offers
(--drop-in-flight of the sink) is restored by real Flink with the exact count.
"""

from __future__ import annotations

import copy
import json

import pytest

import flink_env
from catalog import fixture_named
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.planning import RescaleError, plan_rescale
from ckpt_tool.rewrite import rewrite
from ckpt_tool.session import Session
from ckpt_tool.topology import CHAINED
from ckpt_tool.writer import write_checkpoint

SQL = fixture_named("flink23-sql-p2")
SQLTYPES = fixture_named("flink23-sqltypes-p2")
SQLTYPES120 = fixture_named("flink120-sqltypes-p2")  # the same job on Flink 1.20: metadata v4 holds no uids
COUNTJOB = fixture_named("flink23-hashmap-p2")
COUNTJOB120 = fixture_named("flink120-hashmap-p2")
UPDATES = fixture_named("flink23-updates-p2")  # DataStream: in-flight records on the REBALANCE into the p=1 sink
UPDATES120 = fixture_named("flink120-updates-p2")
SINK_ID = "d1f88f581f7db6bdd7872c2ac6a9f331"  # 5_sink of flink23-sqltypes-p2
SQL_SINK_ID = "c236b8d78d6f266597f918c317358f20"  # Sink: counts[16] of flink23-sql-p2 (no uid)
CHAINED_SINK = f"{CHAINED} The following operators contain channel state: [{SINK_ID}]"
UPDATES_SINK_ID = "59b68e3295bbe958af112642716602c8"  # up-sink-filter, head of the p=1 sink chain (2.3 and 1.20)
CHAINED_UPDATES_SINK = f"{CHAINED} The following operators contain channel state: [{UPDATES_SINK_ID}]"
NOT_MAPPED = f"Cannot map checkpoint/savepoint state for operator {SQL_SINK_ID} to the new program"


def args(fixture, *more: str) -> list[str]:
    return [str(fixture.checkpoint), "--plan", fixture.plan, "--schema", fixture.schema, "--engine", "local", *more]


def written_without_the_check(fixture, tmp_path):
    """The checkpoint ckpt's rewrite would write at parallelism 1, the topology check left out."""
    session = Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan, "local")
    destination = tmp_path / "unchecked" / "job" / fixture.checkpoint.name
    plan = plan_rescale(session.metadata, 1, {}, session.described_exchanges, session.plan)
    rewrite(session, str(destination), plan)
    return destination


def flink_refusal(fixture, checkpoint, tmp_path) -> str:
    """Flink's whole error output (whitespace folded) when it refuses to restore ``checkpoint`` at parallelism 1."""
    info = fixture.info
    arguments = flink_env.job_args(
        "restore",
        parallelism=1,
        n=info["n"],
        backend=info["backend"],
        checkpoint_dir=tmp_path / "restore-ckpts",
        restore=checkpoint,
        job=info["job_kind"],
    )
    result = flink_env.run_java(info["flink_version"], "CountJob", arguments, timeout=600)
    assert result.returncode != 0, "Flink restored it"
    return " ".join(result.stderr.split())


@pytest.mark.parametrize(
    "job, reason",
    [
        (SQLTYPES, CHAINED_SINK),
        (SQL, NOT_MAPPED),
        (SQLTYPES120, CHAINED_SINK),
        (UPDATES, CHAINED_UPDATES_SINK),
        (UPDATES120, CHAINED_UPDATES_SINK),
    ],
    ids=["chained-exchange", "uid-less-id-changes", "chained-exchange-1.20", "datastream", "datastream-1.20"],
)
def test_rescale_to_one_is_refused_with_flinks_reason_and_nothing_written(ckpt, tmp_path, job, reason):
    destination = tmp_path / "out"
    code, _, err = ckpt("rescale", *args(job, "-p", "1"), str(destination))
    assert code == 2 and "Traceback" not in err
    # Flink's reason first: on 1.20 whether the sink has a uid is not in the metadata, so that its
    # id may change too is said after the chained exchange, which is certain
    assert f"Flink would not restore this checkpoint at the new parallelism: {reason}" in err
    assert "--drop-in-flight" in err  # the way out: the in-flight data of the exchange that becomes chained
    assert not destination.exists()


def in_flight_records(fixture, downstream: str) -> int:
    """Records in flight into ``downstream``, as Flink's own classes count them (expected.json)."""
    return sum(c["records"] for c in fixture.expected["logical_channels"] if c["downstream"] == downstream)


@pytest.mark.flink
@pytest.mark.parametrize("job", [UPDATES, UPDATES120], ids=["2.3", "1.20"])
def test_flink_refuses_the_datastream_original_at_one(job, tmp_path):
    """The DataStream job with records in flight on the REBALANCE into its p=1 sink (no explicit
    partitioner): real Flink refuses the checkpoint as Flink wrote it (only relocated) at
    parallelism 1, for the reason ckpt gives, as the issue saw on Flink 2.3."""
    assert in_flight_records(job, UPDATES_SINK_ID) > 0
    source = Checkpoint.open(str(job.checkpoint))
    relocated = tmp_path / "original" / "job" / job.checkpoint.name
    write_checkpoint(source, copy.deepcopy(source.metadata), str(relocated), {})
    refusal = flink_refusal(job, relocated, tmp_path)
    assert " ".join(CHAINED_UPDATES_SINK.split()) in refusal


@pytest.mark.parametrize(
    "job, reason",
    [
        (SQLTYPES, CHAINED_SINK),
        (SQL, NOT_MAPPED),
        (SQLTYPES120, CHAINED_SINK),
        (UPDATES, CHAINED_UPDATES_SINK),
        (UPDATES120, CHAINED_UPDATES_SINK),
    ],
    ids=["sqltypes", "sql", "sqltypes-1.20", "datastream", "datastream-1.20"],
)
def test_verify_target_parallelism_one_says_flink_would_refuse(ckpt, job, reason):
    code, out, err = ckpt("verify", *args(job, "--target-parallelism", "1", "--json"))
    report = json.loads(out)
    assert code == 1, err
    problems = [p["message"] for p in report["problems"] if p["check"] == "target-parallelism"]
    assert len(problems) == 1 and reason in problems[0]


@pytest.mark.parametrize("job", [COUNTJOB, COUNTJOB120], ids=["2.3", "1.20"])
def test_verify_target_parallelism_flink_accepts(ckpt, job):
    """The DataStream job (two-input keyed, REBALANCE into a p=1 sink that holds no records): its
    rescale to 1 is restored by real Flink with the exact count (tests/test_rescale.py, path 2-1-4-1)."""
    code, out, err = ckpt("verify", *args(job, "--target-parallelism", "1", "--json"))
    assert code == 0, err
    assert next(c for c in json.loads(out)["checks"] if c["name"] == "target-parallelism")["status"] == "passed"


@pytest.mark.parametrize("sql, countjob", [(SQLTYPES, COUNTJOB), (SQLTYPES120, COUNTJOB120)], ids=["2.3", "1.20"])
def test_equal_parallelism_across_a_former_rebalance_edge(ckpt, tmp_path, sql, countjob):
    """Only the sink's parallelism changes (1 -> 2, that of its upstream chain): its input edge is
    FORWARD and chained at 2 as at 1."""
    # 1.20's metadata names no operator: the sink by its id
    code, _, err = ckpt("rescale", *args(sql, "--operator", f"{SINK_ID}=2", "--dry-run"), str(tmp_path / "a"))
    assert code == 2 and CHAINED_SINK in err
    # the CountJob's print sink chains with final-filter too, but that edge holds no in-flight data
    code, _, err = ckpt("rescale", *args(countjob, "--operator", "print=2", "--dry-run"), str(tmp_path / "b"))
    assert code == 0, err


@pytest.mark.flink
@pytest.mark.parametrize("job", [COUNTJOB, COUNTJOB120], ids=["2.3", "1.20"])
def test_equal_parallelism_across_a_former_rebalance_edge_restores(ckpt, tmp_path, job):
    """ckpt's output with the print sink at 2, the parallelism of final-filter, is restored by real
    Flink running print at 2 (chained to final-filter: slow-count -> final-filter -> print) with the
    exact count, as Flink restores the original so (1.20's holds a watermark on that edge)."""
    destination = tmp_path / "print2" / "job" / job.checkpoint.name
    code, _, err = ckpt("rescale", *args(job, "--operator", "print=2"), str(destination))
    assert code == 0, err
    info = job.info
    count = flink_env.restore_count(info["flink_version"], destination, 2, backend=info["backend"], sink_parallelism=2)
    assert count == info["source_records"]


def target_plan(fixture, tmp_path, chain_sink: bool):
    """The fixture's plan at parallelism 1, the sink kept apart or chained to its upstream."""
    document = json.loads((fixture.directory / "plan.json").read_text())
    plan = document.get("plan", document)
    for node in plan["nodes"]:
        node["parallelism"] = 1
    if chain_sink:
        sink = next(n for n in plan["nodes"] if n["id"] == SINK_ID)
        upstream = next(n for n in plan["nodes"] if n["id"] == sink["inputs"][0]["id"])
        upstream["description"] += "+- " + sink["description"]
        plan["nodes"] = [n for n in plan["nodes"] if n is not sink]
    path = tmp_path / f"target-{chain_sink}.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_target_plan_overrides_the_derivation(ckpt, tmp_path):
    apart = target_plan(SQLTYPES, tmp_path, chain_sink=False)
    code, _, err = ckpt("rescale", *args(SQLTYPES, "-p", "1", "--dry-run", "--target-plan", apart), str(tmp_path / "a"))
    assert code == 0, err
    chained = target_plan(SQLTYPES, tmp_path, chain_sink=True)
    code, _, err = ckpt("rescale", *args(SQLTYPES, "-p", "1", "--dry-run", "--target-plan", chained), str(tmp_path / "b"))
    assert code == 2 and CHAINED_SINK in err and "--target-plan chains them" in err
    # a repair at the same parallelism is checked against the target plan too
    code, _, err = ckpt("repair", *args(SQLTYPES, "--target-plan", chained), str(tmp_path / "c"))
    assert code == 2 and CHAINED in err and not (tmp_path / "c").exists()


def test_without_a_plan_the_unknown_partitioner_is_taken_as_chained(tmp_path):
    session = Session.open(str(SQLTYPES.checkpoint), SQLTYPES.schema, None, "local")
    from ckpt_tool.ops.rescale import rescale

    with pytest.raises(RescaleError, match="without --plan ckpt cannot tell"):
        rescale(session, str(tmp_path / "out"), 1, dry_run=True)


def test_the_check_follows_the_written_state(tmp_path):
    """Dropping the exchange that becomes chained leaves nothing to refuse; the other exchanges are rerouted."""
    session = Session.open(str(SQLTYPES.checkpoint), SQLTYPES.schema, SQLTYPES.plan, "local")
    from ckpt_tool.ops.rescale import rescale

    report = rescale(session, str(tmp_path / "out"), 1, dry_run=True, drop=["5_sink"])
    assert [d.downstream for d in report.dropped] == [SINK_ID] and report.dropped[0].records > 0


@pytest.mark.flink
@pytest.mark.parametrize(
    "job, reason",
    [(SQLTYPES, CHAINED_SINK), (SQL, NOT_MAPPED), (SQLTYPES120, CHAINED_SINK)],
    ids=["sqltypes", "sql", "sqltypes-1.20"],
)
def test_flink_refuses_what_ckpt_refuses(job, tmp_path, reason):
    """What ckpt's rewrite would have written at parallelism 1: real Flink refuses it, for the reason ckpt gives."""
    refusal = flink_refusal(job, written_without_the_check(job, tmp_path), tmp_path)
    assert " ".join(reason.split()) in refusal


@pytest.mark.flink
@pytest.mark.parametrize(
    "job, sink",
    [(SQLTYPES, SINK_ID), (SQLTYPES120, SINK_ID), (UPDATES, UPDATES_SINK_ID), (UPDATES120, UPDATES_SINK_ID)],
    ids=["2.3", "1.20", "datastream-2.3", "datastream-1.20"],
)
def test_dropping_the_chained_exchange_restores_exactly(ckpt, tmp_path, job, sink):
    destination = tmp_path / "dropped" / "job" / job.checkpoint.name
    # 1.20's metadata names no operator: the sink by its id
    code, out, err = ckpt("rescale", *args(job, "-p", "1", "--drop-in-flight", sink, "--json"), str(destination))
    assert code == 0, err
    report = json.loads(out)
    # exactly the records Flink's own classes count on that exchange are dropped
    assert [(d["downstream"], d["records"]) for d in report["dropped"]] == [(sink, in_flight_records(job, sink))]
    assert report["records_out"] == report["records_in"]
    info = job.info
    count = flink_env.restore_count(info["flink_version"], destination, 1, job=info["job_kind"], n=info["n"])
    # the sink's changelog ends with every key's last count: rows dropped before the sink are
    # updates that later rows of the same keys supersede (DataStream: the dropped lines are UPDATE
    # lines, which the sink does not count; FINAL lines come only at end of input)
    assert count == info["source_records"]
