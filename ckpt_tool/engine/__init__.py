"""Where record work runs: in this process, or on Spark (PySpark).

Both engines run the same functions (``scan_channel`` per logical channel, ``route_task`` per
new channel) on the same plain-data tasks and return the same results; only the distribution
differs. On Spark the executors read, route and write; the driver sees only counters and the
offsets of the files written. Routing needs no shuffle (see ckpt_tool.records.route).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional

from ckpt_tool.records.route import RouteSpec, RouteTask, route_task
from ckpt_tool.records.scan import ChannelTask, scan_channel, suspect_key_groups
from ckpt_tool.records.schema import Exchange

Progress = Optional[Callable[[int, int], None]]
LOCAL_SCAN_LIMIT_BYTES = 256 * 1024 * 1024  # "auto" scans more in-flight data than this on Spark

# (exchange index, upstream subtask, digest) -> old downstream subtasks holding that record,
# where there are several
Holders = dict[tuple[int, int, bytes], set[int]]


def inflight_file_name(downstream_id: str, gate: int, channel: int) -> str:
    return f"ckpt-inflight-{downstream_id}-{gate}-{channel}"


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


class _Engine:
    """scan and route, written once over ``_map`` (apply a function to every task)."""

    def _map(self, function, items: list, progress: Progress, one_per_partition: bool = False) -> list:
        raise NotImplementedError

    def scan(self, tasks: list[ChannelTask], exchanges: list[Exchange], progress: Progress = None):
        """Channel figures and, per exchange and upstream subtask, the records held by several
        downstream subtasks. Digests are computed only in a second pass over the channels of
        key groups that several downstream subtasks hold; a healthy checkpoint needs none."""
        stats = self._map(lambda task: scan_channel(task, exchanges[task.exchange_index]), tasks, progress)
        suspects = suspect_key_groups(
            ((s.exchange_index, s.upstream_subtask), s.downstream_subtask, s.key_groups) for s in stats
        )
        again = [t for t in tasks if (t.exchange_index, t.upstream_subtask) in suspects]
        holders: Holders = {}
        for s in self._map(
            lambda t: scan_channel(t, exchanges[t.exchange_index], suspects[(t.exchange_index, t.upstream_subtask)]),
            again, None,
        ):
            for digest in s.digests:
                holders.setdefault((s.exchange_index, s.upstream_subtask, digest), set()).add(s.downstream_subtask)
        return stats, {k: v for k, v in holders.items() if len(v) > 1}

    def route(self, tasks: list[RouteTask], specs: list[RouteSpec], dst: str, progress: Progress = None):
        """Route every new channel's records and write its file; the RoutedFile of each."""
        return self._map(lambda task: route_task(task, specs[task.exchange_index], dst), tasks, progress, True)


class LocalEngine(_Engine):
    name = "local"

    def _map(self, function, items, progress, one_per_partition=False):
        results = []
        for done, item in enumerate(items, start=1):
            results.append(function(item))
            if progress:
                progress(done, len(items))
        return results


# The driver's JVM only schedules tasks (records go through Python workers): its C1 compiler
# and the serial collector start it seconds sooner on a small machine. --conf overrides this.
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class SparkEngine(_Engine):
    """PySpark, ``local[*]`` by default or a cluster given by ``master``."""

    name = "spark"

    def __init__(self, master: str = "local[*]", conf: Optional[dict[str, str]] = None):
        self.master = master
        self.conf = {"spark.driver.extraJavaOptions": DRIVER_JAVA_OPTIONS, **(conf or {})}
        self._session = None
        self._starting: Optional[Future] = None

    def start(self) -> None:
        """Start Spark in the background, so that its start-up overlaps the driver's own work."""
        if self._session is None and self._starting is None:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-start")
            self._starting = pool.submit(self._create_session)
            pool.shutdown(wait=False)

    def _create_session(self):
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master(self.master).appName("ckpt")
        builder = builder.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        for key, value in {**executor_environment(), **self.conf}.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        return session

    @property
    def context(self):
        if self._session is None:
            starting, self._starting = self._starting, None
            self._session = starting.result() if starting else self._create_session()
        return self._session.sparkContext

    def stop(self) -> None:
        if self._starting is not None:
            try:
                self.context
            except Exception:  # a start that failed has nothing to stop
                return
        if self._session is not None:
            self._session.stop()
            self._session = None

    def _map(self, function, items, progress, one_per_partition=False):
        if not items:
            return []
        sc = self.context
        slices = len(items) if one_per_partition else min(len(items), max(2, sc.defaultParallelism * 4))
        results = sc.parallelize(items, slices).map(function).collect()
        if progress:
            progress(len(items), len(items))
        return results


def duplicates_per_exchange(holders: Holders) -> dict[int, int]:
    """Record copies beyond the first, per exchange."""
    counts: dict[int, int] = {}
    for (exchange_index, _, _), subtasks in holders.items():
        counts[exchange_index] = counts.get(exchange_index, 0) + len(subtasks) - 1
    return counts


def engine_for(choice: str, data_bytes: int, master: Optional[str] = None, conf: Optional[dict] = None):
    """``local`` or ``spark`` as asked; ``auto`` is Spark for large data or when a master is given."""
    if choice == "spark" or (choice == "auto" and (master or data_bytes > LOCAL_SCAN_LIMIT_BYTES)):
        return SparkEngine(master or "local[*]", conf)
    return LocalEngine()
