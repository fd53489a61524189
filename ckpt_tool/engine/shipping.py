"""ckpt on a Spark cluster: what its executors need, shipped by ckpt itself, and a check that the
executors can run it before any work is given to them.

Executors need only Python and Spark. For a cluster master (``spark://``, ``yarn``, ``k8s://``...)
the driver packs what its tasks import into one zip, the *executor bundle*: the ``ckpt_tool``
package as this process runs it (with its compiled record-path module, ``_framing``, built for
this platform) and the installed distributions of its task-side dependencies (NumPy, xxhash,
fastavro, cloudpickle, the object stores' clients boto3, google-cloud-storage, azure-storage-blob and
azure-identity, and theirs; pyarrow when a command writes Parquet on the executors).
Spark ships it as ``spark.archives`` (``<bundle>#ckpt_executor``): every executor unpacks it into
its working directory, where its Python workers find it first on ``PYTHONPATH``. Bundles are
cached by content under ``$CKPT_CACHE`` (default ``~/.cache/ckpt``)/``executor-bundles``.

The bundle's compiled modules are this machine's (platform and Python minor version). PySpark
refuses executors whose Python minor version differs from the driver's; ckpt says so in one line
naming both. Executors of another platform: ship an environment built there instead
(``--conf spark.ckpt.ship=false`` and a venv-pack'ed ``spark.archives``); where ckpt's own compiled
module cannot load, its tasks use the pure NumPy/Python record path, and the report warns.

Before the first task, ``probe`` runs one small task per executor core: Python version, host,
and whether the compiled module loaded. A master that cannot be reached, or a cluster that runs
no task within ``spark.ckpt.executorTimeout`` seconds (default 120), fails with one line naming
the master, instead of Spark's wait without end.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import os
import platform
import re
import socket
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ckpt_tool.errors import CkptError

# The distributions the executors' tasks import (and what those require), by distribution name.
EXECUTOR_PACKAGES = (
    *("numpy", "xxhash", "fastavro", "cloudpickle"),
    *("boto3", "google-cloud-storage", "azure-storage-blob", "azure-identity"),  # the object stores' clients
)
NOT_SHIPPED = {"pyspark", "py4j"}  # the executors' own Spark provides these
ARCHIVE_NAME = "ckpt_executor"  # the directory each executor unpacks the bundle into
SHIP = "spark.ckpt.ship"  # false: ship nothing (the executors have ckpt already)
SHIP_PACKAGES = "spark.ckpt.shipPackages"  # more distributions to ship, comma-separated
EXECUTOR_TIMEOUT = "spark.ckpt.executorTimeout"  # seconds for the executors' first task
DEFAULT_EXECUTOR_TIMEOUT = 120.0
CONNECT_TIMEOUT = 10.0
KEEP_BUNDLES = 4  # in the cache; older ones are removed a day after they were made


class ClusterError(CkptError):
    """The Spark cluster cannot run ckpt's tasks: unreachable, without executors, or unfit."""


def is_cluster(master: str) -> bool:
    return not (master == "local" or master.startswith(("local[", "local-cluster[")))


# --- the master -----------------------------------------------------------------------------------


