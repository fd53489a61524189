"""``ckpt verify``: is a checkpoint sound? Checks for CI, each with the problems it found.

Checks: referenced files exist with their recorded sizes; channel-state headers, offsets and
buffer lengths; one handle per channel; changelog state (change sets decode, key groups);
parallelism within max parallelism; finished markers;
replicated buffers (the same buffer bytes held by several subtasks of an operator). With
``--plan``/``--schema``: record framing of every logical channel, and with keys, misplaced and
duplicate records. ``--target-parallelism N`` checks that a rescale to N is possible.

A check that cannot run says why (``skipped``), and the status says how many were skipped:
"sound" with skipped checks is no proof. ``--strict`` counts every skipped check as failed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from itertools import chain
from typing import Any, Optional

import numpy as np

from ckpt_tool.channel_bounds import ChannelBounds
from ckpt_tool.errors import CkptError
from ckpt_tool.exchanges import MappingError, check_output_mapping, scan_exchanges
from ckpt_tool.flink.changelog import changelog_handles, read_change_set
from ckpt_tool.flink.channel_state import BufferSource, ChannelStateReader
from ckpt_tool.flink.checkpoint import Checkpoint
from ckpt_tool.flink.finished import finished_state_problem
from ckpt_tool.flink.key_groups import key_group_problems
from ckpt_tool.flink.model import (
    INPUT,
    OUTPUT,
    ByteStreamHandle,
    FileHandle,
    MergedChannelStateHandle,
    RelativeFileHandle,
)
from ckpt_tool.flink.operator_state import operator_state_problems
from ckpt_tool.flink.plan import JobPlan, PlanVertex, chain_max_parallelism_problems
from ckpt_tool.flink.uids import uid_problems
from ckpt_tool.planning import plan_rescale
from ckpt_tool.records.scan import digest_holders
from ckpt_tool.session import Session
from ckpt_tool.topology import check_new_topology

SOUND, PROBLEMS, UNUSABLE = "sound", "problems", "unusable"
# Small buffers (a lone watermark, say) are legitimately identical in many channels.
REPLICA_MIN_BUFFER_BYTES = 256


@dataclass
class Problem:
    check: str
    message: str
    operator: Optional[str] = None
    subtask: Optional[int] = None
    channel: Optional[str] = None
    count: int = 1


@dataclass
class CheckResult:
    name: str
    description: str
    skipped: str = ""  # why the check did not run; empty when it ran
    problems: list[Problem] = field(default_factory=list)
    unusable: bool = False  # problems of this check make the checkpoint unrestorable as it is

    @property
    def status(self) -> str:
        if self.skipped:
            return "skipped"
        return "failed" if self.problems else "passed"


@dataclass
class VerifyReport:
    checkpoint: str
    checks: list[CheckResult]
    strict: bool = False

    @property
    def status(self) -> str:
        if any(c.problems and c.unusable for c in self.checks):
            return UNUSABLE
        return PROBLEMS if any(c.problems for c in self.checks) else SOUND

    @property
    def skipped(self) -> list[CheckResult]:
        return [c for c in self.checks if c.skipped]

    @property
    def summary(self) -> str:
        """The status in words, naming what was not checked."""
        if not self.skipped:
            return self.status
        reasons: dict[str, list[str]] = {}
        for check in self.skipped:
            reasons.setdefault(check.skipped, []).append(check.name)
        listed = "; ".join(f"{', '.join(names)} ({reason})" for reason, names in reasons.items())
        return f"{self.status}, but {len(self.skipped)} of {len(self.checks)} checks skipped: {listed}"

    def as_dict(self) -> dict:
        return {
            "checkpoint": self.checkpoint,
            "status": self.status,
            "summary": self.summary,
            "strict": self.strict,
            "checks": [
                {
                    "name": c.name,
                    "description": c.description,
                    "status": c.status,
                    "problems": len(c.problems),
                    "skipped": c.skipped or None,
                }
                for c in self.checks
            ],
            "problems": [asdict(p) for c in self.checks for p in c.problems],
        }


def check_files(cp: Checkpoint) -> CheckResult:
    result = CheckResult("files", "every referenced file exists with its recorded size", unusable=True)
    result.problems = [Problem("files", message) for message in cp.file_problems()]
    return result


def check_channel_state(cp: Checkpoint, files_ok: bool, bounds: Optional[ChannelBounds] = None) -> list[CheckResult]:
    """``bounds``: the channels of each gate and partition, as far as the exchanges described say
    (without: a negative index is the only one known to be wrong)."""
    bounds = bounds or ChannelBounds({}, [])
    buffers = CheckResult("channel-state", "channel-state headers, offsets and buffer lengths", unusable=True)
    handles = CheckResult("channel-handles", "one handle per channel of a subtask at most, each in the job", unusable=True)
    replicas = CheckResult("buffer-replicas", "no buffer held by several subtasks of an operator")
    for op in cp.metadata.operators:
        digests = _Holders()
        # handles in files, by direction and file, across the subtasks: read file by file (ckpt's
        # rescale writes a file per engine task, for all subtasks, so that every subtask has handles
        # in each: opened subtask by subtask, each file was opened once per subtask). Plain handles
        # with their subtasks; merged ones per location, each subtask with its handle
        in_files: dict[tuple[str, int], tuple[Any, list[int], list]] = {}
        merged_in_files: dict[tuple[str, Optional[str]], list[tuple[int, Any, np.ndarray]]] = defaultdict(list)
        for s in op.subtasks:
            with ChannelStateReader() as reader:  # one subtask's files mapped at a time
                for direction in (INPUT, OUTPUT):
                    merged = _merged_digests(cp, reader, s, direction, op.id_hex, bounds) if files_ok else None
                    if merged is not None:  # merged handles, read as columns: nothing to report
                        found_here, in_local_files = merged
                        digests.add(found_here, s.index, direction)
                        for handle, offsets in in_local_files:
                            merged_in_files[(direction, cp.location(handle.delegate))].append((s.index, handle, offsets))
                        continue
                    infos = set()
                    readable = []
                    for h in s.channel_handles(direction):
                        if h.info in infos:
                            channel = _channel_name(direction, h)
                            handles.problems.append(
                                Problem("channel-handles", f"two handles for {channel}", op.label, s.index, channel)
                            )
                        infos.add(h.info)
                        if h.subtask_index != s.index:
                            channel = _channel_name(direction, h)
                            handles.problems.append(
                                Problem("channel-handles", f"handle names subtask {h.subtask_index}", op.label, s.index, channel)
                            )
                        missing = bounds.problem(op.id_hex, direction, *h.info)
                        if missing:  # Flink's restore indexes its gates and channels by them
                            channel = _channel_name(direction, h)
                            handles.problems.append(Problem("channel-handles", missing, op.label, s.index, channel))
                        if isinstance(h.delegate, (RelativeFileHandle, FileHandle)) and files_ok:
                            key = (direction, id(h.delegate))
                            group = in_files.get(key)
                            if group is None or group[0] is not h.delegate:
                                group = in_files[key] = (h.delegate, [], [])
                            group[1].append(s.index)
                            group[2].append(h)
                        elif files_ok or isinstance(h.delegate, ByteStreamHandle):
                            readable.append(h)
                    found = _buffer_digests(cp, reader, readable, direction, buffers.problems, op.label, s.index)
                    digests.add(found, s.index, direction)
        _file_digests(cp, in_files, digests, buffers.problems, op.label)
        _merged_file_digests(cp, merged_in_files, digests, buffers.problems, op.label)
        copies = digests.copies()
        if copies:
            replicas.problems.append(
                Problem("buffer-replicas", f"{copies} buffer copies are held by more than one subtask", op.label, count=copies)
            )
    return [buffers, handles, replicas]


class _Holders:
    """The subtasks of one operator holding each buffer digested (its xxh3-128, by direction),
    gathered as columns and grouped at once (``scan.digest_holders``): a job at parallelism p lists
    the buffers of p² channels."""

    def __init__(self) -> None:
        self._digests: list[bytes] = []
        self._owners: list[np.ndarray] = []
        self._outputs: list[np.ndarray] = []

    def add(self, found: list[bytes] | bytes, owners, direction: str) -> None:
        """``found``: 16-byte digests (or those joined), held by ``owners`` (one subtask, or one for
        each digest)."""
        joined = found if isinstance(found, bytes) else b"".join(found)
        if not joined:
            return
        count = len(joined) // 16
        self._digests.append(joined)
        self._owners.append(np.broadcast_to(np.asarray(owners, dtype=np.int64), (count,)))
        self._outputs.append(np.full(count, direction == OUTPUT, dtype=np.int8))

    def copies(self) -> int:
        """The buffers held too often: for each digest of a direction, its holders but one."""
        if not self._digests:
            return 0
        digest = np.frombuffer(b"".join(self._digests), dtype=np.uint64).reshape(-1, 2)
        *_, holders = digest_holders(digest, np.concatenate(self._owners), np.concatenate(self._outputs))
        return int((holders - 1).sum())


def _channel_name(direction: str, handle) -> str:
    return f"{direction} {handle.info[0]}/{handle.info[1]}"


def _merged_digests(
    cp: Checkpoint,
    reader: ChannelStateReader,
    subtask,
    direction: str,
    operator_id: str = "",
    bounds: Optional[ChannelBounds] = None,
) -> Optional[tuple[list[bytes], list[tuple[MergedChannelStateHandle, np.ndarray]]]]:
    """``_buffer_digests`` of a subtask's handles of one direction where they are merged handles
    whose channels all list as many buffers (as Flink 2.1+ writes them at high parallelism), read
    as columns without decoding a channel, and where there is nothing to report: each channel once,
    every handle the subtask's own, every channel in the job (of the operator ``operator_id``, by
    ``bounds``), every file read. None otherwise (then the handles are checked
    channel by channel, which names what is wrong). The handles in whole files are not read here
    but returned with their offsets, to be read file by file across the subtasks, as plain handles
    are (``_merged_file_digests``): the digests of the others, and those."""
    handles = subtask.input_channels if direction == INPUT else subtask.output_channels
    if not handles or not all(isinstance(h, MergedChannelStateHandle) and h.subtask_index == subtask.index for h in handles):
        return None
    keys, by_file = [], defaultdict(list)
    bounds = bounds or ChannelBounds({}, [])
    for handle in handles:
        channels = handle.alike_channels()
        if channels is None or bounds.first_outside(operator_id, direction, channels["gate"], channels["channel"]) is not None:
            return None  # (a channel not in the job: named channel by channel)
        keys.append(channels["gate"].astype(np.int64) << 32 | channels["channel"].astype(np.int64) & 0xFFFFFFFF)
        if "offsets" in (channels.dtype.names or ()):
            by_file[id(handle.delegate)].append((handle, channels["offsets"].astype(np.int64).reshape(-1)))
    every = np.concatenate(keys)
    ascending = len(every) < 2 or bool((every[1:] > every[:-1]).all())  # as Flink lists them: each once
    if not ascending and len(np.unique(every)) != len(every):
        return None
    found: list[bytes] = []
    deferred: list[tuple[MergedChannelStateHandle, np.ndarray]] = []
    for members in by_file.values():
        if isinstance(members[0][0].delegate, (RelativeFileHandle, FileHandle)):
            deferred += members
            continue
        source = BufferSource.in_delegate(cp, members[0][0].delegate, np.concatenate([o for _, o in members]).tolist())
        together = reader.buffer_digests_together([source], REPLICA_MIN_BUFFER_BYTES)
        if together is None:
            return None
        found += together
    return found, deferred


def _merged_file_digests(cp: Checkpoint, in_files: dict, digests: _Holders, problems: list, op) -> None:
    """The digests of merged handles in whole files, file by file across the subtasks
    (``in_files``: per direction and location, each subtask with its handle and its buffers'
    offsets), into ``digests``: a local file mapped once, its buffers read in one pass. Where a
    file does not read so (or is not local), each of its handles channel by channel, naming what
    does not read."""
    with ChannelStateReader() as reader:
        for (direction, _), members in in_files.items():
            offsets = [o for _, _, o in members]
            if _owned_digests(cp, reader, members[0][1].delegate, [s for s, _, _ in members], offsets, direction, digests):
                continue
            for subtask, handle, _ in members:
                digests.add(_buffer_digests(cp, reader, handle.channels, direction, problems, op, subtask), subtask, direction)


def _file_digests(cp: Checkpoint, in_files: dict, digests: _Holders, problems: list, op) -> None:
    """``_buffer_digests`` of plain handles grouped by file across subtasks (``in_files``: per
    direction and file, the file's handle, and each handle with its subtask), into ``digests``:
    a local file's in one pass; each handle on its own where that does not read (naming it)."""
    by_location: dict[tuple[str, Optional[str]], list[tuple[list[int], list]]] = defaultdict(list)
    for (direction, _), (delegate, subtasks, handles) in in_files.items():
        by_location[(direction, cp.location(delegate))].append((subtasks, handles))
    with ChannelStateReader() as reader:
        for (direction, _), groups in by_location.items():
            handles = [h for _, members in groups for h in members]
            subtasks = [s for owners, _ in groups for s in owners]
            if _owned_digests(cp, reader, handles[0].delegate, subtasks, [h.offsets for h in handles], direction, digests):
                continue
            for subtask, handle in zip(subtasks, handles):
                found = _digests_alone(cp, reader, handle, BufferSource.of(cp, handle), direction, problems, op, subtask)
                digests.add(found, subtask, direction)


def _owned_digests(
    cp: Checkpoint, reader, delegate, subtasks: list[int], offsets: list, direction: str, digests: _Holders
) -> bool:
    """The digests of the buffers of one local file that handles of many subtasks list (handle i,
    of ``subtasks[i]``, at ``offsets[i]``), read in one pass, into ``digests``; False (nothing
    added) where they do not read so."""
    counts = np.fromiter((len(o) for o in offsets), dtype=np.int64, count=len(offsets))
    owners = np.repeat(np.asarray(subtasks, dtype=np.int64), counts)
    if offsets and isinstance(offsets[0], np.ndarray):  # merged handles' columns
        flat = np.concatenate(offsets).astype(np.int64, copy=False)
    else:  # plain handles' tuples
        flat = np.fromiter(chain.from_iterable(offsets), dtype=np.int64, count=int(counts.sum()))
    # the array stands in for a list of offsets (buffer_digests_owned reads them as one): at
    # p=4,096 dense a list of the 16.8 million and back cost more than reading their lengths
    source = BufferSource.in_delegate(cp, delegate, flat)
    together = reader.buffer_digests_owned(source, owners, REPLICA_MIN_BUFFER_BYTES)
    if together is None:
        return False
    found, owners = together
    digests.add(found, owners, direction)
    return True


def _buffer_digests(cp: Checkpoint, reader: ChannelStateReader, handles: list, direction: str, problems: list, op, subtask):
    """Digests of the handles' buffers of at least REPLICA_MIN_BUFFER_BYTES: the handles of one
    local file in one pass (a job at parallelism p has p² of them); where that does not read, each
    handle on its own, and each one that does not read is a problem named by its channel."""
    by_file: dict[tuple, list[tuple[Any, BufferSource]]] = defaultdict(list)
    for handle in handles:
        source = BufferSource.of(cp, handle)
        by_file[(source.location, source.segment) if source.inline is None else (id(source),)].append((handle, source))
    found: list[bytes] = []
    for members in by_file.values():
        together = reader.buffer_digests_together([source for _, source in members], REPLICA_MIN_BUFFER_BYTES)
        if together is not None:
            found += together
            continue
        for handle, source in members:
            found += _digests_alone(cp, reader, handle, source, direction, problems, op, subtask)
    return found


def _digests_alone(cp: Checkpoint, reader: ChannelStateReader, handle, source, direction: str, problems: list, op, subtask):
    """The digests of one handle's buffers read on its own (at ``source``); none, and a problem
    named by its channel, where they do not read."""
    try:
        return reader.buffer_digests(source, REPLICA_MIN_BUFFER_BYTES)
    except CkptError as exc:
        channel = _channel_name(direction, handle)
        problems.append(Problem("channel-state", str(exc), op, subtask, channel))
        return []


def check_changelog(cp: Checkpoint, files_ok: bool) -> CheckResult:
    """Every change set of every changelog handle decodes inside its file, and every changelog
    handle's key groups lie inside its state backend handle's."""
    result = CheckResult("changelog", "changelog state: change sets decode, key groups inside the subtask's", unusable=True)
    read: dict[int, bytes] = {}
    for operator, subtask, backend, handle in changelog_handles(cp.metadata):
        own, held = handle.key_groups, backend.key_groups
        if not held.start <= own.start <= own.stop <= held.stop:
            message = f"changelog key groups {own.start}-{own.stop - 1} outside its state handle's {held.start}-{held.stop - 1}"
            result.problems.append(Problem("changelog", message, operator, subtask))
        for file, offset in handle.handles_and_offsets:
            if file is None or (not files_ok and not isinstance(file, ByteStreamHandle)):
                continue
            source = cp.location(file) or "inline changelog"
            try:
                if id(file) not in read:
                    read[id(file)] = cp.handle_bytes(file)
                read_change_set(read[id(file)], offset, source)
            except CkptError as exc:
                result.problems.append(Problem("changelog", str(exc), operator, subtask))
    return result


def check_key_groups(cp: Checkpoint, files_ok: bool) -> CheckResult:
    """Each key group of keyed state where its handle says, as Flink's restore reads it
    (``key_group_problems``)."""
    result = CheckResult(
        "key-group-offsets",
        "keyed state: each handle's key groups (some of its subtask's own) where it says, as Flink's restore reads them",
    )
    for operator, subtask, message in key_group_problems(cp, read_files=files_ok):
        result.problems.append(Problem("key-group-offsets", message, operator, subtask))
    return result


def check_operator_states(cp: Checkpoint, files_ok: bool) -> CheckResult:
    """Each managed operator state a handle names has its meta info in the handle's data, and its
    partitions inside it, as Flink's restore looks for them (``operator_state_problems``)."""
    result = CheckResult(
        "operator-state",
        "operator state: each state a handle names has its meta info in the handle's data, and its partitions lie inside it",
    )
    for operator, subtask, message in operator_state_problems(cp, read_files=files_ok):
        result.problems.append(Problem("operator-state", message, operator, subtask))
    return result


def check_operator_ids(cp: Checkpoint) -> CheckResult:
    """Each operator's state is under the id its uid hashes to, where the metadata stores uids
    (``uid_problems``)."""
    result = CheckResult("operator-ids", "each operator's state is under the id Flink gives its uid (a restore maps state by id)")
    for operator, message in uid_problems(cp.metadata):
        result.problems.append(Problem("operator-ids", message, operator))
    return result


def check_parallelism_and_finished(cp: Checkpoint, plan: Optional[JobPlan]) -> list[CheckResult]:
    parallelism = CheckResult(
        "parallelism",
        "parallelism within max parallelism, subtask indexes within parallelism (with --plan: one max parallelism per chain)",
        unusable=True,
    )
    finished = CheckResult(
        "finished-markers", "FLIP-147 finished markers are consistent (with --plan: as Flink checks them)", unusable=True
    )
    for op in cp.metadata.operators:
        if not 1 <= op.parallelism <= op.max_parallelism:
            parallelism.problems.append(
                Problem("parallelism", f"parallelism {op.parallelism} outside 1..{op.max_parallelism}", op.label)
            )
        indexes = [s.index for s in op.subtasks]
        if len(set(indexes)) != len(indexes) or any(not 0 <= i < op.parallelism for i in indexes):
            parallelism.problems.append(Problem("parallelism", f"subtask indexes {sorted(indexes)}", op.label))
        if op.fully_finished and op.coordinator_state is not None:
            finished.problems.append(Problem("finished-markers", "fully finished but has coordinator state", op.label))
    for label, message in chain_max_parallelism_problems(plan, cp.metadata) if plan else ():
        parallelism.problems.append(Problem("parallelism", message, label))
    markers = {op.id_hex: op.finished for op in cp.metadata.operators}
    problem = finished_state_problem(plan, markers.get) if plan else None
    if problem:
        finished.problems.append(Problem("finished-markers", problem))
    return [parallelism, finished]


NEEDS_EXCHANGES = "needs --plan or --schema"
NEEDS_KEYS = "needs --schema with record types and keys"


def check_records(session: Session, usable: bool) -> list[CheckResult]:
    exchanges = session.exchanges
    unusable = "" if usable else "the checkpoint is unusable (see the failed checks)"
    framing = CheckResult(
        "record-framing",
        "every logical channel splits into whole records",
        unusable or ("" if exchanges is not None else NEEDS_EXCHANGES),
        unusable=True,
    )
    keyed = exchanges is not None and any(e.keyed for e in exchanges)
    placement = CheckResult(
        "key-groups", "every in-flight record is in its subtask's key groups", unusable or ("" if keyed else NEEDS_KEYS)
    )
    duplicates = CheckResult("record-replicas", "no record held by more than one subtask", placement.skipped)
    if exchanges is None or not usable:
        return [framing, placement, duplicates]
    metadata = session.metadata
    try:
        check_output_mapping(session.checkpoint, exchanges, session.engine)
    except MappingError as exc:  # the channels would be stitched from the wrong sides: not scanned
        framing.problems.append(Problem("record-framing", str(exc)))
        placement.skipped = duplicates.skipped = placement.skipped or "the exchanges' output partitions are not proven"
        return [framing, placement, duplicates]
    for scan in scan_exchanges(session.checkpoint, exchanges, session.engine):
        exchange = scan.exchange
        label = metadata.exchange_label(exchange.upstream_id, exchange.downstream_id)
        downstream = metadata.label(exchange.downstream_id)
        for ch in scan.channels_with_problems():
            channel = f"{ch.upstream_subtask} -> {ch.downstream_subtask}"
            if ch.trailing_bytes:
                framing.problems.append(
                    Problem(
                        "record-framing",
                        f"{label}: {ch.trailing_bytes} bytes of a cut record",
                        downstream,
                        ch.downstream_subtask,
                        channel,
                    )
                )
            if scan.keyed and ch.misplaced_records:
                placement.problems.append(
                    Problem(
                        "key-groups",
                        f"{label}: {ch.misplaced_records} records outside the subtask's key groups",
                        downstream,
                        ch.downstream_subtask,
                        channel,
                        ch.misplaced_records,
                    )
                )
        if scan.keyed and scan.duplicate_records:
            duplicates.problems.append(
                Problem(
                    "record-replicas",
                    f"{label}: {scan.duplicate_records} record copies held by several subtasks",
                    downstream,
                    count=scan.duplicate_records,
                )
            )
    return [framing, placement, duplicates]


def check_target(session: Session, target: Optional[int], target_plan: Optional[dict[str, PlanVertex]] = None) -> CheckResult:
    if target is None:
        return CheckResult("target-parallelism", "a rescale to a given parallelism is possible", "needs --target-parallelism N")
    result = CheckResult("target-parallelism", f"a rescale to parallelism {target} is possible (Flink would restore it)")
    try:
        plan = plan_rescale(session.metadata, target, {}, session.described_exchanges, session.plan)
        check_new_topology(session, plan, target_plan, f"parallelism {target}")
    except CkptError as exc:  # a refusal, or in-flight records that cannot be read to tell
        result.problems.append(Problem("target-parallelism", str(exc)))
    return result


def parallelisms(metadata) -> dict[str, int]:
    return {op.id_hex: op.parallelism for op in metadata.operators}


def verify(
    session: Session, target: Optional[int] = None, strict: bool = False, target_plan: Optional[dict[str, PlanVertex]] = None
) -> VerifyReport:
    """Every check, in order. ``strict``: a check that could not run fails."""
    cp = session.checkpoint
    files = check_files(cp)
    checks = [
        files,
        *check_channel_state(
            cp, not files.problems, ChannelBounds(parallelisms(session.metadata), session.described_exchanges, session.plan)
        ),
        check_changelog(cp, not files.problems),
        check_key_groups(cp, not files.problems),
        check_operator_states(cp, not files.problems),
        check_operator_ids(cp),
        *check_parallelism_and_finished(cp, session.plan),
    ]
    usable = not any(c.problems for c in checks if c.unusable)
    checks += check_records(session, usable)
    checks.append(check_target(session, target, target_plan))
    if strict:
        for check in checks:
            if check.skipped:
                check.problems.append(Problem(check.name, f"not checked: {check.skipped} (--strict)"))
                check.skipped, check.unusable = "", False
    return VerifyReport(cp.uri, checks, strict)


def junit_xml(report: VerifyReport) -> str:
    """The report as JUnit XML: one test case per check, a failure per problem. Names and messages
    are text with unsafe characters escaped (XML 1.0 cannot hold most control characters at all)."""
    from xml.etree import ElementTree as ET

    from ckpt_tool.text import printable

    checks = report.checks
    suite = ET.Element(
        "testsuite",
        name="ckpt verify",
        tests=str(len(checks)),
        failures=str(sum(c.status == "failed" for c in checks)),
        skipped=str(sum(c.status == "skipped" for c in checks)),
    )
    ET.SubElement(ET.SubElement(suite, "properties"), "property", name="checkpoint", value=printable(report.checkpoint))
    for check in checks:
        case = ET.SubElement(suite, "testcase", classname="ckpt.verify", name=check.name)
        if check.skipped:
            ET.SubElement(case, "skipped", message=printable(check.skipped))
        for problem in check.problems:
            where = ", ".join(
                f"{k} {v}"
                for k, v in (("operator", problem.operator), ("subtask", problem.subtask), ("channel", problem.channel))
                if v is not None
            )
            message = printable(problem.message)
            failure = ET.SubElement(case, "failure", message=message, type=check.name)
            failure.text = f"{message} ({printable(where)})" if where else message
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)
