"""Local file system storage."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable

from ckpt_tool.errors import StorageError
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
        path = self._path(uri)
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "xb") as f:
                for chunk in chunks:
                    f.write(chunk)
        except FileExistsError as exc:
            raise StorageError(f"{uri} already exists; ckpt never overwrites files") from exc
        except OSError as exc:
            raise StorageError(f"cannot write {uri}: {exc.strerror or exc}") from exc

    def delete(self, uri: str) -> None:
        path = self._path(uri)
        try:
            os.remove(path)
            directory = os.path.dirname(path)
            while directory and not os.listdir(directory):  # directories ckpt created, now empty
                os.rmdir(directory)
                directory = os.path.dirname(directory)
        except OSError:
            pass
