"""A chain with two outputs, one of them a side output, written by real Flink 2.3 (flink23-sideout-p2).

``so-split`` (tail of ``[so-source -> so-timestamps -> so-split]``) sends its main output and its
side output through keyed exchanges into the two inputs of ``so-slow-count``, and the side output
once more through a REBALANCE into another vertex, ``so-side-filter``: three output partitions of one
chain, all holding in-flight records. Flink numbered them 0, 1, 2 (operators.json). The REST plan
does not say which partition feeds which exchange (see README, *Which output partition feeds which
exchange*), so ckpt takes the pairing from the bytes or proves the one the schema states.
"""

from __future__ import annotations

import json

import pytest

import flink_env
from catalog import fixture_named

SIDEOUT = fixture_named("flink23-sideout-p2")
SPLIT = "b2f6863dbdce0caefa77ce0d791165e5"  # so-split
PAIRING = "partition 0 -> so-slow-count (gate 0), partition 1 -> so-slow-count (gate 1), partition 2 -> so-side-filter (gate 0)"


def schema(tmp_path, name: str, partitions: dict[int, int] | None, untyped_side: bool = True) -> str:
    """The fixture's schema, with ``partition = a`` read as ``partition = partitions[a]`` (None: no
    ``partition`` at all), the side exchange into so-side-filter untyped."""
    blocks = SIDEOUT.directory.joinpath("schema.toml").read_text().split("[[exchange]]")
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


def test_the_fixture_is_a_chain_with_three_output_partitions():
    exchanges = [e for e in SIDEOUT.info["exchanges"] if e["upstream_vertex"].startswith("e1b5b6eb")]
    assert sorted((e["partition"], e["ship_strategy"], e["gate"]) for e in exchanges) == [
        (0, "HASH", 0),
        (1, "HASH", 1),
        (2, "REBALANCE", 0),
    ]
    held = {ch["partition"] for ch in SIDEOUT.expected["logical_channels"] if ch["upstream"] == SPLIT and ch["records"]}
    assert held == {0, 1, 2}


def test_swapped_partitions_of_an_untyped_exchange_are_refused_with_the_evidence(ckpt, tmp_path):
    swapped = schema(tmp_path, "swapped", {0: 0, 1: 2, 2: 1})
    destination = tmp_path / "out"
    code, _, err = ckpt("rescale", str(SIDEOUT.checkpoint), str(destination), "-p", "3", "--schema", swapped, "--engine", "local")
    assert code == 2 and "Traceback" not in err, err
    assert "does not continue the input side's last record" in err and "contradicted by the bytes" in err
    assert f"the bytes fit {PAIRING} only" in err
    assert not destination.exists()
    code, out, _ = ckpt("verify", str(SIDEOUT.checkpoint), "--schema", swapped, "--engine", "local", "--json")
    framing = [p["message"] for p in json.loads(out)["problems"] if p["check"] == "record-framing"]
    assert code != 0 and any("contradicted by the bytes" in m for m in framing)


def test_swapping_the_typed_keyed_exchange_is_refused_too(ckpt, tmp_path):
    swapped = schema(tmp_path, "swapped-typed", {0: 0, 1: 2, 2: 1}, untyped_side=False)
    code, _, err = ckpt(
        "rescale", str(SIDEOUT.checkpoint), str(tmp_path / "out"), "-p", "3", "--schema", swapped, "--engine", "local"
    )
    assert code == 2 and "cut record" in err and not (tmp_path / "out").exists()


def test_plan_alone_pairs_the_partitions_from_the_bytes(ckpt, tmp_path):
    code, _, err = ckpt(
        "rescale",
        str(SIDEOUT.checkpoint),
        str(tmp_path / "out"),
        "-p",
        "3",
        "--plan",
        SIDEOUT.plan,
        "--dry-run",
        "--engine",
        "local",
    )
    assert f"so-split: {PAIRING}, the one pairing the bytes fit" in err
    # the keyed exchanges still need their record type and key: refused, not guessed
    assert code == 2 and "is keyed but --schema gives no record type and key" in err
    # the skeleton states the pairing the bytes fit
    code, out, err = ckpt("schema", str(SIDEOUT.checkpoint), "--plan", SIDEOUT.plan)
    assert code == 0 and f"so-split: {PAIRING}, the one pairing the bytes fit" in err
    stated = [block for block in out.split("[[exchange]]") if 'upstream = "so-split"' in block]
    assert [("gate = 1" in b, "so-side-filter" in b, f"partition = {i}" in b) for i, b in enumerate(stated)] == [
        (False, False, True),
        (True, False, True),
        (False, True, True),
    ]


@pytest.mark.flink
def test_pairing_from_the_bytes_rescales_and_flink_restores_exactly(ckpt, tmp_path):
    """Without `partition`, ckpt takes the one pairing the bytes fit; the output is the same as
    with the right `partition` numbers, and real Flink 2.3 restores it at 3 with the exact count."""
    outputs, reports = {}, {}
    for name, partitions in (("stated", {0: 0, 1: 1, 2: 2}), ("from-bytes", None)):
        destination = tmp_path / name / "job" / SIDEOUT.checkpoint.name
        code, out, err = ckpt(
            "rescale",
            str(SIDEOUT.checkpoint),
            str(destination),
            "-p",
            "3",
            "--schema",
            schema(tmp_path, name, partitions),
            "--engine",
            "local",
            "--json",
        )
        assert code == 0, err
        reports[name] = json.loads(out)["exchanges"]
        assert (f"{PAIRING}, the one pairing the bytes fit" in err) == (partitions is None)
        outputs[name] = destination
    assert reports["stated"] == reports["from-bytes"]
    info = SIDEOUT.info
    count = flink_env.restore_count(info["flink_version"], outputs["from-bytes"], 3, job=info["job_kind"], n=info["n"], k=0)
    assert count == info["source_records"]
