"""`make bench-scale`: ckpt at growing parallelism, the same in-flight bytes.

For each parallelism (default 16 128 1024 4096) and channel layout (dense: every upstream ->
downstream channel of the keyed exchange holds data; sparse: one in ten), bench/generate.py writes
from fixtures/flink23-maxp4096-p2 a checkpoint of the same in-flight bytes: the largest parallelism
first, asked for ``--bytes``, and every smaller one then for the bytes that one holds (a filled
channel holds at least one record: p=4,096 dense holds 1.6 GB however little is asked, so at
p=16 the same 1.6 GB lie in 256 channels). Then, each under ``ulimit -n 1024``:
``ckpt inspect``, ``ckpt inspect --schema``, ``ckpt verify --schema``, ``ckpt rescale`` to 3p/4 and
``ckpt repair`` (every channel written back), each with ``--json`` (which lists every channel: p²
rows), ``ckpt inspect --schema --json --summary`` (the same report without its rows of single
channels), and ``ckpt inspect`` as it prints in a terminal (``inspect text``, a row per subtask past a
thousand channels), ``ckpt schema --plan`` and ``ckpt list --json`` of the job directory, with wall
and CPU seconds (this process's children: the command and its workers), the bytes each prints
(read through a pipe, as a consumer such as ``jq`` reads them) and peak RSS. Beside them, the
system's own copy of the checkpoint (``cp -r``, timed the same way): the floor of a command that
writes every byte again, and what the machine's own file costs do at the same bytes.
``metadata_vs_flink``: ckpt's metadata read (file bytes to parsed metadata, best of 3) over Flink's
own ``Checkpoints.loadCheckpointMetadata`` on the same ``_metadata`` (fixtures/java/LoadMetadataTimer.java,
best of 3, same run), at the largest parallelism; the loader also reads every rescaled and repaired output, and
Flink's classes (fixtures/java/ReferenceReader.java) count in it the records of the input, each in
its key group's subtask, none twice (``reference_records``; where the input's ``_metadata`` is larger
than LARGE_METADATA_MB or its in-flight bytes than LARGE_BYTES, Flink's reader gets 16 GiB and counts
the output only, against what the generator wrote plus its own count of the base fixture).
With ``--spark``, the rescale at p=1024 on Spark. With ``--down-to-one``, at the largest parallelism,
also ``rescale`` to parallelism 1 (one route task of all the bytes), then ``verify --schema`` and
``records`` of its output (one channel of all of them), and Flink's reader's count of that output.

The machine may be shared: wall times then vary with the load; CPU seconds vary less.
Per layout, each command's time at the largest p over its time at the smallest (CPU seconds),
and beside them the same ratio of the system's copy, of Flink's own loader and of ckpt's metadata
read (``_metadata`` holds a handle per channel: at dense it grows as p²).
The last line: ``scale_flatness`` = the worst of these ratios over every command,
``scale_flatness_named`` = the worst over the three #28 names (``inspect --schema``,
``verify --schema``, ``rescale``), and ``metadata_vs_flink``.

    python bench/scale.py [--parallelism 16 128 1024 4096] [--channels dense sparse] [--bytes 50000000] [--spark]
        [--handles plain|merged] [--down-to-one]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE.parent / "fixtures")]

from generate import LARGE_FIXTURE, SCHEMA, SLOW_COUNT, generate  # noqa: E402

import flink_env  # noqa: E402
from spark_cluster import tree_pss_mb, tree_rss_mb  # noqa: E402

CKPT = str(Path(sys.executable).parent / "ckpt")
OPEN_FILES = 1024
COMMANDS = (
    "inspect",
    "inspect --schema",
    "inspect --schema --summary",
    "verify --schema",
    "rescale",
    "repair",
    "inspect text",
    "schema",
    "list",
)
# the commands #28 names for its target of 2 (``scale_flatness`` covers every command)
NAMED = ("inspect --schema", "verify --schema", "rescale")


def _label(command: str) -> str:
    """A command's name in the printed lines: ``inspect --schema --summary`` is ``inspect_schema_summary``."""
    return command.replace(" --", "_").replace(" ", "_")


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def timed(command: list[str]) -> dict:
    """Wall and CPU seconds, the system's part of the CPU seconds (the kernel's work for the
    command), the bytes of its standard output (MB) and peak RSS and PSS (MiB, with every process
    it started: RSS counts a page a forked worker shares with its parent in both, PSS shares it
    out) of ``command``, run with at most OPEN_FILES open files.

    The output goes through a pipe to a reader here, as ``ckpt inspect --json | jq`` sends it, not
    into a file: on this project's VM the kernel's taking of 2.2 GB into the pages of a new file
    cost 6 to 7 s of system time by ``dd`` (1.2 s into tmpfs, 2.4 to 3 s through a pipe), and that
    was charged to the command (``inspect --json`` at p=4,096 dense writes 2.3 GB).
    Each starts with no dirty pages to write (as bench/run.py's): none pays for flushing what the
    generator (1.6 GB at p=4,096 dense, just before the first command) or the command before it
    wrote."""
    os.sync()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, preexec_fn=_limit_open_files)
        written = [0]

        def read_output() -> None:
            while chunk := process.stdout.read1(1 << 20):
                written[0] += len(chunk)

        reader = threading.Thread(target=read_output, daemon=True)
        reader.start()
        peak = peak_pss = 0
        while process.poll() is None:
            peak = max(peak, tree_rss_mb(process.pid))
            peak_pss = max(peak_pss, tree_pss_mb(process.pid))
            # every 50 ms for the first two seconds, then every half second: a sample of the PSS of
            # a driver and two workers of 2 GB each walks their page tables (about 80 ms at p=4,096
            # dense), and sampled every 50 ms it took most of a core of the two beside the command
            time.sleep(0.05 if time.perf_counter() - start < 2 else 0.5)
        reader.join()
        wall = time.perf_counter() - start
        process.stdout.close()
        errors.seek(0)
        error = errors.read().decode(errors="replace")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode not in (0, 1):  # verify exits 1 when it finds problems
        raise RuntimeError(f"{' '.join(command)} failed with exit code {process.returncode}: {error[-1000:]}")
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {
        "wall_s": wall,
        "cpu_s": user + system,
        "sys_s": system,
        "rss_mb": peak,
        "pss_mb": peak_pss,
        "out_mb": written[0] / 1e6,
    }


