"""Where record work runs: in this process, or on Spark (PySpark).

Both engines run the same per-channel functions (``scan_channel``, ``route_channel``,
``build_subtask_file``) on the same plain-data tasks and return the same results; only the
distribution differs. On Spark, channels are read, routed and written by the executors; the
driver sees only counters, replica digests and the offsets of the files written.
"""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import Callable, Optional

from ckpt_tool.records.route import RouteSpec, build_subtask_file, route_channel
from ckpt_tool.records.scan import ChannelTask, scan_channel
from ckpt_tool.records.schema import Exchange
from ckpt_tool.storage import io_for, join

Progress = Optional[Callable[[int, int], None]]
LOCAL_SCAN_LIMIT_BYTES = 256 * 1024 * 1024  # "auto" scans more in-flight data than this on Spark

# (exchange index, digest) -> old downstream subtasks holding that record, where there are several
Holders = dict[tuple[int, bytes], set[int]]


def inflight_file_name(downstream_id: str, subtask: int) -> str:
    return f"ckpt-inflight-{downstream_id}-{subtask}"


def _write_subtask_file(dst: str, group: tuple[str, int], routed) -> tuple[tuple[str, int], str, dict]:
    data, placed = build_subtask_file(list(routed))
    name = inflight_file_name(*group)
    io_for(dst).write(join(dst, name), data)
    return group, name, placed


# What executors need to reach S3 with boto3 as the driver does (no Hadoop S3 jars involved).
S3_ENVIRONMENT = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
    "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE", "CKPT_S3_ENDPOINT",
)


def executor_environment() -> dict[str, str]:
    """``spark.executorEnv.*`` settings carrying the driver's S3 credentials and endpoint."""
    import os

    return {f"spark.executorEnv.{k}": os.environ[k] for k in S3_ENVIRONMENT if os.environ.get(k)}


class LocalEngine:
    name = "local"

    def scan(self, tasks: list[ChannelTask], exchanges: list[Exchange], progress: Progress = None):
        """Channel figures (without digests) and, per exchange, the record copies held twice."""
        results, holders = [], {}
        for done, task in enumerate(tasks, start=1):
            stats = scan_channel(task, exchanges[task.exchange_index])
            for digest in stats.digests:
                holders.setdefault((stats.exchange_index, digest), set()).add(stats.downstream_subtask)
            results.append(replace(stats, digests=[]))
            if progress:
                progress(done, len(tasks))
        return results, {k: v for k, v in holders.items() if len(v) > 1}

    def route(self, tasks: list[ChannelTask], specs: list[RouteSpec], dst: str, progress: Progress = None):
        """Route every channel's records and write one file per new downstream subtask."""
        counters, groups = [], {}
        for done, task in enumerate(tasks, start=1):
            spec = specs[task.exchange_index]
            routed = route_channel(task, spec)
            for target, order, raw in routed.routed:
                groups.setdefault((spec.exchange.downstream_id, target), []).append((order, raw))
            counters.append(replace(routed, routed=[]))
            if progress:
                progress(done, len(tasks) + len(groups))
        files = [_write_subtask_file(dst, group, routed) for group, routed in sorted(groups.items())]
        return counters, files


class SparkEngine:
    """PySpark, ``local[*]`` by default or a cluster given by ``master``."""

    name = "spark"

    def __init__(self, master: str = "local[*]", conf: Optional[dict[str, str]] = None):
        self.master = master
        self.conf = dict(conf or {})
        self._session = None

    @property
    def context(self):
        if self._session is None:
            from pyspark.sql import SparkSession

            builder = SparkSession.builder.master(self.master).appName("ckpt")
            builder = builder.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            for key, value in {**executor_environment(), **self.conf}.items():
                builder = builder.config(key, value)
            self._session = builder.getOrCreate()
            self._session.sparkContext.setLogLevel("ERROR")
        return self._session.sparkContext

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None

    def _tasks(self, tasks):
        sc = self.context
        return sc.parallelize(tasks, min(len(tasks), max(2, sc.defaultParallelism * 4)))

    def scan(self, tasks, exchanges, progress=None):
        if not tasks:
            return [], {}
        scanned = self._tasks(tasks).map(lambda task: scan_channel(task, exchanges[task.exchange_index])).cache()
        try:
            results = scanned.map(lambda s: replace(s, digests=[])).collect()
            holders = (
                scanned.flatMap(lambda s: (((s.exchange_index, d), {s.downstream_subtask}) for d in s.digests))
                .reduceByKey(operator.or_)
                .filter(lambda item: len(item[1]) > 1)
                .collectAsMap()
            )
        finally:
            scanned.unpersist()
        if progress:
            progress(len(tasks), len(tasks))
        return results, dict(holders)

    def route(self, tasks, specs, dst, progress=None):
        if not tasks:
            return [], []
        routed = self._tasks(tasks).map(lambda task: route_channel(task, specs[task.exchange_index])).cache()
        try:
            counters = routed.map(lambda r: replace(r, routed=[])).collect()
            files = (
                routed.flatMap(
                    lambda r: (((specs[r.exchange_index].exchange.downstream_id, t), (o, raw)) for t, o, raw in r.routed)
                )
                .groupByKey()
                .map(lambda item: _write_subtask_file(dst, item[0], item[1]))
                .collect()
            )
        finally:
            routed.unpersist()
        if progress:
            progress(len(tasks), len(tasks))
        return counters, sorted(files)


def duplicates_per_exchange(holders: Holders) -> dict[int, int]:
    """Record copies beyond the first, per exchange."""
    counts: dict[int, int] = {}
    for (exchange_index, _), subtasks in holders.items():
        counts[exchange_index] = counts.get(exchange_index, 0) + len(subtasks) - 1
    return counts


def engine_for(choice: str, data_bytes: int, master: Optional[str] = None, conf: Optional[dict] = None):
    """``local`` or ``spark`` as asked; ``auto`` is Spark for large data or when a master is given."""
    if choice == "spark" or (choice == "auto" and (master or data_bytes > LOCAL_SCAN_LIMIT_BYTES)):
        return SparkEngine(master or "local[*]", conf)
    return LocalEngine()
