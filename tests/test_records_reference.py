"""Every in-flight record as ckpt decodes it equals what Flink's own deserializers and
KeyGroupRangeAssignment say (fixtures/java/ReferenceReader.java, in expected.json)."""

from __future__ import annotations

import hashlib
from collections import Counter

from ckpt_tool.engine import LocalEngine
from ckpt_tool.flink.channel_state import logical_channels
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.inspect import exchanges_summary
from ckpt_tool.records.elements import element_kind
from ckpt_tool.records.framing import split_records
from ckpt_tool.records.keys import key_group_for_hash
from ckpt_tool.records.schema import load_exchanges
from test_record_scan import schema_for


def exchanges_of(fixture, checkpoint):
    return load_exchanges(checkpoint.metadata, schema_for(fixture), str(fixture.directory / "plan.json"))


def test_every_record_matches_flink(fixture):
    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    md = checkpoint.metadata
    expected = {
        (c["upstream"], c["downstream"], c["upstream_subtask"], c["downstream_subtask"]): c["elements"]
        for c in fixture.expected["logical_channels"] if "elements" in c
    }
    assert expected, "the reference lists elements"
    compared = 0
    for exchange in exchanges_of(fixture, checkpoint):
        key_of = exchange.key_function() if exchange.keyed else None
        downstream = md.operator(exchange.downstream_id)
        for channel in logical_channels(md.operator(exchange.upstream_id), downstream, exchange.gate, exchange.partition):
            want = expected[(exchange.upstream_id, exchange.downstream_id, channel.upstream_subtask, channel.downstream_subtask)]
            inputs, outputs = channel.buffers(checkpoint)
            raws = split_records(inputs + outputs).records
            assert len(raws) == len(want)
            for raw, element in zip(raws, want):
                kind = element_kind(raw)
                assert kind.kind == element["kind"]
                if kind.kind != "record":
                    continue
                assert hashlib.sha256(raw).hexdigest() == element["digest"]
                assert kind.timestamp == element["timestamp"]
                if key_of is not None:
                    key_hash, _ = key_of(raw, kind.value_offset)
                    assert key_hash == element["key_hash"]
                    assert key_group_for_hash(key_hash, downstream.max_parallelism) == element["key_group"]
                compared += 1
    assert compared > 0


def test_histograms_misplaced_and_duplicates_match_flink(fixture):
    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    summary = exchanges_summary(checkpoint, exchanges_of(fixture, checkpoint), LocalEngine())
    for want in fixture.expected["keyed_operators"]:
        mine = [e for e in summary if e["downstream"] == want["operator"] and e["keyed"]]
        histogram = Counter()
        for exchange in mine:
            histogram.update({int(k): v for k, v in exchange["key_group_histogram"].items()})
        assert histogram == Counter({int(k): v for k, v in want["key_group_histogram"].items()})
        assert sum(e["records"] for e in mine) == want["records"]
        assert sum(e["misplaced_records"] for e in mine) == want["misplaced_records"]
        assert sum(e["duplicate_records"] for e in mine) == want["duplicate_records"]
