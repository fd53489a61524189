import boto3
import pytest

from ckpt_tool.errors import StorageError
from ckpt_tool.storage import io_for, join, normalize_uri, parent
from ckpt_tool.storage.local import LocalFileIO
from ckpt_tool.storage.s3 import S3FileIO


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("file:/tmp/x", "/tmp/x"),
        ("file:///tmp/x", "/tmp/x"),
        ("/tmp/x", "/tmp/x"),
        ("s3a://b/k", "s3://b/k"),
        ("s3p://b/k", "s3://b/k"),
        ("s3://b/k", "s3://b/k"),
    ],
)
def test_normalize_uri(uri, expected):
    assert normalize_uri(uri) == expected


def test_join_and_parent():
    assert join("s3://b/ck/", "chk-1", "_metadata") == "s3://b/ck/chk-1/_metadata"
    assert parent("s3://b/ck/chk-1") == "s3://b/ck"
    assert parent("file:/a/b") == "/a"


def test_io_for_picks_by_scheme():
    assert isinstance(io_for("/tmp"), LocalFileIO)
    assert isinstance(io_for("file:///tmp"), LocalFileIO)
    with pytest.raises(StorageError, match="unsupported storage scheme"):
        io_for("hdfs://nn/x")


def exercise(io, base):
    io.write(join(base, "a/one"), b"0123456789")
    io.write(join(base, "b"), b"")
    assert io.read(join(base, "a/one")) == b"0123456789"
    assert io.read_range(join(base, "a/one"), 3, 4) == b"3456"
    assert io.size(join(base, "a/one")) == 10
    assert io.exists(join(base, "b")) and not io.exists(join(base, "c"))
    assert io.list(base) == [join(base, "a/one"), join(base, "b")]
    with pytest.raises(StorageError, match="already exists"):
        io.write(join(base, "b"), b"x")
    with pytest.raises(StorageError, match="truncated"):
        io.read_range(join(base, "a/one"), 8, 4)
    with pytest.raises(StorageError, match="cannot read"):
        io.read(join(base, "missing"))


def test_local(tmp_path):
    exercise(LocalFileIO(), str(tmp_path))


def test_s3(s3_endpoint):
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="storage-test")
    exercise(S3FileIO(s3_endpoint), "s3://storage-test/base")
