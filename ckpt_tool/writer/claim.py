"""One writer per destination: a run claims DST before it writes anything there.

The claim is a lock file, ``DST/_ckpt_lock``, created exclusively (``O_EXCL`` locally, a
conditional create on object stores: ``If-None-Match: *`` on S3 and Azure, ``ifGenerationMatch=0`` on
Google Cloud Storage) and holding a JSON record of the run: pid, host,
start time and the files DST held before. Locally the run also holds an ``flock`` on it for its
whole life; the kernel drops that when the process dies, even by ``kill -9``, so a later run can
tell a dead claim from a live one and clean up after it. On an object store nothing tells whether the owner is
still alive: a second run is refused with the exact list of what to remove if that run is dead.

A run that fails removes exactly what it created: the files that were not in DST before, then
the directories it made (never one that existed before it), then its lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

from ckpt_tool.errors import AlreadyExistsError, CkptError, StorageError
from ckpt_tool.storage import FileIO, io_for, is_local, join, normalize_uri, within

LOCK_FILE = "_ckpt_lock"
OUTPUT_PREFIX = "ckpt-"  # every data file ckpt writes is named so
MAX_RECORD_BYTES = 1 << 24


class DestinationBusyError(CkptError):
    """Another ckpt run holds the destination, or a dead one left it locked (object stores)."""


@dataclass
class Claim:
    """This run's hold on ``dst``: what was there before, and the directories it created."""

    dst: str
    io: FileIO
    before: set[str] = field(default_factory=set)
    created_dirs: list[str] = field(default_factory=list)  # outermost first
    leftovers_removed: list[str] = field(default_factory=list)  # files of a dead run, cleaned up
    _fd: Optional[int] = None

    @property
    def lock_uri(self) -> str:
        return join(self.dst, LOCK_FILE)

    def created_files(self) -> list[str]:
        """The data files in DST that this run created: named as ckpt names them, and not there
        before (no other ckpt run writes there while this one holds the claim)."""
        return [uri for uri in self.io.list(self.dst) if uri not in self.before and _is_output(uri)]

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
        claim = Claim(dst, io, set(io.list(dst)))
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


def _take_local(claim: Claim) -> Claim:
    claim.created_dirs = _missing_dirs(claim.dst)
    try:
        os.makedirs(claim.dst, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create {claim.dst}: {exc.strerror or exc}") from exc
    path = claim.lock_uri
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
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
    claim.before = set(claim.io.list(claim.dst)) - {path}
    os.ftruncate(fd, 0)
    os.pwrite(fd, _record(claim), 0)
    return claim


def _take_over(claim: Claim) -> int:
    """The lock exists: refuse if its run is alive; if it died, clean up after it and hold the
    lock from now on."""
    path = claim.lock_uri
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        owner = _owner(_parse_record(os.pread(fd, MAX_RECORD_BYTES, 0)))
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise StorageError(f"cannot lock {path}: {exc.strerror or exc}") from exc
        raise DestinationBusyError(
            f"{claim.dst} is being written by another ckpt run ({owner}); wait for it or choose another destination"
        ) from None
    if not _still_at(path, fd):
        os.close(fd)
        raise DestinationBusyError(f"{claim.dst} was claimed by another ckpt run just now; choose another destination")
    record = _parse_record(os.pread(fd, MAX_RECORD_BYTES, 0))
    if record is None:  # its run died before it wrote its record, so before it wrote anything
        return fd
    before = {join(claim.dst, name) for name in _strings(record, "files_before")}
    for uri in claim.io.list(claim.dst):
        if uri not in before and _is_output(uri):
            claim.io.delete(uri)
            claim.leftovers_removed.append(uri)
    dead_dirs = _strings(record, "created_dirs")  # the lock is untrusted: DST and its parents only
    claim.created_dirs = [d for d in dead_dirs if within(claim.dst, d)]
    return fd


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
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _missing_dirs(directory: str) -> list[str]:
    """The directories from ``directory`` upwards that do not exist yet, outermost first."""
    missing = []
    while directory and not os.path.exists(directory):
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


def _parse_record(data: bytes) -> Optional[dict]:
    """A lock's record, or None where it is empty or not one (the lock is untrusted)."""
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _strings(record: dict, key: str) -> list[str]:
    values = record.get(key)
    return [v for v in values if isinstance(v, str)] if isinstance(values, list) else []


def _owner(record: Optional[dict]) -> str:
    if record is None:
        return "a lock without a record"
    return f"pid {record.get('pid')} on {record.get('host')}, since {record.get('started')}"


def _remote_busy(claim: Claim) -> DestinationBusyError:
    """An object store cannot tell whether the owner lives: say exactly what to remove if it does not."""
    record = _parse_record(claim.io.read(claim.lock_uri))
    before = {join(claim.dst, name) for name in _strings(record or {}, "files_before")}
    owner = _owner(record)
    written = [uri for uri in claim.before if uri not in before and _is_output(uri)]
    listed = ", ".join(sorted(written)[:5]) + (f" and {len(written) - 5} more" if len(written) > 5 else "")
    return DestinationBusyError(
        f"{claim.dst} is claimed by another ckpt run ({owner}); if that run is no longer running, remove "
        f"{claim.lock_uri}" + (f" and the {len(written)} files it wrote ({listed})" if written else "") + ", then run again"
    )
