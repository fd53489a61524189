"""One writer per destination: a run claims DST before it writes anything there.

The claim is a lock file, ``DST/_ckpt_lock``, created exclusively (``O_EXCL`` locally, a
conditional create on object stores: ``If-None-Match: *`` on S3 and Azure, ``ifGenerationMatch=0``
on Google Cloud Storage). Its first line is a JSON record of the run: pid, host, start time, the
files directly in DST before it and the directories it created. Locally the run also holds an
``flock`` on it for its whole life; the kernel drops that when the process dies, even by ``kill -9``,
so a later run can tell a dead claim from a live one and clean up after it.

The lock is also the run's journal: before a file is created in DST, its name (or, for the files
Spark's attempts name, the name's prefix) is appended to the lock as a line ``file NAME`` (``prefix
NAME``) and the lock is fsynced. Cleanup, of a failed run or by the rerun after ``kill -9``, removes
exactly the journaled names that exist directly in DST and were not there before: never a file of
DST's subdirectories (another run's output may be there), never anything by a scan for
``ckpt-*``. On an object store nothing tells whether the owner is still alive: a second run is refused with the
exact list of what to remove if that run is dead (the ``ckpt-*`` objects directly in DST that
were not there before it); there the journal is kept by the run itself, for its own cleanup.

A run that fails removes exactly what it created: its journaled files, then its lock, then the
directories it made (never one that existed before it).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ckpt_tool.errors import AlreadyExistsError, CkptError, StorageError
from ckpt_tool.storage import FileIO, io_for, is_local, join, normalize_uri, within

LOCK_FILE = "_ckpt_lock"
OUTPUT_PREFIX = "ckpt-"  # every data file ckpt writes is named so
MAX_LOCK_BYTES = 1 << 26  # a lock holds a record and a journal line per file written
MAX_RECORD_DEPTH = 2  # the record is an object of strings, numbers and lists of strings
_OUTPUT_NAME = re.compile(r"ckpt-[A-Za-z0-9_-]{1,200}")  # a name of a file directly in DST
_JOURNAL_LINE = re.compile(rb"(file|prefix) (ckpt-[A-Za-z0-9_-]{1,200})")


class DestinationBusyError(CkptError):
    """Another ckpt run holds the destination, or a dead one left it locked (object stores)."""


@dataclass
class Claim:
    """This run's hold on ``dst``: what was there before, the directories it created and the
    files it creates (its journal)."""

    dst: str
    io: FileIO
    before: set[str] = field(default_factory=set)  # URIs of the files directly in DST before the run
    created_dirs: list[str] = field(default_factory=list)  # outermost first
    leftovers_removed: list[str] = field(default_factory=list)  # files of a dead run, cleaned up
    names: set[str] = field(default_factory=set)  # files this run creates directly in DST
    prefixes: set[str] = field(default_factory=set)  # ... and the prefixes of those Spark names
    _fd: Optional[int] = None

    @property
    def lock_uri(self) -> str:
        return join(self.dst, LOCK_FILE)

    def will_create(self, names: Iterable[str] = (), prefixes: Iterable[str] = ()) -> None:
        """Journal, before any of them is created, the names of files this run is about to create
        directly in DST (``prefixes``: files whose names start so, where Spark's attempts add a
        suffix). Locally the lines are appended to the lock and fsynced: a rerun after ``kill -9``
        removes exactly these."""
        lines = []
        for kind, wanted, known in (("file", names, self.names), ("prefix", prefixes, self.prefixes)):
            for name in wanted:
                if not is_output_name(name):
                    raise ValueError(f"ckpt does not create {name!r} in a destination")
                if name not in known:
                    known.add(name)
                    lines.append(f"{kind} {name}\n")
        if lines and self._fd is not None:
            data = "".join(lines).encode()
            try:
                os.lseek(self._fd, 0, os.SEEK_END)
                while data:
                    data = data[os.write(self._fd, data) :]
                os.fsync(self._fd)
            except OSError as exc:
                raise StorageError(f"cannot write {self.lock_uri}: {exc.strerror or exc}") from exc

    def created_files(self) -> list[str]:
        """The files directly in DST that this run created: the journaled names that exist and
        were not there before."""
        return _journaled(self.io, self.dst, self.names, self.prefixes, self.before)

    def undo(self) -> None:
        """Remove what this run created: its files, its lock, then the directories it made."""
        for uri in self.created_files():
            self.io.delete(uri)
        self.release()
        _remove_dirs(self.created_dirs)

    def release(self) -> None:
        try:
            self.io.delete(self.lock_uri)
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _journaled(io: FileIO, dst: str, names: Iterable[str], prefixes: Iterable[str], before: set[str]) -> list[str]:
    """URIs of the files directly in ``dst`` named in ``names`` or starting with one of
    ``prefixes``, and not in ``before``."""
    names, starts = set(names), tuple(prefixes)
    present = (join(dst, name) for name in io.list_names(dst) if name in names or (starts and name.startswith(starts)))
    return [uri for uri in present if uri not in before]


@contextmanager
def claimed(dst: str) -> Iterator[Claim]:
    """Hold ``dst`` for one run; on any failure inside, remove what the run created there."""
    claim = take_claim(dst)
    try:
        yield claim
    except BaseException as failure:
        try:
            claim.undo()
        except Exception as cleanup:  # the first error stays the one reported, with what is left to do
            failure.args = (
                f"{failure}; removing what this run wrote to {claim.dst} failed too ({cleanup}): "
                f"remove its ckpt-* files and {LOCK_FILE} there",
            )
        raise
    claim.release()


def take_claim(dst: str) -> Claim:
    dst = normalize_uri(dst).rstrip("/")
    io = io_for(dst)
    if not is_local(dst):  # an object store
        claim = Claim(dst, io, _files_in(io, dst))
        try:
            io.write(claim.lock_uri, _record(claim))
        except AlreadyExistsError:
            raise _remote_busy(claim) from None
    else:
        claim = _take_local(Claim(dst, io))
    try:
        _refuse_unclaimed_outputs(claim)
    except CkptError:
        claim.undo()
        raise
    return claim


def _files_in(io: FileIO, dst: str) -> set[str]:
    """URIs of the files directly in ``dst`` (its subdirectories are not looked into)."""
    return {join(dst, name) for name in io.list_names(dst)}


def _take_local(claim: Claim) -> Claim:
    claim.created_dirs = _missing_dirs(claim.dst)
    try:
        os.makedirs(claim.dst, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create {claim.dst}: {exc.strerror or exc}") from exc
    path = claim.lock_uri
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        fd = _take_over(claim)
    except OSError as exc:
        _remove_dirs(claim.created_dirs)
        raise StorageError(f"cannot create {path}: {exc.strerror or exc}") from exc
    else:
        # Between the create and this flock another run may have taken the still empty lock for
        # a dead one's: it then holds the flock until it ends, and the lock is its from now on.
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not _still_at(path, fd):
            os.close(fd)
            raise DestinationBusyError(f"{claim.dst} was claimed by another ckpt run just now; choose another destination")
    claim._fd = fd
    claim.before = _files_in(claim.io, claim.dst) - {path}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, _record(claim) + b"\n", 0)
        os.fsync(fd)
    except OSError as exc:
        claim.release()
        raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return claim


def _open_lock(path: str) -> int:
    """The existing lock, opened without following a link or blocking on a FIFO: only a regular
    file is a lock ckpt wrote (a link planted there would have ckpt truncate its target)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DestinationBusyError(
                f"{path} is a symbolic link, not a lock ckpt wrote: remove it, or choose another destination"
            ) from None
        raise StorageError(f"cannot open {path}: {exc.strerror or exc}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise DestinationBusyError(
            f"{path} is not a regular file, so not a lock ckpt wrote: remove it, or choose another destination"
        )
    return fd


