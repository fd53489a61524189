"""S3 storage through boto3 with its standard configuration.

Credentials come from boto3's default chain (environment, ``AWS_PROFILE``, config files, instance
roles); ``AWS_ENDPOINT_URL`` (or ``CKPT_S3_ENDPOINT``) points at S3-compatible stores. Reads of
buffers are ranged GETs; throttling and 5xx answers are retried with backoff by botocore.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from functools import lru_cache

from ckpt_tool.errors import StorageError
from ckpt_tool.storage.base import FileIO, normalize_uri

RETRY_CONFIG = {"max_attempts": 10, "mode": "standard"}
SPOOL_BYTES = 64 * 1024 * 1024


def split_s3_uri(uri: str) -> tuple[str, str]:
    rest = normalize_uri(uri)[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StorageError(f"no bucket in {uri!r}")
    return bucket, key


class S3FileIO(FileIO):
    def __init__(self, endpoint_url: str | None = None):
        import boto3
        from botocore.config import Config

        self.client = boto3.session.Session().client("s3", endpoint_url=endpoint_url or None, config=Config(retries=RETRY_CONFIG))

    @staticmethod
    def default() -> S3FileIO:
        """One client per endpoint setting: ``--s3-endpoint`` (CKPT_S3_ENDPOINT) or boto3's own."""
        return _client_for(os.environ.get("CKPT_S3_ENDPOINT"), os.environ.get("AWS_ENDPOINT_URL"))

    def _call(self, what: str, uri: str, fn, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "error")
            if code in ("404", "NoSuchKey", "NotFound"):
                raise StorageError(f"cannot {what} {uri}: no such object") from exc
            raise StorageError(f"cannot {what} {uri}: {code}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"cannot {what} {uri}: {exc}") from exc

    def read(self, uri: str) -> bytes:
        bucket, key = split_s3_uri(uri)
        return self._call("read", uri, self.client.get_object, Bucket=bucket, Key=key)["Body"].read()

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        bucket, key = split_s3_uri(uri)
        if length == 0:
            return b""
        rng = f"bytes={start}-{start + length - 1}"
        data = self._call("read", uri, self.client.get_object, Bucket=bucket, Key=key, Range=rng)["Body"].read()
        if len(data) != length:
            raise StorageError(f"{uri} is truncated: wanted {length} bytes at {start}, got {len(data)}")
        return data

    def size(self, uri: str) -> int:
        bucket, key = split_s3_uri(uri)
        return self._call("read", uri, self.client.head_object, Bucket=bucket, Key=key)["ContentLength"]

    def exists(self, uri: str) -> bool:
        try:
            self.size(uri)
            return True
        except StorageError:
            return False

    def list(self, uri: str) -> list[str]:
        bucket, prefix = split_s3_uri(uri)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        found: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in self._call("list", uri, paginator.paginate, Bucket=bucket, Prefix=prefix):
            found.extend(f"s3://{bucket}/{item['Key']}" for item in page.get("Contents", []))
        return sorted(found)

    def write_stream(self, uri: str, chunks: Iterable[bytes]) -> None:
        if self.exists(uri):
            raise StorageError(f"{uri} already exists; ckpt never overwrites files")
        bucket, key = split_s3_uri(uri)
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:  # large objects wait on disk
            for chunk in chunks:
                spool.write(chunk)
            spool.seek(0)
            self._call("write", uri, self.client.upload_fileobj, Fileobj=spool, Bucket=bucket, Key=key)

    def delete(self, uri: str) -> None:
        bucket, key = split_s3_uri(uri)
        self._call("delete", uri, self.client.delete_object, Bucket=bucket, Key=key)


@lru_cache(maxsize=8)
def _client_for(endpoint: str | None, _aws_endpoint: str | None) -> S3FileIO:
    return S3FileIO(endpoint)
