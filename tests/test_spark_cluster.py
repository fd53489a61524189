"""ckpt on a real Spark standalone cluster: a master and two workers on 127.0.0.1, started with
pyspark's own ``spark-class``. The workers run a Python environment of their own that holds
pyspark only, in a mount namespace where the repository and the driver's virtualenv are hidden
(empty tmpfs mounts over them): whatever ckpt needs there, it ships itself. Real Flink restores
what the cluster wrote with the exact count."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import flink_env
from catalog import COUNTJOB_SCHEMA, fixture_named

REPOSITORY = Path(__file__).resolve().parent.parent
FIXTURE = fixture_named("flink23-hashmap-p2")
CKPT = Path(sys.executable).parent / "ckpt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workers_python() -> Path:
    """A virtualenv holding pyspark only (this driver's pyspark version), cached outside the
    repository; the workers and their executors run it."""
    import pyspark

    python = getattr(sys, "_base_executable", sys.executable)
    home = Path(os.environ.get("CKPT_SPARK_WORKERS_CACHE") or Path.home() / ".cache" / "ckpt-spark-workers")
    venv = home / f"pyspark-{pyspark.__version__}-py{sys.version_info[0]}.{sys.version_info[1]}"
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".ready").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([python, "-m", "venv", str(venv)], check=True)
            subprocess.run(
                [str(venv / "bin" / "pip"), "install", "--quiet", f"pyspark=={pyspark.__version__}"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            (venv / ".ready").touch()
    return venv


def hidden_paths() -> list[str]:
    """What the workers must not see: the repository and the driver's virtualenv."""
    paths = [str(REPOSITORY)]
    if not Path(sys.prefix).resolve().is_relative_to(REPOSITORY):
        paths.append(sys.prefix)
    return paths


def isolated(command: list[str]) -> list[str]:
    """``command`` in its own mount namespace, with empty tmpfs mounts over hidden_paths()."""
    mounts = " && ".join(f"mount -t tmpfs ckpt-hidden '{p}'" for p in hidden_paths())
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh", *command]


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.venv = workers_python()
        self.spark_home = next((self.venv / "lib").glob("python*/site-packages/pyspark"))
        self.port, self.web = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.work_dirs = [root / f"worker{i}" for i in (1, 2)]
        self.processes: list[subprocess.Popen] = []
        self.env = {
            "PATH": f"{self.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            "SPARK_HOME": str(self.spark_home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(root / "logs"),
            "SPARK_DAEMON_MEMORY": "256m",
            **({"JAVA_HOME": os.environ["JAVA_HOME"]} if os.environ.get("JAVA_HOME") else {}),
        }

    def spawn(self, name: str, *args: str) -> None:
        command = isolated([str(self.spark_home / "bin" / "spark-class"), *args])
        with open(self.root / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
            process = subprocess.Popen(
                command, env=self.env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.processes.append(process)

    def start(self) -> None:
        self.spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
                   "--webui-port", str(self.web))  # fmt: skip
        for number, work in enumerate(self.work_dirs, start=1):
            work.mkdir()
            self.spawn(f"worker{number}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                       "--memory", "1g", "--work-dir", str(work), "--webui-port", str(free_port()), self.url)  # fmt: skip
        deadline = time.monotonic() + 120
        while self.state().get("aliveworkers") != 2:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"the cluster did not start: {self.state()}; logs in {self.root}")
            time.sleep(0.5)

    def state(self) -> dict:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.web}/json/", timeout=5) as answer:
                return json.load(answer)
        except OSError:
            return {}

    def settled_state(self, seconds: float = 15) -> dict:
        """The master's state once no application is active (an application ends as its driver stops)."""
        deadline = time.monotonic() + seconds
        while (state := self.state()).get("activeapps") and time.monotonic() < deadline:
            time.sleep(0.5)
        return state

    def executor_logs(self) -> dict[Path, str]:
        return {log: log.read_text(errors="replace") for work in self.work_dirs for log in work.glob("app-*/*/stderr")}

    def executor_pids(self) -> dict[int, Path]:
        """The executors' JVMs, by pid, with their working directories."""
        found = {}
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and b"CoarseGrainedExecutorBackend" in (entry / "cmdline").read_bytes():
                    found[int(entry.name)] = Path(os.readlink(entry / "cwd"))
            except OSError:
                continue
        return {pid: cwd for pid, cwd in found.items() if any(cwd.is_relative_to(w) for w in self.work_dirs)}

    def stop(self) -> None:
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)  # what is left of the group (executors, Python workers)
            except ProcessLookupError:
                pass
            process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The fixture's checkpoint where the workers can read it (the repository is hidden from them)."""
    copy = tmp_path_factory.mktemp("source") / FIXTURE.directory.name
    shutil.copytree(FIXTURE.directory, copy)
    return copy / FIXTURE.checkpoint.relative_to(FIXTURE.directory)


def run_ckpt(*args, timeout: float = 300, background: bool = False, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_HOME", "PYTHONPATH")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    command = [str(CKPT), *map(str, args)]
    if background:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, **kwargs)