def check_reachable(master: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """A ``spark://`` master must accept a connection (Spark itself would wait without end)."""
    if not master.startswith("spark://"):
        return
    problems = []
    for address in master[len("spark://") :].split(","):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return
        except (OSError, ValueError) as exc:
            problems.append(f"{address}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}")
    raise ClusterError(f"cannot reach the Spark master {master} ({'; '.join(problems)})")


# --- the bundle -----------------------------------------------------------------------------------


def _requirement_names(dist: metadata.Distribution) -> list[str]:
    names = []
    for requirement in dist.requires or []:
        name, _, marker = requirement.partition(";")
        if "extra" in marker:
            continue
        if marker.strip():
            try:
                from packaging.markers import Marker

                if not Marker(marker).evaluate():
                    continue
            except Exception:  # no packaging, or a marker it cannot read: ship it if it is installed
                pass
        match = re.match(r"[A-Za-z0-9._-]+", name.strip())
        if match:
            names.append(match.group(0))
    return names


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(roots: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions ``roots`` name and everything they require, but Spark's own."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = _canonical(todo.pop())
        if name in found or name in NOT_SHIPPED:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency that is not installed
        found[name] = dist
        todo += _requirement_names(dist)
    return [found[name] for name in sorted(found)]


def _package_files() -> list[tuple[Path, str]]:
    """ckpt_tool as this process runs it (an editable install included), compiled module and all."""
    import ckpt_tool

    root = Path(ckpt_tool.__file__).resolve().parent
    return [
        (path, str(Path("ckpt_tool") / path.relative_to(root)))
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".c")
    ]


# botocore's models of the AWS services that S3 access can involve (the others are most of its size)
BOTOCORE_SERVICES = {"s3", "sts", "sso", "sso-oidc"}


def _needed(entry) -> bool:
    parts = entry.parts
    if parts[0] == ".." or "__pycache__" in parts or str(entry).endswith(".pyc"):
        return False  # scripts and headers outside site-packages, byte code
    if parts[0] == "numpy" and "tests" in parts:
        return False
    return not (parts[:2] == ("botocore", "data") and len(parts) > 3 and parts[2] not in BOTOCORE_SERVICES)


def _distribution_files(dist: metadata.Distribution) -> list[tuple[Path, str]]:
    files = []
    for entry in dist.files or []:
        name = str(entry)
        if not _needed(entry):
            continue
        path = Path(str(dist.locate_file(entry)))
        if path.is_file():
            files.append((path, name))
    return files


def cache_dir() -> Path:
    return Path(os.environ.get("CKPT_CACHE") or Path.home() / ".cache" / "ckpt") / "executor-bundles"


def executor_bundle(extra: tuple[str, ...] = ()) -> Path:
    """The zip of ckpt and its task-side dependencies for executors of this platform (cached)."""
    files = _package_files()
    for dist in distributions(EXECUTOR_PACKAGES + extra):
        if _canonical(dist.metadata["Name"]) != "ckpt-tool":
            files += _distribution_files(dist)
    key = hashlib.sha256(f"{sys.version}|{platform.platform()}".encode())
    for path, name in files:
        stat = path.stat()
        key.update(f"{name}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    directory = cache_dir()
    bundle = directory / f"ckpt-executor-{key.hexdigest()[:20]}.zip"
    if bundle.exists():
        return bundle
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".part", delete=False) as part:
        try:
            with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
                seen = set()
                for path, name in files:
                    if name not in seen:
                        seen.add(name)
                        archive.write(path, name)
            os.replace(part.name, bundle)  # whole or not at all, also for a concurrent ckpt
        except BaseException:
            os.unlink(part.name)
            raise
    older = sorted(directory.glob("ckpt-executor-*.zip"), key=lambda p: p.stat().st_mtime, reverse=True)[KEEP_BUNDLES:]
    for stale in older:  # bundles of earlier versions of ckpt or its dependencies, not in use by a running ckpt
        if time.time() - stale.stat().st_mtime > 86400:
            stale.unlink(missing_ok=True)
    return bundle


def shipping_conf(conf: dict[str, str]) -> dict[str, str]:
    """The Spark settings that ship the bundle (none when ``spark.ckpt.ship`` is false)."""
    if conf.get(SHIP, "true").lower() == "false":
        return {}
    extra = tuple(p.strip() for p in conf.get(SHIP_PACKAGES, "").split(",") if p.strip())
    archive = f"{executor_bundle(extra)}#{ARCHIVE_NAME}"
    archives = ",".join(a for a in (conf.get("spark.archives", ""), archive) if a)
    python_path = ":".join(p for p in (ARCHIVE_NAME, conf.get("spark.executorEnv.PYTHONPATH", "")) if p)
    return {"spark.archives": archives, "spark.executorEnv.PYTHONPATH": python_path}


# --- the executors --------------------------------------------------------------------------------


@dataclass
class ExecutorInfo:
    host: str
    python: str
    compiled: bool  # the compiled record-path module loaded
    fallback_reason: Optional[str]


def _probe(_: int) -> ExecutorInfo:
    """Runs on an executor: what ckpt's tasks will find there."""
    from ckpt_tool import framing

    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return ExecutorInfo(socket.gethostname(), python, framing.COMPILED, framing.FALLBACK_REASON)


VERSION_MISMATCH = re.compile(r"Python in worker has different version:? (\S+) than that in driver:? ([0-9.]+)")


def explain(master: str, message: str) -> Optional[str]:
    """ckpt's one line for what an executor's failure to start a task means, if it knows."""
    mismatch = VERSION_MISMATCH.search(message)
    if mismatch:
        worker, driver = mismatch.group(1).rstrip(","), mismatch.group(2).rstrip(".,")
        return (
            f"the executors of {master} run Python {worker}, this driver Python {driver}: ckpt needs the same "
            f"Python minor version on both (PYSPARK_PYTHON names the executors' Python)"
        )
    missing = re.search(r"ModuleNotFoundError: No module named '([^']+)'", message)
    if missing:
        return (
            f"the executors of {master} cannot import {missing.group(1)!r}: ckpt ships itself unless "
            f"{SHIP}=false; then the executors' Python must have ckpt and its dependencies"
        )
    return None


def probe(context, master: str, timeout: float) -> list[ExecutorInfo]:
    """One small task per executor core, within ``timeout`` seconds."""
    slots = max(2, context.defaultParallelism)
    outcome: dict = {}

    def run():
        try:
            outcome["infos"] = context.parallelize(range(slots), slots).map(_probe).collect()
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="ckpt-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        context.cancelAllJobs()
        raise ClusterError(
            f"no executor of the Spark master {master} ran a task within {timeout:g} s "
            f"(are workers registered, with free cores and memory? {EXECUTOR_TIMEOUT} sets the wait)"
        )
    if "error" in outcome:
        error = outcome["error"]
        raise ClusterError(explain(master, str(error)) or f"the executors of {master} failed: {last_line(error)}")
    return outcome["infos"]


def warnings_of(infos: list[ExecutorInfo]) -> list[str]:
    fallen = sorted({(i.host, i.fallback_reason or "") for i in infos if not i.compiled})
    if not fallen:
        return []
    hosts = ", ".join(sorted({host for host, _ in fallen}))
    return [
        f"executors on {hosts} run the pure NumPy/Python record path (slower, same results): "
        f"the compiled module did not load ({fallen[0][1]})"
    ]


def last_line(exc: Exception) -> str:
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
