"""Engines: every engine applies the same functions and reports a task's error the same way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckpt_tool.engine import EngineError, LocalEngine, make_engine
from ckpt_tool.errors import CheckpointFormatError


def task_failing_on_three():
    """A task function defined locally, so that it travels to Spark's workers by value."""

    def fails_on_three(item: int) -> int:
        if item == 3:
            raise CheckpointFormatError(f"item {item} is corrupt")
        return item * 10

    return fails_on_three


@pytest.mark.parametrize("engine", [LocalEngine(), LocalEngine(workers=2)], ids=["in-process", "two-processes"])
def test_results_in_order_and_task_errors_come_back_as_ckpt_errors(engine):
    offset, task = 1, task_failing_on_three()
    assert engine.map(lambda item: task(item) + offset, [0, 1, 2]) == [1, 11, 21]
    with pytest.raises(CheckpointFormatError, match="item 3 is corrupt") as raised:
        engine.map(task, [1, 2, 3, 4])
    assert raised.value.exit_code == 2


def test_task_errors_on_spark_are_ckpt_errors_too(spark):
    with pytest.raises(CheckpointFormatError, match="item 3 is corrupt"):
        spark.map(task_failing_on_three(), [1, 2, 3, 4])


def test_a_bug_on_spark_is_one_line_with_exit_code_3(spark):
    with pytest.raises(EngineError) as raised:
        spark.map(lambda item: 1 // 0, [1, 2])
    assert raised.value.exit_code == 3 and "ZeroDivisionError" in str(raised.value) and "\n" not in str(raised.value)
    named = re.search(r"\(Spark's log: (\S+)\)", str(raised.value))
    assert named is None or Path(named.group(1)).is_file()  # a log the error names is there to read


def test_auto_chooses_by_size_and_master():
    assert isinstance(make_engine("auto", 10_000), LocalEngine) and make_engine("auto", 10_000).workers == 1
    assert make_engine("auto", 100 * 2**20).workers > 1 or __import__("os").cpu_count() == 1
    assert make_engine("auto", 10 * 2**30).name == "spark" and make_engine("auto", 1, "spark://x:7077").name == "spark"


def test_batches_are_sized_by_bytes_not_by_items():
    from ckpt_tool.engine import BATCH_MAX_BYTES, BATCH_MIN_BYTES, batch_budget, plan_batches

    assert plan_batches([5, 5, 5, 0, 0, 5], 10) == [range(0, 2), range(2, 6)]  # empty items cost nothing
    assert plan_batches([30, 1, 1], 10) == [range(0, 1), range(1, 3)]  # a large item is a batch of its own
    assert plan_batches([], 10) == []
    # as packing item by item does, from arrays too (a job at parallelism p has up to p² channels)
    import random

    import numpy as np

    def greedy(sizes, budget):
        batches, start, held = [], 0, 0
        for index, size in enumerate(sizes):
            if index > start and held + size > budget:
                batches.append(range(start, index))
                start, held = index, 0
            held += size
        return batches + ([range(start, len(sizes))] if start < len(sizes) else [])

    rng = random.Random(7)
    for _ in range(300):
        sizes = [rng.choice((0, 0, 1, 3, 9, 10, 11, 40)) for _ in range(rng.randrange(0, 40))]
        budget = rng.choice((1, 10, 25))
        assert plan_batches(sizes, budget) == plan_batches(np.array(sizes, dtype=np.int32), budget) == greedy(sizes, budget)
    assert batch_budget(10, 2) == BATCH_MIN_BYTES and batch_budget(100 * BATCH_MAX_BYTES, 2) == BATCH_MAX_BYTES
    assert batch_budget(64 * BATCH_MIN_BYTES, 2) == 8 * BATCH_MIN_BYTES  # at least 4 batches per slot


@pytest.mark.parametrize("engine", [LocalEngine(), LocalEngine(workers=2)], ids=["in-process", "two-processes"])
def test_sized_items_run_in_batches_in_order_with_progress_in_bytes(engine):
    import os

    from ckpt_tool.engine import BATCH_MIN_BYTES, batch_budget

    items = list(range(1000))
    sizes = [BATCH_MIN_BYTES // 100] * 1000  # 10 MiB in all, at least 4 batches per slot
    batches = 10 * BATCH_MIN_BYTES // batch_budget(10 * BATCH_MIN_BYTES, engine.slots())
    seen: list[tuple[int, int]] = []
    results = engine.map(lambda item: (item, os.getpid()), items, lambda done, total: seen.append((done, total)), sizes)
    assert [item for item, _ in results] == items
    assert len(seen) == batches >= 4 * engine.slots() and seen[-1] == (sum(sizes), sum(sizes))
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    with pytest.raises(CheckpointFormatError, match="item 3 is corrupt"):
        engine.map(task_failing_on_three(), [1, 2, 3, 4], sizes=[10, 10, 10, 10])


def test_spark_runs_one_partition_per_batch(spark):
    from ckpt_tool.engine import BATCH_MIN_BYTES

    sizes = [BATCH_MIN_BYTES // 2] * 8  # 4 MiB: 4 batches of 1 MiB
    partitions = spark.map(lambda item: __import__("pyspark").TaskContext.get().partitionId(), list(range(8)), sizes=sizes)
    assert partitions == [0, 0, 1, 1, 2, 2, 3, 3]
