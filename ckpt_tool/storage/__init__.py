"""Byte storage by URI: local paths and ``file://``, S3 (``s3://``, ``s3a://``, ``s3p://``),
Google Cloud Storage (``gs://``) and Azure (``abfs[s]://``, ``wasb[s]://``).

One ``FileIO`` interface with an implementation per scheme, chosen by :func:`io_for` from a table
of implementation names imported only when a URI of theirs is used (as apache/iceberg-python's
``load_file_io`` does), so that ``base`` imports no implementation and a store's library is loaded
only when that store is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from ckpt_tool.errors import StorageError
from ckpt_tool.storage.base import FileIO
from ckpt_tool.storage.patience import VARIABLES as PATIENCE_VARIABLES
from ckpt_tool.storage.uri import is_local, is_s3, join, normalize_uri, parent, scheme, within

__all__ = [
    "STORAGE_ENVIRONMENT",
    "FileIO",
    "io_for",
    "is_local",
    "is_remote",
    "is_s3",
    "join",
    "normalize_uri",
    "parent",
    "scheme",
    "within",
]

# scheme (normalized) -> the factory of its FileIO, "module:function"
FILE_IO: dict[str, str] = {
    "file": "ckpt_tool.storage.local:LocalFileIO",
    "s3": "ckpt_tool.storage.s3:S3FileIO.default",
    "gs": "ckpt_tool.storage.gcs:GcsFileIO.default",
    "abfss": "ckpt_tool.storage.azure:AzureFileIO.default",
}
# The environment each store's client reads (carried to Spark executors).
STORAGE_ENVIRONMENT = (
    *("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"),
    *("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "CKPT_S3_ENDPOINT"),
    *("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "STORAGE_EMULATOR_HOST"),
    *("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN"),
    *("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_AUTHORITY_HOST"),
    *PATIENCE_VARIABLES,
)
SCHEMES_HELP = "a local path, file://, s3:// (s3a://, s3p://), gs://, abfs[s]:// or wasb[s]://"


def is_remote(uri: str) -> bool:
    """An object store: no directories, links or permission bits."""
    return not is_local(uri)


def io_for(uri: str) -> FileIO:
    """The FileIO for a URI's scheme."""
    factory = FILE_IO.get(scheme(uri))
    if factory is None:
        raise StorageError(f"unsupported storage scheme in {uri!r} (use {SCHEMES_HELP})")
    module_name, _, attribute = factory.partition(":")
    try:
        target = importlib.import_module(module_name)
    except ImportError as exc:  # a store's client library that is not installed
        raise StorageError(f"cannot use {uri}: {exc.name or exc} is not installed (pip install ckpt-tool)") from exc
    factory_function: Any = target
    for name in attribute.split("."):
        factory_function = getattr(factory_function, name)
    return factory_function()
