"""Run a command and measure its own peak memory.

A child forked by the test process (with or without exec) starts its peak resident size at the
test process's, hundreds of MB late in a test run; and the test process's ``RUSAGE_CHILDREN``
holds every child reaped before (Flink JVMs of other test files). So the command runs under a
small Python process that forks it, waits for it alone and writes its ``ru_maxrss`` to a file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class Measured:
    returncode: int
    stdout: str
    stderr: str
    peak_kib: int  # the command's own ru_maxrss; 0 when it was killed before it ended


def run_measured(args: list[str], timeout: float, preexec_fn: Optional[Callable[[], None]] = None) -> Measured:
    """Run ``args`` in a new session; past ``timeout`` seconds its whole process group is killed."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile() as peak:
        wrapped = [sys.executable, "-c", _PEAK_OF_GRANDCHILD, peak.name, *args]
        run = subprocess.Popen(wrapped, stdout=out, stderr=err, preexec_fn=preexec_fn, start_new_session=True)
        timer = threading.Timer(timeout, lambda: os.killpg(run.pid, signal.SIGKILL))
        timer.start()
        try:
            run.wait()
        finally:
            timer.cancel()
        out.seek(0)
        err.seek(0)
        return Measured(run.returncode, out.read().decode(), err.read().decode(), int(Path(peak.name).read_text() or 0))


_PEAK_OF_GRANDCHILD = """
import os, signal, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as peak:
    peak.write(str(usage.ru_maxrss))
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
"""
