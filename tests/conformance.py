"""`make conformance`: ckpt rescales every job shape Flink's own rescale tests rescale, and real Flink
agrees, cell by cell.

    python tests/conformance.py                     # the whole grid on Flink 2.3.0 and 1.20.3
    python tests/conformance.py --versions 2.3.0 --topologies pipeline union

The jobs are fixtures/java/ConformanceJob.java (the shapes of Flink's UnalignedCheckpointRescaleITCase:
pipeline, union, multi_input, keyed_different_parallelism, broadcast, keyed_broadcast, and ckpt's own
stateless_sink and partially_finished). Each cell `topology old->new`:

1. capture: real Flink runs the job at `old` under backpressure (a slow sink) with unaligned
   checkpoints and keeps a checkpoint; Flink's own classes (fixtures/java/ConformanceReader.java)
   must find in-flight data on every exchange whose parallelism changes (a broadcast exchange must
   hold none);
2. ckpt rescale: the installed `ckpt` binary, from another directory, without an activated
   virtualenv, default engine, with the job's plan and a schema;
3. reader: Flink's classes read the output: every exchange holds the same records as before
   (multiset of ids) and every record of a keyed exchange sits in its key group's subtask;
4. restore: real Flink restores the output at `new` and runs to the end; the sink logs every id
   it receives, so the ids it had before the checkpoint (in the capture's log, before the
   checkpoint's barrier) and the ids of the restored run must together be every id exactly once;
5. on Flink 2.3, the column "2.3 FLIP-547": the same output of step 2 restored again, now with
   FLIP-547's two options on (FLIP547 below: checkpointing during recovery, output buffers
   recovered on the downstream side), with the same exact count.

Captures are shared by the cells that start from the same parallelism. After the table, with
FLIP-547's column, the repeated chain (CHAIN, Conformance.chain): ckpt rescales Flink's checkpoint,
Flink restores it with FLIP-547 on and completes a checkpoint during recovery (restored records still
in flight), ckpt rescales that one again and Flink restores it with every id exactly once over the
three runs. The last line is `conformance: P passed, F failed`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "fixtures"))

import flink_env  # noqa: E402

CKPT = Path(sys.executable).parent / "ckpt"  # the console script pip installed
VERSIONS = ("2.3.0", "1.20.3")
# FLIP-547 (Flink 2.3.0, both off by default), as CheckpointingOptions in the 2.3.0 jar spells them:
# the release notes say `execution.checkpointing.unaligned.during-recovery.enabled`, which Flink
# 2.3.0 does not know (an unknown key is ignored). Checkpointing during recovery needs both on
# (CheckpointingOptions#isCheckpointingDuringRecoveryEnabled).
FLIP547 = {
    "execution.checkpointing.unaligned.recover-output-on-downstream.enabled": "true",
    "execution.checkpointing.during-recovery.enabled": "true",
}
FLIP547_VERSION = "2.3.0"  # the first release with FLIP-547
FLIP547_COLUMN = "2.3 FLIP-547"
RECOVERY_SLOWDOWN = 50  # the chain's restore under FLIP-547: a sink this much slower, so recovery takes seconds
# The repeated chain (Conformance.chain): topology, parallelism of Flink's checkpoint, after ckpt's
# first rescale, after its second.
CHAIN = ("union", 2, 3, 2)
RECORDS = 200_000  # ids 0..RECORDS-1, each through the job exactly once
SINK_BUSY_US = 20  # the sink's time per record: it backpressures the whole job
GRID: dict[str, list[tuple[int, int]]] = {
    "pipeline": [(1, 2), (2, 1), (3, 7), (7, 3), (20, 21), (21, 20), (3, 3)],
    "union": [(2, 3), (3, 2), (4, 8), (8, 4), (2, 2)],
    "multi_input": [(1, 2), (2, 1), (3, 7), (7, 3), (7, 7)],
    "keyed_different_parallelism": [(2, 3), (3, 2), (4, 8), (8, 4), (4, 4)],
    "broadcast": [(1, 2), (2, 1), (3, 7), (7, 3), (3, 3)],
    "keyed_broadcast": [(2, 3), (3, 2), (4, 8), (8, 4), (2, 2)],
    "stateless_sink": [(3, 5), (3, 2), (2, 3), (4, 8), (8, 4), (3, 3)],
    "partially_finished": [(4, 1), (2, 3), (3, 2), (4, 8), (8, 4), (4, 4)],
}
# CI runs one cell per topology (tests/test_conformance.py).
CAPTURE_ATTEMPTS = 3  # captures of one topology and parallelism, where Flink's checkpoint caught too little

CI_CELLS = [
    ("pipeline", 1, 2),
    ("union", 2, 3),
    ("multi_input", 2, 1),
    ("keyed_different_parallelism", 2, 3),
    ("broadcast", 1, 2),
    ("keyed_broadcast", 2, 3),
    ("stateless_sink", 3, 5),
    ("partially_finished", 4, 1),
]


class CellFailure(Exception):
    def __init__(self, step: str, detail: str):
        super().__init__(f"{step}: {detail}")
        self.step = step


@dataclass
class Capture:
    """A checkpoint real Flink wrote for one topology at one parallelism, with what it knows of it."""

    checkpoint: Path
    graph: dict
    plan: Path
    log: Path
    reading: dict  # ConformanceReader's view

    @property
    def checkpoint_id(self) -> int:
        return int(self.checkpoint.name.split("-")[1])


@dataclass
class Conformance:
    version: str
    work: Path
    captures: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)  # cell directory -> ckpt's checked output, or its failure
    retaken: dict = field(default_factory=dict)  # (topology, parallelism) -> how often its capture was taken again

    def java(self, main: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return flink_env.run_java(self.version, main, list(args), timeout=timeout)

    def job(self, mode: str, topology: str, parallelism: int, where: Path, *extra: str) -> subprocess.CompletedProcess:
        return self.java(
            "ConformanceJob",
            f"mode={mode}",
            f"topology={topology}",
            f"parallelism={parallelism}",
            f"n={RECORDS}",
            f"busy-us={SINK_BUSY_US}",
            f"checkpoint-dir={where / 'ck'}",
            f"log-dir={where / 'logs'}",
            f"plan-dir={where / 'plan'}",
            *extra,
        )

    def read(self, checkpoint: Path, graph: Path) -> dict:
        result = self.java("ConformanceReader", str(checkpoint), str(graph))
        if result.returncode:
            raise CellFailure("reader", result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed")
        return json.loads(result.stdout)

    def capture(self, topology: str, parallelism: int) -> Capture:
        key = (topology, parallelism)
        if key not in self.captures:
            taken = self.retaken.get(key, 0)
            where = self.work / (f"{topology}-{parallelism}" + (f"-again{taken}" if taken else ""))
            result = self.job("capture", topology, parallelism, where, "target-checkpoint=3")
            if result.returncode or "CAPTURED " not in result.stdout:
                self.captures[key] = CellFailure("capture", (result.stderr.strip() or "no checkpoint").splitlines()[-1])
            else:
                checkpoint = Path(result.stdout.split("CAPTURED ")[1].split()[0])
                graph = json.loads((where / "plan" / "graph.json").read_text())
                reading = self.read(checkpoint, where / "plan" / "graph.json")
                self.captures[key] = Capture(
                    checkpoint, graph, where / "plan" / "plan.json", where / "logs" / "capture-sink-0.log", reading
                )
        found = self.captures[key]
        if isinstance(found, CellFailure):
            raise found
        return found

    def new_parallelism(self, topology: str, parallelism: int, cell: Path) -> dict[str, int]:
        """Each operator's parallelism in the job at ``parallelism``, from Flink's own job graph."""
        result = self.job("plan", topology, parallelism, cell / "new")
        if result.returncode:
            raise CellFailure("capture", f"plan at {parallelism}: {result.stderr.strip()[-300:]}")
        graph = json.loads((cell / "new" / "plan" / "graph.json").read_text())
        return {op["id"]: v["parallelism"] for v in graph["vertices"] for op in v["operators"]}

    def cell(
        self, topology: str, old: int, new: int, source: Capture | None = None, name: str = "", flip547: bool = False
    ) -> None:
        """One cell; ``source`` replaces the captured checkpoint (a checkpoint derived from it);
        ``flip547``: Flink restores with FLIP-547's options on (the rescaled output is shared with
        the cell without them)."""
        cell = self.work / f"{topology}-{old}-{new}{name}"
        if source is not None:
            destination = self.rescaled(topology, old, new, source, cell)
        else:
            destination, source = self.rescaled_capture(topology, old, new, cell)
        self.restore(topology, new, destination, cell / ("flip547" if flip547 else "plain"), [source], flip547)

    def rescaled_capture(self, topology: str, old: int, new: int, cell: Path) -> tuple[Path, Capture]:
        """``rescaled`` of Flink's capture at ``old``, taken again (at most ``CAPTURE_ATTEMPTS`` in
        all) where Flink's checkpoint held no in-flight data on an exchange that must hold some:
        which buffers a checkpoint catches is Flink's timing (a REBALANCE exchange at parallelism
        1 was once empty at checkpoint 3), not what the cell tests."""
        key = (topology, old)
        for _ in range(CAPTURE_ATTEMPTS - 1):
            source = self.capture(topology, old)
            try:
                return self.rescaled(topology, old, new, source, cell), source
            except CellFailure as failure:
                if failure.step != "in-flight":
                    raise
            del self.captures[key]
            self.retaken[key] = self.retaken.get(key, 0) + 1
            prefix = f"{topology}-{old}-"  # every cell rescaled from the old capture
            for done in [c for c in self.outputs if c.name.startswith(prefix)]:
                del self.outputs[done]
        source = self.capture(topology, old)  # the last attempt: its failure is the cell's
        return self.rescaled(topology, old, new, source, cell), source

    def rescaled(self, topology: str, old: int, new: int, source: Capture, cell: Path, require_in_flight: bool = True) -> Path:
        """ckpt's rescale of ``source`` to ``new``, checked by Flink's classes (once per cell);
        ``require_in_flight``: every exchange whose parallelism changes must hold in-flight data."""
        if cell not in self.outputs:
            try:
                self.outputs[cell] = self._rescale(topology, old, new, source, cell, require_in_flight)
            except CellFailure as failure:
                self.outputs[cell] = failure
        found = self.outputs[cell]
        if isinstance(found, CellFailure):
            raise found
        return found

    def _rescale(self, topology: str, old: int, new: int, source: Capture, cell: Path, require_in_flight: bool) -> Path:
        after = self.new_parallelism(topology, new, cell)
        before = {op["id"]: v["parallelism"] for v in source.graph["vertices"] for op in v["operators"]}
        if require_in_flight:
            check_in_flight(source, before, after)
        if topology == "partially_finished" and old > 1:
            source_id = next(v["operators"][0]["id"] for v in source.graph["vertices"] if not v["inputs"])
            if source.reading["operators"][source_id]["finished"] != "partial":
                raise CellFailure("capture", "the source is not partially finished")
        destination = cell / "out" / source.checkpoint.parent.name / source.checkpoint.name
        rescale(source, destination, old, new, before, after, cell)
        check_records(source.reading, self.read(destination, source.plan.parent / "graph.json"))
        return destination

    def restore(
        self, topology: str, parallelism: int, checkpoint: Path, where: Path, earlier: list[Capture], flip547: bool = False
    ) -> None:
        """Flink restores ``checkpoint`` and runs to the end; with the ids the sink had before each
        checkpoint of ``earlier`` (the chain of captures that led to it) every id exactly once."""
        conf = [f"-D{k}={v}" for k, v in FLIP547.items()] if flip547 else []
        restored = self.job("restore", topology, parallelism, where, f"restore={checkpoint}", *conf)
        if restored.returncode:
            raise CellFailure("restore", (restored.stderr.strip() or "failed").splitlines()[-1][:300])
        check_exactly_once(earlier, where / "logs")

    def recovering_capture(self, topology: str, parallelism: int, checkpoint: Path, where: Path) -> Capture:
        """Flink restores ``checkpoint`` at ``parallelism`` with FLIP-547 on and a sink
        ``RECOVERY_SLOWDOWN`` times slower, and keeps (RETAIN_ON_CANCELLATION) the first checkpoint
        it completes after the restore, while the restored in-flight records are still being processed."""
        restored_id = int(checkpoint.name.split("-")[1])
        result = self.job(
            "capture",
            topology,
            parallelism,
            where,
            f"restore={checkpoint}",
            f"target-checkpoint={restored_id + 1}",
            f"busy-us={SINK_BUSY_US * RECOVERY_SLOWDOWN}",
            *[f"-D{k}={v}" for k, v in FLIP547.items()],
        )
        if result.returncode or "CAPTURED " not in result.stdout:
            raise CellFailure("capture during recovery", (result.stderr.strip() or "no checkpoint").splitlines()[-1][:300])
        taken = Path(result.stdout.split("CAPTURED ")[1].split()[0])
        graph = json.loads((where / "plan" / "graph.json").read_text())
        reading = self.read(taken, where / "plan" / "graph.json")
        return Capture(taken, graph, where / "plan" / "plan.json", where / "logs" / "capture-sink-0.log", reading)

    def chain(self, topology: str, first: int, second: int, third: int, flip547: bool = True) -> dict:
        """The repeated chain: ckpt rescales Flink's checkpoint ``first -> second``; Flink restores
        it with FLIP-547 on and completes a checkpoint during recovery; ckpt rescales that one
        ``second -> third``; Flink restores it (``flip547``: with FLIP-547 on) with every id
        exactly once over the three runs. Returns what the checkpoint taken during recovery holds."""
        source = self.capture(topology, first)
        base = self.work / f"chain-{topology}-{first}-{second}-{third}"
        rescaled = self.rescaled(topology, first, second, source, base / "one", require_in_flight=False)
        middle = self.recovering_capture(topology, second, rescaled, base / "recovering")
        restored = in_flight_ids(self.read(rescaled, source.plan.parent / "graph.json"))
        still = restored & in_flight_ids(middle.reading)
        if not still:
            raise CellFailure("capture during recovery", "no restored in-flight record is in flight in the new checkpoint")
        again = self.rescaled(topology, second, third, middle, base / "two", require_in_flight=False)
        self.restore(topology, third, again, base / ("flip547" if flip547 else "plain"), [source, middle], flip547)
        return {
            "restored_in_flight": len(restored),
            "still_in_flight": len(still),
            "in_flight": len(in_flight_ids(middle.reading)),
            "checkpoint": middle.checkpoint,
        }


ALIGNED_ONLY = ("BROADCAST", "FORWARD", "RESCALE")


def check_in_flight(source: Capture, before: dict, after: dict) -> None:
    """Every exchange whose parallelism changes holds in-flight data, except the inputs of a vertex
    that has a broadcast or pointwise input: Flink checkpoints all inputs of such a vertex aligned
    (StreamGraphGenerator), so they must hold none."""
    aligned = {e["downstream"] for e in source.reading["exchanges"] if e["ship_strategy"] in ALIGNED_ONLY}
    for exchange in source.reading["exchanges"]:
        changes = any(before[op] != after[op] for op in (exchange["upstream"], exchange["downstream"]))
        records = len(exchange["records"])
        name = f"{exchange['ship_strategy']} exchange into {exchange['downstream']}"
        if exchange["downstream"] in aligned:
            if records:
                raise CellFailure("in-flight", f"{name} holds {records} records, though Flink aligns it")
        elif changes and not records:
            raise CellFailure("in-flight", f"{name} holds no in-flight data")


def schema(graph: dict) -> str:
    """The TOML schema of a conformance job: every exchange by operator id, Tuple3<Long,Long,String> keyed by f1."""
    vertices = {v["id"]: v for v in graph["vertices"]}
    lines = []
    for vertex in graph["vertices"]:
        for edge in vertex["inputs"]:
            upstream = vertices[edge["upstream_vertex"]]["operators"][-1]["id"]
            lines += [
                "[[exchange]]",
                f'upstream = "{upstream}"',
                f'downstream = "{vertex["operators"][0]["id"]}"',
                f"gate = {edge['gate']}",
                f"partition = {edge['partition']}",
                f'partitioner = "{edge["ship_strategy"]}"',
                'type = "tuple<long,long,string>"',
            ]
            if edge["ship_strategy"] == "HASH":
                lines.append('key = ["f1"]')
            lines.append("")
    return "\n".join(lines)


def rescale(source: Capture, destination: Path, old: int, new: int, before: dict, after: dict, cell: Path) -> None:
    """The installed ckpt, run as a user runs it: by path, from another directory, no virtualenv."""
    (cell / "schema.toml").write_text(schema(source.graph))
    overrides = [
        f"--operator={op}={after[op]}" for op in sorted(after) if after[op] != (new if before[op] == old else before[op])
    ]
    command = [
        str(CKPT),
        "rescale",
        str(source.checkpoint),
        str(destination),
        "--parallelism",
        str(new),
        "--plan",
        str(source.plan),
        "--schema",
        str(cell / "schema.toml"),
        # the job's plan at the new parallelism: its rebalance() into the sink stays unchained at
        # equal parallelisms, which the plan of the old job cannot show (ckpt_tool/topology.py)
        "--target-plan",
        str(cell / "new" / "plan" / "plan.json"),
        "--json",
        *overrides,
    ]
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    with tempfile.TemporaryDirectory() as elsewhere:
        result = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode:
        raise CellFailure("ckpt rescale", (result.stderr.strip() or f"exit {result.returncode}").splitlines()[-1][:400])
    report = json.loads(result.stdout)
    if report["records_out"] != report["records_in"] - report["replicas_removed"]:
        raise CellFailure("ckpt rescale", f"{report['records_in']} records in, {report['records_out']} out")


def check_records(before: dict, after: dict) -> None:
    """Per exchange the same records, and every keyed record in its key group's subtask."""
    old = {(e["downstream"], e["gate"]): e for e in before["exchanges"]}
    for exchange in after["exchanges"]:
        name = f"{exchange['ship_strategy']} exchange into {exchange['downstream']} (gate {exchange['gate']})"
        was = old[(exchange["downstream"], exchange["gate"])]
        if exchange["records"] != was["records"]:
            missing = len(set(was["records"]) - set(exchange["records"]))
            raise CellFailure(
                "reader", f"{name}: {len(exchange['records'])} records, {len(was['records'])} before ({missing} lost)"
            )
        if exchange["misplaced"] or exchange["partial_channels"]:
            raise CellFailure("reader", f"{name}: {exchange['misplaced']} records outside their key groups")


