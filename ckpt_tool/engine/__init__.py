"""Where record work runs: in this process, or on Spark (PySpark).

Both engines apply the same task functions (ckpt_tool.engine.tasks) to the same plain-data tasks
and return the same results; only the distribution differs. On Spark the executors read, route
and write; the driver sees only counters and the offsets of the files written.

An error a task raises on purpose (a ``CkptError``: a corrupt channel, an unreadable file, a full
disk) travels back as a value and is raised again on the driver, so that every engine reports
it with the same one-line message and exit code.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

from ckpt_tool.errors import EXIT_INTERNAL, CkptError
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


def _raise_task_errors(results: list) -> list:
    for result in results:
        if isinstance(result, TaskError):
            result.reraise()
    return results


class Engine:
    """Applies a function to every task; ``map`` raises the first task's error, if any.
    ``warnings``: what the reports should say about where the work ran (e.g. a slower path)."""

    name = "engine"
    warnings: Sequence[str] = ()

    def map(self, function, items: list, progress: Progress = None, one_per_partition: bool = False) -> list:
        return _raise_task_errors(self._map(_Guarded(function), items, progress, one_per_partition))

    def _map(self, function, items: list, progress: Progress, one_per_partition: bool) -> list:
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

    def _map(self, function, items, progress, one_per_partition):
        if self.workers <= 1 or len(items) <= 1:
            results = []
            for done, item in enumerate(items, start=1):
                results.append(function(item))
                if progress:
                    progress(done, len(items))
            return results
        import multiprocessing

        import cloudpickle  # the task functions are closures, which pickle cannot carry

        apply = functools.partial(_apply_pickled, cloudpickle.dumps(function))
        with multiprocessing.get_context("fork").Pool(min(self.workers, len(items))) as pool:
            results = []
            for done, result in enumerate(pool.imap(apply, items, chunksize=1), start=1):
                results.append(result)
                if progress:
                    progress(done, len(items))
        return results


def _apply_pickled(function: bytes, item):
    import cloudpickle

    return cloudpickle.loads(function)(item)


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
        from pyspark import SparkConf, SparkContext

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
            conf = SparkConf().setMaster(self.master).setAppName("ckpt").setAll(list(settings.items()))
            gateway = None
            if self.quiet:
                from pyspark.java_gateway import launch_gateway

                with tempfile.NamedTemporaryFile(prefix="ckpt-spark-", suffix=".log", delete=False) as log:
                    self.log = log.name
                    gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})
            context = SparkContext(conf=conf, gateway=gateway)
        finally:
            if saved is None:
                os.environ.pop("PYSPARK_PYTHON", None)
            else:
                os.environ["PYSPARK_PYTHON"] = saved
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
                if self.log:
                    os.unlink(self.log)
                    self.log = None
            self._context = None

    def _map(self, function, items, progress, one_per_partition):
        if not items:
            return []
        sc = self.context
        slices = len(items) if one_per_partition else min(len(items), max(2, sc.defaultParallelism * 4))
        self._jobs += 1
        group = f"ckpt-map-{self._jobs}"
        sc.setJobGroup(group, "ckpt")
        try:
            results = sc.parallelize(items, slices).map(function).collect()
        except Exception as exc:  # Spark's own failure: one line, not the JVM's stack trace
            from ckpt_tool.engine.shipping import explain

            where = f" (Spark's log: {self.log})" if self.log else ""
            raise EngineError((explain(self.master, str(exc)) or f"Spark failed: {_last_line(exc)}") + where) from exc
        _wait_for_attempts(sc, group)
        if progress:
            progress(len(items), len(items))
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


def _last_line(exc: Exception) -> str:
    """What went wrong, in one line: a Python worker's exception (the line after its traceback),
    else the first line of the JVM's message."""
    lines = str(exc).splitlines()
    for index, line in enumerate(lines):
        if line.strip().endswith("Traceback (most recent call last):"):
            raised = next((x for x in lines[index + 1 :] if x.strip() and not x.startswith((" ", "\t"))), "")
            if raised:
                return raised.strip()
    first = next((line.strip() for line in lines if line.strip()), "")
    return first or type(exc).__name__


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
