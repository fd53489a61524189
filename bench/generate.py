"""Large checkpoints in Flink's real format, for benchmarks.

Starts from a real fixture (Flink 2.3, CountJob): flink23-hashmap-p2 (max parallelism 128) up to
parallelism 128, and above that flink23-maxp4096-p2 (max parallelism 4,096, set by the job) or
``--base`` by name. It rescales the fixture with ckpt to the wanted parallelism (so keyed,
operator and finished state are Flink's), then fills the input channels of the keyed operator
with synthetic in-flight records of the job's own type, ``Tuple2<Long,String>`` keyed by f0, each
placed in the subtask that owns its key group (the keys are 0..1023, more where the parallelism
needs them for every subtask to own one). ``--channels dense`` fills every upstream -> downstream
channel, ``sparse`` one in ten; the total bytes stay as asked, except that a filled channel holds
at least one record. Every filled input channel of a subtask gets the same block of records
(generation stays fast; the copies are on different upstream channels, so they are distinct
records to Flink and to ckpt). Restoring the result, CountJob counts its source records plus
every generated record. ``--handles`` writes the channel state handles ``merged`` (one per
subtask and file, as Flink 2.1+ writes them) or ``plain`` (one per channel, as Flink up to 2.0);
by default as the base fixture holds them (merged for the Flink 2.3 fixtures).

    python bench/generate.py OUT_DIR --parallelism 64 --bytes 100000000 [--files-per-subtask 1]
        [--channels dense|sparse] [--base FIXTURE] [--handles plain|merged]
"""

from __future__ import annotations

import argparse
import copy
import json
import struct
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckpt_tool.flink.channel_state import write_channel_state_file  # noqa: E402
from ckpt_tool.flink.checkpoint import Checkpoint  # noqa: E402
from ckpt_tool.flink.metadata import HANDLE_FORMS, MERGED, channel_handle_form, merge_channel_handles, read_metadata  # noqa: E402
from ckpt_tool.flink.model import INPUT, ChannelStateHandle, WrittenFileHandle  # noqa: E402
from ckpt_tool.ops.rescale import rescale  # noqa: E402
from ckpt_tool.records.keys import key_group_for_hash, long_hash, operator_index_for_key_group  # noqa: E402
from ckpt_tool.session import Session  # noqa: E402
from ckpt_tool.storage import io_for  # noqa: E402
from ckpt_tool.writer import write_checkpoint  # noqa: E402

FIXTURE = ROOT / "fixtures" / "flink23-hashmap-p2"
LARGE_FIXTURE = ROOT / "fixtures" / "flink23-maxp4096-p2"  # max parallelism 4,096 (the job sets it)
SCHEMA = ROOT / "fixtures" / "countjob.schema.toml"
SLOW_COUNT = "0a6c3d247193df04622ad9b3b66741a5"
NUM_KEYS = 1024
SPARSE_EVERY = 10  # sparse: one channel in ten holds data


def base_fixture(parallelism: int) -> Path:
    """The fixture a checkpoint at ``parallelism`` grows from: one whose max parallelism allows it."""
    return FIXTURE if parallelism <= 128 else LARGE_FIXTURE


def filled(upstream: int, downstream: int, parallelism: int, channels: str) -> bool:
    """Whether channel upstream -> downstream holds generated data."""
    return channels == "dense" or (upstream * parallelism + downstream) % SPARSE_EVERY == 0


def keys_by_subtask(max_parallelism: int, parallelism: int) -> dict[int, list[int]]:
    """Keys 0..1023 by the subtask that owns their key group; further keys until every subtask owns one."""
    keys_of: dict[int, list[int]] = {d: [] for d in range(parallelism)}
    key, missing = 0, parallelism
    while key < NUM_KEYS or missing:
        group = key_group_for_hash(long_hash(key), max_parallelism)
        owner = keys_of[operator_index_for_key_group(max_parallelism, parallelism, group)]
        if key < NUM_KEYS or not owner:
            missing -= not owner
            owner.append(key)
        key += 1
    return keys_of


def record(key: int, sequence: int) -> bytes:
    """A StreamRecord with timestamp of Tuple2<Long,String>(key, payload), as Flink serializes it."""
    text = f"bench-{sequence}-" + "x" * (20 + sequence % 80)
    encoded = bytes([len(text) + 1]) + text.encode("ascii")  # StringValue: length+1 varint, ASCII chars
    return b"\x00" + struct.pack(">qq", sequence, key) + encoded