def sink_ids(log: Path, until_barrier: int | None = None) -> list[int]:
    ids = []
    for line in log.read_text().splitlines():
        if line == f"B {until_barrier}":
            return ids
        if line and line[0].isdigit():
            ids.append(int(line))
    if until_barrier is not None:
        raise CellFailure("restore", f"{log.name} has no barrier of checkpoint {until_barrier}")
    return ids


def in_flight_ids(reading: dict) -> set[int]:
    """The ids of every record in flight on some exchange (Flink's reader, ConformanceReader)."""
    return {i for exchange in reading["exchanges"] for i in exchange["records"]}


def check_exactly_once(sources: list[Capture], logs: Path) -> None:
    """The sink's ids before each checkpoint of ``sources`` (a chain: each capture restored from
    the one before) and the restored run's ids: every id exactly once."""
    earlier = [i for source in sources for i in sink_ids(source.log, source.checkpoint_id)]
    restored_log = logs / "restore-sink-0.log"
    if not restored_log.exists() or not restored_log.read_text().rstrip().endswith("END"):
        raise CellFailure("restore", "the restored job did not run to the end")
    later = sink_ids(restored_log)
    seen = earlier + later
    duplicates = len(seen) - len(set(seen))
    lost = RECORDS - len(set(seen))
    if duplicates or lost:
        raise CellFailure("restore", f"{lost} records lost, {duplicates} duplicated ({len(earlier)} + {len(later)} seen)")