def _take_over(claim: Claim) -> int:
    """The lock exists: refuse if its run is alive; if it died, clean up after it and hold the
    lock from now on."""
    path = claim.lock_uri
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        owner = _owner(_read_lock(fd)[0])
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise StorageError(f"cannot lock {path}: {exc.strerror or exc}") from exc
        raise DestinationBusyError(
            f"{claim.dst} is being written by another ckpt run ({owner}); wait for it or choose another destination"
        ) from None
    if not _still_at(path, fd):
        os.close(fd)
        raise DestinationBusyError(f"{claim.dst} was claimed by another ckpt run just now; choose another destination")
    record, names, prefixes = _read_lock(fd)
    if record is None:  # its run died before it wrote its record, so before it wrote anything
        return fd
    before = {join(claim.dst, name) for name in _strings(record, "files_before")}
    try:
        for uri in _journaled(claim.io, claim.dst, names, prefixes, before):
            claim.io.delete(uri)
            claim.leftovers_removed.append(uri)
    except BaseException:
        os.close(fd)
        raise
    dead_dirs = _strings(record, "created_dirs")  # the lock is untrusted: DST and its parents only
    claim.created_dirs = [d for d in dead_dirs if within(claim.dst, d)]
    return fd


def _read_lock(fd: int) -> tuple[Optional[dict], list[str], list[str]]:
    """A lock's record (None where it is empty or not one: the lock is untrusted) and its journal:
    the names and the prefixes its run created files under. Reads at most MAX_LOCK_BYTES."""
    data = os.pread(fd, min(os.fstat(fd).st_size, MAX_LOCK_BYTES), 0)
    first, _, journal = data.partition(b"\n")
    names: list[str] = []
    prefixes: list[str] = []
    for line in journal.split(b"\n")[:-1]:  # whole lines only: a run may die writing one
        match = _JOURNAL_LINE.fullmatch(line)
        if match:
            (names if match.group(1) == b"file" else prefixes).append(match.group(2).decode())
    return _parse_record(first), names, prefixes


