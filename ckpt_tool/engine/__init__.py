"""Where record work runs: in this process, or on Spark (PySpark).

Both engines apply the same task functions (ckpt_tool.engine.tasks) to the same plain-data tasks
and return the same results; only the distribution differs. On Spark the executors read, route
and write; the driver sees only counters and the offsets of the files written.

An error a task raises on purpose (a ``CkptError``: a corrupt channel, an unreadable file, a full
disk) travels back as a value and is raised again on the driver, so that every engine reports
it with the same one-line message and exit code.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import numpy as np

from ckpt_tool.errors import EXIT_INTERNAL, CkptError
from ckpt_tool.memory import release_memory
from ckpt_tool.storage import STORAGE_ENVIRONMENT

Progress = Optional[Callable[[int, int], None]]
LOCAL_LIMIT_BYTES = 8 * 1024**3  # "auto" runs more in-flight data than this on Spark
POOL_MIN_BYTES = 32 * 1024**2  # in-process with one worker per core above this; below, forking costs more

# What executors need to reach the object stores as the driver does (no Hadoop jars involved).
S3_ENVIRONMENT = STORAGE_ENVIRONMENT


class EngineError(CkptError):
    """Spark itself failed (not a task's own error)."""

    exit_code = EXIT_INTERNAL


@dataclass
class TaskError:
    """A CkptError raised by a task, as plain data (it crosses process boundaries)."""

    module: str
    name: str
    message: str
    exit_code: int

    def reraise(self):
        try:
            error_type = getattr(importlib.import_module(self.module), self.name)
            error = error_type(self.message)
        except Exception:  # an error class that cannot be rebuilt keeps its message and code
            error = CkptError(self.message)
        error.exit_code = self.exit_code
        raise error


class _Guarded:
    """A task function whose CkptErrors come back as TaskError values. Picklable."""

    def __init__(self, function):
        self.function = function

    def __call__(self, item):
        try:
            return self.function(item)
        except CkptError as exc:
            return TaskError(type(exc).__module__, type(exc).__name__, str(exc), exc.exit_code)


class Lazy(Protocol):
    """Items an engine hands out in batches without making them all first: a ``ChannelTable``
    (millions of channels as columns) makes a batch's tasks in the worker that runs it."""

    def __len__(self) -> int: ...

    def part(self, start: int, stop: int) -> Any:
        """Items ``start`` to ``stop``: a sequence of them (iterating it makes each)."""


class _Part:
    """Items ``start`` to ``stop`` of lazy items, made where the batch runs (a forked worker
    inherits the items; Spark is handed them made, see ``SparkEngine._map``)."""

    def __init__(self, items: Lazy, start: int, stop: int):
        self.items, self.start, self.stop = items, start, stop

    def made(self) -> Any:
        return self.items.part(self.start, self.stop)


def _made(batch) -> Any:
    return batch.made() if isinstance(batch, _Part) else batch


class _Batch:
    """A task function applied to every item of a batch (one engine task), results in order. Picklable."""

    def __init__(self, function):
        self.function = function

    def __call__(self, batch: list) -> list:
        return [self.function(item) for item in _made(batch)]


class _Whole:
    """A task function of a whole batch (one engine task), its items made first. Picklable."""

    def __init__(self, function):
        self.function = function

    def __call__(self, batch: list):
        return self.function(_made(batch))


def _raise_task_errors(results: list) -> list:
    for result in results:
        if isinstance(result, TaskError):
            result.reraise()
    return results


# Engine tasks are sized by bytes, not by items: consecutive items are packed into batches of at
# most BATCH_MAX_BYTES (an item larger than that is a batch of its own), and into at least
# BATCH_SPREAD batches per slot when the work is large enough, so that the slots stay busy.
BATCH_MAX_BYTES = 64 * 1024**2
BATCH_MIN_BYTES = 1024**2
BATCH_SPREAD = 4


def batch_budget(total_bytes: int, slots: int) -> int:
    """The byte budget of one batch for ``total_bytes`` of work on ``slots`` parallel slots."""
    spread = total_bytes // max(1, slots * BATCH_SPREAD)
    return max(BATCH_MIN_BYTES, min(BATCH_MAX_BYTES, spread))


def plan_batches(sizes: Sequence[int] | np.ndarray, budget: int) -> list[range]:
    """Consecutive items (by index) packed into batches of at most ``budget`` bytes each; an item
    of more than ``budget`` bytes is a batch of its own. Items of no bytes cost nothing."""
    return _packed(_prefix_sums(sizes), budget)


def _prefix_sums(sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    ends = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(np.asarray(sizes, dtype=np.int64), out=ends[1:])
    return ends


def _packed(ends: np.ndarray, budget: int) -> list[range]:
    """``plan_batches`` from the prefix sums of the sizes: a search per batch, not a step per item
    (a job at parallelism p has up to p² channels)."""
    batches: list[range] = []
    start, count = 0, len(ends) - 1
    while start < count:
        stop = max(start + 1, int(np.searchsorted(ends, ends[start] + budget, side="right")) - 1)
        batches.append(range(start, stop))
        start = stop
    return batches


def _planned(count: int, sizes: Optional[Sequence[int] | np.ndarray], slots: int, progress: Progress):
    """The batches of ``count`` items (one item each without ``sizes``, else of a bounded byte
    budget) and the report of a finished batch to ``progress``, in bytes (or items)."""
    if sizes is None:
        weights = [1] * count
        batches = [range(i, i + 1) for i in range(count)]
    else:
        ends = _prefix_sums(sizes)
        batches = _packed(ends, batch_budget(int(ends[-1]), slots))
        weights = [int(ends[b.stop] - ends[b.start]) for b in batches]
    if not progress:
        return batches, None
    total, done = sum(weights), [0]

    def report(batch: int) -> None:
        done[0] += weights[batch]
        progress(done[0], total)

    return batches, report


def _items(items):
    return items if hasattr(items, "part") else list(items)


def _batched(items, batches: list[range]) -> list:
    """Each batch's items: made now from a list, or made where the batch runs from lazy items."""
    if hasattr(items, "part"):
        return [_Part(items, b.start, b.stop) for b in batches]
    return [[items[i] for i in b] for b in batches]


class Engine:
    """Applies a function to every item; ``map`` raises the first item's error, if any.
    ``warnings``: what the reports should say about where the work ran (e.g. a slower path)."""

    name = "engine"
    warnings: Sequence[str] = ()

    def map(
        self, function, items: list | Lazy, progress: Progress = None, sizes: Optional[Sequence[int] | np.ndarray] = None
    ) -> list:
        """``function`` of every item, in order. With ``sizes`` (bytes of each item), items are
        run in batches of a bounded byte budget (``plan_batches``), one engine task per batch,
        and ``progress`` counts bytes; without, every item is a task of its own."""
        items = _items(items)
        if not len(items):
            return []
        batches, report = _planned(len(items), sizes, self.slots(), progress)
        results = self._map(_Batch(_Guarded(function)), _batched(items, batches), report)
        return _raise_task_errors([result for batch in results for result in batch])

    def map_batches(
        self, function, items: list | Lazy, progress: Progress = None, sizes: Optional[Sequence[int] | np.ndarray] = None
    ) -> list:
        """``function`` of every batch of items (a list of consecutive items, planned as ``map``
        plans them from ``sizes``): one result per batch, in order. For work done over a whole
        batch at once (one pass over many channels), where ``map`` would cost a call per item."""
        items = _items(items)
        if not len(items):
            return []
        if sizes is None:  # without sizes, every item weighs one
            sizes = np.ones(len(items), dtype=np.int64)
        batches, report = _planned(len(items), sizes, self.slots(), progress)
        return _raise_task_errors(self._map(_Guarded(_Whole(function)), _batched(items, batches), report))

    def slots(self) -> int:
        """How many tasks run at once."""
        return 1

    def _map(self, function, batches: list[list], progress: Optional[Callable[[int], None]]) -> list:
        """``function`` of every batch, in order; ``progress(i)`` once batch i is done."""
        raise NotImplementedError

    def start(self) -> None:
        """Get ready in the background (Spark's start-up); a no-op where there is nothing to start."""

    def stop(self) -> None:
        """Release what the engine holds."""


class LocalEngine(Engine):
    """This machine: the tasks run in this process, or with ``workers`` > 1 in that many forked
    processes (one per core), results in the order of the tasks."""

    name = "local"

    def __init__(self, workers: int = 1):
        self.workers = workers

    def slots(self) -> int:
        return max(1, self.workers)

    def _map(self, function, batches, progress):
        if self.workers <= 1 or len(batches) <= 1:
            results = []
            for index, batch in enumerate(batches):
                results.append(function(batch))
                if progress:
                    progress(index)
            return results
        import multiprocessing

        # The forked workers inherit the function and the batches: only batch numbers go to them
        # (pickling every channel's task would cost more than scanning it), and results come back.
        global _FORKED
        _FORKED = (function, batches)
        release_memory()  # not inherited by every worker
        try:
            with multiprocessing.get_context("fork").Pool(min(self.workers, len(batches))) as pool:
                results = []
                for index, result in enumerate(pool.imap(_apply_forked, range(len(batches)), chunksize=1)):
                    results.append(result)
                    if progress:
                        progress(index)
        finally:
            _FORKED = None
        return results


_FORKED: Optional[tuple] = None  # (function, batches) of the map under way, inherited by forked workers


def _apply_forked(index: int):
    assert _FORKED is not None
    function, batches = _FORKED
    return function(batches[index])


# The driver's JVM only schedules tasks (records go through Python workers): its C1 compiler
# and the serial collector start it seconds sooner on a small machine. --conf overrides this.
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUIET_LOGGING = os.path.join(os.path.dirname(__file__), "log4j2-quiet.properties")
PYTHON_KILL_TIMEOUT = "spark.python.task.killTimeout"
ATTEMPT_POLL_SECONDS = 0.05


def executor_environment() -> dict[str, str]:
    """``spark.executorEnv.*`` settings carrying the driver's object store credentials, endpoints and
    timeouts (a credentials file a variable names must be at the same path on the executors)."""
    return {f"spark.executorEnv.{k}": os.environ[k] for k in S3_ENVIRONMENT if os.environ.get(k)}


class SparkEngine(Engine):
    """PySpark, ``local[*]`` by default or a cluster given by ``master``.

    Quiet (the default, unless ``--verbose``): the Spark JVM's output goes to a log file
    (``log``) instead of the terminal, and log4j logs nothing; ckpt reports failures itself.
    In local mode the workers run the driver's own Python, so ckpt runs from any directory
    without an activated virtualenv. On a cluster (see ``shipping``) ckpt ships itself to the
    executors, and checks that they run its tasks before it hands them any work."""

    name = "spark"

    def __init__(self, master: str = "local[*]", conf: Optional[dict[str, str]] = None, quiet: bool = True):
        self.master = master
        self.quiet = quiet
        java_options = DRIVER_JAVA_OPTIONS + (f" -Dlog4j2.configurationFile=file:{QUIET_LOGGING}" if quiet else "")
        defaults = {
            "spark.driver.extraJavaOptions": java_options,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        }
        self.conf = {**defaults, **executor_environment(), **(conf or {})}
        self.log: Optional[str] = None
        self._log_named = False  # an error named the log: it is kept for the user to read
        self._context = None
        self._owned = True  # False when Spark was already running in this process: left running
        self._starting: Optional[Future] = None
        self.warnings: list[str] = []
        self.executors: list = []  # on a cluster: what the probe found on each executor core
        self._jobs = 0  # maps run, naming each one's job group

    def start(self) -> None:
        """Start Spark in the background, so that its start-up overlaps the driver's own work."""
        if self._context is None and self._starting is None:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-start")
            self._starting = pool.submit(self._create_context)
            pool.shutdown(wait=False)

    def _create_context(self):
        from pyspark import SparkContext

        from ckpt_tool.engine import shipping

        running = SparkContext._active_spark_context
        if running is not None:
            self._owned = False
            return running
        cluster = shipping.is_cluster(self.master)
        settings = dict(self.conf)
        if cluster:
            shipping.check_reachable(self.master)
            settings.update(shipping.shipping_conf(self.conf))
        # the executors' Python (SparkContext reads PYSPARK_PYTHON): in local mode this one, on a
        # cluster spark.pyspark.python if given, else the executors' own PYSPARK_PYTHON or python3
        python = sys.executable if not cluster else settings.get("spark.pyspark.python")
        saved = os.environ.get("PYSPARK_PYTHON")
        if python and (cluster or saved is None):
            os.environ["PYSPARK_PYTHON"] = python
        try:
            return self._started(settings, cluster)
        except BaseException:
            self._drop_log()  # a failed start's error says what failed; its log names nothing more
            raise
        finally:
            if saved is None:
                os.environ.pop("PYSPARK_PYTHON", None)
            else:
                os.environ["PYSPARK_PYTHON"] = saved

    def _started(self, settings: dict, cluster: bool):
        from pyspark import SparkConf, SparkContext

        from ckpt_tool.engine import shipping

        conf = SparkConf().setMaster(self.master).setAppName("ckpt").setAll(list(settings.items()))
        gateway = None
        if self.quiet:
            from pyspark.java_gateway import launch_gateway

            with tempfile.NamedTemporaryFile(prefix="ckpt-spark-", suffix=".log", delete=False) as log:
                self.log = log.name
                gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})
        context = SparkContext(conf=conf, gateway=gateway)
        context.setLogLevel("OFF" if self.quiet else "ERROR")
        if cluster:
            try:
                timeout = float(self.conf.get(shipping.EXECUTOR_TIMEOUT, shipping.DEFAULT_EXECUTOR_TIMEOUT))
                self.executors = shipping.probe(context, self.master, timeout)
            except BaseException:
                context.stop()  # a cluster that cannot run ckpt is left at once
                raise
            self.warnings += shipping.warnings_of(self.executors)
        return context

    @property
    def context(self):
        context = self._context
        if context is None:
            starting, self._starting = self._starting, None
            context = self._context = starting.result() if starting else self._create_context()
        return context

    def stop(self) -> None:
        if self._starting is not None:
            try:
                _ = self.context  # wait for the start under way
            except Exception:  # a start that failed has nothing to stop
                return
        if self._context is not None:
            if self._owned:
                self._context.stop()
                if not self._log_named:
                    self._drop_log()
            self._context = None

    def _drop_log(self) -> None:
        if self.log:
            with contextlib.suppress(OSError):
                os.unlink(self.log)
            self.log = None

    def slots(self) -> int:
        return max(1, self.context.defaultParallelism)

    def _map(self, function, batches, progress):
        sc = self.context
        self._jobs += 1
        group = f"ckpt-map-{self._jobs}"
        sc.setJobGroup(group, "ckpt")
        batches = [_made(batch) for batch in batches]  # Spark pickles each batch's own items, not lazy ones
        try:  # one partition per batch: Spark's tasks are the batches
            results = sc.parallelize(batches, len(batches)).map(function).collect()
        except Exception as exc:  # Spark's own failure: one line, not the JVM's stack trace
            from ckpt_tool.engine.shipping import explain, last_line

            where = f" (Spark's log: {self.log})" if self.log else ""
            self._log_named = bool(self.log)  # kept when Spark stops
            raise EngineError((explain(self.master, str(exc)) or f"Spark failed: {last_line(exc)}") + where) from exc
        _wait_for_attempts(sc, group)
        if progress:
            for index in range(len(batches)):
                progress(index)
        return results


