"""Hostile Java-serialized parts of ``_metadata`` (issue 26): the ``CheckpointProperties`` at its
end and the key serializer snapshots in inline keyed state. Each run must end in bounded time and
memory with exit 0 or one line and exit 2: never a traceback, an internal error (exit 3), a
RecursionError, a hang, or memory growing without bound.

The hostile streams are built by hand following the Java serialization spec (tests/java_streams.py,
checked byte for byte against what Flink writes) and spliced into copies of real fixtures. The
mutations are seeded; each case runs ``ckpt`` in-process in a forked child that has an address-space
limit (``RLIMIT_AS``) and a per-case timer, two children at a time.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import resource
import selectors
import shutil
import signal
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from java_streams import JavaStream, billion_laughs, checkpoint_properties, real_checkpoint_type

from catalog import fixture_named
from ckpt_tool.errors import CkptError
from ckpt_tool.flink.metadata import read_metadata
from ckpt_tool.flink.model import ByteStreamHandle
from ckpt_tool.records.key_serializer import MAX_SNAPSHOT_DEPTH, NESTED_MAGIC, parse_key_serializer

CASE_SECONDS = 20  # a case's budget (a case takes 0.05 to 0.5 s; the machine may be loaded)
MEMORY_HEADROOM = 1 << 30  # a child's address space may grow by this much over the parent's
WORKERS = 2
PROPERTY_MUTATIONS = 330
KEYED_MUTATIONS = 240
TUPLE_SNAPSHOT = "org.apache.flink.api.java.typeutils.runtime.TupleSerializerSnapshot"
LONG_SNAPSHOT = "org.apache.flink.api.common.typeutils.base.LongSerializer$LongSerializerSnapshot"


# --- running cases in bounded children ----------------------------------------------------------


@dataclass
class Case:
    name: str
    metadata: bytes  # the _metadata to run against
    checkpoint: Path  # the fixture checkpoint it replaces the _metadata of
    commands: list[list[str]]  # ckpt arguments; "CKPT" stands for the checkpoint copy, "DST" for a destination
    head: bytes | None = None  # a mutated key serializer snapshot (keyed state's head)


@dataclass
class Outcome:
    case: Case
    command: list[str]
    code: int | None = None
    out: str = ""
    err: str = ""
    seconds: float = 0.0
    wrote: list[str] = field(default_factory=list)  # what appeared in the destination's parent


class CaseTimeout(BaseException):
    """Raised by the per-case timer: a BaseException, so that ckpt's error handling cannot take it."""


def _on_timer(signum, frame):
    raise CaseTimeout()


