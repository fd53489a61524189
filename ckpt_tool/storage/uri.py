"""Storage URIs: one spelling per location, and the scheme that picks a store.

Flink writes local paths as ``file:/x`` or ``file:///x``; S3 paths as ``s3://``, ``s3a://`` or
``s3p://`` depending on its plugin; Google Cloud Storage as ``gs://<bucket>/<path>``; Azure as
``abfs[s]://<container>@<account>.dfs.core.windows.net/<path>`` (ADLS Gen2) or
``wasb[s]://<container>@<account>.blob.core.windows.net/<path>`` (Blob Storage). Each family
names the same objects whichever spelling it uses, so each has one normalized form: ``s3://``,
``gs://`` and ``abfss://<container>@<account>.dfs.<suffix>``.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from ckpt_tool.errors import StorageError

S3_SCHEMES = ("s3://", "s3a://", "s3n://", "s3p://")
GCS_SCHEMES = ("gs://",)
AZURE_SCHEMES = ("abfs://", "abfss://", "wasb://", "wasbs://")
# <container>@<account>.<dfs|blob>.<endpoint suffix, e.g. core.windows.net>
_AZURE_AUTHORITY = re.compile(r"^([a-z0-9](?:[a-z0-9-]*[a-z0-9])?)@([a-z0-9]+)\.(dfs|blob)\.([A-Za-z0-9.-]+)$")


def normalize_uri(uri: str) -> str:
    """One spelling per location: local paths free of ``file:``; all S3 schemes as ``s3://``;
    every Azure form as ``abfss://<container>@<account>.dfs.<suffix>/<path>``."""
    for scheme in S3_SCHEMES:
        if uri.startswith(scheme):
            return "s3://" + uri[len(scheme) :]
    for scheme in AZURE_SCHEMES:
        if uri.startswith(scheme):
            authority, slash, path = uri[len(scheme) :].partition("/")
            match = _AZURE_AUTHORITY.match(authority)
            if match:
                container, account, _, suffix = match.groups()
                authority = f"{container}@{account}.dfs.{suffix}"
            return f"abfss://{authority}{slash}{path}"
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    elif uri.startswith("file:"):
        uri = uri[len("file:") :]
    return uri


def scheme(uri: str) -> str:
    """``file`` for local paths, else the normalized URI's scheme (``s3``, ``gs``, ``abfss``, ...)."""
    uri = normalize_uri(uri)
    head, sep, _ = uri.partition("://")
    return head.lower() if sep and "/" not in head else "file"


def is_local(uri: str) -> bool:
    return scheme(uri) == "file"


def is_s3(uri: str) -> bool:
    return scheme(uri) == "s3"


def root_length(uri: str) -> int:
    """The length of the part of a URI that no path operation goes above: ``s3://bucket``."""
    if is_local(uri):
        return 1 if uri.startswith("/") else 0
    head, _, rest = uri.partition("://")
    return len(head) + 3 + len(rest.partition("/")[0])


def join(base: str, *parts: str) -> str:
    return posixpath.join(normalize_uri(base).rstrip("/") or "/", *parts)


def within(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or lies below it (by name: no links are followed)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def parent(uri: str) -> str:
    uri = normalize_uri(uri).rstrip("/")
    if not is_local(uri) and len(uri) <= root_length(uri):
        return uri
    return posixpath.dirname(uri)


@dataclass(frozen=True)
class AzurePath:
    container: str
    account: str
    suffix: str  # core.windows.net, or a sovereign cloud's
    key: str

    @property
    def blob_endpoint(self) -> str:
        return f"https://{self.account}.blob.{self.suffix}"


def refuse_dot_segments(uri: str, key: str) -> None:
    """An object store keeps ``.`` and ``..`` in a key as they are, where a file system (and
    Flink's own paths) would resolve them: such a key is refused rather than read or written."""
    if any(segment in (".", "..") for segment in key.split("/")):
        raise StorageError(f"{uri}: an object key with a '.' or '..' segment is refused (object stores do not resolve them)")


def split_azure_uri(uri: str) -> AzurePath:
    normal = normalize_uri(uri)
    authority, _, key = normal[len("abfss://") :].partition("/")
    match = _AZURE_AUTHORITY.match(authority)
    if not match:
        raise StorageError(
            f"{uri!r} is not an Azure storage URI of the form abfs[s]://<container>@<account>.dfs.core.windows.net/<path> "
            "or wasb[s]://<container>@<account>.blob.core.windows.net/<path>"
        )
    container, account, _, suffix = match.groups()
    refuse_dot_segments(uri, key)
    return AzurePath(container, account, suffix, key)


def split_bucket_uri(uri: str) -> tuple[str, str]:
    """``s3://`` or ``gs://`` URIs: bucket and key."""
    rest = normalize_uri(uri).partition("://")[2]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StorageError(f"no bucket in {uri!r}")
    refuse_dot_segments(uri, key)
    return bucket, key
