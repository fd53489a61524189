"""Every in-flight record as ckpt decodes it equals what Flink's own deserializers and
KeyGroupRangeAssignment say (fixtures/java/ReferenceReader.java, in expected.json)."""

from __future__ import annotations

import hashlib
from collections import Counter

from ckpt_tool.engine import LocalEngine
from ckpt_tool.engine.tasks import channel_tasks, key_groups_of, read_channel
from ckpt_tool.exchanges import scan_exchanges
from ckpt_tool.flink.channel_state import ChannelStateReader
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.records.elements import NON_RECORDS
from ckpt_tool.records.keys import key_group_for_hash
from ckpt_tool.session import Session


def exchanges_of(fixture, checkpoint):
    return Session.open(checkpoint.uri, fixture.schema, fixture.plan).described_exchanges


def test_every_record_matches_flink(inflight):
    """The production record path (C framing, NumPy tags and key groups) record by record."""
    fixture = inflight
    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    expected = {
        (c["upstream"], c["downstream"], c.get("gate", 0), c["upstream_subtask"], c["downstream_subtask"]): c["elements"]
        for c in fixture.expected["logical_channels"]
        if "elements" in c
    }
    assert expected, "the reference lists elements"
    compared = 0
    exchanges = exchanges_of(fixture, checkpoint)
    for task in channel_tasks(checkpoint, exchanges):
        exchange = exchanges[task.exchange_index]
        channel = (exchange.upstream_id, exchange.downstream_id, exchange.gate, task.upstream_subtask, task.downstream_subtask)
        want = expected[channel]
        with ChannelStateReader() as reader:
            records = read_channel(reader, task)
        assert len(records.tags) == len(want)
        kinds = ["record" if tag <= 1 else NON_RECORDS[tag][0] for tag in records.tags.tolist()]
        assert kinds == [element["kind"] for element in want]
        keys = key_groups_of(exchange, task.max_parallelism)
        groups = iter(keys.of(records, records.is_record).tolist() if keys else [])
        key_of = exchange.key_function() if keys else None
        value_starts = records.value_starts() - records.starts - 4
        for index, element in enumerate(want):
            if element["kind"] != "record":
                continue
            raw = records.element(index)
            assert hashlib.sha256(raw).hexdigest() == element["digest"]
            assert (int.from_bytes(raw[1:9], "big", signed=True) if raw[0] == 0 else None) == element["timestamp"]
            if key_of is not None:
                key_hash, _ = key_of(raw, int(value_starts[index]))
                assert key_hash == element["key_hash"]
                assert key_group_for_hash(key_hash, task.max_parallelism) == element["key_group"] == next(groups)
            compared += 1
    assert compared > 0


def test_histograms_misplaced_and_duplicates_match_flink(fixture):
    checkpoint = Checkpoint.open(str(fixture.checkpoint))
    summary = [e.as_dict() for e in scan_exchanges(checkpoint, exchanges_of(fixture, checkpoint), LocalEngine())]
    for want in fixture.expected["keyed_operators"]:
        mine = [e for e in summary if e["downstream"] == want["operator"] and e["keyed"]]
        histogram = Counter()
        for exchange in mine:
            histogram.update({int(k): v for k, v in exchange["key_group_histogram"].items()})
        assert histogram == Counter({int(k): v for k, v in want["key_group_histogram"].items()})
        assert sum(e["records"] for e in mine) == want["records"]
        assert sum(e["misplaced_records"] for e in mine) == want["misplaced_records"]
        assert sum(e["duplicate_records"] for e in mine) == want["duplicate_records"]
