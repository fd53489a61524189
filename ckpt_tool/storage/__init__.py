"""Byte storage by URI: local paths, ``file://`` and ``s3://`` (boto3).

One ``FileIO`` interface with an implementation per scheme, chosen by :func:`io_for`.
"""

from ckpt_tool.storage.base import FileIO, io_for, join, normalize_uri, parent

__all__ = ["FileIO", "io_for", "join", "normalize_uri", "parent"]
