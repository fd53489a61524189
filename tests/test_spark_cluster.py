"""ckpt on a real Spark standalone cluster (fixtures/spark_cluster.py): a master and two workers on
127.0.0.1 and 127.0.0.2, whose Python holds pyspark only and who see neither the repository nor
the driver's virtualenv: whatever ckpt needs there, it ships itself. Real Flink restores what the
cluster wrote with the exact count."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

import flink_env
from catalog import COUNTJOB_SCHEMA, fixture_named
from spark_cluster import (
    REPOSITORY,
    another_python_minor,
    descendants,
    driver_environment,
    executor_args,
    free_port,
    isolated,
    python_minor,
    running_cluster,
    workers_python,
)

FIXTURE = fixture_named("flink23-hashmap-p2")
CKPT = Path(sys.executable).parent / "ckpt"
sys.path.insert(0, str(REPOSITORY / "bench"))
from generate import generate  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def _pruned(request):
    """After each test, the bundles its applications' executors unpacked are removed."""
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").prune()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The fixture's checkpoint where the workers can read it (the repository is hidden from them)."""
    copy = tmp_path_factory.mktemp("source") / FIXTURE.directory.name
    shutil.copytree(FIXTURE.directory, copy)
    return copy / FIXTURE.checkpoint.relative_to(FIXTURE.directory)


def run_ckpt(*args, timeout: float = 300, background: bool = False, temp: Optional[Path] = None, **kwargs):
    """ckpt as the cluster's driver; ``temp``: its temporary directory (TMPDIR)."""
    command = [str(CKPT), *map(str, args)]
    env = driver_environment()
    if temp is not None:
        temp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(temp)
    if background:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, **kwargs)


def rescale_args(src, dst, master, *conf: str) -> list:
    return ["rescale", src, dst, "--parallelism", 3, "--plan", FIXTURE.plan, "--schema", COUNTJOB_SCHEMA,
            "--spark-master", master, *executor_args(*conf), "--json"]  # fmt: skip


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
    result = run_ckpt(*rescale_args(source, dst, cluster.url), temp=tmp_path / "temp")
    assert result.returncode == 0, result.stderr
    assert not list((tmp_path / "temp").iterdir()), "ckpt left files in its temporary directory"
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


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, dict]:
    """A checkpoint of the bench's generator at parallelism 6 whose rescale to 3 has three route
    tasks of about 8 MB each: on the pure record path, each writes its file for seconds."""
    checkpoint = tmp_path_factory.mktemp("generated") / "job" / "chk-3"
    return checkpoint, generate(checkpoint, 6, 36_000_000)


PURE = "spark.executorEnv.CKPT_FRAMING=python"  # the slower record path: longer route tasks


def attempt_id(name: str) -> str:
    return name.rsplit("-attempt-", 1)[1]