def columns(versions: list[str], flip547: bool) -> list[str]:
    """The table's columns: one per version, and "2.3 FLIP-547" after 2.3.0's."""
    out = []
    for version in versions:
        out.append(version)
        if flip547 and version == FLIP547_VERSION:
            out.append(FLIP547_COLUMN)
    return out


def run(cells: list[tuple[str, int, int]], versions: list[str], flip547: bool = True) -> dict:
    results: dict = {}
    for version in versions:
        with tempfile.TemporaryDirectory(prefix=f"ckpt-conformance-{version}-") as tmp:
            conformance = Conformance(version, Path(tmp))
            for topology, old, new in cells:
                for column in columns([version], flip547):
                    started = time.perf_counter()
                    try:
                        conformance.cell(topology, old, new, flip547=column == FLIP547_COLUMN)
                        outcome = "pass"
                    except CellFailure as failure:
                        outcome = f"FAIL ({failure})"
                    results[(topology, old, new, column)] = outcome
                    print(
                        f"  {column} {topology} {old}->{new}: {outcome} ({time.perf_counter() - started:.0f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", nargs="+", default=list(VERSIONS))
    parser.add_argument("--topologies", nargs="+", default=list(GRID))
    parser.add_argument("--ci", action="store_true", help="only the cells CI runs")
    parser.add_argument("--no-flip547", action="store_true", help="without the column " + FLIP547_COLUMN)
    args = parser.parse_args(argv)
    cells = (
        [c for c in CI_CELLS if c[0] in args.topologies]
        if args.ci
        else [(t, old, new) for t in args.topologies for old, new in GRID[t]]
    )
    started = time.perf_counter()
    results = run(cells, args.versions, not args.no_flip547)
    shown = columns(args.versions, not args.no_flip547)
    print("| topology | old -> new | " + " | ".join(c if c == FLIP547_COLUMN else f"Flink {c}" for c in shown) + " |")
    print("|---|---|" + "---|" * len(shown))
    for topology, old, new in cells:
        row = [results[(topology, old, new, c)] for c in shown]
        print(f"| {topology} | {old} -> {new} | " + " | ".join(row) + " |")
    if not args.no_flip547 and FLIP547_VERSION in args.versions:
        topology, first, second, third = CHAIN
        started_chain = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="ckpt-conformance-chain-") as tmp:
            try:
                held = Conformance(FLIP547_VERSION, Path(tmp)).chain(topology, first, second, third)
                outcome = "pass"
                note = f"{held['still_in_flight']} of {held['restored_in_flight']} restored in-flight records still in flight"
            except CellFailure as failure:
                outcome, note = f"FAIL ({failure})", ""
        results[("chain", first, second, third)] = outcome
        print(
            f"chain {topology} {first} -> {second} -> {third} (ckpt, Flink {FLIP547_VERSION} with FLIP-547 checkpoints "
            f"during recovery, ckpt, Flink restores): {outcome}; {note} ({time.perf_counter() - started_chain:.0f} s)"
        )
    passed = sum(r == "pass" for r in results.values())
    print(f"conformance: {passed} passed, {len(results) - passed} failed ({time.perf_counter() - started:.0f} s)")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
