"""Giving freed memory back to the operating system.

NumPy's arrays of a few KiB to a few MiB come from the C heap, and glibc keeps what is freed
there for reuse. After building columns of p² channels from many small pieces, hundreds of MB
can stay with the process though nothing uses them; forked workers then share them, and every
measure of the process's memory counts them. ``release_memory`` returns them (glibc's
``malloc_trim``); elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any, Optional


@functools.cache
def _trim() -> Optional[Any]:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Return the C heap's free memory to the operating system, where the C library can."""
    trim = _trim()
    if trim is not None:
        trim(0)
