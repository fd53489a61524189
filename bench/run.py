"""`make bench`: ckpt against the I/O floor and against Flink itself, in one run.

1. Rescale: for each size of channel state (GiB, default 0.1 1 4) a checkpoint at parallelism 64 is
   generated (bench/generate.py) and rescaled to 48 with `ckpt rescale` and its default engine.
   Per size: `cp -r` of the checkpoint (the I/O floor), `ckpt rescale`, their ratio, records per
   second, output/input bytes, inflation and the driver's peak RSS (the ckpt process, its worker
   processes and, on Spark, its JVM).
2. verify and inspect at scale: `ckpt verify` and `ckpt inspect` with plan and schema (every record
   decoded) of the largest checkpoint, against `cp -r`, with their peak RSS.
3. Metadata-only `ckpt inspect` of a checkpoint with 10,000 channel-state files.
4. Against Flink's own rescale (--flink-gib, default 0.1): a generated checkpoint at parallelism 16
   is restored by Flink 2.3 at 12 as it is (Flink replicates the old buffers to every new subtask
   that may need them and filters records), and ckpt's rescale of it is restored the same way.
   Read amplification: the bytes Flink reads from channel-state files during the restore, over
   the in-flight bytes, counted by a file system registered for the scheme `counting://`
   (fixtures/java/v2.3/CountingFileSystem.java: the local file system, counting each file's bytes
   read) from which the restore reads the checkpoint. Recovery time: from the job's submission to
   its first completed checkpoint (Flink completes none while it recovers in-flight data).
5. On a Spark cluster (--cluster-gib, default 1): the rescale of 1. with the default engine, then
   with `--spark-master` on a standalone cluster of two one-core workers on this machine
   (fixtures/spark_cluster.py, as tests/test_spark_cluster.py starts it); `cluster_ratio_vs_local`
   is the cluster's time over the local one. `--cluster-only` runs this part alone.

The last line holds every figure as name=value; ``max_ratio_vs_cp_1gib_up`` is the worst ratio
to `cp -r` over the sizes from 1 GiB up (the target is at most 1; below 1 GiB ckpt's fixed cost of
start-up and read-back dominates, see README "Performance").
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE.parent / "fixtures")]

from generate import FIXTURE, SCHEMA, generate  # noqa: E402

import flink_env  # noqa: E402
from spark_cluster import driver_environment, executor_args, running_cluster, tree_rss_mb  # noqa: E402

CKPT = [str(Path(sys.executable).parent / "ckpt")]
INPUTS = ["--plan", str(FIXTURE / "plan.json"), "--schema", str(SCHEMA)]
GIB = 1024**3


def timed(command: list[str], env: Optional[dict[str, str]] = None) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (MiB) of the command with everything it started, and its stdout."""
    subprocess.run(["sync"], check=True)  # each timed command starts with no dirty pages to write
    start = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as output:  # not a pipe: a large output must not block
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.DEVNULL, text=True, env=env)
        peak = 0
        while process.poll() is None:
            peak = max(peak, tree_rss_mb(process.pid))
            time.sleep(0.05)
        elapsed = time.perf_counter() - start
        output.seek(0)
        out = output.read()
    if process.returncode not in (0, 1):  # verify exits 1 when it finds problems
        raise RuntimeError(f"{' '.join(command)} failed with exit code {process.returncode}")
    return elapsed, peak, out


def copy_seconds(source: Path, work: Path) -> float:
    seconds, _, _ = timed(["cp", "-r", str(source), str(work / "copy")])
    shutil.rmtree(work / "copy")
    return seconds


def bench_size(work: Path, gib: float, scale_reads: bool) -> dict:
    source = work / f"src-{gib}" / "job" / "chk-3"
    info = generate(source, 64, int(gib * GIB))
    cp_s = copy_seconds(source, work)
    target = work / f"out-{gib}" / "job" / "chk-3"
    seconds, rss, out = timed([*CKPT, "rescale", str(source), str(target), "-p", "48", "--json", *INPUTS])
    report = json.loads(out)
    size_in = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    size_out = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    row = {
        "gib": gib,
        "cp_s": cp_s,
        "rescale_s": seconds,
        "ratio_vs_cp": seconds / cp_s,
        "records_per_s": report["records_in"] / seconds,
        "bytes_out_over_in": size_out / size_in,
        "inflation": report["inflation"],
        "peak_rss_mb": rss,
        "engine": report["engine"],
        "generated": info["generated_records"],
    }
    if scale_reads:  # verify and inspect read and decode every record of the largest checkpoint
        verify_s, verify_rss, _ = timed([*CKPT, "verify", str(source), "--json", *INPUTS])
        inspect_s, inspect_rss, _ = timed([*CKPT, "inspect", str(source), "--json", *INPUTS])
        row |= {
            "verify_ratio_vs_cp": verify_s / cp_s,
            "verify_rss_mb": verify_rss,
            "inspect_ratio_vs_cp": inspect_s / cp_s,
            "inspect_rss_mb": inspect_rss,
        }
    for directory in (source.parent.parent, target.parent.parent):
        shutil.rmtree(directory, ignore_errors=True)
    return row