def _run_in_child(cases: list[Case], out_fd: int, workdir: Path) -> None:
    from ckpt_tool.cli.main import main

    status = Path("/proc/self/status").read_text()
    vm_kib = int(re.search(r"VmSize:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]
    limit = vm_kib * 1024 + MEMORY_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _on_timer)
    copies: dict[Path, Path] = {}
    for index, case in enumerate(cases):
        if case.checkpoint not in copies:  # one copy of each fixture's job directory per child
            target = workdir / f"job{len(copies)}"
            shutil.copytree(case.checkpoint.parent, target)
            copies[case.checkpoint] = target / case.checkpoint.name
        checkpoint = copies[case.checkpoint]
        (checkpoint / "_metadata").write_bytes(case.metadata)
        for command in case.commands:
            destination = workdir / "dst" / "out"
            args = [str(checkpoint) if a == "CKPT" else str(destination) if a == "DST" else a for a in command]
            out, err = io.StringIO(), io.StringIO()
            started = time.monotonic()
            code: int | None
            try:
                signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    main(args)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except CaseTimeout:
                code = None
                err.write(f"no result within {CASE_SECONDS} s")
            except MemoryError:
                code = None
                err.write("MemoryError outside ckpt's handling")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            seconds = time.monotonic() - started
            wrote = (
                sorted(str(p.relative_to(workdir)) for p in (workdir / "dst").rglob("*")) if (workdir / "dst").exists() else []
            )
            shutil.rmtree(workdir / "dst", ignore_errors=True)
            line = {"index": index, "command": command, "code": code, "err": err.getvalue()[-2000:], "out": out.getvalue()[-300:]}
            line.update(seconds=seconds, wrote=wrote)
            os.write(out_fd, (json.dumps(line) + "\n").encode())


def run_cases(cases: list[Case], workdir: Path) -> list[Outcome]:
    """Every command of every case, in ``WORKERS`` forked children; a child that dies or stalls
    is reported at the case it was running."""
    chunks = [cases[i::WORKERS] for i in range(WORKERS)]
    children = {}
    selector = selectors.DefaultSelector()
    for number, chunk in enumerate(chunks):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 0
            try:
                os.close(read_fd)
                _run_in_child(chunk, write_fd, workdir / f"w{number}")
            except BaseException as exc:
                os.write(write_fd, (json.dumps({"crash": repr(exc)[:2000]}) + "\n").encode())
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        children[read_fd] = (pid, chunk, bytearray(), [])
        selector.register(read_fd, selectors.EVENT_READ)
    outcomes: list[Outcome] = []
    open_fds = set(children)
    heard = dict.fromkeys(children, time.monotonic())  # when each child last reported
    while open_fds:
        for key, _ in selector.select(timeout=1):
            fd = key.fd
            chunk_data = os.read(fd, 65536)
            pid, chunk, buffer, lines = children[fd]
            heard[fd] = time.monotonic()
            if not chunk_data:
                selector.unregister(fd)
                open_fds.discard(fd)
                continue
            buffer += chunk_data
            *complete, rest = buffer.split(b"\n")
            buffer[:] = rest
            lines += [json.loads(line) for line in complete]
        for fd in list(open_fds):  # a command stuck where the child's timer cannot reach (C code)
            if time.monotonic() - heard[fd] > CASE_SECONDS + 10:
                os.kill(children[fd][0], signal.SIGKILL)
                selector.unregister(fd)
                open_fds.discard(fd)
    for fd, (pid, chunk, _, lines) in children.items():
        os.waitpid(pid, 0)
        os.close(fd)
        crash = [line["crash"] for line in lines if "crash" in line]
        assert not crash, f"a child failed outside any case: {crash}"
        done = [line for line in lines if "index" in line]
        outcomes += [
            Outcome(chunk[line["index"]], line["command"], line["code"], line["out"], line["err"], line["seconds"], line["wrote"])
            for line in done
        ]
        reported = [sum(line["index"] == i for line in done) for i in range(len(chunk))]
        unfinished = [i for i, case in enumerate(chunk) if reported[i] < len(case.commands)]
        if unfinished:
            outcomes.append(Outcome(chunk[unfinished[0]], ["?"], None, "", "the child died or stalled in this case"))
    return outcomes


def assert_bounded(outcome: Outcome, codes=(0, 2)) -> None:
    """Exit 0, or exit 2 with one ``ckpt: error:`` line; in time; nothing written on exit 2."""
    where = f"{outcome.case.name} {outcome.command}: exit {outcome.code}, {outcome.err!r}"
    assert outcome.code in codes, where
    assert outcome.seconds < CASE_SECONDS, where
    assert "Traceback" not in outcome.err and "internal error" not in outcome.err, where
    if outcome.code == 2:
        lines = outcome.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ckpt: error: "), where
        assert not outcome.wrote, where


# --- hostile streams, end to end ----------------------------------------------------------------

BASE = fixture_named("flink23-hashmap-p2")  # v6, inline keyed state, channel state in files
SAVEPOINT = fixture_named("flink120-savepoint-canonical-p2")  # v4, a SavepointType
SQL = fixture_named("flink23-sqltypes-p2")  # a RowData key: Java-serialized logical types in the snapshot
ALIGNED = fixture_named("flink23-aligned-p2")  # inline keyed state, no channel state: cheap runs with a schema


def properties_start(data: bytes) -> int:
    metadata = read_metadata(data)
    assert metadata.properties is not None and data.endswith(metadata.properties)
    return len(data) - len(metadata.properties)


def with_properties(fixture, properties: bytes) -> bytes:
    data = fixture.metadata_file.read_bytes()
    return data[: properties_start(data)] + properties


def test_the_hand_built_stream_is_what_flink_writes():
    data = BASE.metadata_file.read_bytes()
    assert data[properties_start(data) :] == checkpoint_properties()


def string_properties() -> bytes:
    s = JavaStream()
    s.string("Checkpoint")
    return s.getvalue()


def null_properties() -> bytes:
    s = JavaStream()
    s.null()
    return s.getvalue()


HOSTILE_PROPERTIES = {
    "string": (string_properties(), 'checkpoint properties are a String "Checkpoint", not a'),
    "null": (null_properties(), "checkpoint properties are null, not a"),
    "string-type": (checkpoint_properties(lambda s: s.string("Checkpoint")), 'checkpointType is a String "Checkpoint"'),
    "cycle": (checkpoint_properties(lambda s: s.ref(0x7E0002)), "(a cycle)"),
    "name-cycle": (
        checkpoint_properties(lambda s: real_checkpoint_type(s, lambda: s.ref(0x7E0000 + s.handles - 1))),
        "(a cycle)",
    ),
    "laughs": (
        checkpoint_properties(lambda s: real_checkpoint_type(s, lambda: billion_laughs(s, 22))),
        "expands to more than 262144 values (ckpt's limit)",
    ),
    "laughs-deep": (
        checkpoint_properties(lambda s: real_checkpoint_type(s, lambda: billion_laughs(s, 60))),
        "objects nested more than 32 deep (ckpt's limit)",
    ),
    "laughs-as-name": (
        checkpoint_properties(lambda s: real_checkpoint_type(s, lambda: billion_laughs(s, 14))),
        "checkpointType.name is an object of class Lol, not a String",
    ),
    "trailing": (checkpoint_properties() + b"garbage", "7 trailing bytes after the checkpoint properties"),
    "trailing-zeros": (checkpoint_properties() + bytes(1 << 20), "1048576 trailing bytes after the checkpoint properties"),
}
COMMANDS = [
    ["inspect", "CKPT"],
    ["inspect", "CKPT", "--json"],
    ["verify", "CKPT"],
    ["verify", "CKPT", "--json"],
    ["rescale", "CKPT", "DST", "-p", "3", "--plan", BASE.plan, "--schema", BASE.schema, "--engine", "local"],
]


def test_hostile_properties_give_one_line_and_exit_2(tmp_path):
    cases = [Case(name, with_properties(BASE, data), BASE.checkpoint, COMMANDS) for name, (data, _) in HOSTILE_PROPERTIES.items()]
    laughs = HOSTILE_PROPERTIES["laughs"][0]
    assert len(laughs) - len(checkpoint_properties()) < 400  # a few hundred bytes of back-references
    outcomes = run_cases(cases, tmp_path)
    assert len(outcomes) == len(cases) * len(COMMANDS)
    for outcome in outcomes:
        assert_bounded(outcome, codes=(2,))
        assert HOSTILE_PROPERTIES[outcome.case.name][1] in outcome.err, outcome.err


def nested_tuple_snapshots(levels: int) -> bytes:
    """The head of a KeyedBackendSerializationProxy whose key serializer is ``levels``
    TupleSerializers, each holding the next, around a LongSerializer."""
    out = bytearray(struct.pack(">i?i", 6, False, 2))  # proxy version, no compression, snapshot proxy version

    def utf(text: str) -> None:
        out.extend(len(text).to_bytes(2, "big") + text.encode())

    for _ in range(levels):
        utf(TUPLE_SNAPSHOT)
        out.extend(struct.pack(">i", 2) + NESTED_MAGIC + struct.pack(">ii", 1, 1))  # version; nested: version, one snapshot
    utf(LONG_SNAPSHOT)
    out.extend(struct.pack(">i", 3))
    return bytes(out)


@dataclass
class KeyedRegion:
    """Inline keyed state in ``_metadata``: where its bytes are, and where its key serializer
    snapshot ends."""

    start: int  # file offset of the ByteStreamHandle's bytes (its int length is just before)
    length: int
    snapshot_end: int  # offset within the bytes


def keyed_regions(data: bytes) -> list[KeyedRegion]:
    regions = {}
    for op in read_metadata(data).operators:
        for subtask in op.subtasks:
            handle = getattr(subtask.managed_keyed, "delegate", None)
            if isinstance(handle, ByteStreamHandle) and handle.data:
                start = data.index(handle.data)
                assert struct.unpack_from(">i", data, start - 4)[0] == len(handle.data)
                regions[start] = KeyedRegion(start, len(handle.data), snapshot_end(handle.data))
    return list(regions.values())


def snapshot_end(keyed: bytes) -> int:
    """The shortest head that holds the whole key serializer (parsing reads only forward)."""
    low, high = 1, len(keyed)
    while low < high:
        middle = (low + high) // 2
        try:
            parse_key_serializer(keyed[:middle], "x")
            high = middle
        except CkptError:
            low = middle + 1
    return low


def replace_keyed(data: bytes, region: KeyedRegion, new_head: bytes, head_end: int | None = None) -> bytes:
    """``data`` with the region's first ``head_end`` bytes (its snapshot) replaced by ``new_head``,
    the handle's length field fixed."""
    end = region.snapshot_end if head_end is None else head_end
    keyed = new_head + data[region.start + end : region.start + region.length]
    return data[: region.start - 4] + struct.pack(">i", len(keyed)) + keyed + data[region.start + region.length :]


def test_deep_key_serializer_gives_one_line_and_exit_2(tmp_path):
    data = ALIGNED.metadata_file.read_bytes()
    for region in sorted(keyed_regions(data), key=lambda r: -r.start):  # from the end: earlier offsets stay
        data = replace_keyed(data, region, nested_tuple_snapshots(300))
    schema = ["--schema", ALIGNED.schema, "--engine", "local"]
    commands = [["inspect", "CKPT", *schema], ["verify", "CKPT", *schema], ["rescale", "CKPT", "DST", "-p", "3", *schema]]
    shallow = ALIGNED.metadata_file.read_bytes()
    for region in sorted(keyed_regions(shallow), key=lambda r: -r.start):
        shallow = replace_keyed(shallow, region, nested_tuple_snapshots(MAX_SNAPSHOT_DEPTH - 1))
    cases = [Case("deep", data, ALIGNED.checkpoint, commands), Case("shallow", shallow, ALIGNED.checkpoint, commands[:1])]
    outcomes = run_cases(cases, tmp_path)
    assert len(outcomes) == 4
    for outcome in outcomes:
        if outcome.case.name == "deep":
            assert_bounded(outcome, codes=(2,))
            assert f"key serializer snapshots nested more than {MAX_SNAPSHOT_DEPTH} deep" in outcome.err
        else:  # within the limit: read, and a Tuple of a Long key is not the schema's Long key
            assert_bounded(outcome, codes=(2,))
            assert "but slow-count's keyed state was written with key serializer TupleSerializer<TupleSerializer<" in outcome.err


# --- seeded mutations ---------------------------------------------------------------------------

INTERESTING = [0x00, 0x01, 0x02, 0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x78, 0x7E, 0x7F, 0x80, 0xFF]


def java_fields(region: bytes) -> dict[str, list[int]]:
    """Offsets (within ``region``) of a Java stream's or snapshot's structure: string length
    fields (2 bytes before that many printable characters), back-reference handles (4 bytes),
    class field counts (2 bytes) and nested snapshot counts (4 bytes)."""
    lengths, counts = [], []
    for match in re.finditer(rb"(?=([\x00][\x03-\x7e]))", region):
        at = match.start()
        size = region[at + 1]
        text = region[at + 2 : at + 2 + size]
        if len(text) == size and re.fullmatch(rb"[\x20-\x7e]+", text):
            lengths.append(at)
            if at > 0 and region[at - 1] == 0x72:  # TC_CLASSDESC: name, serialVersionUID, flags, field count
                counts.append(at + 2 + size + 9)
    handles = [m.start() + 1 for m in re.finditer(rb"\x71\x00\x7e\x00", region)]
    nested = [m.start() + 8 for m in re.finditer(re.escape(NESTED_MAGIC), region)]
    return {"length": lengths, "handle": handles, "count": [c for c in counts if c + 2 <= len(region)], "nested": nested}


def mutate(region: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One mutation of a Java-serialized region, and its name."""
    data = bytearray(region)
    fields = java_fields(region)
    kind = rng.choice(["flip", "byte", "truncate", "length", "handle", "count", "duplicate", "delete", "insert"])
    if kind == "length" and fields["length"]:
        at = rng.choice(fields["length"])
        old = int.from_bytes(data[at : at + 2], "big")
        new = rng.choice([0, 1, 0xFFFF, 0x8000, old - 1, old + 1, old + rng.randrange(2, 200), rng.randrange(0x10000)])
        data[at : at + 2] = (new % 0x10000).to_bytes(2, "big")
    elif kind == "handle" and fields["handle"]:
        at = rng.choice(fields["handle"])
        new = rng.choice([0x7E0000 + rng.randrange(-3, 40), rng.randrange(1 << 32), 0x7E0000 + rng.randrange(1 << 16)])
        data[at : at + 4] = (new % (1 << 32)).to_bytes(4, "big")
    elif kind == "count" and (fields["count"] or fields["nested"]):
        at = rng.choice(fields["count"] + fields["nested"])
        size = 4 if at in fields["nested"] else 2
        new = rng.choice([0, 1, 2, 3, 7, 300, (1 << (8 * size)) - 1, 1 << (8 * size - 1)])
        data[at : at + size] = (new % (1 << (8 * size))).to_bytes(size, "big")
    elif kind == "truncate":
        del data[rng.randrange(len(data)) :]
    elif kind == "duplicate":
        start = rng.randrange(len(data))
        piece = data[start : start + rng.randrange(1, 80)]
        at = rng.randrange(len(data) + 1)
        data[at:at] = piece * rng.choice([1, 1, 2, 50])
    elif kind == "delete":
        start = rng.randrange(len(data))
        del data[start : start + rng.randrange(1, 20)]
    elif kind == "insert":
        at = rng.randrange(len(data) + 1)
        data[at:at] = bytes(rng.choice(INTERESTING) for _ in range(rng.randrange(1, 6)))
    elif kind == "byte":
        data[rng.randrange(len(data))] = rng.choice(INTERESTING)
    else:
        kind = "flip"
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
    return bytes(data), kind


def property_cases(count: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    subjects = []
    for fixture in (BASE, SAVEPOINT):
        data = fixture.metadata_file.read_bytes()
        subjects.append((fixture, data, properties_start(data)))
    cases = []
    for number in range(count):
        fixture, data, start = subjects[number % len(subjects)]
        mutated, kind = mutate(data[start:], rng)
        commands = [["inspect", "CKPT", "--json"], ["verify", "CKPT"]]
        if number % 2 == 0:
            commands.append(["inspect", "CKPT"])  # the tables too, for every other case
        cases.append(Case(f"properties-{number}-{kind}-{fixture.name}", data[:start] + mutated, fixture.checkpoint, commands))
    return cases


def keyed_cases(count: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    subjects = []
    for fixture in (ALIGNED, SQL):
        data = fixture.metadata_file.read_bytes()
        subjects.append((fixture, data, keyed_regions(data)))
    cases = []
    for number in range(count):
        fixture, data, regions = subjects[0] if number % 4 else subjects[1]  # the SQL fixture scans records: fewer
        region = rng.choice(regions)
        head = data[region.start : region.start + region.snapshot_end]
        mutated, kind = mutate(head, rng)
        snapshot: bytes | None = mutated
        if rng.random() < 0.05:  # the handle's own length field, wrong
            metadata = bytearray(data)
            struct.pack_into(">i", metadata, region.start - 4, region.length + rng.choice([-1, 1, 1000, -region.length - 1]))
            mutated_metadata, kind, snapshot = bytes(metadata), "handle-length", None
        else:
            mutated_metadata = replace_keyed(data, region, mutated)
        schema = ["--schema", fixture.schema, "--engine", "local"]
        commands = [["inspect", "CKPT", *schema, "--json"], ["verify", "CKPT", *schema]]
        cases.append(Case(f"keyed-{number}-{kind}-{fixture.name}", mutated_metadata, fixture.checkpoint, commands, snapshot))
    return cases


def test_seeded_mutations_of_java_serialized_parts_are_bounded(tmp_path):
    """At least 500 mutated ``_metadata`` files (CheckpointProperties, key serializer snapshots):
    every ``inspect`` and ``verify`` gives exit 0 or one line and exit 2, within the case budget
    and the memory limit; ``verify`` may also find problems (exit 1): a snapshot made longer or
    shorter moves the key groups after it from where their handle says (``key-group-offsets``)."""
    cases = property_cases(PROPERTY_MUTATIONS, seed=26) + keyed_cases(KEYED_MUTATIONS, seed=2626)
    assert len(cases) >= 500
    parsed = {"read": 0, "refused": 0}  # ckpt swallows an unreadable key serializer (the check is skipped): count here
    for case in cases:
        if case.head is not None:
            try:
                parse_key_serializer(case.head, case.name)
                parsed["read"] += 1
            except CkptError:  # anything else fails the test
                parsed["refused"] += 1
    assert parsed["read"] > 20 and parsed["refused"] > 20, parsed
    started = time.monotonic()
    outcomes = run_cases(cases, tmp_path)
    failures = []
    for outcome in outcomes:
        try:
            assert_bounded(outcome, (0, 1, 2) if outcome.command[0] == "verify" else (0, 2))
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, f"{len(failures)} of {len(outcomes)} runs were not bounded: " + "\n".join(failures[:20])
    assert len(outcomes) == sum(len(c.commands) for c in cases)
    codes = {code: sum(o.code == code for o in outcomes) for code in (0, 2)}
    assert codes[0] and codes[2], codes  # both accepted and refused mutations: the mutations reach the parsers
    slowest = max(outcomes, key=lambda o: o.seconds)
    assert slowest.seconds < CASE_SECONDS, slowest
    seconds = time.monotonic() - started
    print(f"{len(cases)} mutations, {len(outcomes)} runs in {seconds:.1f} s: {codes}; key serializers {parsed}")
