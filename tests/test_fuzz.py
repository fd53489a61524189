"""Mutated metadata gives a clean CheckpointFormatError or a successful parse, never a crash."""

from __future__ import annotations

import random

from catalog import ALL_FIXTURES
from ckpt_tool.errors import CkptError
from ckpt_tool.flink.checkpoint import Checkpoint, PathMapping
from ckpt_tool.flink.metadata import read_metadata
from ckpt_tool.ops.inspect import inspect
from ckpt_tool.session import Session
from ckpt_tool.storage.local import LocalFileIO

MUTATIONS_PER_FIXTURE = 500


def mutate(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    kind = rng.randrange(5)
    position = rng.randrange(len(data))
    if kind == 0:  # flip one bit
        data[position] ^= 1 << rng.randrange(8)
    elif kind == 1:  # random byte
        data[position] = rng.randrange(256)
    elif kind == 2:  # truncate
        del data[position:]
    elif kind == 3:  # insert junk
        data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    else:  # a large count or length where an int was
        data[position : position + 4] = rng.choice([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff", b"\x00\x01\x00\x00"])
    return bytes(data)


def test_fuzzed_metadata(tmp_path):
    rng = random.Random(20261121)
    parsed = failed = 0
    for fixture in ALL_FIXTURES:
        original = fixture.metadata_file.read_bytes()
        for _ in range(MUTATIONS_PER_FIXTURE):
            data = mutate(original, rng)
            try:
                metadata = read_metadata(data)
            except CkptError:
                failed += 1
                continue
            parsed += 1
            checkpoint = Checkpoint(str(tmp_path), LocalFileIO(), metadata, PathMapping.detect(metadata, str(tmp_path)))
            try:
                inspect(Session(checkpoint))  # metadata-only inspect must cope with whatever parsed
            except CkptError:
                pass
    assert failed > 0 and parsed > 0
