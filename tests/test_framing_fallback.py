"""The pure Python/NumPy framing (used where the compiled module cannot load, e.g. on a Spark
executor of another platform) is the compiled module's equal: same results, same errors, on real
Flink channel data and on generated streams."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from catalog import fixture_named
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.model import INPUT, OUTPUT
from ckpt_tool.framing import _framing, _framing_py


def outcome(function, *args):
    """What a call returns, or the error it raises (type and message)."""
    try:
        return function(*args)
    except ValueError as exc:
        return ("ValueError", str(exc))


def same(name, *args):
    assert outcome(getattr(_framing_py, name), *args) == outcome(getattr(_framing, name), *args), name


def int64s(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


@pytest.mark.parametrize("name", ["flink23-hashmap-p2", "flink120-rocksdb-p2", "flink23-sql-p2"])
def test_equal_on_real_flink_channel_state(name):
    checkpoint = Checkpoint.open(str(fixture_named(name).checkpoint))
    subtasks = [s for op in checkpoint.metadata.operators for s in op.subtasks]
    handles = [h for s in subtasks for d in (INPUT, OUTPUT) for h in s.channel_handles(d)]
    assert handles
    for handle in handles:
        data = checkpoint.handle_bytes(handle.delegate)
        offsets = int64s(handle.offsets)
        same("lengths", data, offsets)
        same("payloads", data, offsets)
        stream = _framing.payloads(data, offsets)
        same("frame", stream)
        starts = np.frombuffer(_framing.frame(stream)[0], dtype=np.int64)
        same("gather", stream, starts, starts + 4)
        same("digests", stream, starts, starts + 4)
        same("digests", data, offsets + 4, offsets + 4 + np.frombuffer(_framing.lengths(data, offsets), dtype=np.int64))
        same("frame_segments", stream, int64s([0, len(stream) // 2, len(stream)]))
        same("payloads_many", data, offsets, int64s([len(offsets) // 2, len(offsets) - len(offsets) // 2]))
        same("lengths", data, offsets[::-1].copy())  # out of order: the same error


def chain(rng: random.Random, count: int) -> bytes:
    return b"".join(struct.pack(">i", n) + rng.randbytes(n) for n in (rng.randrange(0, 40) for _ in range(count)))


def test_equal_on_generated_streams_and_errors():
    rng = random.Random(16)
    for _ in range(300):
        stream = chain(rng, rng.randrange(0, 30))
        cut = stream[: rng.randrange(0, len(stream) + 1)]
        same("frame", stream)
        same("frame", cut)
        same("frame", memoryview(cut))
        same("frame", cut + struct.pack(">i", -rng.randrange(1, 100)) + b"x" * 8)  # a negative length
        starts = int64s(sorted(rng.randrange(0, len(stream) + 1) for _ in range(rng.randrange(0, 6))))
        ends = np.minimum(starts + rng.randrange(0, 9), len(stream) + rng.randrange(0, 2))
        same("gather", stream, starts, ends)
        same("gather", stream, starts, ends[:-1].copy())
        same("gather", np.frombuffer(stream, dtype=np.uint8), starts, ends)
        same("digests", stream, starts, ends)  # xxHash's own digests (the twin uses the xxhash package)
        same("digests", stream, starts, ends[:-1].copy())
        same("digests", memoryview(stream), starts, ends)
        file = b"\0\0\0\0" + chain(rng, rng.randrange(0, 8))
        offsets, position = [], 4
        while position < len(file):
            offsets.append(position)
            position += 4 + struct.unpack_from(">i", file, position)[0]
        picked = int64s(offsets) if rng.random() < 0.5 else int64s(rng.sample(range(len(file) + 8), min(3, len(file))))
        same("payloads", file, picked)
        same("lengths", file, picked)
        same("payloads", file[: rng.randrange(0, len(file) + 1)], int64s(offsets))
        # several channels framed in one pass, several handles of one file read in one call
        streams = [chain(rng, rng.randrange(0, 5))[: rng.randrange(0, 200)] for _ in range(rng.randrange(0, 6))]
        bounds = int64s(np.cumsum([0] + [len(s) for s in streams]))
        same("frame_segments", b"".join(streams), bounds)
        same("frame_segments", b"".join(streams) + struct.pack(">i", -1), np.append(bounds, bounds[-1] + 4))
        same("frame_segments", b"".join(streams), bounds[::-1].copy())  # out of order: the same error
        cut_at = rng.randrange(0, len(offsets) + 1)
        same("payloads_many", file, int64s(offsets), int64s([cut_at, len(offsets) - cut_at]))
        same("payloads_many", file, int64s(offsets[::-1]), int64s([len(offsets)]))
        same("payloads_many", file, int64s(offsets), int64s([len(offsets) + 1]))
        same("payloads_many", file, picked, int64s([len(picked)]))


def test_equal_runs_of_a_file_and_their_payloads():
    """A file's buffers read in runs (a route task at p=4,096 visits each of 4,096 files): the runs
    of the offsets, and each handle's payloads from the runs, with the same errors where a buffer
    lies outside every run, runs past its run, or overlaps the one before it."""
    rng = random.Random(28)
    for _ in range(300):
        file = b"\0\0\0\0" + chain(rng, rng.randrange(1, 12))
        offsets, position = [], 4
        while position < len(file):
            offsets.append(position)
            position += 4 + struct.unpack_from(">i", file, position)[0]
        gap = rng.choice([0, 8, 40, 1 << 16])
        picked = rng.sample(offsets, rng.randrange(0, len(offsets) + 1))
        same("span_runs", int64s(picked), gap)
        same("span_runs", int64s(picked[::-1]), gap)
        runs = _framing.span_runs(int64s(sorted(picked)), gap)
        slack = rng.randrange(0, 6)
        datas = [file[first : last + 4 + struct.unpack_from(">i", file, last)[0] + slack] for first, last in runs]
        firsts = int64s([first for first, _ in runs])
        cut = rng.randrange(0, len(picked) + 1)
        ordered = sorted(picked[:cut]) + sorted(picked[cut:])
        counts = int64s([cut, len(picked) - cut])
        result = outcome(_framing.payloads_in_runs, datas, firsts, int64s(ordered), counts)
        if runs and not slack:  # read whole, as each handle's payloads from the file itself
            assert result == _framing.payloads_many(file, int64s(ordered), counts)
        same("payloads_in_runs", datas, firsts, int64s(ordered), counts)
        same("payloads_in_runs", datas, firsts, int64s(ordered[::-1]), int64s([len(ordered)]))  # out of order
        same("payloads_in_runs", datas, firsts, int64s(ordered), int64s([len(ordered) + 1]))  # counts wrong
        same("payloads_in_runs", datas, firsts, int64s([*ordered, len(file) + 3]), int64s([len(ordered) + 1]))
        if datas:
            shorter = [*datas[:-1], datas[-1][: rng.randrange(0, len(datas[-1]))]]  # the last run cut
            same("payloads_in_runs", shorter, firsts, int64s(ordered), counts)
            same("payloads_in_runs", datas, firsts[::-1].copy(), int64s(ordered), counts)  # runs out of order
            same("payloads_in_runs", datas[:-1], firsts, int64s(ordered), counts)  # a run missing


def test_runs_are_let_go_of_whatever_the_outcome():
    """Every run's buffer taken by ``payloads_in_runs`` is given back, also where it refuses the runs
    (a bytearray cannot be resized while a view of it is held)."""
    file = b"\0\0\0\0" + struct.pack(">i", 2) + b"ab" + struct.pack(">i", 1) + b"c"
    for firsts in ([4, 10], [10, 4], [4, 5]):  # apart; out of order; overlapping
        runs = [bytearray(file[4:10]), bytearray(file[10:])]
        for module in (_framing, _framing_py):
            outcome(module.payloads_in_runs, runs, int64s(firsts), int64s([4, 10]), int64s([2]))
        for run in runs:
            run.extend(b"x")  # BufferError where a view is still held


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def test_equal_on_string_values():
    """StringValue tails (a varint of the length + 1, then a varint per UTF-16 unit): whole, null,
    empty, cut, too long, wrong length, bad varints, ranges at and past the data's end."""
    rng = random.Random(29)
    pieces, tails, ends, position = [], [], [], 0
    for _ in range(4000):
        units = [rng.choice([0x41, 0x7F, 0x80, 0x3FFF, 0x4000, 0xFFFF]) for _ in range(rng.randrange(0, 40))]
        length, body = len(units) + 1, b"".join(varint(u) for u in units)
        kind = rng.randrange(6)
        if kind == 0:
            length, body = 0, b""  # null
        elif kind == 1:
            length += rng.choice([-1, 1, 1 << 30])
        value = varint(length) + body
        if kind == 2:
            value = value[:-1]
        elif kind == 3:
            value += bytes([rng.randrange(256)])
        elif kind == 4:
            value = bytes([0x80 | rng.randrange(128)] * rng.randrange(0, 7))
        junk = rng.randbytes(rng.randrange(3))
        pieces += [junk, value]
        tails.append(position + len(junk))
        position += len(junk) + len(value)
        ends.append(position)
    data = b"".join(pieces)
    fits = _framing.string_tails(data, int64s(tails), int64s(ends))
    assert 0 < sum(fits) < len(fits)
    same("string_tails", data, int64s(tails), int64s(ends))
    moved = np.minimum(int64s(ends) + int64s([rng.choice([-1, 0, 1]) for _ in ends]), len(data))
    same("string_tails", data, int64s(tails), moved)
    same("string_tails", memoryview(data), int64s(tails), int64s(ends))
    same("string_tails", data, int64s(tails), int64s(ends)[:-1].copy())  # the same error
    same("string_tails", data, int64s(tails), int64s(ends) + 1)  # past the end: the same error
    same("string_tails", data, int64s([]), int64s([]))


