"""Keyed state reassignment finds each new subtask's old handles without checking every old handle
for every new subtask: the same handles, in the same order, as checking them all."""

from __future__ import annotations

import random

from ckpt_tool.assign.keyed import _common, _intersection, _Overlaps, _pieces, reassign_keyed
from ckpt_tool.flink.model import KeyGroupsHandle, RelativeFileHandle
from ckpt_tool.records.keys import key_group_range


def test_overlaps_are_those_every_range_checked_finds():
    chance = random.Random(28)
    for _ in range(300):
        ranges = []
        for _ in range(chance.randint(0, 40)):
            start = chance.randint(0, 200)
            ranges.append(range(start, start + chance.choice([0, 1, 1, 3, 7, 50, 200])))
        overlaps = _Overlaps(ranges)
        for _ in range(20):
            start = chance.randint(0, 250)
            wanted = range(start, start + chance.randint(1, 60))
            assert overlaps.of(wanted) == [i for i, r in enumerate(ranges) if _common(r, wanted)]


def _handles(max_parallelism: int, parallelism: int) -> list:
    result = []
    for index in range(parallelism):
        groups = key_group_range(max_parallelism, parallelism, index)
        delegate = RelativeFileHandle(f"state-{index}", 100 * len(groups))
        result.append(KeyGroupsHandle(12, groups.start, [10 * g for g in groups], delegate, f"id-{index}"))
    return result


def test_reassigned_as_when_every_old_handle_is_checked():
    """From p=96 to every parallelism 1..130 at max parallelism 4,096 (uneven ranges), and up."""
    old = _handles(4096, 96)
    pieces = [p for h in old for p in _pieces(h)]
    for new in (1, 2, 3, 7, 64, 95, 96, 97, 130):
        found = reassign_keyed(old, 4096, new, 9)
        for index, handle in enumerate(found):
            wanted = key_group_range(4096, new, index)
            parts = [part for part in (_intersection(p, wanted) for p in pieces) if part is not None]
            if len(parts) == 1:
                assert handle == parts[0]
            else:
                assert handle.materialized == parts and handle.key_groups == wanted
