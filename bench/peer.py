"""`make bench-peer`: ckpt side by side with Flink 2.3's own rescale, FLIP-547 off and on (issue #29).

For each size of in-flight data (GiB, default 0.1 1) a checkpoint at parallelism P (default 16) is
generated from the real fixture flink23-hashmap-p2 (bench/generate.py, as `make bench` does) and
restored at 3P/4 and at 3P/2 along four paths:

    (a) native, FLIP-547 off: Flink 2.3 restores the checkpoint as it is;
    (b) native, FLIP-547 on: the same with both options of FLIP547 below;
    (c) ckpt, FLIP-547 off: `ckpt rescale`, then Flink 2.3 restores its output;
    (d) ckpt, FLIP-547 on: the same output, restored with FLIP-547 on.

Flink runs fixtures/java/v2.3/PeerJob.java: CountJob's job (same operators and state) whose keyed
operator busy-waits `--busy-us` per record (recovery takes real time) and notes when it processes
a generated in-flight record; checkpoints every 100 ms, at least 10 s apart once one has completed
(the first is not delayed), every path on the same JVM heap, 8 GiB by default (--xmx; Flink 2.3.0's
native FLIP-547 path runs out of a 1 GiB heap at 1 GiB of in-flight data, and a figure needs all four
paths). Per path:

- ttfc_s: wall seconds from the start (ckpt's rescale included in (c) and (d)) to the first
  checkpoint the restored job completes; Flink's times run from PeerJob's main (the JVM's own start,
  the same on every path, is not counted);
- drain_s: wall seconds from the start until the last restored in-flight record is processed;
- read_x: channel-state bytes Flink reads during the restore over the in-flight bytes, counted by the
  file system of the scheme counting:// (fixtures/java/v2.3/CountingFileSystem.java, as `make bench`);
- first_inflation: channel-state bytes of that first checkpoint over the original in-flight bytes;
- count: the job's final count, which must be exact (and every generated record processed once).

Then a chain of three rescales, P -> 2P -> P/2 -> P, per path: Flink restores at the next
parallelism and the first checkpoint it completes after the restore is kept and restored at the
next; on the ckpt path ckpt rescales each checkpoint first and Flink restores with FLIP-547 on. The
chain's inflation is the in-flight bytes of the last checkpoint over the first. So that it measures
what the rescales carry, not how much the job happened to process, the job is gated during the
chain (--pause-ms: slow-count and the maps sleep per record, so the restored records stay in flight
and the sources add next to nothing, while checkpoints still run between records): a path that
carries every restored record once, and no replica, keeps 1.00. Flink without FLIP-547 completes no
checkpoint before its recovery ends, so on that path (native, FLIP-547 off) the job runs ungated to
the end of its recovery and its figure is what is left in flight then (0.00: nothing restored is
carried). `chain_inflation_ckpt_offline` is the chain of ckpt's own rescales with no Flink run in
between. A path that fails (Flink's restore, or ckpt refusing a checkpoint) is printed as it is and
its figures are nan.

Rows per size and path; the last line holds the figures as name=value, the worst over the sizes
from 1 GiB up (over all sizes when none is that large): ttfc_vs_flip547 (the better of (c) and (d)
over (b)), drain_vs_native ((c) over (a)), drain_vs_flip547 (the better of (c) and (d) over (b)),
read_x_native, read_x_flip547, read_x_ckpt, chain_inflation_native, chain_inflation_flip547,
chain_inflation_ckpt.

    python bench/peer.py [--sizes 0.1 1] [--parallelism 16] [--busy-us 2] [--no-chain] [--pause-ms 100]
        [--paths abcd] [--xmx 8g]
        [--chain-sizes 1]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE.parent / "fixtures")]

from generate import FIXTURE, SCHEMA, generate  # noqa: E402

import flink_env  # noqa: E402

CKPT = [str(Path(sys.executable).parent / "ckpt")]
INPUTS = ["--plan", str(FIXTURE / "plan.json"), "--schema", str(SCHEMA)]
GIB = 1024**3
VERSION = "2.3.0"
# FLIP-547's options as CheckpointingOptions in the 2.3.0 jar spells them (the release notes' key
# execution.checkpointing.unaligned.during-recovery.enabled is unknown to 2.3.0); see README.
FLIP547 = {
    "execution.checkpointing.unaligned.recover-output-on-downstream.enabled": "true",
    "execution.checkpointing.during-recovery.enabled": "true",
}
PATHS = {"a": ("native", False), "b": ("native", True), "c": ("ckpt", False), "d": ("ckpt", True)}
JVM_FLAGS: tuple[str, ...] = ()  # after flink_env's own flags: with --xmx, a heap that replaces theirs
CAPTURE_LIMIT_S = 900  # a chain step with no checkpoint by then is recorded as failed


def inspected(checkpoint: Path) -> tuple[int, set[str]]:
    """(channel-state bytes, the files holding them) of ``checkpoint``, from `ckpt inspect --json`."""
    result = subprocess.run([*CKPT, "inspect", "--json", str(checkpoint)], capture_output=True, text=True, check=True)
    report = json.loads(result.stdout)
    in_flight = sum(o["channel_state"][d]["bytes"] for o in report["operators"] for d in ("input", "output"))
    files = {c["file"] for o in report["operators"] for s in o["subtasks"] for c in s["channels"] if c["file"]}
    return in_flight, files


class RescaleRefused(Exception):
    """`ckpt rescale` refused its input (the message is ckpt's one-line error)."""


def rescale_seconds(source: Path, target: Path, parallelism: int) -> float:
    started = time.perf_counter()
    result = subprocess.run([*CKPT, "rescale", str(source), str(target), "-p", str(parallelism), *INPUTS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    if result.returncode:
        raise RescaleRefused(f"ckpt rescale of {source} to {parallelism}: {result.stderr.strip()[-500:]}")
    return time.perf_counter() - started


def flink(mode: str, checkpoint: Path, parallelism: int, work: Path, flip547: bool, busy_us: int, pause_ms: int = 0) -> dict:
    """PeerJob restores ``checkpoint`` (through counting://) at ``parallelism``: measure (to the end)
    or capture (the first checkpoint after the restore, kept)."""
    if work.exists():
        shutil.rmtree(work)
    args = [f"mode={mode}", f"parallelism={parallelism}", f"busy-us={busy_us}", f"checkpoint-dir={work / 'ck'}",
            f"restore=counting://{checkpoint}", f"first-copy={work / 'first' / 'chk-first'}", f"pause-ms={pause_ms}"]  # fmt: skip
    args += [f"-D{k}={v}" for k, v in FLIP547.items()] if flip547 else []
    limit = 3600 if mode == "measure" else CAPTURE_LIMIT_S
    try:
        result = flink_env.run_java(VERSION, "PeerJob", args, timeout=limit, jvm_flags=JVM_FLAGS)
    except subprocess.TimeoutExpired as late:  # e.g. a JVM whose heap is full, collecting garbage for ever
        tail = str(late.stderr or "")[-1000:]
        raise RuntimeError(f"PeerJob {mode} of {checkpoint}: no end within {limit} s, stopped:\n{tail}") from late
    if result.returncode:
        raise RuntimeError(f"PeerJob {mode} of {checkpoint} failed:\n{result.stderr[-2000:]}")
    out: dict = {"reads": {}}
    for line in result.stdout.splitlines():
        if line.startswith("READ "):
            _, path, count = line.rsplit(" ", 2)
            out["reads"][path] = out["reads"].get(path, 0) + int(count)
        elif line.startswith(("FIRST_CHECKPOINT_S ", "DRAIN_S ")):
            out[line.split()[0].lower()] = float(line.split()[1])
        elif line.startswith("RESTORED_RECORDS "):
            out["restored_records"] = int(line.split()[1])
        elif line.startswith("CAPTURED "):
            out["captured"] = Path(line.split(" ", 1)[1])
    if mode == "measure":
        out["count"] = flink_env.final_count("tuple", result.stdout)
        out["first"] = work / "first" / "chk-first"
    return out


def paths(work: Path, source: Path, info: dict, target: int, busy_us: int, which: str = "abcd") -> dict:
    """The four paths (or those named in ``which``) at one new parallelism."""
    in_flight, files = inspected(source)
    rescaled = work / f"ckpt-{target}" / "job" / source.name
    ckpt_s = rescale_seconds(source, rescaled, target)
    _, rescaled_files = inspected(rescaled)
    rows = {}
    nan = float("nan")
    for name, (how, flip547) in PATHS.items():
        if name not in which:
            continue
        start = ckpt_s if how == "ckpt" else 0.0
        checkpoint, channel_files = (rescaled, rescaled_files) if how == "ckpt" else (source, files)
        try:
            run = flink("measure", checkpoint, target, work / f"run-{name}-{target}", flip547, busy_us)
            first_bytes, _ = inspected(run["first"])
        except (RuntimeError, subprocess.CalledProcessError) as failed:  # recorded as it is, the row is nan
            print(f"path ({name}) at {target} failed: {failed}", flush=True)
            rows[name] = {"ttfc_s": nan, "drain_s": nan, "ckpt_s": start, "read_x": nan, "first_inflation": nan,
                          "count": -1, "exact": False}  # fmt: skip
            continue
        read = sum(n for path, n in run["reads"].items() if path in channel_files)
        rows[name] = {
            "ttfc_s": start + run["first_checkpoint_s"],
            "drain_s": start + run["drain_s"],
            "ckpt_s": start,
            "read_x": read / in_flight,
            "first_inflation": first_bytes / in_flight,
            "count": run["count"],
            "exact": run["count"] == info["expected_count"] and run["restored_records"] == info["generated_records"],
        }
        if not rows[name]["exact"]:
            print(
                f"path ({name}) at {target}: counted {run['count']} (expected {info['expected_count']}), "
                f"processed {run['restored_records']} of {info['generated_records']} generated records",
                flush=True,
            )
        shutil.rmtree(work / f"run-{name}-{target}", ignore_errors=True)
    shutil.rmtree(rescaled.parent.parent, ignore_errors=True)
    return rows


def chain(work: Path, source: Path, parallelism: int, busy_us: int, pause_ms: int, which: list[str]) -> dict:
    """In-flight bytes of the last checkpoint over the first after P -> 2P -> P/2 -> P, per path.

    The job is gated (``pause_ms`` per record, PeerJob's pause-ms) so that the restored records stay
    in flight and each step's first checkpoint must carry them; only where Flink cannot complete a
    checkpoint before its recovery ends (FLIP-547 off) does the job run ungated, to the end of its
    recovery (a gated job would never checkpoint), so nothing restored is left to carry."""
    steps = [2 * parallelism, max(1, parallelism // 2), parallelism]
    first, _ = inspected(source)
    out = {}
    work = work / f"chain-{source.parent.parent.name}"
    for name, how, flip547 in (("native", "native", False), ("flip547", "native", True), ("ckpt", "ckpt", True)):
        if name not in which:
            continue
        current = source
        gate = pause_ms if flip547 else 0
        try:
            for i, target in enumerate(steps):
                if how == "ckpt":
                    rescaled = work / f"chain-{name}-{i}-ckpt" / "job" / current.name
                    rescale_seconds(current, rescaled, target)
                    current = rescaled
                run = flink("capture", current, target, work / f"chain-{name}-{i}", flip547, busy_us, gate)
                current = run["captured"]
                print(
                    f"chain {name} step {i + 1} ({target}): first checkpoint at {run['first_checkpoint_s']:.1f} s, "
                    f"in-flight {inspected(current)[0] / first:.4f} of the first",
                    flush=True,
                )
        except (RescaleRefused, RuntimeError) as failed:  # reported as it is; the chain's figure is nan
            print(f"chain {name}: step {i + 1}: {failed}", flush=True)
            out[name] = float("nan")
            continue
        out[name] = inspected(current)[0] / first
    current = source
    for i, target in enumerate(steps):
        rescaled = work / f"chain-offline-{i}" / "job" / current.name
        rescale_seconds(current, rescaled, target)
        current = rescaled
    out["ckpt_offline"] = inspected(current)[0] / first
    shutil.rmtree(work, ignore_errors=True)
    return out


def worst_of(name: str, values: list[float]) -> float:
    """The worst of ``values``: nan if any is (a path failed), the farthest from 1 for a chain's
    inflation, else the largest."""
    if not values or any(math.isnan(v) for v in values):
        return float("nan")
    return max(values, key=lambda v: abs(v - 1)) if name.startswith("chain_") else max(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.1, 1], help="GiB of in-flight data")
    parser.add_argument("--parallelism", type=int, default=16, help="P: restored at 3P/4 and 3P/2")
    parser.add_argument("--busy-us", type=int, default=2, help="the keyed operator's busy wait per record")
    parser.add_argument("--no-chain", action="store_true", help="without the chain of three rescales")
    parser.add_argument("--pause-ms", type=int, default=100, help="the chain's gate: sleep per record (FLIP-547 on)")
    parser.add_argument("--paths", default="abcd", help="only these of the paths (a) to (d); the figures need all")
    parser.add_argument("--xmx", default="8g", help="the Flink JVM's heap on every path (default: 8g)")
    parser.add_argument("--chain-paths", nargs="+", default=["native", "flip547", "ckpt"], help="the chain's paths")
    parser.add_argument("--chain-sizes", type=float, nargs="*", help="sizes that run the chain (default: all)")
    args = parser.parse_args()
    if args.xmx:
        global JVM_FLAGS
        JVM_FLAGS = (f"-Xmx{args.xmx}",)
    p = args.parallelism
    summary = []
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-peer-") as tmp:
        work = Path(tmp)
        for gib in args.sizes:
            source = work / f"src-{gib}" / "job" / "chk-3"
            info = generate(source, p, int(gib * GIB))
            figures: dict = {"gib": gib}
            for target in (3 * p // 4, 3 * p // 2):
                rows = paths(work, source, info, target, args.busy_us, args.paths)
                for name, r in rows.items():
                    how, flip547 = PATHS[name]
                    print(
                        f"size_gib={gib} {p}->{target} path=({name}) {how} flip547={'on' if flip547 else 'off'} "
                        f"ckpt_s={r['ckpt_s']:.2f} ttfc_s={r['ttfc_s']:.2f} drain_s={r['drain_s']:.2f} "
                        f"read_x={r['read_x']:.2f} first_inflation={r['first_inflation']:.2f} "
                        f"count={r['count']} exact={r['exact']}",
                        flush=True,
                    )
                if len(rows) < len(PATHS):
                    continue
                a, b, c, d = (rows[k] for k in "abcd")
                figures.setdefault("ttfc_vs_flip547", []).append(min(c["ttfc_s"], d["ttfc_s"]) / b["ttfc_s"])
                figures.setdefault("drain_vs_native", []).append(c["drain_s"] / a["drain_s"])
                figures.setdefault("drain_vs_flip547", []).append(min(c["drain_s"], d["drain_s"]) / b["drain_s"])
                figures.setdefault("read_x_native", []).append(a["read_x"])
                figures.setdefault("read_x_flip547", []).append(b["read_x"])
                figures.setdefault("read_x_ckpt", []).append(max(c["read_x"], d["read_x"]))
            if not args.no_chain and (args.chain_sizes is None or gib in args.chain_sizes):
                inflation = chain(work, source, p, args.busy_us, args.pause_ms, args.chain_paths)
                print(
                    f"size_gib={gib} chain {p}->{2 * p}->{max(1, p // 2)}->{p} "
                    + " ".join(f"chain_inflation_{k}={v:.2f}" for k, v in inflation.items()),
                    flush=True,
                )
                for k, v in inflation.items():
                    figures[f"chain_inflation_{k}"] = [v]
            worst = {k: worst_of(k, v) for k, v in figures.items() if k != "gib"}
            print(f"size_gib={gib} " + " ".join(f"{k}={v:.2f}" for k, v in worst.items()), flush=True)
            summary.append((gib, worst))
            shutil.rmtree(source.parent.parent, ignore_errors=True)
    large = [w for gib, w in summary if gib >= 1] or [w for _, w in summary]
    keys = ["ttfc_vs_flip547", "drain_vs_native", "drain_vs_flip547", "read_x_native", "read_x_flip547", "read_x_ckpt"]
    if not args.no_chain:
        keys += ["chain_inflation_native", "chain_inflation_flip547", "chain_inflation_ckpt"]
    print(" ".join(f"{k}={worst_of(k, [w[k] for w in large if k in w]):.2f}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