def is_output_name(name: str) -> bool:
    """Whether ``name`` is one ckpt gives a file it creates directly in a destination."""
    return _OUTPUT_NAME.fullmatch(name) is not None


def _is_output(uri: str) -> bool:
    return uri.rsplit("/", 1)[-1].startswith(OUTPUT_PREFIX)


def _refuse_unclaimed_outputs(claim: Claim) -> None:
    """Files named as ckpt names its outputs, with no lock beside them, come from a run that left
    no record (or from a copy): ckpt would not overwrite them, so it says what to remove first."""
    found = sorted(uri for uri in claim.before if _is_output(uri))
    if found:
        listed = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise DestinationBusyError(
            f"{claim.dst} holds {len(found)} files of an earlier ckpt run that did not finish ({listed}); "
            "remove them, or choose another destination"
        )


def _still_at(path: str, fd: int) -> bool:
    """Whether the lock file ``fd`` holds is still the one at ``path`` (not removed by its run)."""
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _missing_dirs(directory: str) -> list[str]:
    """The directories from ``directory`` upwards that do not exist yet, outermost first."""
    missing = []
    while directory and not os.path.lexists(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    return missing[::-1]


def _remove_dirs(directories: list[str]) -> None:
    """Remove the directories a run created, innermost first, while they are empty."""
    for directory in reversed(directories):
        try:
            os.rmdir(directory)
        except OSError:
            return


def _record(claim: Claim) -> bytes:
    names = sorted(uri[len(claim.dst) + 1 :] for uri in claim.before)
    return json.dumps(
        {
            "tool": "ckpt",
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files_before": names,
            "created_dirs": claim.created_dirs,
        }
    ).encode()


def _nesting(text: str) -> int:
    """How deeply JSON ``text`` nests arrays and objects, counted without parsing it (so a
    hostile lock cannot make the parser recurse)."""
    brackets = re.sub(r'"(?:[^"\\]|\\.)*"|[^\[\]{}]', "", text).encode()
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def _parse_record(data: bytes) -> Optional[dict]:
    """A lock's record, or None where it is empty or not one (the lock is untrusted): a JSON
    object no deeper than a record is, read without recursion."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    if _nesting(text) > MAX_RECORD_DEPTH:
        return None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _strings(record: dict, key: str) -> list[str]:
    values = record.get(key)
    return [v for v in values if isinstance(v, str)] if isinstance(values, list) else []


def _owner(record: Optional[dict]) -> str:
    if record is None:
        return "a lock without a record"
    pid, host, started = (record.get(key) for key in ("pid", "host", "started"))
    if type(pid) is not int or not isinstance(host, str) or not isinstance(started, str):
        return "a lock without a record"
    return f"pid {pid} on {host[:100]}, since {started[:40]}"


def _remote_busy(claim: Claim) -> DestinationBusyError:
    """An object store cannot tell whether the owner lives: say exactly what to remove if it does not."""
    try:
        record = _parse_record(claim.io.read_at_most(claim.lock_uri, MAX_LOCK_BYTES).partition(b"\n")[0])
    except StorageError:
        record = None
    before = {join(claim.dst, name) for name in _strings(record or {}, "files_before")}
    owner = _owner(record)
    written = [uri for uri in claim.before if uri not in before and _is_output(uri)]
    listed = ", ".join(sorted(written)[:5]) + (f" and {len(written) - 5} more" if len(written) > 5 else "")
    return DestinationBusyError(
        f"{claim.dst} is claimed by another ckpt run ({owner}); if that run is no longer running, remove "
        f"{claim.lock_uri}" + (f" and the {len(written)} files it wrote ({listed})" if written else "") + ", then run again"
    )
