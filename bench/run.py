"""`make bench`: ckpt rescale against the I/O floor, in one run.

For each size of channel state (GiB, default 0.1 1 4) a checkpoint at parallelism 64 is generated
(bench/generate.py) and rescaled to 48 with `ckpt rescale` on Spark local[*]. Printed per size:
wall time of `cp -r` of the checkpoint (the I/O floor), of `ckpt rescale`, their ratio, records
per second, output/input bytes, inflation and the driver's peak RSS. Then the time of a
metadata-only `ckpt inspect` of a checkpoint with 10,000 channel-state files, and Spark's start-up
time. The last line is for the largest size:

    ratio_vs_cp=<x> inflation=<y> peak_rss_mb=<z> inspect_10k_s=<t>
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from generate import FIXTURE, SCHEMA, generate  # noqa: E402

CKPT = [sys.executable, "-m", "ckpt_tool.cli.main"]
GIB = 1024**3


def _rss_mb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def _driver_pids(pid: int) -> list[int]:
    """The process and its JVM (Spark's driver, which in local mode also runs the executor),
    without Spark's Python workers (they belong to the executor side). OSError once it is gone."""
    pids = [pid]
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"java" in command:
            pids.append(int(child))
    return pids


def timed(command: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (MiB) of the driver (the process and its JVM), and its stdout."""
    subprocess.run(["sync"], check=True)  # each timed command starts with no dirty pages to write
    start = time.perf_counter()
    output = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (read after the process ends; not a pipe, which could block)
    process = subprocess.Popen(command, stdout=output, stderr=subprocess.DEVNULL, text=True)
    peak = 0
    while process.poll() is None:
        try:
            peak = max(peak, sum(_rss_mb(p) for p in _driver_pids(process.pid)))
        except OSError:
            pass
        time.sleep(0.05)
    output.seek(0)
    out = output.read()
    if process.returncode:
        raise RuntimeError(f"{' '.join(command)} failed with exit code {process.returncode}")
    return time.perf_counter() - start, peak, out


def spark_startup_seconds() -> float:
    """Start-up of Spark as ckpt runs it (SparkEngine's settings), one trivial job, and stop."""
    code = (
        "from ckpt_tool.engine import SparkEngine; e = SparkEngine(); e.start(); "
        "e.context.parallelize([1, 2], 2).count(); e.stop()"
    )
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=HERE.parent)
    return time.perf_counter() - start


def bench_size(work: Path, gib: float) -> dict:
    source = work / f"src-{gib}" / "job" / "chk-3"
    info = generate(source, 64, int(gib * GIB))
    copy_seconds, _, _ = timed(["cp", "-r", str(source), str(work / f"copy-{gib}")])
    target = work / f"out-{gib}" / "job" / "chk-3"
    seconds, rss, out = timed(
        [
            *CKPT,
            "rescale",
            str(source),
            str(target),
            "-p",
            "48",
            "--json",
            "--engine",
            "spark",
            "--plan",
            str(FIXTURE / "plan.json"),
            "--schema",
            str(SCHEMA),
        ]
    )
    report = json.loads(out)
    size_in = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    size_out = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    for directory in (source.parent.parent, work / f"copy-{gib}", target.parent.parent):
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "gib": gib,
        "cp_s": copy_seconds,
        "rescale_s": seconds,
        "ratio_vs_cp": seconds / copy_seconds,
        "records_per_s": report["records_in"] / seconds,
        "bytes_out_over_in": size_out / size_in,
        "inflation": report["inflation"],
        "peak_rss_mb": rss,
        "records": report["records_in"],
        "generated": info["generated_records"],
    }


def inspect_10k_seconds(work: Path) -> float:
    source = work / "files-10k" / "job" / "chk-3"
    generate(source, 100, 100 * 100 * 64, files_per_subtask=100)  # 100 subtasks x 100 files
    seconds, _, _ = timed([*CKPT, "inspect", "--json", str(source)])
    shutil.rmtree(source.parent.parent, ignore_errors=True)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.1, 1, 4], help="GiB of channel state")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as tmp:
        work = Path(tmp)
        print(f"spark_startup_s={spark_startup_seconds():.1f}", flush=True)
        rows = [bench_size(work, gib) for gib in args.sizes]
        for r in rows:
            print(
                f"size_gib={r['gib']} cp_s={r['cp_s']:.2f} rescale_s={r['rescale_s']:.2f} "
                f"ratio_vs_cp={r['ratio_vs_cp']:.1f} records_per_s={r['records_per_s']:.0f} "
                f"bytes_out_over_in={r['bytes_out_over_in']:.3f} inflation={r['inflation']:.2f} "
                f"peak_rss_mb={r['peak_rss_mb']}"
            )
        for small, large in zip(rows, rows[1:]):
            print(
                f"scaling: {large['gib'] / small['gib']:.0f}x the data ({small['gib']} -> {large['gib']} GiB) "
                f"in {large['rescale_s'] / small['rescale_s']:.2f}x the time",
                flush=True,
            )
        inspect_s = inspect_10k_seconds(work)
        last = rows[-1]
        print(
            f"ratio_vs_cp={last['ratio_vs_cp']:.1f} inflation={last['inflation']:.2f} "
            f"peak_rss_mb={last['peak_rss_mb']} inspect_10k_s={inspect_s:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
