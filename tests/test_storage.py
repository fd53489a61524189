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
        ("gs://b/k", "gs://b/k"),
        ("abfs://c@acct.dfs.core.windows.net/k", "abfss://c@acct.dfs.core.windows.net/k"),
        ("abfss://c@acct.dfs.core.windows.net/k", "abfss://c@acct.dfs.core.windows.net/k"),
        ("wasb://c@acct.blob.core.windows.net/k/l", "abfss://c@acct.dfs.core.windows.net/k/l"),
        ("wasbs://c@acct.blob.core.chinacloudapi.cn/k", "abfss://c@acct.dfs.core.chinacloudapi.cn/k"),
    ],
)
def test_normalize_uri(uri, expected):
    assert normalize_uri(uri) == expected


def test_join_and_parent():
    assert join("s3://b/ck/", "chk-1", "_metadata") == "s3://b/ck/chk-1/_metadata"
    assert parent("s3://b/ck/chk-1") == "s3://b/ck"
    assert parent("file:/a/b") == "/a"


def test_parent_stops_at_the_bucket_or_container():
    assert parent("gs://b/ck/chk-1") == "gs://b/ck"
    assert parent("gs://b") == "gs://b"
    assert parent("abfss://c@a.dfs.core.windows.net/ck") == "abfss://c@a.dfs.core.windows.net"
    assert parent("wasb://c@a.blob.core.windows.net") == "abfss://c@a.dfs.core.windows.net"


def test_io_for_picks_by_scheme():
    from ckpt_tool.storage.azure import AzureFileIO
    from ckpt_tool.storage.gcs import GcsFileIO

    assert isinstance(io_for("/tmp"), LocalFileIO)
    assert isinstance(io_for("file:///tmp"), LocalFileIO)
    assert isinstance(io_for("gs://b/k"), GcsFileIO)
    for uri in ("abfs://c@a.dfs.core.windows.net/k", "wasbs://c@a.blob.core.windows.net/k"):
        assert isinstance(io_for(uri), AzureFileIO)
    with pytest.raises(StorageError, match="unsupported storage scheme"):
        io_for("hdfs://nn/x")


def test_base_imports_no_implementation():
    """storage.base is the interface only: importing it loads no store's implementation or client."""
    import subprocess
    import sys

    code = (
        "import sys, ckpt_tool.storage.base; "
        "print(sorted(m for m in sys.modules if m.startswith(('ckpt_tool.storage.', 'boto', 'google', 'azure'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['ckpt_tool.storage.base', 'ckpt_tool.storage.patience', 'ckpt_tool.storage.uri']", loaded


@pytest.mark.parametrize(
    "uri",
    ["gs://b/a/../k", "s3://b/./k", "abfss://c@a.dfs.core.windows.net/x/..", "wasb://c@a.blob.core.windows.net/../k"],
)
def test_object_keys_with_dot_segments_are_refused(uri):
    with pytest.raises(StorageError, match=r"an object key with a '\.' or '\.\.' segment is refused"):
        io_for(uri).exists(uri)


@pytest.mark.parametrize("uri", ["abfss://acct.dfs.core.windows.net/k", "wasb://C@acct.blob.core.windows.net/k"])
def test_azure_uris_name_container_and_account(uri):
    with pytest.raises(StorageError, match=r"is not an Azure storage URI of the form abfs\[s\]://<container>@<account>"):
        io_for(uri).exists(uri)


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