def generate(
    out: Path,
    parallelism: int,
    total_bytes: int,
    files_per_subtask: int = 1,
    channels: str = "dense",
    base: Optional[Path] = None,
    handles: Optional[str] = None,
) -> dict:
    base = base or base_fixture(parallelism)
    form = handles or channel_handle_form(read_metadata(next(base.glob("*/chk-*/_metadata")).read_bytes()))
    staged = out.parent / (out.name + ".base")
    with Session.open(str(next(base.glob("*/chk-*"))), str(SCHEMA), str(base / "plan.json"), "local") as session:
        rescale(session, str(staged), parallelism)
    source = Checkpoint.open(str(staged))
    metadata = copy.deepcopy(source.metadata)
    slow = metadata.operator(SLOW_COUNT)
    keys_of = keys_by_subtask(slow.max_parallelism, parallelism)
    # the channels the generator fills: not those that hold the fixture's own in-flight data
    kept = {(s.index, h.info[1]) for s in slow.subtasks for h in s.channel_handles(INPUT) if h.info[0] == 0}
    filled_channels = sum(
        filled(u, d.index, parallelism, channels) and (d.index, u) not in kept and bool(keys_of[d.index])
        for d in slow.subtasks
        for u in range(parallelism)
    )
    per_channel = max(1, total_bytes // max(1, filled_channels))
    written, generated, sequence, total = set(), 0, 0, 0
    blocks = {}
    for subtask in slow.subtasks:
        keys = keys_of[subtask.index]
        if not keys:
            continue
        existing = {h.info: h for h in subtask.channel_handles(INPUT)}
        handles, pieces = [], [[] for _ in range(files_per_subtask)]
        for upstream in range(parallelism):
            if (0, upstream) in existing:  # the fixture's own in-flight data stays where it is
                handles.append(existing[(0, upstream)])
                continue
            if not filled(upstream, subtask.index, parallelism, channels):
                continue
            if subtask.index not in blocks:
                records, size = [], 0
                while size < per_channel:
                    raw = record(keys[sequence % len(keys)], sequence)
                    records.append(struct.pack(">i", len(raw)) + raw)
                    size += len(records[-1])
                    sequence += 1
                blocks[subtask.index] = (len(records), b"".join(records))
            count, stream = blocks[subtask.index]
            generated += count
            pieces[upstream % files_per_subtask].append((upstream, stream))
        for which, file_pieces in enumerate(pieces):
            if not file_pieces:
                continue
            name = f"bench-inflight-{subtask.index}-{which}"
            writer = write_channel_state_file(io_for(str(out)), str(out / name), file_pieces)
            delegate = WrittenFileHandle(name, writer.size)
            for upstream, _ in file_pieces:
                placed = writer.placements[upstream]
                handles.append(ChannelStateHandle(INPUT, subtask.index, (0, upstream), placed.offsets, placed.size, delegate))
            written.add(name)
            total += writer.size
        handles.sort(key=lambda h: h.info)
        subtask.input_channels = handles + [h for h in subtask.channel_handles(INPUT) if h.info[0] != 0]
        if form == MERGED:  # merged subtask by subtask: a handle per channel lives only meanwhile
            subtask.input_channels = merge_channel_handles(subtask.input_channels)
    write_checkpoint(source, metadata, str(out), {}, already_written=frozenset(written), channel_handles=form)
    info = {
        "parallelism": parallelism,
        "max_parallelism": slow.max_parallelism,
        "channels": channels,
        "handles": form,
        "base": base.name,
        "generated_records": generated,
        "expected_count": json.loads((base / "fixture.json").read_text())["source_records"] + generated,
        "channel_state_bytes": total,
        "files": len(written),
    }
    (out.parent / (out.name + ".json")).write_text(json.dumps(info, indent=1))
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--parallelism", type=int, default=64)
    parser.add_argument("--bytes", type=int, default=100_000_000)
    parser.add_argument("--files-per-subtask", type=int, default=1)
    parser.add_argument("--channels", choices=("dense", "sparse"), default="dense")
    parser.add_argument("--base", help="the fixture to start from (a directory name under fixtures/)")
    parser.add_argument("--handles", choices=HANDLE_FORMS, help="channel state handles: plain or merged (default: as the base)")
    args = parser.parse_args()
    base = ROOT / "fixtures" / args.base if args.base else None
    info = generate(Path(args.out), args.parallelism, args.bytes, args.files_per_subtask, args.channels, base, args.handles)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
