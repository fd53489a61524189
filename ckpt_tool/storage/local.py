"""Local file system storage.

Every file read is opened once, without blocking (``O_NONBLOCK``: a FIFO never hangs the open),
and checked on the open descriptor: it must be a regular file (not a FIFO, a device or a
directory), and what is read is the file that was checked. A FileIO confined to a directory
(``confined``, as a checkpoint's job directory) opens the files named below that directory only
where they really are below it: the path is resolved once (symbolic links that stay inside are
followed), then opened one component at a time from the directory with ``O_NOFOLLOW``, so a
link swapped in while ckpt runs is refused, never followed out.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import mmap
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from typing import Optional

from ckpt_tool.errors import AlreadyExistsError, StorageError
from ckpt_tool.storage.base import FileIO, normalize_uri, within

READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
)


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class LocalFileIO(FileIO):
    def __init__(self, root: Optional[str] = None):
        self.root = root  # files named below it are read only where they really are below it

    def _path(self, uri: str) -> str:
        return normalize_uri(uri)

    def confined(self, directory: str) -> LocalFileIO:
        return LocalFileIO(os.path.abspath(normalize_uri(directory)))

    def _open(self, uri: str, blocking: bool = True) -> int:
        """A descriptor of the regular file at ``uri``, opened for reading, in blocking mode
        (``blocking`` False leaves ``O_NONBLOCK`` set: a regular file reads the same with it)."""
        return self._opened(uri, blocking)[0]

    def _opened(self, uri: str, blocking: bool = True) -> tuple[int, os.stat_result]:
        """``_open``'s descriptor, and what ``fstat`` says of it."""
        path, parts = self._located(uri)
        try:
            if parts is not None and self.root is not None:
                fd = _open_beneath(uri, path, self.root, parts)
            else:
                fd = os.open(path, READ_FLAGS)
        except OSError as exc:
            raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise StorageError(f"{uri} is {kind_of(info.st_mode)}, not a regular file: refused")
            if blocking:
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        except BaseException:
            os.close(fd)
            raise
        return fd, info

    def _located(self, uri: str) -> tuple[str, Optional[tuple[str, ...]]]:
        """The path of ``uri``, and where it is named below the root (or is it), its components
        from there (None where it is not). Kept for an absolute path (a rescale at p=4,096 opens
        each of 4,096 files in each task); a relative one is made absolute first (the working
        directory asked once, not twice per file)."""
        path = uri if uri.startswith("/") else normalize_uri(uri)
        return _located_absolute(self.root, path if path.startswith("/") else os.path.join(os.getcwd(), path))

    def read(self, uri: str) -> bytes:
        fd = self._open(uri)
        try:
            with os.fdopen(fd, "rb") as f:
                return f.read()
        except OSError as exc:
            raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from exc

    def read_at_most(self, uri: str, limit: int) -> bytes:
        """The whole file, refused without reading it where the open file holds more than ``limit``
        bytes (its size as ``fstat`` gives it; a file that grows while read is cut at ``limit + 1``)."""
        fd = self._open(uri)
        try:
            with os.fdopen(fd, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                # read(n) allocates n bytes first: ask for what fstat says (and one more), then
                # go on in pieces only where the file grew meanwhile
                data = f.read(size + 1) if size <= limit else b""
                if len(data) > size:
                    pieces = [data]
                    while (held := sum(map(len, pieces))) <= limit and (piece := f.read(min(1 << 24, limit + 1 - held))):
                        pieces.append(piece)
                    data = b"".join(pieces)
        except OSError as exc:
            raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from exc
        if size > limit or len(data) > limit:
            raise StorageError(f"{uri} has {max(size, len(data))} bytes, more than the {limit} ckpt reads: refused")
        return data

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        fd = self._open(uri)
        try:
            with os.fdopen(fd, "rb") as f:
                f.seek(start)
                data = f.read(length)
        except OSError as exc:
            raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from exc
        if len(data) != length:
            raise StorageError(f"{uri} is truncated: wanted {length} bytes at {start}, got {len(data)}")
        return data

    def read_spans(self, uri: str, spans: Callable[[Callable[[int, int], bytes]], object]) -> object:
        """``spans(read)`` with the file opened once: ``read(start, length)`` returns up to
        ``length`` bytes at ``start`` (fewer at the end of the file). A task reads a few kB of each
        of thousands of files, where mapping each costs more than reading what it needs."""
        fd, info = self._opened(uri, blocking=False)
        try:
            return spans(_Pread(fd, info))
        except OSError as exc:
            raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)

    def size(self, uri: str) -> int:
        try:
            info = os.stat(self._path(uri))
        except OSError as exc:
            raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(info.st_mode):
            raise StorageError(f"{uri} is {kind_of(info.st_mode)}, not a regular file: refused")
        return info.st_size

    def exists(self, uri: str) -> bool:
        return os.path.exists(self._path(uri))

    def list_names(self, uri: str) -> list[str]:
        """The names of the entries directly in the directory ``uri`` that are not directories
        (symbolic links included, never followed); subdirectories are not looked into."""
        try:
            with os.scandir(self._path(uri)) as entries:
                return sorted(e.name for e in entries if not e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StorageError(f"cannot list {uri}: {exc.strerror or exc}") from exc

    def list(self, uri: str) -> list[str]:
        root = self._path(uri)
        found: list[str] = []
        for directory, _, files in os.walk(root):
            found.extend(os.path.join(directory, name) for name in files)
        return sorted(found)

    def map(self, uri: str):
        fd = self._open(uri)
        try:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if os.fstat(fd).st_size else b""
        except OSError as exc:
            raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)

    def write_stream(self, uri: str, chunks: Iterable[bytes]) -> None:
        """Created owner-only (the writer opens it up as far as its sources are, at the end);
        a file this call created is removed again if writing it fails."""
        path = self._path(uri)
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError as exc:
            raise AlreadyExistsError(f"{uri} already exists; ckpt never overwrites files") from exc
        except OSError as exc:
            raise StorageError(f"cannot write {uri}: {exc.strerror or exc}") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
        except BaseException as exc:
            os.remove(path)
            if isinstance(exc, OSError):
                raise StorageError(f"cannot write {uri}: {exc.strerror or exc}") from exc
            raise

    def set_mode(self, uri: str, mode: int) -> None:
        """Change the mode through a descriptor of the file itself: a symbolic link is never
        followed, and only a regular file with no other name (not a hard link to someone else's
        file) is changed."""
        try:
            fd = os.open(self._path(uri), READ_FLAGS | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StorageError(f"{uri} is a symbolic link, not a file ckpt wrote: refused") from exc
            raise StorageError(f"cannot change the mode of {uri}: {exc.strerror or exc}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                what = kind_of(info.st_mode) if not stat.S_ISREG(info.st_mode) else "a file with other names (hard links)"
                raise StorageError(f"{uri} is {what}, not a file ckpt wrote: refused")
            os.fchmod(fd, mode)
        except OSError as exc:
            raise StorageError(f"cannot change the mode of {uri}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)

    def delete(self, uri: str) -> None:
        try:
            os.remove(self._path(uri))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"cannot remove {uri}: {exc.strerror or exc}") from exc


class _Pread:
    """``read(start, length)`` of an open file, and the file's ``identity`` (device, inode, size
    and modification time): what a reader may key what it learned of the file by."""

    __slots__ = ("fd", "identity")

    def __init__(self, fd: int, info: os.stat_result):
        self.fd = fd
        self.identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)

    def __call__(self, start: int, length: int) -> bytes:
        return os.pread(self.fd, length, start)


def _locate(root: Optional[str], path: str) -> tuple[str, Optional[tuple[str, ...]]]:
    if root is None or not within(os.path.abspath(path), root):
        return path, None
    path = os.path.abspath(path)
    return path, tuple(path[len(root.rstrip("/")) + 1 :].split("/")) if path != root else ()


_located_absolute = functools.lru_cache(maxsize=1 << 16)(_locate)


def _open_beneath(uri: str, path: str, root: str, parts: Sequence[str]) -> int:
    """Open ``path``, which is named below ``root``, only where it really is below ``root``: each
    of its components is opened from ``root`` with ``O_NOFOLLOW``, so no link is followed (the
    common case, without resolving the path: a rescale's output is read a file per channel); where
    one is a link, the path's links are resolved once, then each component of what they resolve to
    is opened so, and nothing swapped in later is followed. ``parts``: the path's components from
    ``root`` (``_locate``)."""
    if path != root:
        fd = _open_components(root, parts)
        if fd is not None:
            return fd
    real_root = os.path.realpath(root)
    real = _resolved(uri, path)
    if not within(real, real_root):
        raise StorageError(f"{uri} is a symbolic link to {real}, outside {root}: refused")
    fd = _open_components(real_root, os.path.relpath(real, real_root).split("/"))
    if fd is None:
        now = _resolved(uri, path)  # a component became a link since it was resolved
        where = f"to {now}, outside {root}" if not within(now, real_root) else f"inside {root}"
        raise StorageError(f"{uri} became a symbolic link {where} while ckpt read it: refused")
    return fd


def _resolved(uri: str, path: str) -> str:
    """``path`` with its links resolved; refused where a component is swapped between a link and a
    directory while it is resolved (``realpath`` then fails reading a link that is no longer one)."""
    try:
        return os.path.realpath(path)
    except OSError as exc:
        raise StorageError(f"{uri}: a part of it became or stopped being a symbolic link while ckpt read it: refused") from exc


def _open_components(root: str, parts: Sequence[str]) -> Optional[int]:
    """``parts`` (a relative path's components) opened one by one from ``root``, none followed if
    it is a link; None where one is a link (or a link to something that is not a directory)."""
    directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            os.close(directory)
            directory = inner
        return os.open(parts[-1], READ_FLAGS | os.O_NOFOLLOW, dir_fd=directory)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return None
        raise
    finally:
        os.close(directory)
