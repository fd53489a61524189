"""The Flink version matrix: for every version's fixture, ckpt reads it as Flink does, writes its
metadata back byte for byte, and that version of Flink restores ckpt's rescale and repair of it
with the exact count.

    python tests/compat_matrix.py            # every version (make compat)
    python tests/compat_matrix.py 1.20 2.3   # some

CI runs the 1.20 and 2.3 rows (tests/test_compat.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "fixtures")]

import flink_env  # noqa: E402
from catalog import CAPTURED  # noqa: E402
from ckpt_tool.flink.metadata import read_metadata, write_metadata  # noqa: E402
from ckpt_tool.ops.inspect import inspect  # noqa: E402
from ckpt_tool.ops.repair import repair  # noqa: E402
from ckpt_tool.ops.rescale import rescale  # noqa: E402
from ckpt_tool.session import Session  # noqa: E402

COLUMNS = ("read", "round trip", "rescale restore", "repair restore")
READ_KEYS = ("id", "parallelism", "max_parallelism", "finished", "channel_state")


def version_fixtures(prefixes: list[str]) -> list:
    """One hashmap tuple-job fixture per Flink version (written by Flink, not derived)."""
    chosen = {}
    for fixture in CAPTURED:
        info = fixture.info
        if info.get("job_kind", "tuple") != "tuple" or info["backend"] != "hashmap" or info.get("restored_from"):
            continue
        if info.get("snapshot"):  # savepoints and aligned checkpoints: no in-flight data
            continue
        if info.get("feature"):  # a state feature switched on (file merging): not the version's plain checkpoint
            continue
        if prefixes and not any(info["flink_version"].startswith(p) for p in prefixes):
            continue
        chosen.setdefault(info["flink_version"], fixture)
    return [chosen[v] for v in sorted(chosen, key=lambda v: tuple(int(x) for x in v.split(".")))]


def read_matches(fixture) -> bool:
    summary = inspect(Session.open(str(fixture.checkpoint))).as_dict()
    got = {o["id"]: {k: o[k] for k in READ_KEYS} for o in summary["operators"]}
    want = {o["id"]: {k: o[k] for k in READ_KEYS} for o in fixture.expected["operators"]}
    return got == want and summary["checkpoint_id"] == fixture.expected["checkpoint_id"]


def round_trips(fixture) -> bool:
    data = fixture.metadata_file.read_bytes()
    return write_metadata(read_metadata(data)) == data


def restores(fixture, work: Path, repaired: bool) -> bool:
    parallelism = fixture.info["parallelism"] if repaired else fixture.info["parallelism"] + 1
    destination = work / ("repair" if repaired else "rescale") / "job" / fixture.checkpoint.name
    with Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan, "local") as session:
        if repaired:
            repair(session, str(destination), [])
        else:
            rescale(session, str(destination), parallelism)
    version, k = fixture.info["flink_version"], fixture.info["k"]  # k = 0: the job without its small source (1.13)
    count = flink_env.restore_count(version, destination, parallelism, backend="hashmap", k=k)
    return count == fixture.info["source_records"]


def compat_row(fixture) -> dict:
    with tempfile.TemporaryDirectory(prefix="ckpt-compat-") as tmp:
        work = Path(tmp)
        return {
            "read": read_matches(fixture),
            "round trip": round_trips(fixture),
            "rescale restore": restores(fixture, work, repaired=False),
            "repair restore": restores(fixture, work, repaired=True),
        }


def main(argv: list[str]) -> int:
    rows = [(f, compat_row(f)) for f in version_fixtures(argv)]
    width = max(len(c) for c in COLUMNS)
    print("| Flink | metadata | " + " | ".join(c.ljust(width) for c in COLUMNS) + " |")
    print("|---|---|" + "|".join("---" for _ in COLUMNS) + "|")
    for fixture, row in rows:
        cells = " | ".join(("pass" if row[c] else "FAIL").ljust(width) for c in COLUMNS)
        print(f"| {fixture.info['flink_version']} | v{fixture.expected['metadata_version']} | {cells} |")
    return 0 if all(all(row.values()) for _, row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