def metadata_read_seconds(checkpoint: Path) -> float:
    """ckpt's metadata read of ``checkpoint``: the file's bytes to parsed metadata, best of 3, in a
    fresh process (as a command reads it)."""
    code = (
        "import time; from ckpt_tool.flink.metadata import read_metadata\n"
        "best = 1e9\n"
        "for _ in range(3):\n"
        f"    start = time.perf_counter(); read_metadata(open({str(checkpoint / '_metadata')!r}, 'rb').read())\n"
        "    best = min(best, time.perf_counter() - start)\n"
        "print(best)\n"
    )
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def flink_load_seconds(checkpoint: Path) -> float:
    """Flink's ``Checkpoints.loadCheckpointMetadata`` of ``checkpoint``, best of 3, on a 6 GiB heap
    (a JobManager's for such a job: Flink's loader makes a ``Path`` per plain channel handle, and
    ran out of a 1 GiB heap on the 1.7 million of a p=4,096 sparse rescale's output)."""
    result = flink_env.run_java("2.3.0", "LoadMetadataTimer", [str(checkpoint), "3"], timeout=1800, jvm_flags=("-Xmx6g",))
    for line in result.stdout.splitlines():
        if line.startswith("LOAD_MS "):
            fields = dict(part.split("=") for part in line.split()[1:])
            return float(fields["best"]) / 1000
    raise RuntimeError(f"LoadMetadataTimer failed:\n{result.stderr[-2000:]}")


# Flink's reference reader holds every buffer of every channel as a Java object: a checkpoint
# whose `_metadata` is larger than this (p=4,096 dense: 472 MB in, 272 MB out) or whose in-flight
# bytes are more than LARGE_BYTES (p=16 with p=4,096 dense's 1.4 GB: 6.2 GB resident on a 6 GiB
# heap, 144 s) gets a 16 GiB heap
LARGE_METADATA_MB = 200
LARGE_BYTES = 1_000_000_000


