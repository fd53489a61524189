"""Record scans on real fixtures: the figures of Flink's own deserializers, on both engines."""

from __future__ import annotations

from ckpt_tool.engine import LocalEngine
from ckpt_tool.exchanges import scan_exchanges
from ckpt_tool.session import Session


def scan(fixture, engine) -> list[dict]:
    session = Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan)
    return [e.as_dict() for e in scan_exchanges(session.checkpoint, session.described_exchanges, engine)]


def test_records_per_channel_match_flink(fixture):
    expected = {
        (c["upstream"], c["downstream"], c["upstream_subtask"], c["downstream_subtask"]): c
        for c in fixture.expected["logical_channels"]
        if c["input_buffers"] or c["output_buffers"]
    }
    got = {}
    for exchange in scan(fixture, LocalEngine()):
        for ch in exchange["channels"]:
            key = (exchange["upstream"], exchange["downstream"], ch["upstream_subtask"], ch["downstream_subtask"])
            got[key] = ch
            assert ch["partial_bytes"] == 0
    assert set(got) == set(expected)
    for key, want in expected.items():
        figures = {k: got[key][k] for k in ("input_buffers", "output_buffers", "records", "watermarks", "other_elements")}
        assert figures == {k: want[k] for k in figures}, key


def test_keyed_records_sit_in_their_subtasks_key_groups(fixture):
    for exchange in scan(fixture, LocalEngine()):
        if exchange["keyed"] and not fixture.info.get("restored_from") and not fixture.info.get("naive_rescale"):
            assert exchange["misplaced_records"] == 0 and exchange["duplicate_records"] == 0
            assert sum(exchange["key_group_histogram"].values()) == exchange["records"]


def test_spark_and_local_engines_agree(fixture, spark):
    assert scan(fixture, spark) == scan(fixture, LocalEngine())


def test_one_process_per_core_gives_the_same_figures(fixture):
    from ckpt_tool.engine import LocalEngine

    assert scan(fixture, LocalEngine(workers=2)) == scan(fixture, LocalEngine())


def test_blocks_read_together_and_scanned_apart_give_the_same_figures(fixture, monkeypatch):
    """A scan reads rows READ_TOGETHER_BYTES at a time (each file once for them) and scans them
    TOGETHER_BYTES at a time: with both small, so that a read holds many scanned blocks and a
    block many reads, the figures are those of the default sizes (the copies of records held
    twice too, which the digests of a second pass count); with every channel taken as large, and
    where a read fails (each of its blocks scanned and digested channel by channel), the same."""
    from ckpt_tool.engine import tasks

    expected = scan(fixture, LocalEngine())
    for read_bytes, block_bytes in ((4096, 512), (512, 4096), (1, 1)):
        monkeypatch.setattr(tasks, "READ_TOGETHER_BYTES", read_bytes)
        monkeypatch.setattr(tasks, "TOGETHER_BYTES", block_bytes)
        assert scan(fixture, LocalEngine()) == expected, (read_bytes, block_bytes)
    monkeypatch.setattr(tasks, "READ_TOGETHER_BYTES", 1 << 20)
    monkeypatch.setattr(tasks, "TOGETHER_BYTES", 4096)
    monkeypatch.setattr(tasks, "LARGE_CHANNEL_BYTES", 0)  # every channel alone, scanned and digested in pieces
    assert scan(fixture, LocalEngine()) == expected
    monkeypatch.setattr(tasks, "LARGE_CHANNEL_BYTES", 64 << 20)

    def unreadable(*_):
        raise tasks.CkptError("not read together")

    monkeypatch.setattr(tasks, "_read_rows", unreadable)
    assert scan(fixture, LocalEngine()) == expected


def test_channels_are_listed_by_upstream_then_downstream_however_they_were_scanned(monkeypatch):
    """A scan returns an exchange's channels by downstream subtask; ``figures`` lists them by
    (upstream, downstream): a full grid transposed tile by tile (tiles smaller than the grid here,
    with ragged edges), other rows sorted, rows already in order kept. A broadcast zero stays one,
    and only the channels with a problem are put in order for ``verify``."""
    import numpy as np

    from ckpt_tool import exchanges
    from ckpt_tool.exchanges import ExchangeScan, channel_order
    from ckpt_tool.records.scan import FIGURES, ScanColumns
    from ckpt_tool.records.schema import Exchange

    monkeypatch.setattr(exchanges, "TILE", 7)
    rng = np.random.default_rng(5)

    def scanned(pairs: list[tuple[int, int]]) -> ScanColumns:
        n = len(pairs)
        columns = {name: rng.integers(0, 1000, n).astype(np.int32) for name in FIGURES}
        columns["exchange_index"] = np.zeros(n, dtype=np.int32)
        columns["upstream_subtask"] = np.array([u for u, _ in pairs], dtype=np.int32)
        columns["downstream_subtask"] = np.array([d for _, d in pairs], dtype=np.int32)
        columns["watermarks"] = np.broadcast_to(np.zeros(1, dtype=np.int32), (n,))
        columns["trailing_bytes"] = np.where(rng.random(n) < 0.1, 3, 0).astype(np.int32)
        return ScanColumns(columns)

    grid = [(u, d) for d in range(23) for u in range(2, 33)]  # by (d, u), 23 x 31
    sparse = [(u, d) for u, d in grid if (u * 7 + d) % 10 == 0]
    ordered = sorted(grid)
    shuffled = [grid[i] for i in rng.permutation(len(grid))]  # not by downstream subtask: sorted
    for pairs in (grid, sparse, ordered, shuffled, grid[:1], []):
        scan = scanned(pairs)
        result = channel_order(scan)
        order = np.lexsort((scan.columns["downstream_subtask"], scan.columns["upstream_subtask"]))
        for name in FIGURES:
            assert result.columns[name].tolist() == scan.columns[name][order].tolist(), name
        assert result.columns["watermarks"].strides == (0,)
        exchange = ExchangeScan(Exchange("a" * 32, "b" * 32), scan, 0, [])
        assert [c.trailing_bytes for c in exchange.channels] == result.columns["trailing_bytes"].tolist()
        problems = [(c.upstream_subtask, c.downstream_subtask) for c in exchange.channels_with_problems()]
        assert problems == [(c.upstream_subtask, c.downstream_subtask) for c in exchange.channels if c.trailing_bytes]
        assert exchange.total("records") == int(scan.columns["records"].sum())
    assert exchanges._grid(scanned(grid).columns["upstream_subtask"], scanned(grid).columns["downstream_subtask"]) == (23, 31)
    assert exchanges._grid(scanned(sparse).columns["upstream_subtask"], scanned(sparse).columns["downstream_subtask"]) is None
    shuffled_scan = scanned(shuffled)
    assert exchanges._grid(shuffled_scan.columns["upstream_subtask"], shuffled_scan.columns["downstream_subtask"]) is None