def test_equal_key_groups_and_flinks():
    """Key groups of hash codes: both modules, and Flink's scalar murmur hash (ckpt_tool.records.keys)."""
    from ckpt_tool.records.keys import key_group_for_hash

    rng = np.random.default_rng(29)
    edges = np.array([0, 1, 2**31 - 1, 2**31, 2**32 - 1], dtype=np.uint32)
    hashes = np.concatenate([edges, rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32)])
    for max_parallelism in (1, 128, 4096, 32768, 2**31 - 1):
        same("key_groups", hashes, max_parallelism)
        groups = np.frombuffer(_framing.key_groups(hashes, max_parallelism), dtype=np.int32)
        signed = hashes.view(np.int32).tolist()
        assert groups.tolist() == [key_group_for_hash(h, max_parallelism) for h in signed]
    same("key_groups", hashes, 0)  # the same error
    same("key_groups", hashes.tobytes()[:-1], 128)  # a cut hash code is left out by both


def test_equal_int_rows():
    """``int_rows`` (the JSON of millions of channel rows): the same text from both, for values of
    every width and sign, literal parts holding '%', no rows, and the same refusals."""
    rng = np.random.default_rng(7)
    values = np.concatenate(
        [rng.integers(-(2**63), 2**63 - 1, 300, dtype=np.int64), int64s([0, -1, 9, 10, -10, 2**63 - 1, -(2**63)])]
    )
    for k in (1, 3, 7):
        rows = values[: len(values) // k * k].reshape(-1, k)
        parts = tuple(f'{{"f{j}%d": '.encode() if j == 0 else f', "f{j}%s": '.encode() for j in range(k)) + (b"}",)
        same("int_rows", parts, rows, b", ")
        same("int_rows", parts, rows[:0], b", ")
        assert _framing.int_rows(parts, rows[:1], b", ").decode() == "".join(
            part.decode() + (str(int(v)) if j < k else "") for j, (part, v) in enumerate(zip(parts, [*rows[0], 0]))
        )
    same("int_rows", (b"[", b"]"), int64s([1, 2, 3]), b"")
    same("int_rows", (b"[", b",", b"]"), int64s([1, 2, 3]), b", ")  # not rows of two
    same("int_rows", (b"x",), int64s([1]), b", ")  # no value per row