def _large(checkpoint: Path) -> bool:
    in_flight = sum(f.stat().st_size for f in checkpoint.iterdir() if f.name != "_metadata")
    return (checkpoint / "_metadata").stat().st_size / 1e6 > LARGE_METADATA_MB or in_flight > LARGE_BYTES


def reference_keyed(checkpoint: Path, base: Path) -> dict:
    """Flink's own view (fixtures/java/ReferenceReader.java) of the keyed exchange into slow-count:
    its in-flight records, how many lie outside their key group's subtask, how many are held twice."""
    result = flink_env.run_java(
        "2.3.0",
        "ReferenceReader",
        [str(checkpoint), str(base / "operators.json")],
        timeout=3600,
        jvm_flags=("-Xmx16g" if _large(checkpoint) else "-Xmx6g", "-Dckpt.keyedOnly=true"),
    )
    if result.returncode != 0:
        raise RuntimeError(f"ReferenceReader failed on {checkpoint}:\n{result.stderr[-2000:]}")
    return next(k for k in json.loads(result.stdout)["keyed_operators"] if k["operator"] == SLOW_COUNT)


def down_to_one(source: Path, inputs: list[str], base: Path, before: dict) -> dict:
    """``rescale`` of ``source`` to parallelism 1 (one new input channel fed by every old one: one
    route task of all the bytes), then ``verify --schema``, ``records``, ``repair`` and ``rescale``
    to 4 of its output (one channel of all the in-flight data, which the last two route a piece at
    a time), timed as the other commands; Flink's reader counts the records of each output, none
    outside its key group's subtask, none twice."""
    single = source.parent.parent / "one" / "job" / "chk-3"
    repaired = source.parent.parent / "one-repaired" / "job" / "chk-3"
    four = source.parent.parent / "one-to-4" / "job" / "chk-3"
    runs = {
        "rescale": timed([CKPT, "rescale", str(source), str(single), "-p", "1", "--json", *inputs]),
        "verify --schema": timed([CKPT, "verify", str(single), "--json", *inputs]),
        "records": timed([CKPT, "records", str(single), "--out", str(single.parent.parent / "records.parquet"), *inputs]),
        "repair": timed([CKPT, "repair", str(single), str(repaired), "--json", *inputs]),
        "rescale to 4": timed([CKPT, "rescale", str(single), str(four), "-p", "4", "--json", *inputs]),
    }
    for output in (single, repaired, four):
        after = reference_keyed(output, base)
        if (after["records"], after["misplaced_records"], after["duplicate_records"]) != (before["records"], 0, 0):
            raise RuntimeError(f"{output}, from {source} rescaled to 1: Flink's reader finds {after}, before {before}")
        shutil.rmtree(output.parent.parent, ignore_errors=True)
    return {"runs": runs, "reference_records": after["records"]}


