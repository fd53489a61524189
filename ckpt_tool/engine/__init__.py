"""Where record work runs: in this process for small checkpoints, on Spark for large ones.

Both engines run the same per-channel function (``ckpt_tool.records.scan.scan_channel``) and
return the same figures: channel statistics, and per exchange the number of duplicate records.
"""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import Callable, Optional, Protocol

from ckpt_tool.records.scan import ChannelStats, ChannelTask, count_duplicates, scan_channel
from ckpt_tool.records.schema import Exchange

Progress = Optional[Callable[[int, int], None]]
ENGINES = ("auto", "local", "spark")
LOCAL_SCAN_LIMIT_BYTES = 256 * 1024 * 1024  # "auto" scans more in-flight data than this on Spark


class Engine(Protocol):
    name: str

    def scan(
        self, tasks: list[ChannelTask], exchanges: list[Exchange], progress: Progress = None
    ) -> tuple[list[ChannelStats], dict[int, int]]:
        """Channel figures (without digests) and duplicate records per exchange index."""


class LocalEngine:
    name = "local"

    def scan(self, tasks, exchanges, progress=None):
        results, pairs = [], {}
        for done, task in enumerate(tasks, start=1):
            stats = scan_channel(task, exchanges[task.exchange_index])
            pairs.setdefault(stats.exchange_index, []).extend((d, stats.downstream_subtask) for d in stats.digests)
            results.append(replace(stats, digests=[]))
            if progress:
                progress(done, len(tasks))
        return results, {index: count_duplicates(p) for index, p in pairs.items()}


class SparkEngine:
    """PySpark, ``local[*]`` by default or a cluster given by ``master``."""

    name = "spark"

    def __init__(self, master: str = "local[*]", conf: Optional[dict[str, str]] = None):
        self.master = master
        self.conf = dict(conf or {})
        self._session = None

    @property
    def session(self):
        if self._session is None:
            from pyspark.sql import SparkSession

            builder = SparkSession.builder.master(self.master).appName("ckpt")
            builder = builder.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            for key, value in self.conf.items():
                builder = builder.config(key, value)
            self._session = builder.getOrCreate()
            self._session.sparkContext.setLogLevel("ERROR")
        return self._session

    def scan(self, tasks, exchanges, progress=None):
        if not tasks:
            return [], {}
        sc = self.session.sparkContext
        scanned = sc.parallelize(tasks, min(len(tasks), max(2, sc.defaultParallelism * 4)))
        scanned = scanned.map(lambda task: scan_channel(task, exchanges[task.exchange_index])).cache()
        try:
            results = scanned.map(lambda s: replace(s, digests=[])).collect()
            holders = scanned.flatMap(
                lambda s: (((s.exchange_index, d), s.downstream_subtask) for d in s.digests)
            ).distinct()
            duplicates = (
                holders.map(lambda pair: (pair[0], 1))
                .reduceByKey(operator.add)
                .filter(lambda item: item[1] > 1)
                .map(lambda item: (item[0][0], item[1] - 1))
                .reduceByKey(operator.add)
                .collectAsMap()
            )
        finally:
            scanned.unpersist()
        if progress:
            progress(len(tasks), len(tasks))
        keyed = {s.exchange_index for s in results}
        return results, {index: duplicates.get(index, 0) for index in keyed}


def engine_for(choice: str, data_bytes: int, master: Optional[str] = None, conf: Optional[dict] = None) -> Engine:
    """``local`` or ``spark`` as asked; ``auto`` is Spark for large data or when a master is given."""
    if choice == "spark" or (choice == "auto" and (master or data_bytes > LOCAL_SCAN_LIMIT_BYTES)):
        return SparkEngine(master or "local[*]", conf)
    return LocalEngine()
