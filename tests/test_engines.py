"""Engines: every engine applies the same functions and reports a task's error the same way."""

from __future__ import annotations

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


def test_auto_chooses_by_size_and_master():
    assert isinstance(make_engine("auto", 10_000), LocalEngine) and make_engine("auto", 10_000).workers == 1
    assert make_engine("auto", 100 * 2**20).workers > 1 or __import__("os").cpu_count() == 1
    assert make_engine("auto", 10 * 2**30).name == "spark" and make_engine("auto", 1, "spark://x:7077").name == "spark"