def test_copies_held_count_what_the_holders_of_each_digest_say():
    """``_copies_held`` (verify and inspect of an inflated checkpoint: millions of suspect records)
    counts per exchange, at once, the copies the definition counts: for each (exchange, upstream
    subtask, record digest), the downstream subtasks holding it, less one; a record twice in one
    channel is not a copy, and the same record from two upstream subtasks is two records."""
    import random
    from collections import Counter

    import numpy as np

    from ckpt_tool.engine.tasks import HeldDigests
    from ckpt_tool.exchanges import _copies_held

    rng = random.Random(5)
    pool = [rng.randbytes(16) for _ in range(9)]
    for _ in range(200):
        found = [
            (rng.randrange(3), rng.randrange(3), rng.randrange(4), b"".join(rng.choice(pool) for _ in range(rng.randrange(0, 6))))
            for _ in range(rng.randrange(0, 12))
        ]
        holders: dict[tuple, set[int]] = {}
        for exchange, upstream, downstream, digests in found:
            for at in range(0, len(digests), 16):
                holders.setdefault((exchange, upstream, digests[at : at + 16]), set()).add(downstream)
        wanted: Counter = Counter()
        for (exchange, _, _), held in holders.items():
            if len(held) > 1:
                wanted[exchange] += len(held) - 1
        counts = [len(digests) // 16 for *_, digests in found]
        columns = [np.repeat(np.array([f[i] for f in found], dtype=np.int64), counts) for i in range(3)]
        held = HeldDigests(*columns, b"".join(f[3] for f in found))  # as digest_batch gives them
        assert _copies_held(held) == wanted


def test_digest_holders_group_records_by_all_their_keys_even_where_their_mixes_collide():
    """``digest_holders`` sorts by one 64-bit mix of each record's keys: records of different keys
    whose mixes are equal (crafted here: digests are not collision-proof against crafted input),
    and holders out of order in a group, take the sort by all the keys; every group is then what
    grouping by all the keys says, its records by holder, its first the lowest holder."""
    import numpy as np

    from ckpt_tool.records.scan import digest_holders

    rng = np.random.default_rng(7)
    mix = np.uint64(0x9E3779B97F4A7C15)
    for case in range(60):
        n = int(rng.integers(1, 40))
        pool = rng.integers(0, 2**63, size=(5, 2), dtype=np.int64).astype(np.uint64)
        if case % 3 == 0:  # a second digest whose mix equals the first's, with another second half
            with np.errstate(over="ignore"):
                pool[1, 1] = pool[0, 1] + np.uint64(1)
                pool[1, 0] = pool[0, 0] ^ (pool[0, 1] * mix) ^ (pool[1, 1] * mix)
        digest = pool[rng.integers(0, 5, n)]
        holder = np.sort(rng.integers(0, 4, n)) if case % 2 else rng.integers(0, 4, n)
        outer = rng.integers(0, 2, n)
        order, first, group, holders = digest_holders(digest, holder, outer)
        want: dict[tuple, set] = {}
        for i in range(n):
            want.setdefault((int(outer[i]), int(digest[i, 0]), int(digest[i, 1])), set()).add(int(holder[i]))
        got: dict[tuple, list] = {}
        for position, i in enumerate(order.tolist()):
            key = (int(outer[i]), int(digest[i, 0]), int(digest[i, 1]))
            got.setdefault(key, []).append((int(group[position]), int(holder[i]), bool(first[position])))
        assert set(got) == set(want) and len(holders) == len(want)
        for key, rows in got.items():
            assert len({g for g, _, _ in rows}) == 1  # one group, contiguous below
            assert [h for _, h, _ in rows] == sorted(h for _, h, _ in rows) and rows[0][2] and not any(f for *_, f in rows[1:])
            assert holders[rows[0][0]] == len(want[key])
        assert (np.diff(group) >= 0).all()
