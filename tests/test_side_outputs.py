"""A chain with two outputs, one of them a side output, written by real Flink 2.3 and 1.20
(flink23-sideout-p2, flink120-sideout-p2).

``so-split`` (tail of ``[so-source -> so-timestamps -> so-split]``) sends its main output and its
side output through keyed exchanges into the two inputs of ``so-slow-count``, and the side output
once more through a REBALANCE into another vertex, ``so-side-filter``: three output partitions of one
chain, all holding in-flight records. Flink 2.3 and 1.20 both numbered them 0, 1, 2 (operators.json).
The REST plan does not say which partition feeds which exchange (see README, *Which output
partition feeds which exchange*), so ckpt takes the pairing from the bytes or proves the one the
schema states. At parallelism 1 real Flink (both versions) restores the original: the keyed
exchanges and the explicit ``rebalance()`` stay exchanges, and the REBALANCE into the p=1 sink
``so-print``, which becomes FORWARD and chained, holds no data; ckpt says so and its output is
restored with the exact count.
"""

from __future__ import annotations

import itertools
import json

import pytest

import flink_env
from catalog import fixture_named
from ckpt_tool.planning import plan_rescale
from ckpt_tool.session import Session
from ckpt_tool.topology import target_graph

SIDEOUTS = [fixture_named("flink23-sideout-p2"), fixture_named("flink120-sideout-p2")]
VERSIONS = ["2.3", "1.20"]
SPLIT = "b2f6863dbdce0caefa77ce0d791165e5"  # so-split
SLOW_COUNT, SIDE_FILTER = "a739881016b621401c853fd10d17499f", "82f34297feb47bc666c1d6c75e6cda34"
FINAL_FILTER_CHAIN, PRINT = SLOW_COUNT, "59b8db86839fe1ace56f06054de4bbca"  # [so-slow-count -> so-final-filter], so-print


def pairing(fixture, partitions=(0, 1, 2)) -> str:
    """How ckpt states a pairing of so-split's partitions; metadata v4 (1.20) names no operator, so
    its messages name them by id."""
    named = fixture.info["metadata_version"] >= 5
    slow, side = ("so-slow-count", "so-side-filter") if named else (SLOW_COUNT, SIDE_FILTER)
    names = [f"{slow} (gate 0)", f"{slow} (gate 1)", f"{side} (gate 0)"]
    return ", ".join(f"partition {p} -> {name}" for p, name in zip(partitions, names))


def schema(fixture, tmp_path, name: str, partitions: dict[int, int] | None, untyped_side: bool = True) -> str:
    """The fixture's schema, with ``partition = a`` read as ``partition = partitions[a]`` (None: no
    ``partition`` at all), the side exchange into so-side-filter untyped."""
    blocks = fixture.directory.joinpath("schema.toml").read_text().split("[[exchange]]")
    out = []
    for block in blocks:
        lines = []
        for line in block.splitlines():
            if line.startswith("partition = "):
                if partitions is None:
                    continue
                line = f"partition = {partitions[int(line.split('=')[1])]}"
            if untyped_side and "so-side-filter" in block and line.startswith("type = "):
                continue
            lines.append(line)
        out.append("\n".join(lines))
    path = tmp_path / f"{name}.toml"
    path.write_text("[[exchange]]".join(out))
    return str(path)


@pytest.mark.parametrize("sideout", SIDEOUTS, ids=VERSIONS)
def test_the_fixture_is_a_chain_with_three_output_partitions(sideout):
    exchanges = [e for e in sideout.info["exchanges"] if e["upstream_vertex"].startswith("e1b5b6eb")]
    assert sorted((e["partition"], e["ship_strategy"], e["gate"]) for e in exchanges) == [
        (0, "HASH", 0),
        (1, "HASH", 1),
        (2, "REBALANCE", 0),
    ]
    held = {ch["partition"] for ch in sideout.expected["logical_channels"] if ch["upstream"] == SPLIT and ch["records"]}
    assert held == {0, 1, 2}


