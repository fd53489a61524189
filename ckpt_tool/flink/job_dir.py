"""A job's checkpoint directory (``…/<job-id>/``): its ``chk-<n>`` checkpoints and any
``savepoint-*`` directories, and which checkpoint is the newest complete one.

Flink writes a checkpoint's ``_metadata`` last, so a ``chk-<n>`` that holds one is complete;
one without is in progress, or was abandoned.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional

from ckpt_tool.storage import FileIO, is_local, join, normalize_uri

METADATA_FILE = "_metadata"
_ENTRY = re.compile(r"^(?:chk-(\d+)|(savepoint-[^/]+))$")


@dataclass
class JobEntry:
    """One checkpoint or savepoint directory of a job directory."""

    name: str  # chk-7, savepoint-1a2b3c-…
    uri: str
    kind: str  # checkpoint or savepoint
    checkpoint_id: Optional[int]  # from the directory's name (checkpoints only)
    complete: bool  # holds a _metadata
    files: int = 0
    directory_bytes: int = 0  # what the directory itself holds (shared files are counted apart)
    sizes: dict[str, int] = field(default_factory=dict, repr=False)


def job_entries(io: FileIO, job_dir: str) -> list[JobEntry]:
    """The job directory's checkpoints (by id) and savepoints (by name), from one listing."""
    job_dir = normalize_uri(job_dir).rstrip("/")
    entries: dict[str, JobEntry] = {}
    for uri, size in _listing(io, job_dir):
        relative = uri[len(job_dir) + 1 :]
        top, _, rest = relative.partition("/")
        match = _ENTRY.match(top)
        if not match or not rest:
            continue
        entry = entries.get(top)
        if entry is None:
            number = int(match.group(1)) if match.group(1) else None
            kind = "checkpoint" if number is not None else "savepoint"
            entry = entries[top] = JobEntry(top, join(job_dir, top), kind, number, False)
        entry.files += 1
        entry.directory_bytes += size
        entry.sizes[uri] = size
        if rest == METADATA_FILE:
            entry.complete = True
    return sorted(entries.values(), key=lambda e: (e.kind != "checkpoint", e.checkpoint_id or 0, e.name))


def _listing(io: FileIO, job_dir: str) -> list[tuple[str, int]]:
    """The files of the job directory's checkpoint and savepoint directories, with sizes. Locally
    only those directories are walked (not ``shared/``, nor a whole tree given by mistake)."""
    if not is_local(job_dir):
        return io.list_sizes(job_dir)
    try:
        children = sorted(entry.name for entry in os.scandir(job_dir) if entry.is_dir(follow_symlinks=False))
    except OSError:
        return []
    found: list[tuple[str, int]] = []
    for name in children:
        if _ENTRY.match(name):
            found += io.list_sizes(join(job_dir, name))
    return found


def newest_complete(io: FileIO, job_dir: str) -> Optional[JobEntry]:
    """The complete checkpoint with the highest id, if any."""
    complete = [e for e in job_entries(io, job_dir) if e.kind == "checkpoint" and e.complete]
    return max(complete, key=lambda e: e.checkpoint_id or 0) if complete else None
