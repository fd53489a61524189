"""The Flink version matrix: for every version's fixture, ckpt reads it as Flink does, writes its
metadata back byte for byte, and that version of Flink restores ckpt's rescale and repair of it
with the exact count. One column per state feature does the same for every fixture of that
version with the feature (savepoints, aligned checkpoints, RocksDB, ForSt, file merging, the
changelog backend): ``pass`` when every one passes, ``-`` when that version has none.

    python tests/compat_matrix.py            # every version (make compat)
    python tests/compat_matrix.py 1.20 2.3   # some

CI runs the 1.20.3 and 2.3.0 rows, every cell (tests/test_compat.py).
"""

from __future__ import annotations

import functools
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "fixtures")]

import flink_env  # noqa: E402
from catalog import CAPTURED, tree_digest  # noqa: E402
from ckpt_tool.flink.metadata import read_metadata, write_metadata  # noqa: E402
from ckpt_tool.ops.inspect import inspect  # noqa: E402
from ckpt_tool.ops.repair import repair  # noqa: E402
from ckpt_tool.ops.rescale import rescale  # noqa: E402
from ckpt_tool.session import Session  # noqa: E402

CHECKS = ("read", "round trip", "rescale restore", "repair restore")
READ_KEYS = ("id", "parallelism", "max_parallelism", "finished", "channel_state")
# A feature column and the fixtures that show it (a fixture may show several).
FEATURES: dict[str, Callable[[dict], bool]] = {
    "savepoint": lambda info: info.get("snapshot", "").startswith("savepoint-"),
    "aligned": lambda info: info.get("snapshot") == "aligned-checkpoint",
    "RocksDB": lambda info: info["backend"] == "rocksdb",
    "ForSt": lambda info: info["backend"] == "forst",
    "file merging": lambda info: info.get("feature") == "file-merging",
    "changelog": lambda info: info.get("feature") == "changelog",
    "max parallelism 4,096 and 32,768": lambda info: info.get("feature") == "max-parallelism",
}
COLUMNS = CHECKS + tuple(FEATURES)


def by_version(fixtures, prefixes: list[str]) -> dict[str, list]:
    """The tuple-job fixtures Flink wrote (not restored from another), per Flink version, oldest first."""
    versions: dict[str, list] = {}
    for fixture in fixtures:
        info = fixture.info
        if info.get("job_kind", "tuple") != "tuple" or info.get("restored_from"):
            continue
        if prefixes and not any(info["flink_version"].startswith(p) for p in prefixes):
            continue
        versions.setdefault(info["flink_version"], []).append(fixture)
    return {v: versions[v] for v in sorted(versions, key=lambda v: tuple(int(x) for x in v.split(".")))}


def is_plain(fixture) -> bool:
    """A hashmap checkpoint with in-flight data and none of the features: a row's first four cells."""
    info = fixture.info
    return info["backend"] == "hashmap" and not info.get("snapshot") and not any(show(info) for show in FEATURES.values())


def version_fixtures(prefixes: list[str]) -> list:
    """One plain fixture per Flink version (written by Flink, not derived)."""
    rows = by_version(CAPTURED, prefixes)
    return [next(f for f in fixtures if is_plain(f)) for fixtures in rows.values() if any(is_plain(f) for f in fixtures)]


def feature_fixtures(prefixes: list[str]) -> list:
    """Every fixture that shows a feature, of the chosen versions."""
    return [f for fixtures in by_version(CAPTURED, prefixes).values() for f in fixtures if not is_plain(f)]


def read_matches(fixture) -> bool:
    summary = inspect(Session.open(str(fixture.checkpoint))).as_dict()
    got = {o["id"]: {k: o[k] for k in READ_KEYS} for o in summary["operators"]}
    want = {o["id"]: {k: o[k] for k in READ_KEYS} for o in fixture.expected["operators"]}
    return got == want and summary["checkpoint_id"] == fixture.expected["checkpoint_id"]


def round_trips(fixture) -> bool:
    data = fixture.metadata_file.read_bytes()
    return write_metadata(read_metadata(data)) == data


def restores(fixture, work: Path, repaired: bool) -> bool:
    """ckpt's rescale (P to P+1) or repair of the fixture, moved to another directory, is restored by
    the fixture's Flink version and backend with the exact count, and the input is unchanged."""
    info = fixture.info
    parallelism = info["parallelism"] if repaired else info["parallelism"] + 1
    kind = "repair" if repaired else "rescale"
    written = work / kind / "written" / "job" / fixture.checkpoint.name
    before = tree_digest(fixture.directory)
    with Session.open(str(fixture.checkpoint), fixture.schema, fixture.plan, "local") as session:
        if repaired:
            repair(session, str(written), [])
        else:
            rescale(session, str(written), parallelism)
    moved = work / kind / "moved" / "job" / fixture.checkpoint.name
    moved.parent.mkdir(parents=True)
    shutil.move(written, moved)  # ckpt's output references its own files relative to itself
    # k = 0: the job without its small source (1.13)
    count = flink_env.restore_count(info["flink_version"], moved, parallelism, backend=info["backend"], k=info["k"])
    return count == info["source_records"] and tree_digest(fixture.directory) == before


@functools.cache
def checks(fixture) -> dict[str, bool]:
    """The four checks of one fixture (computed once per run)."""
    with tempfile.TemporaryDirectory(prefix="ckpt-compat-") as tmp:
        work = Path(tmp)
        return {
            "read": read_matches(fixture),
            "round trip": round_trips(fixture),
            "rescale restore": restores(fixture, work, repaired=False),
            "repair restore": restores(fixture, work, repaired=True),
        }


def feature_cell(fixtures: list) -> str:
    if not fixtures:
        return "-"
    return "pass" if all(all(checks(f).values()) for f in fixtures) else "FAIL"


def matrix(prefixes: list[str]) -> list[tuple[str, str, dict[str, str]]]:
    """(Flink version, metadata version, cell per column) per version."""
    rows = []
    for version, fixtures in by_version(CAPTURED, prefixes).items():
        plain = next((f for f in fixtures if is_plain(f)), None)
        cells = {c: ("pass" if checks(plain)[c] else "FAIL") if plain else "-" for c in CHECKS}
        for column, show in FEATURES.items():
            cells[column] = feature_cell([f for f in fixtures if show(f.info)])
        metadata = f"v{(plain or fixtures[0]).expected['metadata_version']}"
        rows.append((version, metadata, cells))
    return rows


def main(argv: list[str]) -> int:
    rows = matrix(argv)
    print("| Flink | metadata | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "|".join("---" for _ in COLUMNS) + "|")
    for version, metadata, cells in rows:
        print(f"| {version} | {metadata} | " + " | ".join(cells[c] for c in COLUMNS) + " |")
    return 0 if all("FAIL" not in cells.values() for _, _, cells in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