# small executors that start sooner (their JVM only feeds Python workers), as the driver's
EXECUTORS = ("spark.executor.memory=512m", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def rescale_args(src, dst, master, *conf: str) -> list:
    confs = [x for c in (*EXECUTORS, *conf) for x in ("--conf", c)]
    return ["rescale", src, dst, "--parallelism", 3, "--plan", FIXTURE.plan, "--schema", COUNTJOB_SCHEMA,
            "--spark-master", master, *confs, "--json"]  # fmt: skip


def attempt_files(directory: Path) -> set[str]:
    return {p.name for p in directory.glob("ckpt-inflight-*")} if directory.exists() else set()


def assert_restores_exactly(dst: Path) -> None:
    info = FIXTURE.info
    assert flink_env.restore_count(info["flink_version"], dst, 3, backend=info["backend"]) == info["source_records"]


def test_the_workers_cannot_see_ckpt(cluster):
    """The isolation the other tests rely on: in the workers' namespace the repository is empty
    and their Python has no ckpt, NumPy or xxhash."""
    probe = "import importlib.util as u; print([m for m in ('ckpt_tool', 'numpy', 'xxhash') if u.find_spec(m)])"
    command = isolated(["sh", "-c", f"ls -A '{REPOSITORY}' | wc -l; python3 -c \"{probe}\""])
    shown = subprocess.run(command, env=cluster.env, capture_output=True, text=True, check=True).stdout.split()
    assert shown == ["0", "[]"]


@pytest.mark.flink
def test_rescale_on_the_cluster_restores_exactly(cluster, source, tmp_path):
    dst = tmp_path / "rescaled" / "job" / source.name
    started = time.monotonic()
    result = run_ckpt(*rescale_args(source, dst, cluster.url))
    assert result.returncode == 0, result.stderr
    print(f"ckpt rescale on the cluster: {time.monotonic() - started:.1f} s")
    report = json.loads(result.stdout)
    assert report["engine"] == "spark" and report["records_out"] == report["records_in"] > 0 and report["warnings"] == []
    logs = cluster.executor_logs()
    ran = {log.parent.parent.parent for log, text in logs.items() if re.search(r"Finished task .* \(TID \d+\)", text)}
    assert ran, f"no executor of the workers ran a task: {list(logs)}"
    assert any((log.parent / "ckpt_executor" / "ckpt_tool").is_dir() for log in logs), "the bundle was not unpacked"
    # one file per route task, of the attempt that won; nothing else left behind
    assert attempt_files(dst) and all("-attempt-" in name for name in attempt_files(dst))
    assert_restores_exactly(dst)


@pytest.mark.flink
def test_a_lost_executor_mid_rescale_is_retried_and_its_files_removed(cluster, source, tmp_path):
    """Also: executors whose compiled record-path module does not load (here: CKPT_FRAMING=python
    makes them not try) run the pure one, and the report says so."""
    dst = tmp_path / "rescaled" / "job" / source.name
    pause = "spark.executorEnv.CKPT_TEST_PAUSE_AFTER_WRITE=6"  # each route task waits after writing its file
    pure = "spark.executorEnv.CKPT_FRAMING=python"
    process = run_ckpt(*rescale_args(source, dst, cluster.url, pause, pure), background=True)
    seen: set[str] = set()
    killed = None
    try:
        deadline = time.monotonic() + 180
        while killed is None and time.monotonic() < deadline and process.poll() is None:
            seen |= attempt_files(dst)
            if seen:
                name = sorted(seen)[0]
                tid = name.rsplit("-attempt-", 1)[1]
                for pid, cwd in cluster.executor_pids().items():
                    log = cwd / "stderr"
                    if log.exists() and f"(TID {tid})" in log.read_text(errors="replace"):
                        os.kill(pid, signal.SIGKILL)  # the executor that wrote ``name`` dies in its pause
                        killed = (pid, name)
                        break
            time.sleep(0.2)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert killed, f"no executor was killed (files seen: {seen})"
    assert process.returncode == 0, stderr
    final = attempt_files(dst)
    assert killed[1] not in final, "the lost attempt's file is still there"
    tasks = {name.rsplit("-attempt-", 1)[0] for name in final}
    assert len(tasks) == len(final), f"more than one attempt's file of a task: {sorted(final)}"
    report = json.loads(stdout)
    assert report["files_written"] >= len(final) and report["records_out"] == report["records_in"] > 0
    assert len(report["warnings"]) == 1 and "pure NumPy/Python record path" in report["warnings"][0]
    assert "ckpt: warning: executors on" in stderr
    assert_restores_exactly(dst)


def test_an_unreachable_master_fails_at_once_naming_it(source, tmp_path):
    master = f"spark://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    result = run_ckpt(*rescale_args(source, tmp_path / "out" / source.name, master), timeout=120)
    elapsed = time.monotonic() - started
    assert result.returncode == 2 and elapsed < 60
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and master in lines[0] and lines[0].startswith("ckpt: error: cannot reach the Spark master")
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


def test_a_cluster_that_runs_no_task_fails_naming_the_master(cluster, source, tmp_path):
    """Executors of 4 GiB do not fit the workers' 1 GiB: Spark would wait for them without end."""
    wants = ("spark.executor.memory=4g", "spark.ckpt.executorTimeout=10")
    started = time.monotonic()
    result = run_ckpt(*rescale_args(source, tmp_path / "out" / source.name, cluster.url, *wants), timeout=120)
    assert result.returncode == 2 and time.monotonic() - started < 60
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no executor of the Spark master {cluster.url} ran a task within 10 s" in lines[0]
    assert not cluster.settled_state()["activeapps"]


def test_pyspark_refusing_another_python_is_one_line_naming_both_versions():
    """PySpark's own refusal of executors whose Python differs from the driver's, as PySpark words
    it, becomes ckpt's line (no second Python minor version is at hand to start a worker with)."""
    from pyspark.errors import PySparkRuntimeError

    from ckpt_tool.engine.shipping import explain

    refusal = PySparkRuntimeError(
        errorClass="PYTHON_VERSION_MISMATCH", messageParameters={"worker_version": "3.12", "driver_version": "3.11"}
    )
    line = explain("spark://h:7077", f"Job aborted due to stage failure: ...\n{refusal}\n\tat ...")
    assert line is not None and "\n" not in line
    assert "spark://h:7077" in line and "Python 3.12" in line and "Python 3.11" in line


def corrupt_copy(source: Path, directory: Path) -> Path:
    """A copy of the source whose first input channel buffer claims more bytes than its file holds:
    only a task reading the channel finds out."""
    from ckpt_tool.flink.channel_state import BufferSource
    from ckpt_tool.flink.checkpoint import Checkpoint
    from ckpt_tool.flink.model import INPUT

    copy = directory / source.parent.parent.name
    shutil.copytree(source.parent.parent, copy)
    checkpoint = Checkpoint.open(str(copy / source.parent.name / source.name))
    handles = [h for op in checkpoint.metadata.operators for s in op.subtasks for h in s.channel_handles(INPUT)]
    where = next(b for b in (BufferSource.of(checkpoint, h) for h in handles) if b.location and b.segment is None)
    with open(where.location, "r+b") as file:
        file.seek(where.offsets[0])
        file.write((0x7FFFFF00).to_bytes(4, "big"))
    return Path(checkpoint.uri)


@pytest.mark.flink
def test_errors_on_executors_are_ckpt_errors_and_every_command_stops_spark(cluster, source, tmp_path):
    corrupt = corrupt_copy(source, tmp_path)
    local = run_ckpt(*rescale_args(corrupt, tmp_path / "local" / "chk", "local[1]"), "--engine", "local")
    remote = run_ckpt(*rescale_args(corrupt, tmp_path / "cluster" / "chk", cluster.url))
    assert local.returncode == remote.returncode == 2, remote.stderr
    assert remote.stderr == local.stderr and len(remote.stderr.splitlines()) == 1 and "runs past the end" in remote.stderr
    on_cluster = ["--spark-master", cluster.url, *[x for c in EXECUTORS for x in ("--conf", c)], "--json"]
    described = ["--plan", FIXTURE.plan, "--schema", COUNTJOB_SCHEMA]
    inspected = run_ckpt("inspect", source, *described, *on_cluster)
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["engine"] == "spark"
    verified = run_ckpt("verify", source, *described, "--target-parallelism", 3, *on_cluster)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    state = cluster.settled_state()
    assert not state["activeapps"] and state["completedapps"]
    assert {app["state"] for app in state["completedapps"]} == {"FINISHED"}


def test_executors_without_ckpt_are_one_line_naming_what_they_miss(cluster, source, tmp_path):
    """With shipping turned off, the workers' Python has no ckpt: the probe says so before any work."""
    result = run_ckpt(*rescale_args(source, tmp_path / "out" / source.name, cluster.url, "spark.ckpt.ship=false"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"the executors of {cluster.url} cannot import 'ckpt_tool'" in lines[0]


def test_executors_read_and_write_s3_with_the_drivers_settings(cluster, source, s3_endpoint):
    """The driver's S3 endpoint and credentials (here moto's server on 127.0.0.1, from the
    environment) reach the executors, which read and write S3 through the shipped boto3."""
    import boto3

    client = boto3.client("s3")
    client.create_bucket(Bucket="cluster")
    job = source.parent
    for path in job.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), "cluster", f"in/{path.relative_to(job.parent)}")
    src = f"s3://cluster/in/{job.name}/{source.name}"
    dst = f"s3://cluster/out/job/{source.name}"
    result = run_ckpt(*rescale_args(src, dst, cluster.url))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["records_out"] == report["records_in"] > 0
    written = [o["Key"] for o in client.list_objects_v2(Bucket="cluster", Prefix="out/")["Contents"]]
    inflight = [k for k in written if "/ckpt-inflight-" in k]
    assert inflight and all("-attempt-" in k for k in inflight)
    verified = run_ckpt("verify", dst, "--plan", FIXTURE.plan, "--schema", COUNTJOB_SCHEMA, "--engine", "local", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