@pytest.mark.parametrize("sideout", SIDEOUTS, ids=VERSIONS)
def test_swapped_partitions_of_an_untyped_exchange_are_refused_with_the_evidence(ckpt, tmp_path, sideout):
    swapped = schema(sideout, tmp_path, "swapped", {0: 0, 1: 2, 2: 1})
    destination = tmp_path / "out"
    code, _, err = ckpt("rescale", str(sideout.checkpoint), str(destination), "-p", "3", "--schema", swapped, "--engine", "local")
    assert code == 2 and "Traceback" not in err, err
    assert "does not continue the input side's last record" in err and "contradicted by the bytes" in err
    assert f"the bytes fit {pairing(sideout)} only" in err
    assert not destination.exists()
    code, out, _ = ckpt("verify", str(sideout.checkpoint), "--schema", swapped, "--engine", "local", "--json")
    framing = [p["message"] for p in json.loads(out)["problems"] if p["check"] == "record-framing"]
    assert code != 0 and any("contradicted by the bytes" in m for m in framing)


WRONG = [dict(enumerate(p)) for p in itertools.permutations(range(3)) if p != (0, 1, 2)]
ONE_PARTITION = "through one output partition; give each its own"
NOT_DESCRIBED = "has in-flight data on output partition 2 that no exchange in --plan/--schema describes"


@pytest.mark.parametrize("sideout", SIDEOUTS, ids=VERSIONS)
def test_every_wrong_partition_is_refused(ckpt, tmp_path, sideout):
    """Each of the five wrong pairings of the three partitions (the side exchange untyped), a
    partition given twice and one the chain does not have: exit 2, nothing written, verify unsound."""
    cases = [(m, "contradicted by the bytes") for m in WRONG] + [
        ({0: 0, 1: 0, 2: 2}, ONE_PARTITION),
        ({0: 0, 1: 1, 2: 3}, NOT_DESCRIBED),
    ]
    for number, (partitions, reason) in enumerate(cases):
        destination = tmp_path / f"out{number}"
        stated = schema(sideout, tmp_path, f"wrong{number}", partitions)
        code, _, err = ckpt("rescale", str(sideout.checkpoint), str(destination), "-p", "3", "--schema", stated)
        assert code == 2 and reason in err and "Traceback" not in err and not destination.exists(), (partitions, err)
        code, _, _ = ckpt("verify", str(sideout.checkpoint), "--schema", stated, "--engine", "local", "--json")
        assert code != 0, partitions


@pytest.mark.parametrize("sideout", SIDEOUTS, ids=VERSIONS)
def test_swapping_the_typed_keyed_exchange_is_refused_too(ckpt, tmp_path, sideout):
    swapped = schema(sideout, tmp_path, "swapped-typed", {0: 0, 1: 2, 2: 1}, untyped_side=False)
    code, _, err = ckpt(
        "rescale", str(sideout.checkpoint), str(tmp_path / "out"), "-p", "3", "--schema", swapped, "--engine", "local"
    )
    assert code == 2 and "cut record" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("sideout", SIDEOUTS, ids=VERSIONS)
def test_plan_alone_pairs_the_partitions_from_the_bytes(ckpt, tmp_path, sideout):
    code, _, err = ckpt(
        "rescale",
        str(sideout.checkpoint),
        str(tmp_path / "out"),
        "-p",
        "3",
        "--plan",
        sideout.plan,
        "--dry-run",
        "--engine",
        "local",
    )
    split = "so-split" if sideout.info["metadata_version"] >= 5 else SPLIT
    assert f"{split}: {pairing(sideout)}, the one pairing the bytes fit" in err
    # the keyed exchanges still need their record type and key: refused, not guessed
    assert code == 2 and "is keyed but --schema gives no record type and key" in err
    # the skeleton states the pairing the bytes fit
    code, out, err = ckpt("schema", str(sideout.checkpoint), "--plan", sideout.plan)
    assert code == 0 and f"{split}: {pairing(sideout)}, the one pairing the bytes fit" in err
    stated = [block for block in out.split("[[exchange]]") if f'upstream = "{split}"' in block]
    side = "so-side-filter" if sideout.info["metadata_version"] >= 5 else SIDE_FILTER
    assert [("gate = 1" in b, side in b, f"partition = {i}" in b) for i, b in enumerate(stated)] == [
        (False, False, True),
        (True, False, True),
        (False, True, True),
    ]