def inspect_10k_seconds(work: Path) -> float:
    source = work / "files-10k" / "job" / "chk-3"
    generate(source, 100, 100 * 100 * 64, files_per_subtask=100)  # 100 subtasks x 100 files
    seconds, _, _ = timed([*CKPT, "inspect", "--json", str(source)])
    shutil.rmtree(source.parent.parent, ignore_errors=True)
    return seconds


def flink_restore(checkpoint: Path, parallelism: int, work: Path) -> tuple[float, float, int]:
    """Flink 2.3 restores ``checkpoint`` (through counting://) at ``parallelism`` and runs to the end:
    (channel-state bytes read / in-flight bytes, seconds to the first checkpoint, records counted)."""
    inspected = json.loads(subprocess.run([*CKPT, "inspect", "--json", str(checkpoint)], capture_output=True,
                                          text=True, check=True).stdout)  # fmt: skip
    in_flight = sum(o["channel_state"][d]["bytes"] for o in inspected["operators"] for d in ("input", "output"))
    channel_files = {c["file"] for o in inspected["operators"] for s in o["subtasks"] for c in s["channels"] if c["file"]}
    args = flink_env.job_args("measure", parallelism=parallelism, n=1000, backend="hashmap",
                              checkpoint_dir=work / f"restored-{checkpoint.parent.parent.name}",
                              restore=f"counting://{checkpoint}", busy_us=0, timeout_s=1700)  # fmt: skip
    result = flink_env.run_java("2.3.0", "CountJob", args, timeout=1800)
    if result.returncode:
        raise RuntimeError(f"Flink's restore of {checkpoint} failed:\n{result.stderr[-2000:]}")
    read = 0
    recovery = float("nan")
    for line in result.stdout.splitlines():
        if line.startswith("READ "):
            _, path, count = line.rsplit(" ", 2)
            read += int(count) if path in channel_files else 0
        elif line.startswith("FIRST_CHECKPOINT_S "):
            recovery = float(line.split()[1])
    return read / in_flight, recovery, flink_env.final_count("tuple", result.stdout)


def against_flink(work: Path, gib: float) -> dict:
    source = work / "flink-src" / "job" / "chk-3"
    info = generate(source, 16, int(gib * GIB))
    native_read_x, native_recovery, native_count = flink_restore(source, 12, work)
    target = work / "flink-ckpt" / "job" / "chk-3"
    rescale_s, _, _ = timed([*CKPT, "rescale", str(source), str(target), "-p", "12", *INPUTS])
    ckpt_read_x, ckpt_recovery, ckpt_count = flink_restore(target, 12, work)
    for count in (native_count, ckpt_count):
        if count != info["expected_count"]:
            raise RuntimeError(f"a restore counted {count} records, not {info['expected_count']}")
    return {
        "native_restore_read_x": native_read_x,
        "ckpt_restore_read_x": ckpt_read_x,
        "native_recovery_s": native_recovery,
        "ckpt_recovery_s": ckpt_recovery,
        "ckpt_rescale_s": rescale_s,
    }


def against_cluster(work: Path, gib: float) -> dict:
    """The rescale of ``bench_size`` (64 -> 48) with the default engine on this machine, then on a
    Spark standalone cluster of two one-core workers on this machine (fixtures/spark_cluster.py),
    started before the timed run; the timed run includes the Spark application's start, its
    executors' start and the probe. The executor bundle is built before (it is cached across runs)."""
    from ckpt_tool.engine.shipping import executor_bundle

    base = work / "cluster"
    source = base / "src" / "job" / "chk-3"
    generate(source, 64, int(gib * GIB))
    executor_bundle()
    local_s, _, out = timed([*CKPT, "rescale", str(source), str(base / "local" / "job" / "chk-3"), "-p", "48", "--json", *INPUTS])
    local_engine = json.loads(out)["engine"]
    with running_cluster(base / "spark") as cluster:
        on_cluster = [*CKPT, "rescale", str(source), str(base / "out" / "job" / "chk-3"), "-p", "48", "--json", *INPUTS,
                      "--spark-master", cluster.url, *executor_args()]  # fmt: skip
        cluster_s, _, out = timed(on_cluster, env=driver_environment())
    report = json.loads(out)
    if report["engine"] != "spark" or report["records_out"] != report["records_in"]:
        raise RuntimeError(f"the rescale on the cluster did not run as expected: {report}")
    shutil.rmtree(base, ignore_errors=True)
    return {"local_s": local_s, "local_engine": local_engine, "cluster_s": cluster_s, "ratio": cluster_s / local_s}


