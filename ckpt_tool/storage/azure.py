"""Azure Blob Storage and Data Lake Storage Gen2 (``abfs[s]://`` and ``wasb[s]://``) through
Microsoft's client library, azure-storage-blob (ADLS Gen2 accounts serve the Blob API too).

Credentials, first that applies: ``AZURE_STORAGE_CONNECTION_STRING`` when it names the URI's
account (Azurite's included); the account's key in ``AZURE_STORAGE_KEY``; a SAS token in
``AZURE_STORAGE_SAS_TOKEN``; else azure-identity's default chain (a service principal or workload
identity from the ``AZURE_*`` environment, a managed identity, ``az login``). Throttling and 5xx
answers are retried with backoff as the library does; connections that fail or go silent only
``CKPT_IO_ATTEMPTS`` times (``patience``). Writes are exclusive creates (``If-None-Match: *``).
Every failure is one named StorageError.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any
from urllib.parse import urlparse

from ckpt_tool.errors import AlreadyExistsError, StorageError
from ckpt_tool.storage.base import ObjectStoreIO, spooled
from ckpt_tool.storage.patience import Patience, first_line, os_reason
from ckpt_tool.storage.uri import AzurePath, split_azure_uri

NO_CREDENTIALS = (
    "no Azure credentials found (set AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, "
    "sign in with 'az login', or use a managed identity)"
)
ENVIRONMENT = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN")
PARALLEL_BLOCKS = 4
MAX_BACKOFF = 16.0  # seconds between two tries, at most


class _MissingObject(StorageError):
    pass


class AzureFileIO(ObjectStoreIO):
    """One FileIO for every Azure account: a client per account, made at first use."""

    def __init__(self, patience: Patience | None = None):
        self.patience = patience or Patience.from_environment()

    @staticmethod
    def default() -> AzureFileIO:
        return _io_for(tuple(os.environ.get(name) for name in ENVIRONMENT), Patience.from_environment())

    def _client(self, path: AzurePath):
        return _service_client(path.account, path.suffix, tuple(os.environ.get(name) for name in ENVIRONMENT), self.patience)

    def _blob(self, path: AzurePath):
        return self._client(path).get_blob_client(path.container, path.key)

    @contextmanager
    def _errors(self, what: str, uri: str, path: AzurePath) -> Iterator[None]:
        from azure.core import exceptions as az

        try:
            yield
        except az.ResourceNotFoundError as exc:
            if _code(exc) == "ContainerNotFound":
                raise StorageError(f"container '{path.container}' does not exist in account '{path.account}'") from exc
            raise _MissingObject(f"cannot {what} {uri}: no such object") from exc
        except (az.ResourceExistsError, az.ResourceModifiedError) as exc:
            if _code(exc) in ("BlobAlreadyExists", "ConditionNotMet") or exc.status_code in (409, 412):
                raise AlreadyExistsError(f"{uri} already exists; ckpt never overwrites files") from exc
            raise StorageError(f"cannot {what} {uri}: {_code(exc) or exc.status_code}") from exc
        except az.ClientAuthenticationError as exc:
            if exc.status_code is None:  # the credential chain found nothing to use
                raise StorageError(f"cannot {what} {uri}: {NO_CREDENTIALS}") from exc
            code = _code(exc) or exc.status_code
            raise StorageError(f"cannot {what} {uri}: the Azure credentials were rejected ({code})") from exc
        except az.HttpResponseError as exc:
            if exc.status_code == 403 and _code(exc) in ("AuthenticationFailed", "InvalidAuthenticationInfo"):
                raise StorageError(f"cannot {what} {uri}: the Azure credentials were rejected ({_code(exc)})") from exc
            if exc.status_code == 403:
                raise StorageError(f"access denied to {uri}") from exc
            if exc.status_code == 404:
                raise _MissingObject(f"cannot {what} {uri}: no such object") from exc
            raise StorageError(f"cannot {what} {uri}: {_code(exc) or exc.status_code} ({first_line(exc.reason)})") from exc
        except az.ServiceResponseError as exc:
            raise StorageError(f"Azure endpoint {self._endpoint(path)} stalled: {self.patience.stalled()}") from exc
        except az.ServiceRequestError as exc:
            reason = self.patience.unreachable() if isinstance(exc, az.ServiceRequestTimeoutError) else os_reason(exc)
            raise StorageError(f"cannot reach Azure endpoint {self._endpoint(path)}: {reason}") from exc
        except az.AzureError as exc:
            raise StorageError(f"cannot {what} {uri}: {first_line(str(exc))}") from exc

    def _endpoint(self, path: AzurePath) -> str:
        try:
            return self._client(path).primary_endpoint.rstrip("/")
        except Exception:
            return path.blob_endpoint

    def _path(self, uri: str) -> AzurePath:
        path = split_azure_uri(uri)
        if not path.key:
            raise StorageError(f"no path inside the container in {uri!r}")
        return path

    def read(self, uri: str) -> bytes:
        path = self._path(uri)
        with self._errors("read", uri, path):
            return self._blob(path).download_blob(max_concurrency=PARALLEL_BLOCKS).readall()

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        if length == 0:
            return b""
        path = self._path(uri)
        with self._errors("read", uri, path):
            data = self._blob(path).download_blob(offset=start, length=length).readall()
        if len(data) != length:
            raise StorageError(f"{uri} is truncated: wanted {length} bytes at {start}, got {len(data)}")
        return data

    def _properties(self, uri: str):
        """The blob's properties, or None if the blob (but not its container) is missing."""
        path = self._path(uri)
        try:
            with self._errors("read", uri, path):
                return self._blob(path).get_blob_properties()
        except _MissingObject:
            return None

    def _object_size(self, uri: str) -> int | None:
        properties = self._properties(uri)
        return None if properties is None else int(properties.size)

    def list_sizes(self, uri: str) -> list[tuple[str, int]]:
        path = split_azure_uri(uri)
        prefix = path.key.rstrip("/") + "/" if path.key else ""
        base = f"abfss://{path.container}@{path.account}.dfs.{path.suffix}/"
        found: list[tuple[str, int]] = []
        with self._errors("list", uri, path):
            container = self._client(path).get_container_client(path.container)
            for blob in container.list_blobs(name_starts_with=prefix, include=["metadata"]):
                if (blob.metadata or {}).get("hdi_isfolder") == "true" or blob.name.endswith("/"):
                    continue  # a directory of a hierarchical namespace (ADLS Gen2)
                found.append((base + blob.name, int(blob.size or 0)))
        return sorted(found)

    def list(self, uri: str) -> list[str]:
        return [found for found, _ in self.list_sizes(uri)]

    def write_stream(self, uri: str, chunks: Iterable[bytes]) -> None:
        """Create the blob only if it does not exist (``If-None-Match: *``, checked by the store
        when the blob is created or its blocks committed, so two writers cannot both succeed)."""
        path = self._path(uri)
        with spooled(chunks) as (spool, size):  # large objects wait on disk
            with self._errors("write", uri, path):
                self._blob(path).upload_blob(spool, length=size, overwrite=False, max_concurrency=PARALLEL_BLOCKS)

    def delete(self, uri: str) -> None:
        path = self._path(uri)
        try:
            with self._errors("delete", uri, path):
                self._blob(path).delete_blob()
        except _MissingObject:
            pass