def first_attempt(cluster, process, dst: Path) -> tuple[int, str]:
    """The first route attempt seen writing its file in ``dst``: its executor's pid, and the file."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        for name in sorted(attempt_files(dst)):
            pid = cluster.executor_running(attempt_id(name))
            if pid is not None:
                return pid, name
        time.sleep(0.02)
    raise AssertionError(f"no route attempt was seen writing in {dst}: {process.poll()=}")


def referenced_files(checkpoint: Path) -> set[str]:
    inspected = json.loads(run_ckpt("inspect", checkpoint, "--json", "--engine", "local").stdout)
    channels = [c for o in inspected["operators"] for s in o["subtasks"] for c in s["channels"]]
    return {Path(c["file"]).name for c in channels if c["file"] and "ckpt-inflight-" in c["file"]}


def assert_only_winners_left(dst: Path, loser: str) -> None:
    final = attempt_files(dst)
    assert loser not in final, "the losing attempt's file is still there"
    assert final == referenced_files(dst), "DST holds files _metadata does not reference"
    tasks = {name.rsplit("-attempt-", 1)[0] for name in final}
    assert len(tasks) == len(final) == 3, f"not one file per route task: {sorted(final)}"


@pytest.mark.flink
def test_a_lost_executor_mid_rescale_is_retried_and_its_files_removed(cluster, generated, tmp_path):
    """The executor writing the first route attempt's file is killed while it writes: Spark reruns
    the task elsewhere, and only the winners' files are left. Also: executors whose compiled
    record-path module does not load (here: CKPT_FRAMING=python makes them not try) run the pure
    one, and the report says so."""
    source, info = generated
    dst = tmp_path / "rescaled" / "job" / source.name
    process = run_ckpt(*rescale_args(source, dst, cluster.url, PURE), background=True)
    try:
        pid, name = first_attempt(cluster, process, dst)
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert_only_winners_left(dst, name)
    report = json.loads(stdout)
    assert report["files_written"] >= 3 and report["records_out"] == report["records_in"] > 0
    assert len(report["warnings"]) == 1 and "pure NumPy/Python record path" in report["warnings"][0]
    assert "ckpt: warning: executors on" in stderr
    assert flink_env.restore_count("2.3.0", dst, 3, backend="hashmap") == info["expected_count"]


# a running task gets a copy on another host as soon as it takes longer than the others
SPECULATION = ("spark.speculation=true", "spark.speculation.interval=100ms", "spark.speculation.quantile=0.1",
               "spark.speculation.multiplier=1.1", "spark.speculation.minTaskRuntime=1s",
               "spark.speculation.efficiency.enabled=false")  # fmt: skip


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


@pytest.mark.flink
def test_a_speculative_copy_wins_and_ckpt_waits_for_the_late_attempt(cluster, generated, tmp_path):
    """The executor writing the first route attempt's file is frozen (SIGSTOP, with its Python
    workers) mid-write: Spark runs a speculative copy on the other worker, which wins. While the
    frozen attempt still runs, ckpt writes no ``_metadata``; thawed, it is killed (or ends), and
    DST holds exactly the files ``_metadata`` references."""
    source, info = generated
    dst = tmp_path / "rescaled" / "job" / source.name
    process = run_ckpt(*rescale_args(source, dst, cluster.url, PURE, *SPECULATION), background=True)
    frozen: list[int] = []
    try:
        pid, name = first_attempt(cluster, process, dst)
        frozen = descendants(pid)
        signal_all(frozen, signal.SIGSTOP)
        task = name.rsplit("-attempt-", 1)[0]
        deadline = time.monotonic() + 120
        sizes: list[dict] = []  # DST's attempt files and their sizes, each second
        while len(sizes) < 4 or len({json.dumps(s) for s in sizes[-4:]}) > 1:  # until unchanged for 3 s
            assert time.monotonic() < deadline and process.poll() is None, "ckpt did not wait"
            sizes.append({n: (dst / n).stat().st_size for n in attempt_files(dst)})
            time.sleep(1)
        copies = [n for n in sizes[-1] if n.startswith(task) and n != name]
        assert copies, f"no speculative copy of {name} ran: {sorted(sizes[-1])}"
        assert not (dst / "_metadata").exists() and process.poll() is None, "ckpt did not wait for the frozen attempt"
        signal_all(frozen, signal.SIGCONT)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        signal_all(frozen, signal.SIGCONT)
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    report = json.loads(stdout)
    assert report["records_out"] == report["records_in"] > 0
    assert_only_winners_left(dst, name)
    assert flink_env.restore_count("2.3.0", dst, 3, backend="hashmap") == info["expected_count"]


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
    temp = tmp_path / "temp"
    result = run_ckpt(*rescale_args(source, tmp_path / "out" / source.name, cluster.url, *wants), timeout=120, temp=temp)
    assert result.returncode == 2 and time.monotonic() - started < 60
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no executor of the Spark master {cluster.url} ran a task within 10 s" in lines[0]
    assert not cluster.settled_state()["activeapps"]
    assert not list(temp.glob("ckpt-spark-*.log"))  # the error names no log: none is left behind


def test_executors_on_another_python_minor_are_refused_naming_both_versions(cluster, source, tmp_path):
    """The executors start their Python workers with another minor version (a pyspark-only
    environment of it, given as PYSPARK_PYTHON): PySpark refuses them, ckpt says so in one line
    naming both versions, exit 2, and writes nothing."""
    other = workers_python(another_python_minor())
    dst = tmp_path / "out" / "job" / "chk-1"
    command = [str(CKPT), *map(str, rescale_args(source, dst, cluster.url))]
    env = {**driver_environment(), "PYSPARK_PYTHON": str(other / "bin" / "python")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    theirs, ours = python_minor(str(other / "bin" / "python")), python_minor(sys.executable)
    assert cluster.url in line and f"Python {theirs}" in line and f"Python {ours}" in line
    assert not (dst / "_metadata").exists() and not attempt_files(dst)


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
    on_cluster = ["--spark-master", cluster.url, *executor_args(), "--json"]
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


def test_executors_read_gcs_and_write_azure_with_the_drivers_settings(cluster, source, gcs_emulator, azurite):
    """The executors read Google Cloud Storage and write Azure (both emulators on 127.0.0.1, named
    by the driver's STORAGE_EMULATOR_HOST and AZURE_STORAGE_CONNECTION_STRING) through the shipped
    google-cloud-storage and azure-storage-blob."""
    from stores import AzureStore, GcsStore, upload_tree

    gcs, azure = GcsStore("cluster"), AzureStore("cluster")
    job = source.parent
    upload_tree(gcs, job, f"in/{job.name}")
    src, dst = gcs.uri(f"in/{job.name}/{source.name}"), azure.uri(f"out/job/{source.name}")
    result = run_ckpt(*rescale_args(src, dst, cluster.url))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["records_out"] == report["records_in"] > 0
    inflight = [k for k in azure.keys("out/") if "/ckpt-inflight-" in k]
    assert inflight and all("-attempt-" in k for k in inflight), "the executors wrote the in-flight files"
    verified = run_ckpt("verify", dst, "--plan", FIXTURE.plan, "--schema", COUNTJOB_SCHEMA, "--engine", "local", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
