"""The storage interface and URI helpers."""

from __future__ import annotations

import posixpath
from abc import ABC, abstractmethod
from collections.abc import Iterable

from ckpt_tool.errors import StorageError

S3_SCHEMES = ("s3://", "s3a://", "s3n://", "s3p://")


def normalize_uri(uri: str) -> str:
    """One spelling per location: local paths absolute-free of ``file:``; all S3 schemes as ``s3://``.

    Flink writes local paths as ``file:/x`` or ``file:///x`` and S3 paths as ``s3://``, ``s3a://``
    or ``s3p://`` depending on the plugin; they name the same objects.
    """
    for scheme in S3_SCHEMES:
        if uri.startswith(scheme):
            return "s3://" + uri[len(scheme) :]
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    elif uri.startswith("file:"):
        uri = uri[len("file:") :]
    return uri


def is_s3(uri: str) -> bool:
    return normalize_uri(uri).startswith("s3://")


def join(base: str, *parts: str) -> str:
    return posixpath.join(normalize_uri(base).rstrip("/") or "/", *parts)


def within(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or lies below it (by name: no links are followed)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def parent(uri: str) -> str:
    uri = normalize_uri(uri).rstrip("/")
    if is_s3(uri) and uri.count("/") <= 2:
        return uri
    return posixpath.dirname(uri)


class FileIO(ABC):
    """Read and write whole files or byte ranges by URI."""

    @abstractmethod
    def read(self, uri: str) -> bytes: ...

    @abstractmethod
    def read_range(self, uri: str, start: int, length: int) -> bytes: ...

    @abstractmethod
    def size(self, uri: str) -> int: ...

    @abstractmethod
    def exists(self, uri: str) -> bool: ...

    def list_names(self, uri: str) -> list[str]:
        """The names of the files directly in ``uri`` (nothing below its subdirectories), sorted."""
        base = normalize_uri(uri).rstrip("/") + "/"
        return sorted(u[len(base) :] for u in self.list(uri) if u.startswith(base) and "/" not in u[len(base) :])

    @abstractmethod
    def list(self, uri: str) -> list[str]:
        """Every file below ``uri`` (recursively), as full URIs, sorted."""

    def read_at_most(self, uri: str, limit: int) -> bytes:
        """The whole file, refused (StorageError) without reading it where it holds more than
        ``limit`` bytes."""
        size = self.size(uri)
        data = self.read(uri) if size <= limit else b""
        if size > limit or len(data) > limit:
            raise StorageError(f"{uri} has {max(size, len(data))} bytes, more than the {limit} ckpt reads: refused")
        return data

    def confined(self, directory: str) -> FileIO:
        """This storage, reading the files named below ``directory`` only where they really are
        below it (local symbolic links are checked on every open; object stores have none)."""
        return self

    def map(self, uri: str):
        """The whole file as a bytes-like object (memory-mapped where the storage allows)."""
        return self.read(uri)

    def write(self, uri: str, data: bytes) -> None:
        """Create ``uri`` with ``data``; fails with AlreadyExistsError if it exists (ckpt never
        overwrites), which makes a write an exclusive create, the destination lock included."""
        self.write_stream(uri, (data,))

    @abstractmethod
    def write_stream(self, uri: str, chunks: Iterable[bytes]) -> None:
        """Create ``uri`` from chunks produced as it is written (memory stays bounded);
        fails if it exists."""

    @abstractmethod
    def delete(self, uri: str) -> None:
        """Remove a file ckpt wrote (used to leave nothing behind when a write fails)."""

    def set_mode(self, uri: str, mode: int) -> None:  # noqa: B027 (a no-op where there are no modes)
        """Set a file's permission bits, where the storage has them (object stores do not)."""


def io_for(uri: str) -> FileIO:
    """The FileIO for a URI's scheme."""
    if is_s3(uri):
        from ckpt_tool.storage.s3 import S3FileIO

        return S3FileIO.default()
    if "://" in normalize_uri(uri):
        raise StorageError(f"unsupported storage scheme in {uri!r} (use a local path, file:// or s3://)")
    from ckpt_tool.storage.local import LocalFileIO

    return LocalFileIO()
