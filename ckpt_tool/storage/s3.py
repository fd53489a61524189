"""S3 storage through boto3 with its standard configuration.

Credentials come from boto3's default chain (environment, ``AWS_PROFILE``, config files, instance
roles); ``AWS_ENDPOINT_URL`` (or ``CKPT_S3_ENDPOINT``) points at S3-compatible stores. Reads of
buffers are ranged GETs; throttling and 5xx answers are retried with backoff by botocore, failed
or silent connections only a few times (``patience``: about 30 s for a stalled endpoint). Every
failure is one named StorageError. Writes are exclusive creates (``If-None-Match: *``), also for multipart uploads.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from functools import lru_cache

from ckpt_tool.errors import AlreadyExistsError, StorageError
from ckpt_tool.storage.base import ObjectStoreIO, spooled
from ckpt_tool.storage.patience import Patience, os_reason
from ckpt_tool.storage.uri import split_bucket_uri

RETRY_CONFIG = {"max_attempts": 10, "mode": "standard"}  # throttling and 5xx answers
MULTIPART_BYTES = 8 * 1024 * 1024  # objects this large are uploaded in parts (boto3's threshold)
MAX_PARTS = 10_000
PARALLEL_PARTS = 4

MISSING_OBJECT = ("404", "NoSuchKey", "NotFound")
DENIED = ("403", "AccessDenied", "Forbidden", "AllAccessDisabled")
REJECTED_CREDENTIALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired")
EXISTS = ("412", "PreconditionFailed", "ConditionalRequestConflict")
NO_CREDENTIALS = "no AWS credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or use an instance role)"


def split_s3_uri(uri: str) -> tuple[str, str]:
    return split_bucket_uri(uri)


class _MissingObject(StorageError):
    """A 404 on an object: a missing key, or (for HEAD, which has no error body) a missing bucket."""


class S3FileIO(ObjectStoreIO):
    def __init__(self, endpoint_url: str | None = None, patience: Patience | None = None):
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        self.patience = patience = patience or Patience.from_environment()
        config = Config(retries=RETRY_CONFIG, connect_timeout=patience.connect, read_timeout=patience.read)
        try:
            self.client = boto3.session.Session().client("s3", endpoint_url=endpoint_url or None, config=config)
        except (BotoCoreError, ValueError) as exc:
            raise StorageError(f"cannot use S3{f' at {endpoint_url}' if endpoint_url else ''}: {exc}") from exc
        self.client.meta.events.register_first("needs-retry.s3", self._stop_reconnecting)
        self._buckets: set[str] = set()  # buckets known to exist

    @staticmethod
    def default() -> S3FileIO:
        """One client per endpoint setting: ``--s3-endpoint`` (CKPT_S3_ENDPOINT) or boto3's own."""
        return _client_for(os.environ.get("CKPT_S3_ENDPOINT"), os.environ.get("AWS_ENDPOINT_URL"), Patience.from_environment())

    @contextmanager
    def _errors(self, what: str, uri: str) -> Iterator[None]:
        """botocore's failures as one-line StorageErrors that name the cause."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ReadTimeoutError
        from botocore.exceptions import ConnectionError as BotoConnectionError

        try:
            yield
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code, message = error.get("Code", "error"), error.get("Message")
            if code in MISSING_OBJECT:
                raise _MissingObject(f"cannot {what} {uri}: no such object") from exc
            if code == "NoSuchBucket":
                raise StorageError(f"bucket '{split_s3_uri(uri)[0]}' does not exist") from exc
            if code in DENIED:
                raise StorageError(f"access denied to {uri}") from exc
            if code in REJECTED_CREDENTIALS:
                raise StorageError(f"cannot {what} {uri}: the AWS credentials were rejected ({code})") from exc
            if code in EXISTS:
                raise AlreadyExistsError(f"{uri} already exists; ckpt never overwrites files") from exc
            raise StorageError(f"cannot {what} {uri}: {code}{f' ({message})' if message else ''}") from exc
        except NoCredentialsError as exc:
            raise StorageError(f"cannot {what} {uri}: {NO_CREDENTIALS}") from exc
        except BotoConnectionError as exc:
            raise StorageError(f"cannot reach S3 endpoint {self.client.meta.endpoint_url}: {self._reason(exc)}") from exc
        except ReadTimeoutError as exc:
            raise StorageError(f"S3 endpoint {self.client.meta.endpoint_url} stalled: {self.patience.stalled()}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"cannot {what} {uri}: {exc}") from exc

    def _stop_reconnecting(self, attempts: int, caught_exception=None, **_) -> bool | None:
        """botocore's retry hook: no more attempts after a few connections that failed or went
        silent (else its own decision, None)."""
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import ReadTimeoutError

        silent = isinstance(caught_exception, (BotoConnectionError, ReadTimeoutError))
        if silent and attempts >= self.patience.attempts:
            return False
        return None

    def _reason(self, exc: Exception) -> str:
        """Why a connection failed, briefly: the OS's words (``Connection refused``) where there are some."""
        from botocore.exceptions import ConnectTimeoutError

        if isinstance(exc, ConnectTimeoutError):
            return self.patience.unreachable()
        return os_reason(exc)

    def _head(self, uri: str) -> dict | None:
        """The object's HEAD answer, or None if the object (but not its bucket) is missing."""
        bucket, key = split_s3_uri(uri)
        try:
            with self._errors("read", uri):
                return self.client.head_object(Bucket=bucket, Key=key)
        except _MissingObject:
            if bucket not in self._buckets:
                try:
                    with self._errors("read", f"s3://{bucket}"):
                        self.client.head_bucket(Bucket=bucket)
                except _MissingObject as exc:
                    raise StorageError(f"bucket '{bucket}' does not exist") from exc
                self._buckets.add(bucket)
            return None

    def read(self, uri: str) -> bytes:
        bucket, key = split_s3_uri(uri)
        with self._errors("read", uri):
            return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        bucket, key = split_s3_uri(uri)
        if length == 0:
            return b""
        rng = f"bytes={start}-{start + length - 1}"
        with self._errors("read", uri):
            data = self.client.get_object(Bucket=bucket, Key=key, Range=rng)["Body"].read()
        if len(data) != length:
            raise StorageError(f"{uri} is truncated: wanted {length} bytes at {start}, got {len(data)}")
        return data

    def _object_size(self, uri: str) -> int | None:
        head = self._head(uri)
        return None if head is None else head["ContentLength"]

    def list_sizes(self, uri: str) -> list[tuple[str, int]]:
        bucket, prefix = split_s3_uri(uri)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        found: list[tuple[str, int]] = []
        with self._errors("list", uri):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                found.extend((f"s3://{bucket}/{item['Key']}", int(item.get("Size", 0))) for item in page.get("Contents", []))
        return sorted(found)

    def list(self, uri: str) -> list[str]:
        return [found for found, _ in self.list_sizes(uri)]

    def write_stream(self, uri: str, chunks: Iterable[bytes]) -> None:
        """Create the object only if it does not exist (``If-None-Match: *``, checked by S3 when the
        object is created, so two writers cannot both succeed)."""
        bucket, key = split_s3_uri(uri)
        with spooled(chunks) as (spool, size):  # large objects wait on disk
            if size < MULTIPART_BYTES:
                with self._errors("write", uri):
                    self.client.put_object(Bucket=bucket, Key=key, Body=spool.read(), IfNoneMatch="*")
            else:
                self._upload_parts(uri, spool, size)

    def _upload_parts(self, uri: str, spool, size: int) -> None:
        """A multipart upload, a few parts at a time; aborted if anything fails."""
        bucket, key = split_s3_uri(uri)
        part_size = max(MULTIPART_BYTES, -(-size // MAX_PARTS))
        with self._errors("write", uri):
            upload = self.client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        try:
            etags: list[str] = []
            pending: deque = deque()
            with ThreadPoolExecutor(PARALLEL_PARTS) as pool:
                for number in range(1, -(-size // part_size) + 1):
                    if len(pending) == PARALLEL_PARTS:
                        etags.append(pending.popleft().result())
                    pending.append(pool.submit(self._upload_part, uri, upload, number, spool.read(part_size)))
                etags.extend(future.result() for future in pending)
            parts = [{"PartNumber": number, "ETag": etag} for number, etag in enumerate(etags, 1)]
            with self._errors("write", uri):
                self.client.complete_multipart_upload(
                    Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}, IfNoneMatch="*"
                )
        except BaseException:
            with suppress(Exception):
                self.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
            raise

    def _upload_part(self, uri: str, upload: str, number: int, data: bytes) -> str:
        bucket, key = split_s3_uri(uri)
        with self._errors("write", uri):
            return self.client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=data)["ETag"]

    def delete(self, uri: str) -> None:
        bucket, key = split_s3_uri(uri)
        with self._errors("delete", uri):
            self.client.delete_object(Bucket=bucket, Key=key)


@lru_cache(maxsize=8)
def _client_for(endpoint: str | None, _aws_endpoint: str | None, patience: Patience) -> S3FileIO:
    return S3FileIO(endpoint, patience)