def bench_one(
    work: Path, parallelism: int, channels: str, total_bytes: int, spark: bool, handles: Optional[str] = None, one: bool = False
) -> dict:
    source = work / f"p{parallelism}-{channels}" / "job" / "chk-3"
    started = time.perf_counter()
    base = LARGE_FIXTURE  # one base at every parallelism: the same keyed state, max parallelism 4,096
    info = generate(source, parallelism, total_bytes, channels=channels, base=base, handles=handles)
    generated_s = time.perf_counter() - started
    inputs = ["--plan", str(base / "plan.json"), "--schema", str(SCHEMA)]
    target = source.parent.parent / "out" / "job" / "chk-3"
    repaired = source.parent.parent / "repaired" / "job" / "chk-3"
    # the floor of a command that writes every byte again (rescale, repair): the system's own copy
    # of the checkpoint, timed as the commands are
    copied = source.parent.parent / "copy"
    row_copy = timed(["cp", "-r", str(source.parent), str(copied)])
    shutil.rmtree(copied, ignore_errors=True)
    runs = {
        "inspect": timed([CKPT, "inspect", str(source), "--json"]),
        "inspect --schema": timed([CKPT, "inspect", str(source), "--json", *inputs]),
        "inspect --schema --summary": timed([CKPT, "inspect", str(source), "--json", "--summary", *inputs]),
        "verify --schema": timed([CKPT, "verify", str(source), "--json", *inputs]),
        "rescale": timed([CKPT, "rescale", str(source), str(target), "-p", str(max(1, 3 * parallelism // 4)), "--json", *inputs]),
        "repair": timed([CKPT, "repair", str(source), str(repaired), "--json", *inputs]),
        "inspect text": timed([CKPT, "inspect", str(source)]),
        "schema": timed([CKPT, "schema", str(source), "--plan", str(base / "plan.json")]),
        "list": timed([CKPT, "list", str(source.parent), "--json"]),
    }
    row = {
        "parallelism": parallelism,
        "channels": channels,
        "bytes": info["channel_state_bytes"],
        "metadata_mb": (source / "_metadata").stat().st_size / 1e6,
        "generate_s": generated_s,
        "copy": row_copy,
        "runs": runs,
    }
    flink_load_seconds(target)  # Flink's own loader accepts the rescaled output (it raises otherwise)
    flink_load_seconds(repaired)  # and the repaired one
    shutil.rmtree(repaired.parent.parent, ignore_errors=True)
    # and Flink's classes count the same records in it, each in its key group's subtask, none twice.
    # On an input of more than a few million channels (p=4,096 dense) Flink's reader does not finish
    # within 20 minutes on a 16 GiB heap (it does on ckpt's output of it, whose files are few), and on
    # one of more than LARGE_BYTES it takes minutes: there the input holds what the generator wrote on
    # top of the base, whose records Flink's reader counted (the fixture's expected.json)
    if _large(source):
        expected = json.loads((base / "expected.json").read_text())
        base_records = next(k["records"] for k in expected["keyed_operators"] if k["operator"] == SLOW_COUNT)
        before = {"records": info["generated_records"] + base_records}
        row["reference_input"] = "generated + the base fixture's count by Flink's reader"
    else:
        before = reference_keyed(source, base)
        row["reference_input"] = "Flink's reader"
    after = reference_keyed(target, base)
    if (after["records"], after["misplaced_records"], after["duplicate_records"]) != (before["records"], 0, 0):
        raise RuntimeError(f"the rescaled output of p={parallelism} {channels}: Flink's reader finds {after}, before {before}")
    row["reference_records"] = after["records"]
    if one:
        row["down_to_one"] = down_to_one(source, inputs, base, before)
    if spark:
        shutil.rmtree(target.parent.parent, ignore_errors=True)
        row["spark"] = timed([CKPT, "rescale", str(source), str(target), "-p", str(3 * parallelism // 4), "--json",
                              "--engine", "spark", *inputs])  # fmt: skip
    row["metadata_read_s"] = metadata_read_seconds(source)
    row["flink_load_s"] = flink_load_seconds(source)
    shutil.rmtree(source.parent.parent, ignore_errors=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parallelism", type=int, nargs="+", default=[16, 128, 1024, 4096])
    parser.add_argument("--channels", nargs="+", choices=("dense", "sparse"), default=["dense", "sparse"])
    parser.add_argument(
        "--bytes",
        type=int,
        default=50_000_000,
        help="in-flight bytes asked of the largest parallelism (the others get what it holds)",
    )
    parser.add_argument("--spark", action="store_true", help="also the rescale on Spark at p=1024")
    parser.add_argument("--work", help="where to write the checkpoints (default: a temporary directory)")
    parser.add_argument(
        "--handles", choices=("plain", "merged"), help="channel state handles to generate (default: as the base, merged)"
    )
    parser.add_argument(
        "--down-to-one",
        action="store_true",
        help="at the largest parallelism, also rescale to 1 and verify and export the output (one channel of all the bytes)",
    )
    args = parser.parse_args()
    flink_env.ensure_flink("2.3.0")
    work = Path(args.work or tempfile.mkdtemp(prefix="ckpt-bench-scale-"))
    rows = []
    try:
        for channels in args.channels:
            same_bytes = args.bytes
            for parallelism in sorted(args.parallelism, reverse=True):  # the largest sets the bytes of all
                spark, one = args.spark and parallelism == 1024, args.down_to_one and parallelism == max(args.parallelism)
                row = bench_one(work, parallelism, channels, same_bytes, spark, args.handles, one)
                if parallelism == max(args.parallelism):
                    same_bytes = row["bytes"]
                rows.append(row)
                runs = " ".join(
                    f"{_label(name)}_s={r['wall_s']:.2f}/{r['cpu_s']:.2f}cpu/{r['sys_s']:.2f}sys "
                    f"rss={r['rss_mb']} pss={r['pss_mb']} out_mb={r['out_mb']:.2f}"
                    for name, r in row["runs"].items()
                )
                copy = row["copy"]
                runs = f"copy_s={copy['wall_s']:.2f}/{copy['cpu_s']:.2f}cpu/{copy['sys_s']:.2f}sys {runs}"
                spark = f" spark_rescale_s={row['spark']['wall_s']:.2f}" if "spark" in row else ""
                print(
                    f"p={parallelism} channels={channels} bytes={row['bytes']} metadata_mb={row['metadata_mb']:.1f} "
                    f"{runs}{spark} metadata_read_s={row['metadata_read_s']:.4f} flink_load_s={row['flink_load_s']:.4f} "
                    f"reference_records={row['reference_records']}"
                    + ("" if row["reference_input"] == "Flink's reader" else " (input: generated + base)"),
                    flush=True,
                )
                if "down_to_one" in row:
                    one = row["down_to_one"]
                    print(
                        f"p={parallelism} channels={channels} down_to_one "
                        + " ".join(
                            f"{_label(name)}_s={r['wall_s']:.2f}/{r['cpu_s']:.2f}cpu rss={r['rss_mb']} pss={r['pss_mb']}"
                            for name, r in one["runs"].items()
                        )
                        + f" reference_records={one['reference_records']}",
                        flush=True,
                    )
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    ratios = {}
    for channels in args.channels:
        mine = [r for r in rows if r["channels"] == channels]
        low, high = min(mine, key=lambda r: r["parallelism"]), max(mine, key=lambda r: r["parallelism"])
        for name in COMMANDS:
            ratios[f"{channels}:{name}"] = high["runs"][name]["cpu_s"] / max(low["runs"][name]["cpu_s"], 1e-9)
        # beside them, not among them: the ratios of the system's copy of the checkpoint (the floor
        # of a command that writes every byte again) and of Flink's own metadata loader and ckpt's
        # metadata read on the same `_metadata` (which holds a handle per channel: p² at dense)
        copy_ratio = high["copy"]["cpu_s"] / max(low["copy"]["cpu_s"], 1e-9)
        flink_ratio = high["flink_load_s"] / max(low["flink_load_s"], 1e-9)
        read_ratio = high["metadata_read_s"] / max(low["metadata_read_s"], 1e-9)
        print(
            f"channels={channels} p{high['parallelism']}/p{low['parallelism']} (cpu) "
            + " ".join(f"{_label(name)}={ratios[f'{channels}:{name}']:.1f}" for name in COMMANDS)
            + f" (copy={copy_ratio:.1f} flink_load={flink_ratio:.0f} metadata_read={read_ratio:.0f})",
            flush=True,
        )
    largest = max(rows, key=lambda r: (r["parallelism"], r["metadata_mb"]))
    peak = max(r["runs"][name]["rss_mb"] for r in rows for name in COMMANDS)
    peak_pss = max(r["runs"][name]["pss_mb"] for r in rows for name in COMMANDS)
    named = max(ratio for key, ratio in ratios.items() if key.split(":", 1)[1] in NAMED)
    print(
        f"peak_rss_mb={peak} peak_pss_mb={peak_pss} scale_flatness={max(ratios.values()):.1f} "
        f"scale_flatness_named={named:.1f} metadata_vs_flink={largest['metadata_read_s'] / largest['flink_load_s']:.2f}"
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
