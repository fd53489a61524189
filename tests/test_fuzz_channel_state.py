"""Corrupt channel state: a rescale either fails with exit code 2 and one line, or writes every
record of the (corrupt) input as Flink's framing splits it. Never success with fewer records.

The oracle below is independent of ckpt's record path: it reads the buffers, splits the length
chain and decodes ``tuple<long,string>`` and ``string`` values in plain Python.
"""

from __future__ import annotations

import random
import shutil
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from catalog import fixture_named
from ckpt_tool.engine.tasks import channel_tasks
from ckpt_tool.errors import CkptError
from ckpt_tool.flink.metadata import PLAIN, set_channel_handle_form
from ckpt_tool.flink.model import INPUT, OUTPUT
from ckpt_tool.ops.rescale import rescale
from ckpt_tool.planning import plan_rescale
from ckpt_tool.session import Session

FIXTURES = ("flink120-hashmap-p2", "flink23-hashmap-p2")
CASES_PER_FIXTURE = 250
NON_RECORD_SIZES = {2: 9, 3: 29, 4: 5, 5: 2, 6: 13}  # tag -> element size (StreamElementSerializer)


# --- the oracle: Flink's framing and serializers, in plain Python --------------------------------


def _stream(session: Session, task) -> Optional[bytes]:
    """The channel's payloads as Flink's reader takes them, or None where a handle's buffers are
    not sound (outside the file, inside its header, repeated or overlapping)."""
    stream = b""
    for source in task.inputs + task.outputs:
        data = source.inline if source.inline is not None else Path(source.location).read_bytes()
        end = 4
        for offset in source.offsets:
            if offset < end or offset + 4 > len(data):
                return None
            (length,) = struct.unpack_from(">i", data, offset)
            if length < 0 or offset + 4 + length > len(data):
                return None
            stream += data[offset + 4 : offset + 4 + length]
            end = offset + 4 + length
    return stream