def _wait_for_attempts(sc, group: str) -> None:
    """Return once no attempt of the job group's tasks still runs. A job completes with the first
    successful attempt of each task, while a speculative copy, or an attempt Spark gave up on, may
    still run and write. Spark may end a killed attempt before its Python worker, which PySpark
    destroys ``spark.python.task.killTimeout`` later: where Spark speculates or an attempt was still
    running or failed, that long is waited on top."""
    tracker = sc.statusTracker()

    def jobs() -> list:
        return [job for job in map(tracker.getJobInfo, tracker.getJobIdsForGroup(group)) if job is not None]

    while any(job.status == "RUNNING" for job in jobs()):  # Spark's listener has yet to see the job end
        time.sleep(ATTEMPT_POLL_SECONDS)
    stages = [stage for job in jobs() for stage in job.stageIds]

    def running_and_failed() -> tuple[int, int]:
        infos = [info for info in map(tracker.getStageInfo, stages) if info is not None]
        return sum(i.numActiveTasks for i in infos), sum(i.numFailedTasks for i in infos)

    running, failed = running_and_failed()
    stragglers = running > 0 or failed > 0 or sc.getConf().get("spark.speculation", "false").lower() == "true"
    while running:
        time.sleep(ATTEMPT_POLL_SECONDS)
        running, _ = running_and_failed()
    if stragglers:
        time.sleep(sc._jsc.sc().conf().getTimeAsMs(PYTHON_KILL_TIMEOUT, "2s") / 1000)


ENGINES = ("auto", "local", "spark")


def make_engine(
    choice: str, data_bytes: int, master: Optional[str] = None, conf: Optional[dict] = None, quiet: bool = True
) -> Engine:
    """``local`` or ``spark`` as asked; ``auto`` is Spark for more than LOCAL_LIMIT_BYTES of
    in-flight data or when a master is given, else local. Local work above POOL_MIN_BYTES uses
    one process per core."""
    if choice == "spark" or (choice == "auto" and (master or data_bytes > LOCAL_LIMIT_BYTES)):
        return SparkEngine(master or "local[*]", conf, quiet)
    return LocalEngine((os.cpu_count() or 1) if data_bytes > POOL_MIN_BYTES else 1)
