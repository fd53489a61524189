"""A fuzz campaign judged by real Flink: "exit 0 means Flink will restore it", tried on corrupt input.

Each case mutates the fixture's ``_metadata`` (``test_fuzz.mutate``: a bit, a byte, a cut, junk, a
large int) in a copy of its job directory. Where ckpt reads the result, ``ckpt rescale -p 3`` runs
on it; where that exits 0, the fixture's Flink version restores both the mutated input (Flink
rescaling it itself) and ckpt's output at parallelism 3. A case is

- ``OK``: both restore, with the same count (a mutation Flink and ckpt both carry along);
- ``SAME-FAIL``: both fail with the same reason (the path of the checkpoint each names aside): ckpt
  gave exit 0 on a checkpoint Flink refuses;
- ``DIFF``: they differ (Flink's own rescale of the input may fail where ckpt's succeeds).

Mutations inside inline keyed or operator state bytes, and inside inline channel-state bytes, are skipped:
Flink's format has no checksum, and ckpt does not decode the state's values, so such a corruption is
found by Flink's restore only; a record whose bytes changed is a record with other values, which
ckpt routes by its key as it reads it (where its framing breaks, ckpt refuses it).

    python tests/flink_fuzz.py flink23-hashmap-p2 --seed 1 --cases 10

Found so far (2026-11-28): a path holding a NUL (an internal error), a key group's offset past its
state (exit 0; now the ``key-group-offsets`` check and a refusal), a chained operator's id altered
(exit 0: the JSON plan names chained operators, not their ids; Flink refuses the mixed finished
state), and Flink 1.20.3 failing to rescale its own checkpoints (README, "Flink versions"). Then
(2026-11-28, ``flink23-ckpt-recovery-p3``, ``flink120-savepoint-canonical-p2``): channels a rescale
to the same parallelism carried unchanged with a subpartition out of range or a buffer past its file
(exit 0; now proven before writing, ``ckpt_tool/carried.py``), and a canonical savepoint's key-group
offset moved inside its key group, still in order (exit 0; now read as Flink reads it), a
file-merging segment's scope Flink does not have and a RocksDB file name holding a NUL (exit 0; now
refused as the metadata is read). Then (2026-11-29) nothing new in ``flink120-filemerging-rocksdb-p2``
(seed 71: every DIFF is Flink 1.20.3 failing to rescale its own checkpoint, ckpt's output restoring
exactly) nor in ``flink23-sideout-p2`` (seed 72: one DIFF, a chained sink's operator id altered, the
limitation above), nor in the CLAIM-mode fixture ``flink23-rocksdb-claim-p2`` (seed 73: 29 OK, and one
SAME-FAIL, a source coordinator's state altered, on which Flink's job never ends), nor in the SQL
join ``flink23-sqljoin-p2`` (seeds 74 and 75: 5 OK, 25 refused, no DIFF) nor in
``flink120-updates-p2`` (seed 76: 27 DIFF, each Flink 1.20.3 failing to rescale its own checkpoint,
ckpt's output restoring with the exact 30,010), nor in ``flink115-rocksdb-full-p2`` (seed 77: 9 OK; a
DIFF where a handle's subtask index was altered, Flink's own rescale failing and ckpt's output
restoring with the exact 60,010; two SAME-FAIL, a coordinator's state and a chained operator's id)
nor in ``flink23-rocksdb-savepoint-native-p2`` (seed 78: 11 OK, one SAME-FAIL, a chained operator's
id: the limitation above, met a third time), nor in ``flink23-javatime-p2`` (seed 79: 10 OK, 17
refused; two DIFF, a subpartition index and a buffer's offset altered, Flink's own rescale failing
and ckpt's output restoring with the exact 60,010). Then (2026-11-29, ``flink113-hashmap-p2``,
seed 80): a source's reader state renamed in its handle (exit 0; Flink 1.13 fails on it, "Found
state without corresponding meta info", and Flink 2.3 restores it empty; now the
``operator-state`` check and a refusal). Nothing new in ``flink117-hashmap-p2`` (seed 81: 10
OK, 17 refused; a source coordinator's state altered twice, on which Flink's job never ends or
fails), nor in ``flink116-hashmap-p2`` (seed 82: 8 OK, 27 refused; a DIFF where a subpartition
index was altered, Flink's own rescale failing and ckpt's output restoring with the exact 60,010)
nor in ``flink23-savepoint-native-p2`` (seed 83: 10 OK, 27 refused), nor in
``flink120-sqltypes-p2`` (seed 84: 5 OK, 21 refused; a DIFF, a handle's subtask index altered),
``flink118-hashmap-p2`` (seed 85: 13 OK, 36 refused; a handle's subtask index, and a coordinator's
state on which both restores hang), ``flink119-hashmap-p2`` (seed 86: 21 OK, 42 refused; three DIFF,
each a handle's subtask index), ``flink23-pojo-p2`` (seed 87: 19 OK, 35 refused; a chained
operator's id, on which both restores fail, and a handle's subtask index) or
``flink120-savepoint-native-p2`` (seed 88, stopped after 22 OK and a SAME-FAIL, an operator's id,
while restores hung on a coordinator's state), nor in ``flink23-sqltypes-p2`` (seed 89: 16 OK, 20
refused) or ``flink120-sideout-p2`` (seed 90: 20 OK, 56 refused; three DIFF, each a handle's subtask
index, and two where an operator's id was altered, on which both restores fail alike, Flink's
"Cannot map checkpoint/savepoint state for operator": the chained operator's id above; where the
metadata stores uids, Flink 2.x, such an id is now refused, the ``operator-ids`` check), nor in
``flink23-changelog-p2`` (seed 91: 25 OK, 50 refused), ``flink23-forst-p2`` (seed 92: 19 OK, 10
refused; a SAME-FAIL, a coordinator's state) or ``flink120-filemerging-hashmap-p2`` (seed 93: 29
DIFF, each Flink 1.20.3 failing to rescale its own checkpoint, "Cannot get old subtasks from a
descriptor that represents no state", ckpt's output restoring with the exact 60,010; a SAME-FAIL,
an operator's id in metadata without uids). Then (``flink23-filemerging-rocksdb-p2``, seed 94: 29
OK, one DIFF) a file-merging operator-state handle's task-owned directory holding NULs, on which
Flink's restore fails (``URISyntaxException``) and which ckpt had rescaled with exit 0: now refused
as the metadata is read. Nothing new in ``flink120-maxp32768-p2`` (seed 95: 600 mutations, 363
refused, two DIFF, each Flink 1.20.3 failing to rescale its own checkpoint, "Cannot get old
subtasks from a descriptor that represents no state", ckpt's output restoring with the exact
60,010). Then (``flink23-updates-p2``, seed 96: 18 OK, 20 refused, a SAME-FAIL on an operator's
id, and a DIFF of a subtask index) a chained operator's max parallelism altered (128 to 129), on
which both restores fail ("KeyGroupRange{...} does not contain key group"), ckpt having rescaled it
with exit 0: the operators of one chain at different max parallelisms are now refused (with
``--plan``; ``verify``'s ``parallelism``). Then (``flink120-rocksdb-p2``, seed 97: 15 DIFF, 3
refused, each DIFF Flink 1.20.3 failing to rescale its own checkpoint) a RocksDB handle's key-group
count altered below 1: ckpt's output restored with 58,898 of 60,010 (Flink 2.3 loses state alike at
a new parallelism): a keyed handle whose range is empty, outside the operator's key groups or
sharing none with its subtask's is now refused (``key-group-offsets``); and a RocksDB file's local
path altered, on which ckpt's output fails (``No such file or directory``): not decoded (RocksDB's
manifest names its files), left. Nothing new in ``flink23-rocksdb-p2`` (seed 98: 24 OK, 8 refused,
a SAME-FAIL on a RocksDB file's local path, and four DIFF where a file's recorded path was altered:
Flink's own restore fails, "FileNotFoundException", and ckpt, which finds a moved checkpoint's files
under their names in its job directory, wrote an output Flink restored with the exact 60,010), nor in
``flink23-filemerging-hashmap-p2`` (seed 99: 30 OK, 28 refused). Then (``flink23-recovery-p3``,
seed 100: 19 OK, 25 refused, three SAME-FAIL: an operator's id, the limitation above) two faults
Flink's restore fails on and ckpt had rescaled with exit 0, both now refused: the checkpoint
properties' class flags made externalizable and serializable at once ("serializable and
externalizable flags conflict"; Java's other class-description checks with it), and an output
handle's result partition made 262,144 where the vertex has one (``ArrayIndexOutOfBoundsException``;
``verify``'s ``channel-handles`` with ``--plan``; an input gate past the vertex's with it). Nothing
new in ``flink23-naive-p2`` (seed 101: 19 DIFF, 31 refused; each DIFF Flink's own rescale replaying
the inflated checkpoint's copies, 60,185, where ckpt's output restores the exact 60,010) nor in
``flink23-sql-p2`` (seed 102: 8 OK, 21 refused), nor in ``flink23-savepoint-canonical-p2`` (seed 103:
25 OK, 82 refused, five SAME-FAIL: an operator's id three times, a coordinator's state, and a keyed
handle's type tag altered from a savepoint's (7) to plain key groups (3), on which Flink's heap
restore reads the canonical layout as its own, "Unexpected key-group in restore"; a RocksDB job's
full snapshots are that layout under tag 3, so which one fails depends on the backend restoring it:
left), nor in ``flink120-aligned-p2`` (seed 104: 13 OK, 40 refused), nor in ``flink23-hashmap-p2``
(seed 105: 14 OK, 33 refused, a DIFF of a subtask index) or ``flink120-sqljoin-p2`` (seed 106: 17
refused, eight DIFF, each Flink 1.20.3 failing to rescale its own checkpoint, "Cannot get old subtasks
from a descriptor that represents no state", ckpt's output restoring with the exact 20,000, and a
SAME-FAIL, an operator's id in metadata without uids), nor in ``flink23-rocksdb-savepoint-canonical-p2``
(seed 107: 20 OK, 89 refused) or ``flink120-hashmap-p2`` (seed 108: 27 refused, twenty DIFF, each
Flink 1.20.3 failing to rescale its own checkpoint, ckpt's output restoring with the exact 60,010), nor in
``flink23-maxp4096-p2`` (seed 109: 5 OK, 317 refused, a SAME-FAIL, a chained operator's id: the
limitation above), nor in ``flink22-hashmap-p2`` (seed 110: 20 OK, 39 refused) or
``flink20-hashmap-p2`` (seed 111: 20 OK, 29 refused), nor in ``flink114-hashmap-p2`` (seed 112: 14 OK,
37 refused, a SAME-FAIL, a coordinator's state altered: both restores hang, as below). In each DIFF
of a subtask index Flink's own rescale fails ("Cannot select SubtaskConnectionDescriptor") and ckpt's
output restores exactly; ``verify`` names the handle ("handle names subtask ..."). Left: opaque bytes
ckpt does not decode (a source's split state, a coordinator's state: Flink fails on them, or its job
never ends).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "fixtures")]

import generate  # noqa: E402
from test_fuzz import mutate  # noqa: E402

import flink_env  # noqa: E402
from catalog import fixture_named  # noqa: E402
from ckpt_tool.errors import CkptError  # noqa: E402
from ckpt_tool.flink.metadata import read_metadata  # noqa: E402

CKPT = Path(sys.executable).parent / "ckpt"


def changed_fields(before, after, path: str = "metadata") -> list[str]:
    """Where two parsed metadata differ, as attribute paths."""
    if type(before) is not type(after):
        return [path]
    if isinstance(before, (list, tuple)):
        if len(before) != len(after):
            return [path]
        return [p for i, (a, b) in enumerate(zip(before, after)) for p in changed_fields(a, b, f"{path}[{i}]")]
    names = list(vars(before)) if hasattr(before, "__dict__") else list(getattr(before, "__slots__", ()))
    if names:
        return [p for name in names for p in changed_fields(getattr(before, name), getattr(after, name), f"{path}.{name}")]
    try:
        same = before == after
        same = bool(same.all()) if hasattr(same, "all") else bool(same)
    except (ValueError, TypeError):
        same = False
    return [] if same else [path]


def restore(version: str, checkpoint: Path, backend: str, parallelism: int = 3, k: int = 10) -> str:
    """Flink's count of a restore, or ``FAIL`` and the innermost cause of its failure."""
    try:
        return str(flink_env.restore_count(version, checkpoint, parallelism, backend=backend, k=k, timeout=300))
    except RuntimeError as exc:
        causes = [line.strip() for line in str(exc).splitlines() if line.strip().startswith("Caused by")]
        return "FAIL " + (causes[-1] if causes else str(exc).strip().splitlines()[-1])[:200]


