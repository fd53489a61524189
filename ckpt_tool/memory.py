"""Giving freed memory back to the operating system.

NumPy's arrays of a few KiB to a few MiB come from the C heap, and glibc keeps what is freed
there for reuse. After building columns of p² channels from many small pieces, hundreds of MB
can stay with the process though nothing uses them; forked workers then share them, and every
measure of the process's memory counts them. ``release_memory`` returns them (glibc's
``malloc_trim``); elsewhere it does nothing.

The other way round, ``keep_heap_top`` stops glibc from giving memory back by itself each time
the top of the heap is freed: ``inspect --json`` at p=4,096 writes 2.3 GB of channel rows a MiB
at a time, and each piece, made and freed, had the kernel map and zero its pages again (3.1 s of
system time in a run of 5.8 s, written to /dev/null; 0.7 s with it. Written to a file, as the
bench does: 7.4 to 9.5 s CPU before, 5.0 to 5.9 s with it, the same peak).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any, Optional

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
HEAP_TOP_KEPT = 16 << 20  # free memory at the top of the heap kept for reuse, at most
MAPPED_FROM = 32 << 20  # allocations at least this large are mapped on their own (glibc's own upper bound)


@functools.cache
def _libc() -> Optional[Any]:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def keep_heap_top() -> None:
    """Keep up to HEAP_TOP_KEPT of free memory at the top of the C heap instead of returning it
    at every free, with allocations below MAPPED_FROM taken from the heap (as glibc comes to on
    its own once a large block is freed; fixing the one threshold stops that adjustment, so both
    are set). ``release_memory`` still gives everything back where a command asks. A no-op where
    the C library is not glibc."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MAPPED_FROM)
        mallopt(M_TRIM_THRESHOLD, HEAP_TOP_KEPT)


@functools.cache
def _trim() -> Optional[Any]:
    return getattr(_libc(), "malloc_trim", None)


def release_memory() -> None:
    """Return the C heap's free memory to the operating system, where the C library can."""
    trim = _trim()
    if trim is not None:
        trim(0)
