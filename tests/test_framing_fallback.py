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
from ckpt_tool.records import _framing, _framing_py


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
    assert _framing_py.reuse_memory() is None
