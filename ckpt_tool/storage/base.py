"""The storage interface. Implementations import it; it imports none of them (``io_for`` in
the package chooses one by scheme)."""

from __future__ import annotations

import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import BinaryIO, Optional

from ckpt_tool.errors import StorageError

# the URI helpers, where callers have found them so far
from ckpt_tool.storage.uri import is_local, is_s3, join, normalize_uri, parent, within

__all__ = ["FileIO", "ObjectStoreIO", "is_local", "is_s3", "join", "normalize_uri", "parent", "spooled", "within"]

SPOOL_BYTES = 64 * 1024 * 1024  # an object being uploaded waits in memory up to this size, then on disk


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

    def list_sizes(self, uri: str) -> list[tuple[str, int]]:
        """Every file below ``uri`` with its size, sorted (object stores list sizes with names)."""
        return [(found, self.size(found)) for found in self.list(uri)]

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


@contextmanager
def spooled(chunks: Iterable[bytes]) -> Iterator[tuple[BinaryIO, int]]:
    """Chunks gathered into a seekable file (an object store uploads a known size, and retries
    from the start), with their size; large ones wait on disk."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
        for chunk in chunks:
            spool.write(chunk)
        size = spool.tell()
        spool.seek(0)
        yield spool, size  # type: ignore[misc]


class ObjectStoreIO(FileIO):
    """A store of objects in buckets or containers (S3, GCS, Azure): a file exists where its
    object's metadata can be read, and has the size that metadata says."""

    @abstractmethod
    def _object_size(self, uri: str) -> Optional[int]:
        """The object's size from its metadata, or None if the object (but not its bucket or
        container) is missing; other failures raise."""

    def size(self, uri: str) -> int:
        size = self._object_size(uri)
        if size is None:
            raise StorageError(f"cannot read {uri}: no such object")
        return size

    def exists(self, uri: str) -> bool:
        """False only for a missing object in an existing bucket or container; other failures raise."""
        return self._object_size(uri) is not None
