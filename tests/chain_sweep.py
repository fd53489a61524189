"""A sweep judged by real Flink: ckpt's own outputs as its inputs.

For each captured fixture with a plan, a chain of ckpt commands runs, each on the previous one's
output (by default ``repair``, ``rescale -p 3``, ``repair``, ``rescale -p 5``); the fixture's own
Flink version restores the last output, which must give the fixture's exact count. A checkpoint
ckpt wrote holds files of ckpt's names, views of part of an old file and handles carried unchanged:
the inputs Flink writes do not.

    python tests/chain_sweep.py                       # every fixture with a plan (about 8 minutes)
    python tests/chain_sweep.py flink23-sideout-p2 --steps rescale:3 rescale:3 repair rescale:5

Found (2026-11-28): a repair of a rescaled ``flink23-sideout-p2`` that carried 6 buffers of the
source's ``ckpt-inflight-…`` file while writing its own file of that name had referenced its new
file as the old one (exit 0; Flink: ``EOFException``), and Flink 1.15's checkpoints rescaled twice
were refused ("keyed state files describe their states differently"). Both are fixed, and every
fixture's chains now restore exactly on Flink 1.13 to 2.3. The CLAIM-mode fixture
(``flink23-rocksdb-claim-p2``, whose outputs reference the old job's files where ckpt read them) is
swept too (2026-11-29: the default chain and ``rescale:1 rescale:4 repair rescale:2`` exact).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "fixtures")]

from flink_fuzz import restore  # noqa: E402

from catalog import CAPTURED, CLAIMED  # noqa: E402

CKPT = Path(sys.executable).parent / "ckpt"


def step_args(step: str) -> tuple[str, list[str], int | None]:
    """``repair`` or ``rescale:N`` -> (command, its arguments, the new parallelism or None)."""
    command, _, parallelism = step.partition(":")
    if command == "rescale":
        return command, ["-p", parallelism], int(parallelism)
    return command, [], None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixtures", nargs="*", help="fixture names (default: every captured fixture with a plan)")
    parser.add_argument("--steps", nargs="+", default=["repair", "rescale:3", "repair", "rescale:5"])
    args = parser.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="ckpt-chain-sweep-") as work:
        for fixture in CAPTURED + CLAIMED:
            if (args.fixtures and fixture.name not in args.fixtures) or not fixture.plan:
                continue
            inputs = ["--plan", str(fixture.plan)] + (["--schema", str(fixture.schema)] if fixture.schema else [])
            current, parallelism, said = fixture.checkpoint, fixture.info["parallelism"], []
            for number, step in enumerate(args.steps):
                command, extra, new_parallelism = step_args(step)
                output = Path(work) / fixture.name / f"{number}-{command}" / "chk-1"
                run = subprocess.run([CKPT, command, current, output, *extra, *inputs], capture_output=True, text=True)
                said.append(f"{step}={run.returncode}")
                if run.returncode:
                    said.append(run.stderr.strip().splitlines()[-1][:200])
                    failed += 1  # ckpt refused its own output, or failed on it
                    break
                current, parallelism = output, new_parallelism or parallelism
            else:
                info = fixture.info
                count = restore(info["flink_version"], current, info["backend"], parallelism, info.get("k", 10))
                exact = count == str(info["source_records"])
                said.append(f"restored at {parallelism}: {count}" + ("" if exact or count.startswith("FAIL") else " WRONG"))
                failed += not exact
            print(fixture.name, " ".join(said), flush=True)
            shutil.rmtree(Path(work) / fixture.name, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
