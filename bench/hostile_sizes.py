"""Time the two slow paths of issue #26 with the installed ``ckpt``: the tables of ``ckpt inspect``
for a checkpoint with many operators (against ``--json``), and ``ckpt records`` of one huge record
(against ``inspect`` with the same plan and schema), with each run's peak RSS.

    python bench/hostile_sizes.py [--operators 100000] [--record-mib 200]

Both checkpoints are the real fixture flink23-hashmap-p2 with its ``_metadata`` rewritten by ckpt's
own writer: operators without state added, or one Tuple2<Long,String> record with a string of
``--record-mib`` MiB put into the channel map-main 0 -> slow-count 0. The last line holds every
figure as name=value. (The tests check the same paths by counting work, not time:
tests/test_hostile_output.py.)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import struct
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE.parent / "fixtures")]

from run import CKPT, timed  # noqa: E402

from catalog import fixture_named  # noqa: E402
from ckpt_tool.flink.channel_state import write_channel_state_file  # noqa: E402
from ckpt_tool.flink.metadata import read_metadata, write_metadata  # noqa: E402
from ckpt_tool.flink.model import INPUT, ChannelStateHandle, WrittenFileHandle  # noqa: E402
from ckpt_tool.records.keys import key_group_for_hash, long_hash, operator_index_for_key_group  # noqa: E402
from ckpt_tool.storage import io_for  # noqa: E402

BASE = fixture_named("flink23-hashmap-p2")
MAIN, SLOW = "5ff73b99d0669153bf2feac805d152ac", "0a6c3d247193df04622ad9b3b66741a5"
INPUTS = ["--plan", BASE.plan, "--schema", BASE.schema, "--engine", "local"]


def copy(work: Path, name: str):
    shutil.copytree(BASE.checkpoint.parent, work / name)
    checkpoint = work / name / BASE.checkpoint.name
    return checkpoint, read_metadata((checkpoint / "_metadata").read_bytes())


def many_operators(work: Path, count: int) -> Path:
    checkpoint, metadata = copy(work, "many")
    template, rng = metadata.operator(MAIN), random.Random(count)
    metadata.operators += [type(template)(rng.randbytes(16), 2, 128, f"operator number {i}", f"op-{i}") for i in range(count)]
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    return checkpoint


def huge_record(work: Path, mib: float) -> Path:
    checkpoint, metadata = copy(work, "huge")
    key = next(k for k in range(1000) if operator_index_for_key_group(128, 2, key_group_for_hash(long_hash(k), 128)) == 0)
    size, length = int(mib * 2**20), bytearray()
    n = size + 1
    while n >= 0x80:
        length.append((n & 0x7F) | 0x80)
        n >>= 7
    element = b"\x00" + struct.pack(">qq", 7, key) + bytes(length + bytes([n])) + b"r" * size
    stream = struct.pack(">i", len(element)) + element
    writer = write_channel_state_file(io_for(str(checkpoint)), str(checkpoint / "huge-inflight"), [(0, stream)])
    placed, subtask = writer.placements[0], metadata.operator(SLOW).subtasks[0]
    delegate = WrittenFileHandle("huge-inflight", writer.size)
    handle = ChannelStateHandle(INPUT, subtask.index, (0, 0), placed.offsets, placed.size, delegate)
    subtask.input_channels = [handle] + [h for h in subtask.channel_handles(INPUT) if h.info != (0, 0)]
    (checkpoint / "_metadata").write_bytes(write_metadata(metadata))
    return checkpoint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--operators", type=int, default=100_000)
    parser.add_argument("--record-mib", type=float, default=200)
    args = parser.parse_args()
    figures = {}
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-hostile-") as tmp:
        work = Path(tmp)
        many = many_operators(work, args.operators)
        figures["tables_s"], figures["tables_rss_mb"], _ = timed([*CKPT, "inspect", str(many)])
        figures["json_s"], figures["json_rss_mb"], _ = timed([*CKPT, "inspect", "--json", str(many)])
        huge = huge_record(work, args.record_mib)
        out = work / "records.parquet"
        figures["records_s"], figures["records_rss_mb"], _ = timed([*CKPT, "records", str(huge), *INPUTS, "--out", str(out)])
        figures["inspect_s"], figures["inspect_rss_mb"], _ = timed([*CKPT, "inspect", str(huge), *INPUTS])
        os.unlink(out)
    print(f"operators={args.operators} record_mib={args.record_mib} " + " ".join(f"{k}={v:.2f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