@pytest.mark.parametrize("sideout", SIDEOUTS, ids=VERSIONS)
def test_skeleton_without_a_plan_states_the_one_pairing_the_bytes_fit(ckpt, tmp_path, sideout):
    """Without --plan, each undescribed gate lists the candidate senders with what the bytes say of
    each; where exactly one fits and every other is contradicted, the entry states that pairing
    (never a guess), and the untouched skeleton is a schema ckpt accepts."""
    code, out, err = ckpt("schema", str(sideout.checkpoint))
    assert code == 0, err
    named = sideout.info["metadata_version"] >= 5
    split = "so-split" if named else SPLIT
    stated = {}
    for block in out.split("[[exchange]]")[1:]:
        values = dict(line.split(" = ", 1) for line in block.splitlines() if line and not line.startswith("#"))
        assert values["upstream"] == f'"{split}"' and "the one pairing the bytes fit" in block
        stated[(values["downstream"].strip('"'), int(values["gate"]))] = int(values["partition"])
    slow, side = ("so-slow-count", "so-side-filter") if named else (SLOW_COUNT, SIDE_FILTER)
    assert stated == {(slow, 0): 0, (slow, 1): 1, (side, 0): 2}
    path = tmp_path / "skeleton.toml"
    path.write_text(out)
    code, _, err = ckpt("inspect", str(sideout.checkpoint), "--schema", str(path), "--engine", "local")
    assert code == 0, err


@pytest.mark.parametrize("sideout", SIDEOUTS, ids=VERSIONS)
def test_at_parallelism_one_only_the_edge_without_data_is_chained(ckpt, sideout):
    """verify --target-parallelism 1 passes, as Flink restores the original at 1: the REBALANCE
    so-final-filter -> so-print (2 -> 1) becomes FORWARD and chained, the explicit rebalance()
    into so-side-filter (2 -> 2, with in-flight records) stays an exchange."""
    args = [str(sideout.checkpoint), "--plan", sideout.plan, "--schema", sideout.schema, "--engine", "local"]
    code, out, err = ckpt("verify", *args, "--target-parallelism", "1", "--json")
    assert code == 0, err
    assert next(c for c in json.loads(out)["checks"] if c["name"] == "target-parallelism")["status"] == "passed"
    session = Session.open(*args[:1], sideout.schema, sideout.plan, "local")
    plan = plan_rescale(session.metadata, 1, {}, session.described_exchanges, session.plan)
    links = target_graph(session.metadata, session.plan, plan).links
    assert [(link.upstream, link.downstream) for link in links] == [(FINAL_FILTER_CHAIN, PRINT)]


@pytest.mark.flink
@pytest.mark.parametrize("sideout", SIDEOUTS, ids=VERSIONS)
def test_pairing_from_the_bytes_rescales_and_flink_restores_exactly(ckpt, tmp_path, sideout):
    """Without `partition`, ckpt takes the one pairing the bytes fit; the output is the same as
    with the right `partition` numbers, and real Flink (2.3, 1.20) restores it at 3 with the exact count."""
    outputs, reports = {}, {}
    for name, partitions in (("stated", {0: 0, 1: 1, 2: 2}), ("from-bytes", None)):
        destination = tmp_path / name / "job" / sideout.checkpoint.name
        code, out, err = ckpt(
            "rescale",
            str(sideout.checkpoint),
            str(destination),
            "-p",
            "3",
            "--schema",
            schema(sideout, tmp_path, name, partitions),
            "--engine",
            "local",
            "--json",
        )
        assert code == 0, err
        reports[name] = json.loads(out)["exchanges"]
        assert (f"{pairing(sideout)}, the one pairing the bytes fit" in err) == (partitions is None)
        outputs[name] = destination
    assert reports["stated"] == reports["from-bytes"]
    info = sideout.info
    count = flink_env.restore_count(info["flink_version"], outputs["from-bytes"], 3, job=info["job_kind"], n=info["n"], k=0)
    assert count == info["source_records"]


@pytest.mark.flink
@pytest.mark.parametrize("sideout", SIDEOUTS, ids=VERSIONS)
def test_rescale_to_one_is_restored_by_flink_exactly(ckpt, tmp_path, sideout):
    """Flink restores the original at parallelism 1 (fixtures/README.md), and ckpt's rescale to 1,
    pairing the partitions from the bytes, too: every in-flight record once, the exact count."""
    destination = tmp_path / "p1" / "job" / sideout.checkpoint.name
    stated = schema(sideout, tmp_path, "from-bytes", None)
    code, out, err = ckpt(
        "rescale", str(sideout.checkpoint), str(destination), "-p", "1", "--plan", sideout.plan, "--schema", stated, "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["records_out"] == report["records_in"] > 0 and not report["dropped"]
    info = sideout.info
    assert flink_env.restore_count(info["flink_version"], destination, 1, job=info["job_kind"], n=info["n"], k=0) == 40000