def _string_end(value: bytes, pos: int) -> Optional[int]:
    """Where a ``StringValue`` starting at ``pos`` ends, or None where the bytes run out."""

    def varint(at: int) -> Optional[tuple[int, int]]:
        result = shift = 0
        while at < len(value):
            byte = value[at]
            result |= (byte & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if byte < 0x80:
                return result, at
        return None

    head = varint(pos)
    if head is None:
        return None
    length, pos = head
    for _ in range(length - 1):
        char = varint(pos)
        if char is None:
            return None
        pos = char[1]
    return pos


def _fits(record_type: str, value: bytes) -> bool:
    start = 8 if record_type == "tuple<long,string>" else 0
    return len(value) >= start and _string_end(value, start) == len(value)


def reference_records(session: Session, task, record_type: str) -> Optional[list[bytes]]:
    """The channel's records (whole elements with their tag), or None where its data is not
    whole elements that Flink's deserializers read."""
    stream = _stream(session, task)
    if stream is None:
        return None
    records, pos = [], 0
    while pos < len(stream):
        if pos + 4 > len(stream):
            return None
        (length,) = struct.unpack_from(">i", stream, pos)
        if length <= 0 or pos + 4 + length > len(stream):
            return None
        element, pos = stream[pos + 4 : pos + 4 + length], pos + 4 + length
        tag = element[0]
        if tag in NON_RECORD_SIZES and length == NON_RECORD_SIZES[tag]:
            continue
        value_start = {0: 9, 1: 1}.get(tag)
        if value_start is None or length < value_start or not _fits(record_type, element[value_start:]):
            return None
        records.append(element)
    return records


def expected_records(session: Session, rewritten: set[int]) -> tuple[Counter, bool]:
    """The records a sound rescale writes (replicas of one upstream subtask's record held by several
    downstream subtasks are kept at the lowest), and whether a rewritten channel is broken."""
    kept: Counter = Counter()
    broken = False
    holders: dict[tuple[int, int, bytes], int] = {}
    for task in channel_tasks(session.checkpoint, session.exchanges):
        exchange = session.exchanges[task.exchange_index]
        records = reference_records(session, task, exchange.record_type)
        if records is None:
            broken |= task.exchange_index in rewritten
            continue
        for record in records:
            replica_key = (task.exchange_index, task.upstream_subtask, record)
            if task.exchange_index in rewritten and exchange.keyed:
                holders.setdefault(replica_key, task.downstream_subtask)
                if holders[replica_key] != task.downstream_subtask:
                    continue
            kept[record] += 1
    return kept, broken


def written_records(destination: Path, fixture) -> Counter:
    with Session.open(str(destination), fixture.schema, fixture.plan, "local") as written:
        found: Counter = Counter()
        for task in channel_tasks(written.checkpoint, written.exchanges):
            records = reference_records(written, task, written.exchanges[task.exchange_index].record_type)
            found.update(records or [])
        return found


# --- mutations ---------------------------------------------------------------------------------


@dataclass
class Layout:
    """Where a fixture's channel-state file holds buffers and record length fields."""

    buffers: list[tuple[int, int]]  # (offset of the length field, payload length)
    lengths: list[tuple[int, int]]  # (file offset of a record's length field, bytes to the end of the next record)
    handles: list  # ChannelStateHandles with buffers in the file


def layout_of(session: Session, path: str) -> Layout:
    buffers, lengths, handles = {}, [], []
    data = Path(path).read_bytes()
    for op in session.metadata.operators:
        for subtask in op.subtasks:
            for handle in subtask.channel_handles(INPUT) + subtask.channel_handles(OUTPUT):
                if handle.offsets and session.checkpoint.location(handle.delegate) == path:
                    handles.append(handle)
    for task in channel_tasks(session.checkpoint, session.exchanges):
        where: list[Optional[int]] = []  # file position of each byte of the channel's stream
        for source in task.inputs + task.outputs:
            for offset in source.offsets:
                (length,) = struct.unpack_from(">i", data if source.inline is None else source.inline, offset)
                if source.location == path:
                    buffers[offset] = length
                where += range(offset + 4, offset + 4 + length) if source.location == path else [None] * length
        stream = _stream(session, task)
        pos, starts = 0, []
        while pos < len(stream):
            starts.append(pos)
            pos += 4 + struct.unpack_from(">i", stream, pos)[0]
        for first, second in zip(starts, starts[1:] + [len(stream)]):
            field = where[first : first + 4]
            if None not in field and field == list(range(field[0], field[0] + 4)):
                swallow = second + 4 + struct.unpack_from(">i", stream, second)[0] if second < len(stream) else second
                lengths.append((field[0], swallow - first - 4))
    return Layout(sorted(buffers.items()), lengths, handles)


def mutate(data: bytes, layout: Layout, rng: random.Random) -> tuple[bytes, Optional[tuple]]:
    """A corrupt copy of the file, or the file and a handle whose offsets to corrupt instead."""
    data = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0:  # a bit flip
        data[rng.randrange(4, len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # a record's length: extreme, off by a little, or swallowing the next record
        position, swallow = rng.choice(layout.lengths)
        (old,) = struct.unpack_from(">i", data, position)
        new = rng.choice([0, -1, 2**31 - 1, old + rng.choice([-9, -1, 1, 2, 9]), swallow, rng.randrange(1, 300)])
        struct.pack_into(">i", data, position, new)
    elif kind == 2:  # a buffer's length: extreme, or the buffer cut short
        offset, length = rng.choice(layout.buffers)
        struct.pack_into(">i", data, offset, rng.choice([0, -1, 2**31 - 1, max(length - rng.randrange(1, 64), 0)]))
    elif kind == 3:  # two buffers' payloads swapped (of equal length where there are such)
        (a, length), (b, other) = rng.sample(layout.buffers, 2)
        size = min(length, other)
        data[a + 4 : a + 4 + size], data[b + 4 : b + 4 + size] = data[b + 4 : b + 4 + size], data[a + 4 : a + 4 + size]
    elif kind == 4:  # bytes duplicated over others
        size = rng.randrange(1, 65)
        source, target = rng.randrange(4, len(data) - size), rng.randrange(4, len(data) - size)
        data[target : target + size] = data[source : source + size]
    else:  # a handle's buffer offsets: repeated, overlapping, inside the header or beyond the file
        handle = rng.choice(layout.handles)
        offsets = list(handle.offsets)
        i = rng.randrange(len(offsets))
        offsets[i] = rng.choice([offsets[i - 1] if i else 0, offsets[i] + 2, len(data), 2**40, -4])
        return bytes(data), (handle, offsets)
    return bytes(data), None


# --- the cases ---------------------------------------------------------------------------------


@dataclass
class Subject:
    fixture: object
    session: Session
    path: Path
    original: bytes
    layout: Layout
    rewritten: set[int]


@pytest.fixture(scope="module")
def subjects(tmp_path_factory):
    made = []
    for name in FIXTURES:
        fixture = fixture_named(name)
        job = tmp_path_factory.mktemp(name) / "job"
        shutil.copytree(fixture.checkpoint.parent, job)
        checkpoint = job / fixture.checkpoint.name
        path = next(p for p in checkpoint.iterdir() if p.name != "_metadata")
        session = Session.open(str(checkpoint), fixture.schema, fixture.plan, "local")
        # one handle per channel, so that a case can corrupt a channel's offsets in place (a merged
        # handle's channels are decoded anew at every use)
        set_channel_handle_form(session.metadata, PLAIN)
        plan = plan_rescale(session.metadata, 3, {}, session.described_exchanges, session.plan)
        made.append(Subject(fixture, session, path, path.read_bytes(), layout_of(session, str(path)), set(plan.rescaled)))
    yield made
    for subject in made:
        subject.session.close()


def run_case(subject: Subject, rng: random.Random, destination: Path, session: Optional[Session] = None):
    """Corrupt the subject, rescale it to 3 and check the outcome; returns (outcome, error)."""
    data, offsets = mutate(subject.original, subject.layout, rng)
    subject.path.write_bytes(data)
    handle, saved = (offsets[0], list(offsets[0].offsets)) if offsets else (None, None)
    if handle is not None:
        handle.offsets = offsets[1]
    try:
        expected, broken = expected_records(subject.session, subject.rewritten)
        try:
            report = rescale(session or subject.session, str(destination), 3)
        except CkptError as exc:
            assert exc.exit_code == 2 and "\n" not in str(exc), str(exc)
            assert not destination.exists()
            return "refused", exc
        assert not broken, "a rescale of a channel that does not split into decodable records succeeded"
        written = written_records(destination, subject.fixture)
        assert written == expected, (sum(written.values()), sum(expected.values()), report.as_dict())
        return "written", None
    finally:
        if handle is not None:
            handle.offsets = saved
        subject.path.write_bytes(subject.original)
        shutil.rmtree(destination, ignore_errors=True)


def test_corrupt_channel_state_is_refused_or_rescaled_whole(subjects, tmp_path):
    rng = random.Random(20261122)
    outcomes: Counter = Counter()
    for subject in subjects:
        for number in range(CASES_PER_FIXTURE):
            outcome, _ = run_case(subject, rng, tmp_path / f"{subject.fixture.name}-{number}" / "chk-3")
            outcomes[outcome] += 1
    assert outcomes["refused"] > 100 and outcomes["written"] > 50, outcomes


def test_spark_refuses_as_local_does(subjects, tmp_path, spark):
    """The same corrupt inputs give the same one line and exit code on Spark as in-process."""
    subject = subjects[1]
    seen = 0
    for number in range(40):
        state = random.Random(number).getstate()
        outcome, local = run_case(subject, random.Random(number), tmp_path / f"local-{number}" / "chk-3")
        if outcome != "refused":
            continue
        rng = random.Random()
        rng.setstate(state)
        on_spark = Session(subject.session.checkpoint, subject.session.exchanges, subject.session.plan, spark)
        outcome, remote = run_case(subject, rng, tmp_path / f"spark-{number}" / "chk-3", on_spark)
        assert outcome == "refused" and (str(remote), remote.exit_code) == (str(local), local.exit_code)
        seen += 1
        if seen == 4:
            break
    assert seen == 4


# --- the vectorised value check against the decoder -------------------------------------------


def _java_string(text: Optional[str]) -> bytes:
    def varint(value: int) -> bytes:
        out = b""
        while value >= 0x80:
            out, value = out + bytes([value & 0x7F | 0x80]), value >> 7
        return out + bytes([value])

    if text is None:
        return b"\x00"
    units = text.encode("utf-16-be", "surrogatepass")
    return varint(len(units) // 2 + 1) + b"".join(varint(units[i] << 8 | units[i + 1]) for i in range(0, len(units), 2))


@pytest.mark.parametrize(
    "record_type",
    ["tuple<long,string>", "string", "pojo<id:long,name:string>", "tuple<int,double>", "bytes", "binary_row<a:bigint>"],
)
def test_vectorised_value_check_agrees_with_the_decoder(record_type):
    """Fuzzed values: the NumPy check and the strict per-record decoder accept exactly the same."""
    from ckpt_tool.records.batch import Values, _fits, frame_channel
    from ckpt_tool.records.schema import Exchange
    from ckpt_tool.records.types import RecordDecodeError, decode_value, parse_type

    rng = random.Random(record_type)
    texts = ["", "a", "rec-1", "é€😀", "x" * 200, "日本語" * 50, None]

    def value() -> bytes:
        text = rng.choice(texts)
        return {
            "tuple<long,string>": struct.pack(">q", rng.randrange(-99, 99)) + _java_string(text or ""),
            "string": _java_string(text),
            "pojo<id:long,name:string>": b"\x02\x00"
            + struct.pack(">q", 5)
            + (b"\x01" if text is None else b"\x00" + _java_string(text)),
            "tuple<int,double>": struct.pack(">id", 3, 0.5),
            "bytes": struct.pack(">i", len(text or ""))
            + (text or "").encode("utf-8", "surrogatepass")[: len(text or "")].ljust(len(text or ""), b"."),
            "binary_row<a:bigint>": struct.pack(">i", 16) + bytes(16),
        }[record_type]

    values = Values(Exchange("u", "d", record_type=record_type))
    t = parse_type(record_type)
    for _ in range(300):
        raw = bytearray(value())
        if rng.random() < 0.7 and raw:  # corrupt it: a flipped bit, a byte more or less
            choice = rng.randrange(3)
            if choice == 0:
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
            elif choice == 1:
                raw.insert(rng.randrange(len(raw) + 1), rng.randrange(256))
            else:
                del raw[rng.randrange(len(raw))]
        element = b"\x01" + bytes(raw)
        records = frame_channel(struct.pack(">i", len(element)) + element)
        try:
            decode_value(t, element, 1)
            decodes = True
        except RecordDecodeError:
            decodes = False
        try:
            values.check(records, records.is_record)
            checked = True
        except RecordDecodeError:
            checked = False
        assert checked == decodes, (record_type, bytes(raw).hex())
        if values.layout is not None:  # the NumPy check vouches for exactly these (a POJO's for fewer)
            vouched = _fits(values.layout, records.data, records.value_starts(), records.ends)[0]
            assert vouched == decodes or (not vouched and t.name == "pojo"), (record_type, bytes(raw).hex())
