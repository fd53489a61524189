"""Google Cloud Storage (``gs://<bucket>/<path>``) through Google's client library, google-cloud-storage.

Credentials come from Google's default chain (``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth
application-default login``, a workload identity or the metadata server on Google Cloud); the
project, where one is needed, from ``GOOGLE_CLOUD_PROJECT``. ``STORAGE_EMULATOR_HOST`` points at an
emulator (anonymous, as Google's clients reach one). Throttling and 5xx answers are retried with
backoff as the library does; connections that fail or go silent only ``CKPT_IO_ATTEMPTS`` times
(``patience``). Writes are exclusive creates (``ifGenerationMatch=0``, checked by the store when
the object is created, so two writers cannot both succeed). Every failure is one named StorageError.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from ckpt_tool.errors import AlreadyExistsError, StorageError
from ckpt_tool.storage.base import ObjectStoreIO, spooled
from ckpt_tool.storage.patience import Patience, first_line, os_reason
from ckpt_tool.storage.uri import split_bucket_uri

PUBLIC_ENDPOINT = "https://storage.googleapis.com"
NO_CREDENTIALS = (
    "no Google Cloud credentials found (set GOOGLE_APPLICATION_CREDENTIALS, run 'gcloud auth application-default login', "
    "or run on Google Cloud)"
)


class _MissingObject(StorageError):
    pass


class GcsFileIO(ObjectStoreIO):
    def __init__(self, patience: Patience | None = None):
        self.patience = patience or Patience.from_environment()
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator and "://" not in emulator:
            emulator = "http://" + emulator
        self.endpoint = emulator or PUBLIC_ENDPOINT
        self._client: Any = None
        self._buckets: set[str] = set()  # buckets known to exist

    @staticmethod
    def default() -> GcsFileIO:
        """One client per environment (emulator, credentials file, project, patience)."""
        names = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT")
        return _client_for(tuple(os.environ.get(name) for name in names), Patience.from_environment())

    @property
    def client(self):
        """Made at first use, inside ``_errors``: finding credentials can fail."""
        if self._client is None:
            from google.cloud import storage

            self._client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT"))
        return self._client

    def _retry(self):
        """The library's retry policy, except that connections that failed or went silent are
        tried ``patience.attempts`` times in all."""
        from google.api_core.retry import Retry
        from google.cloud.storage.retry import _should_retry

        silent = [0]

        def predicate(exc: Exception) -> bool:
            if _is_connection_failure(exc):
                silent[0] += 1
                return silent[0] < self.patience.attempts
            return _should_retry(exc)

        return Retry(predicate=predicate, initial=1.0, maximum=8.0, multiplier=2.0, timeout=120.0)

    def _call(self) -> dict:
        return {"timeout": (self.patience.connect, self.patience.read), "retry": self._retry()}

    @contextmanager
    def _errors(self, what: str, uri: str) -> Iterator[None]:
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        try:
            yield
        except api.NotFound as exc:
            raise _MissingObject(f"cannot {what} {uri}: no such object") from exc
        except api.PreconditionFailed as exc:
            raise AlreadyExistsError(f"{uri} already exists; ckpt never overwrites files") from exc
        except api.Forbidden as exc:
            raise StorageError(f"access denied to {uri}") from exc
        except api.Unauthorized as exc:
            raise StorageError(f"cannot {what} {uri}: the Google Cloud credentials were rejected (401)") from exc
        except api.RetryError as exc:
            raise self._connection_error(exc.cause or exc, what, uri) from exc
        except api.GoogleAPICallError as exc:
            raise StorageError(f"cannot {what} {uri}: {exc.code} ({first_line(exc.message)})") from exc
        except auth.DefaultCredentialsError as exc:
            named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
            if named:
                problem = f"GOOGLE_APPLICATION_CREDENTIALS names {named}, not a usable credentials file"
                raise StorageError(f"cannot {what} {uri}: {problem} ({first_line(str(exc))})") from exc
            raise StorageError(f"cannot {what} {uri}: {NO_CREDENTIALS}") from exc
        except auth.RefreshError as exc:
            raise StorageError(
                f"cannot {what} {uri}: the Google Cloud credentials were rejected ({first_line(str(exc))})"
            ) from exc
        except (auth.GoogleAuthError, OSError) as exc:
            raise self._connection_error(exc, what, uri) from exc
        except Exception as exc:
            if _is_connection_failure(exc) or _is_requests_error(exc):
                raise self._connection_error(exc, what, uri) from exc
            raise

    def _connection_error(self, exc: BaseException, what: str, uri: str) -> StorageError:
        import requests

        if isinstance(exc, requests.exceptions.ConnectTimeout):
            return StorageError(f"cannot reach Google Cloud Storage endpoint {self.endpoint}: {self.patience.unreachable()}")
        if _is_silence(exc):
            return StorageError(f"Google Cloud Storage endpoint {self.endpoint} stalled: {self.patience.stalled()}")
        if isinstance(exc, (requests.exceptions.ConnectionError, ConnectionError)):
            return StorageError(f"cannot reach Google Cloud Storage endpoint {self.endpoint}: {os_reason(exc)}")
        return StorageError(f"cannot {what} {uri}: {first_line(str(exc)) or type(exc).__name__}")

    def _bucket(self, bucket: str):
        return self.client.bucket(bucket)

    def _missing(self, uri: str, bucket: str) -> StorageError:
        """A 404: the bucket's, if it is missing (said once), else the object's."""
        if bucket not in self._buckets:
            with self._errors("read", f"gs://{bucket}"):
                if self.client.lookup_bucket(bucket, **self._call()) is None:
                    return StorageError(f"bucket '{bucket}' does not exist")
            self._buckets.add(bucket)
        return _MissingObject(f"cannot read {uri}: no such object")

    def read(self, uri: str) -> bytes:
        return self._download(uri)

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        if length == 0:
            return b""
        data = self._download(uri, start, start + length - 1)
        if len(data) != length:
            raise StorageError(f"{uri} is truncated: wanted {length} bytes at {start}, got {len(data)}")
        return data

    def _download(self, uri: str, start: int | None = None, end: int | None = None) -> bytes:
        bucket, key = split_bucket_uri(uri)
        try:
            with self._errors("read", uri):
                blob = self._bucket(bucket).blob(key)
                return blob.download_as_bytes(start=start, end=end, checksum=None, **self._call())
        except _MissingObject:
            raise self._missing(uri, bucket) from None

    def _blob(self, uri: str):
        """The object's metadata, or None if the object (but not its bucket) is missing."""
        bucket, key = split_bucket_uri(uri)
        with self._errors("read", uri):
            blob = self._bucket(bucket).get_blob(key, **self._call())
        if blob is None:
            error = self._missing(uri, bucket)
            if not isinstance(error, _MissingObject):
                raise error
        return blob

    def _object_size(self, uri: str) -> int | None:
        blob = self._blob(uri)
        return None if blob is None else int(blob.size)

    def list_sizes(self, uri: str) -> list[tuple[str, int]]:
        bucket, prefix = split_bucket_uri(uri)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        try:
            with self._errors("list", uri):
                blobs = [
                    (blob.name, int(blob.size or 0)) for blob in self.client.list_blobs(bucket, prefix=prefix, **self._call())
                ]
        except _MissingObject:
            raise self._missing(uri, bucket) from None
        return sorted((f"gs://{bucket}/{name}", size) for name, size in blobs if not name.endswith("/"))

    def list(self, uri: str) -> list[str]:
        return [found for found, _ in self.list_sizes(uri)]

    def write_stream(self, uri: str, chunks: Iterable[bytes]) -> None:
        """Create the object only if it does not exist (``ifGenerationMatch=0``)."""
        bucket, key = split_bucket_uri(uri)
        with spooled(chunks) as (spool, size):  # large objects wait on disk
            try:
                with self._errors("write", uri):
                    blob = self._bucket(bucket).blob(key)
                    blob.upload_from_file(spool, size=size, if_generation_match=0, rewind=False, **self._call())
            except _MissingObject:
                raise self._missing(uri, bucket) from None

    def delete(self, uri: str) -> None:
        bucket, key = split_bucket_uri(uri)
        try:
            with self._errors("delete", uri):
                self._bucket(bucket).blob(key).delete(**self._call())
        except _MissingObject:
            pass


def _is_connection_failure(exc: BaseException) -> bool:
    """A connection that could not be made or stopped answering (not an answer of the store's)."""
    import requests

    return isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, TimeoutError))


def _is_silence(exc: BaseException) -> bool:
    """A connection that was made and then did not answer in time."""
    import requests

    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return False
    if isinstance(exc, (requests.exceptions.Timeout, TimeoutError)):
        return True
    return _is_connection_failure(exc) and "read timed out" in str(exc).lower()


def _is_requests_error(exc: BaseException) -> bool:
    import requests

    return isinstance(exc, requests.exceptions.RequestException)


@lru_cache(maxsize=8)
def _client_for(_environment: tuple, patience: Patience) -> GcsFileIO:
    return GcsFileIO(patience)
