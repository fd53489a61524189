"""Local file system storage."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable

from ckpt_tool.errors import AlreadyExistsError, StorageError
from ckpt_tool.storage.base import FileIO, normalize_uri


class LocalFileIO(FileIO):
    def _path(self, uri: str) -> str:
        return normalize_uri(uri)

    def read(self, uri: str) -> bytes:
        try:
            with open(self._path(uri), "rb") as f:
                return f.read()
        except OSError as exc:
            raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from exc

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        try:
            with open(self._path(uri), "rb") as f:
                f.seek(start)
                data = f.read(length)
        except OSError as exc:
            raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from exc
        if len(data) != length:
            raise StorageError(f"{uri} is truncated: wanted {length} bytes at {start}, got {len(data)}")
        return data

    def size(self, uri: str) -> int:
        try:
            return os.path.getsize(self._path(uri))
        except OSError as exc:
            raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from exc

    def exists(self, uri: str) -> bool:
        return os.path.exists(self._path(uri))

    def list(self, uri: str) -> list[str]:
        root = self._path(uri)
        found: list[str] = []
        for directory, _, files in os.walk(root):
            found.extend(os.path.join(directory, name) for name in files)
        return sorted(found)

    def map(self, uri: str):
        try:
            with open(self._path(uri), "rb") as f:
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
        except OSError as exc:
            raise StorageError(f"cannot read {uri}: {exc.strerror or exc}") from exc

    def write_stream(self, uri: str, chunks: Iterable[bytes]) -> None:
        """Created owner-only (the writer opens it up as far as its sources are, at the end);
        a file this call created is removed again if writing it fails."""
        path = self._path(uri)
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
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
        try:
            os.chmod(self._path(uri), mode)
        except OSError as exc:
            raise StorageError(f"cannot change the mode of {uri}: {exc.strerror or exc}") from exc

    def delete(self, uri: str) -> None:
        try:
            os.remove(self._path(uri))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"cannot remove {uri}: {exc.strerror or exc}") from exc
