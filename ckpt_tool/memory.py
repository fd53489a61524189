"""The C heap: freed memory given back to the operating system, or kept for reuse.

NumPy's arrays of a few KiB to a few MiB come from the C heap, and glibc keeps what is freed
there for reuse. After building columns of p² channels from many small pieces, hundreds of MB
can stay with the process though nothing uses them; forked workers then share them, and every
measure of the process's memory counts them. ``release_memory`` returns them (glibc's
``malloc_trim``); elsewhere it does nothing.

The other way round, glibc gives the top of the heap back by itself at every free past a
threshold, and the kernel then maps and zeroes those pages again at the next allocation. A
command keeps up to HEAP_TOP_KEPT there (``keep_heap_top``): ``inspect --json`` at p=4,096 writes
2.3 GB of channel rows a MiB at a time, and each piece made and freed had cost its pages again
(3.1 s of system time in a run of 5.8 s, written to /dev/null; 0.7 s with it. Written to a
file, as the bench does: 7.4 to 9.5 s CPU before, 5.0 to 5.9 s with it, the same peak). An
engine task keeps more (``reuse_memory``): it makes and frees channel-sized blocks of up to 32 MiB
again and again, which on a small VM had made first touches of memory slower than the rest of
the record path. glibc only: elsewhere these do nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any, Optional

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
HEAP_TOP_KEPT = 16 << 20  # a command's process: free memory at the top of the heap kept for reuse, at most
TASK_HEAP_TOP_KEPT = 256 << 20  # an engine task's process
TASK_TOP_PAD = 64 << 20  # an engine task's process: grown by at least this much at a time
MAPPED_FROM = 32 << 20  # allocations at least this large are mapped on their own (glibc's own upper bound)


@functools.cache
def _libc() -> Optional[Any]:
    """The C library's functions, as the process has them linked (not ``find_library``, which
    runs ``ldconfig``: 20 ms at every command's start)."""
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):
        return None


# (process, kept, pad) as ``keep_heap_top`` last set them: an engine task asks at every channel
# it scans one by one, and a forked worker sets its own once
_kept_as: Optional[tuple[int, int, int]] = None


def keep_heap_top(kept: int = HEAP_TOP_KEPT, pad: int = 0) -> None:
    """Keep up to ``kept`` bytes of free memory at the top of the C heap instead of returning them
    at every free (growing it by at least ``pad`` at a time where not 0), with allocations below
    MAPPED_FROM taken from the heap (as glibc comes to on its own once a large block is freed;
    fixing the one threshold stops that adjustment, so both are set). ``release_memory`` still
    gives everything back where a command asks. A no-op where the C library is not glibc, and
    where this process has them set so already."""
    global _kept_as
    wanted = (os.getpid(), kept, pad)
    if _kept_as == wanted:
        return
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MAPPED_FROM)
        mallopt(M_TRIM_THRESHOLD, kept)
        if pad:
            mallopt(M_TOP_PAD, pad)
    _kept_as = wanted


def reuse_memory() -> None:
    """``keep_heap_top`` as an engine task keeps it (TASK_HEAP_TOP_KEPT, TASK_TOP_PAD)."""
    keep_heap_top(TASK_HEAP_TOP_KEPT, TASK_TOP_PAD)


@functools.cache
def _trim() -> Optional[Any]:
    return getattr(_libc(), "malloc_trim", None)


def release_memory() -> None:
    """Return the C heap's free memory to the operating system, where the C library can."""
    trim = _trim()
    if trim is not None:
        trim(0)
