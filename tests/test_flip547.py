"""Checkpoints Flink 2.3 takes during recovery (FLIP-547) are input like any other (issue #29).

The fixtures flink23-recovery-p3 (Flink rescaled flink23-hashmap-p2 itself) and
flink23-ckpt-recovery-p3 (ckpt rescaled it first) were completed while restored in-flight records
were still being processed. The fixture-wide tests inspect, verify, rescale and restore them like
every fixture; here: what they hold, and `ckpt repair` of them restored by Flink with FLIP-547 on.
"""

from __future__ import annotations

import json

import pytest
from conformance import FLIP547

import flink_env
from catalog import ALL_FIXTURES, fixture_named

DURING_RECOVERY = [f for f in ALL_FIXTURES if "execution.checkpointing.during-recovery.enabled" in f.info.get("extra_config", {})]
SLOW = "0a6c3d247193df04622ad9b3b66741a5"  # slow-count
MAP_MAIN = "5ff73b99d0669153bf2feac805d152ac"


def record_digests(expected: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for channel in expected["logical_channels"]:
        for element in channel.get("elements", []):
            if element["kind"] == "record":
                out[element["digest"]] = out.get(element["digest"], 0) + 1
    return out


def test_both_fixtures_were_taken_during_recovery_with_the_2_3_keys():
    assert sorted(f.name for f in DURING_RECOVERY) == ["flink23-ckpt-recovery-p3", "flink23-recovery-p3"]
    for fixture in DURING_RECOVERY:
        assert fixture.info["flink_config"].items() >= FLIP547.items()
        assert fixture.info["restored_from"] == "flink23-hashmap-p2"
    assert fixture_named("flink23-ckpt-recovery-p3").info["ckpt_rescaled_to"] == 3


def test_restored_records_still_unprocessed_are_input_channel_state():
    """Flink's reader (expected.json): the in-flight records of the checkpoint ckpt's output came
    from are, in the checkpoint taken during recovery, at the head of slow-count's input channels:
    the layout of any other checkpoint, without a handle of their own."""
    fixture = fixture_named("flink23-ckpt-recovery-p3")
    restored = record_digests(fixture_named("flink23-hashmap-p2").expected)
    by_id = {o["id"]: o["channel_state"] for o in fixture.expected["operators"]}
    assert all(by_id[op]["upstream_output"]["buffers"] == 0 for op in by_id)
    still, still_bytes = 0, 0
    for channel in fixture.expected["logical_channels"]:
        records = [e for e in channel.get("elements", []) if e["kind"] == "record"]
        head = 0
        while head < len(records) and records[head]["digest"] in restored:
            head += 1
        assert not any(e["digest"] in restored for e in records[head:]), "restored records only at the head"
        still += head
        still_bytes += sum(4 + e["size"] for e in records[:head])  # with each record's length prefix
    assert 0 < still <= sum(restored.values())
    assert still_bytes == by_id[SLOW]["input"]["bytes"]  # slow-count's input state: those records, no more
    assert by_id[MAP_MAIN]["output"]["bytes"] > 0  # records emitted after the restore


@pytest.mark.flink
@pytest.mark.parametrize("taken", DURING_RECOVERY, ids=[f.name for f in DURING_RECOVERY])
def test_repaired_checkpoint_taken_during_recovery_restores_under_flip547(ckpt, taken, tmp_path):
    """`ckpt repair` keeps every record of a checkpoint taken during recovery, and Flink 2.3 restores
    its output with FLIP-547 on with the exact count."""
    fixture = taken
    repaired = tmp_path / "repaired" / "job" / fixture.checkpoint.name
    args = ["--plan", fixture.plan, "--schema", fixture.schema, "--engine", "local", "--json"]
    code, out, err = ckpt("repair", str(fixture.checkpoint), str(repaired), *args)
    assert code == 0, err
    report = json.loads(out)
    in_flight = sum(c["records"] for c in fixture.expected["logical_channels"])
    assert report["records_in"] == report["records_out"] == in_flight and not report["replicas_removed"]
    count = flink_env.restore_count("2.3.0", repaired, fixture.info["parallelism"], FLIP547, backend="hashmap")
    assert count == fixture.info["source_records"]