def _without_paths(result: str, case: Path) -> str:
    """A restore's result with the case's own paths taken out: a failure that names the checkpoint
    (``.../in/chk-3`` or ``.../out/chk-1``) is the same failure on either (a message is cut at 200
    characters, the longer path cutting it sooner: compared up to the shorter)."""
    return re.sub(re.escape(str(case)) + r"/(in|out)/[^ .,;:]*", "<checkpoint>", result)[:150]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixture")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=10, help="cases ckpt rescales with exit 0, each restored twice")
    parser.add_argument("--tries", type=int, default=600, help="mutations at most")
    args = parser.parse_args()
    fixture = fixture_named(args.fixture)
    info = fixture.info
    staged = generate.stage_fixture(args.fixture)  # where Flink wrote it: its metadata may hold absolute paths
    original = (staged / "_metadata").read_bytes()
    parsed = read_metadata(original)
    inputs = ["--plan", str(fixture.plan), "--schema", str(fixture.schema), "--engine", "local"]
    rng = random.Random(args.seed)
    found = tried = 0
    tally: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="ckpt-flink-fuzz-") as work:
        while found < args.cases and tried < args.tries:
            tried += 1
            data = mutate(original, rng)
            try:
                fields = changed_fields(parsed, read_metadata(data))
            except CkptError:
                continue
            if not fields or all(("keyed" in f or "_operator" in f or "_channels" in f) and f.endswith(".data") for f in fields):
                continue  # inside inline state or in-flight records: corrupt values, no format Flink checks
            case = Path(work) / str(tried)
            shutil.copytree(staged.parent, case / "in", copy_function=os.link)
            source = case / "in" / staged.name
            (source / "_metadata").unlink()
            (source / "_metadata").write_bytes(data)
            output = case / "out" / "chk-1"
            run = subprocess.run([CKPT, "rescale", source, output, "-p", "3", *inputs], capture_output=True, text=True)
            if run.returncode == 0:
                found += 1
                native = restore(info["flink_version"], source, info["backend"])
                ckpt = restore(info["flink_version"], output, info["backend"])
                same = native == ckpt or _without_paths(native, case) == _without_paths(ckpt, case)
                kind = ("OK" if not native.startswith("FAIL") else "SAME-FAIL") if same else "DIFF"
                tally[kind] = tally.get(kind, 0) + 1
                print(f"{kind} case {tried}: {', '.join(fields[:2])}")
                print(f"  Flink's own rescale: {native}\n  ckpt's rescale:      {ckpt}")
            else:
                tally["refused"] = tally.get("refused", 0) + 1
            shutil.rmtree(case)
    print(f"{args.fixture}: {tried} mutations, " + ", ".join(f"{v} {k}" for k, v in sorted(tally.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