def _code(exc: BaseException) -> str | None:
    """The store's error code (``BlobNotFound``...), which the storage library sets on its errors."""
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code)) if code else None


def _connection_string_account(text: str) -> str | None:
    """The account a connection string is for: its AccountName, else its blob endpoint's
    (``https://<account>.blob...``, or Azurite's ``http://127.0.0.1:10000/<account>``)."""
    fields = dict(part.split("=", 1) for part in text.split(";") if "=" in part)
    if fields.get("UseDevelopmentStorage", "").lower() == "true":
        return "devstoreaccount1"
    if fields.get("AccountName"):
        return fields["AccountName"]
    endpoint = urlparse(fields.get("BlobEndpoint", ""))
    host = endpoint.hostname or ""
    if host.replace(".", "").isdigit() or host == "localhost":
        return endpoint.path.strip("/").split("/")[0] or None
    return host.split(".")[0] or None


@lru_cache(maxsize=32)
def _service_client(account: str, suffix: str, environment: tuple, patience: Patience) -> Any:
    """A client for one account: the connection string's if it names the account, else the
    account's endpoint with a key, a SAS token or azure-identity's default chain."""
    from azure.storage.blob import BlobServiceClient

    connection_string, key, sas = environment
    retry = _retry_policy()(
        initial_backoff=0.5,  # waits of 2, 2.75, 3.9, ... s (and jitter), at most MAX_BACKOFF
        increment_base=1.5,
        retry_total=10,
        retry_connect=patience.attempts - 1,
        retry_read=patience.attempts - 1,
        random_jitter_range=1,
    )
    options: dict[str, Any] = {
        "connection_timeout": patience.connect,
        "read_timeout": patience.read,
        "retry_policy": retry,
    }
    if connection_string and _connection_string_account(connection_string) == account:
        return BlobServiceClient.from_connection_string(connection_string, **options)
    credential: Any
    if key:
        credential = {"account_name": account, "account_key": key}
    elif sas:
        credential = sas
    else:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    return BlobServiceClient(f"https://{account}.blob.{suffix}", credential=credential, **options)


@lru_cache(maxsize=1)
def _retry_policy() -> type:
    """The library's exponential retry, except that an error with no answer or connection behind
    it (a credential the default chain could not find) is not retried, and no wait between tries
    is longer than ``MAX_BACKOFF`` seconds."""
    from azure.core.exceptions import ServiceRequestError, ServiceResponseError
    from azure.storage.blob import ExponentialRetry

    class Retry(ExponentialRetry):
        def increment(self, settings, request, response=None, error=None) -> bool:
            if error is not None and not isinstance(error, (ServiceRequestError, ServiceResponseError)):
                return False
            return super().increment(settings, request, response, error)

        def get_backoff_time(self, settings) -> float:
            return min(super().get_backoff_time(settings), MAX_BACKOFF)

    return Retry


@lru_cache(maxsize=8)
def _io_for(_environment: tuple, patience: Patience) -> AzureFileIO:
    return AzureFileIO(patience)