def cluster_line(gib: float, cluster: dict) -> str:
    return (
        f"cluster_gib={gib} local_s={cluster['local_s']:.2f} local_engine={cluster['local_engine']} "
        f"cluster_s={cluster['cluster_s']:.2f} cluster_ratio_vs_local={cluster['ratio']:.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.1, 1, 4], help="GiB of channel state")
    parser.add_argument("--flink-gib", type=float, default=0.1, help="GiB of channel state for the Flink comparison")
    parser.add_argument("--cluster-gib", type=float, default=1, help="GiB of channel state for the cluster comparison")
    parser.add_argument("--cluster-only", action="store_true", help="only the comparison of the cluster with this machine")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as tmp:
        work = Path(tmp)
        if args.cluster_only:
            cluster = against_cluster(work, args.cluster_gib)
            print(cluster_line(args.cluster_gib, cluster), flush=True)
            print(f"cluster_ratio_vs_local={cluster['ratio']:.1f}")
            return 0
        rows = [bench_size(work, gib, gib == max(args.sizes)) for gib in args.sizes]
        for r in rows:
            print(
                f"size_gib={r['gib']} cp_s={r['cp_s']:.2f} rescale_s={r['rescale_s']:.2f} "
                f"ratio_vs_cp={r['ratio_vs_cp']:.1f} records_per_s={r['records_per_s']:.0f} "
                f"bytes_out_over_in={r['bytes_out_over_in']:.3f} inflation={r['inflation']:.2f} "
                f"peak_rss_mb={r['peak_rss_mb']} engine={r['engine']}",
                flush=True,
            )
        largest = rows[-1]
        print(
            f"size_gib={largest['gib']} verify_ratio_vs_cp={largest['verify_ratio_vs_cp']:.1f} "
            f"verify_rss_mb={largest['verify_rss_mb']} inspect_ratio_vs_cp={largest['inspect_ratio_vs_cp']:.1f} "
            f"inspect_rss_mb={largest['inspect_rss_mb']}",
            flush=True,
        )
        inspect_s = inspect_10k_seconds(work)
        flink = against_flink(work, args.flink_gib)
        print(
            f"flink_gib={args.flink_gib} native_restore_read_x={flink['native_restore_read_x']:.2f} "
            f"ckpt_restore_read_x={flink['ckpt_restore_read_x']:.2f} native_recovery_s={flink['native_recovery_s']:.1f} "
            f"ckpt_recovery_s={flink['ckpt_recovery_s']:.1f} ckpt_rescale_s={flink['ckpt_rescale_s']:.1f}",
            flush=True,
        )
        cluster = against_cluster(work, args.cluster_gib)
        print(cluster_line(args.cluster_gib, cluster), flush=True)
        print(
            f"max_ratio_vs_cp={max(r['ratio_vs_cp'] for r in rows):.1f} "
            f"max_ratio_vs_cp_1gib_up={max((r['ratio_vs_cp'] for r in rows if r['gib'] >= 1), default=float('nan')):.1f} "
            f"ratio_vs_cp={largest['ratio_vs_cp']:.1f} "
            f"verify_ratio_vs_cp={largest['verify_ratio_vs_cp']:.1f} verify_rss_mb={largest['verify_rss_mb']} "
            f"inspect_10k_s={inspect_s:.2f} peak_rss_mb={max(r['peak_rss_mb'] for r in rows)} "
            f"inflation={max(r['inflation'] for r in rows):.2f} "
            f"native_restore_read_x={flink['native_restore_read_x']:.2f} ckpt_restore_read_x={flink['ckpt_restore_read_x']:.2f} "
            f"native_recovery_s={flink['native_recovery_s']:.1f} ckpt_recovery_s={flink['ckpt_recovery_s']:.1f} "
            f"cluster_ratio_vs_local={cluster['ratio']:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
