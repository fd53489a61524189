"""Files ckpt writes besides checkpoints: the records' Parquet file and the HTML and JUnit reports.

They hold what the checkpoint holds (``ckpt records`` every record value), so they are never more
readable than the checkpoint: they get the permission bits its files would give a written
checkpoint (``ckpt_tool.writer.readable_mode``: owner-only unless the source and the umask are
more open). Each is written to a new owner-only temporary file in the target's directory and
renamed over the target, so nobody reads a half-written report and a symbolic link at the target
is replaced, never followed.
"""

from __future__ import annotations

import os
import tempfile

from ckpt_tool.errors import StorageError
from ckpt_tool.flink.checkpoint import Checkpoint


def report_mode(source: Checkpoint) -> int:
    """The permission bits of a file holding what ``source`` holds."""
    from ckpt_tool.writer import readable_mode

    return readable_mode(source)


def publish(temporary: str, path: str, mode: int) -> None:
    """Give ``temporary`` (a file this run created) ``mode`` on its own descriptor, then rename it
    to ``path``."""
    fd = os.open(temporary, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def write_report(path: str, text: str, mode: int) -> None:
    """Write ``text`` (UTF-8) to ``path`` with permission bits ``mode``."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, temporary = tempfile.mkstemp(prefix=".ckpt-report-", dir=directory)  # O_EXCL, owner-only
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        publish(temporary, path, mode)
    except OSError as exc:
        _remove(temporary)
        raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        _remove(temporary)
        raise


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
