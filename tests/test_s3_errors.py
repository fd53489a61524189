"""S3 failures are named in one line (exit code 2), and S3 writes are exclusive creates; against
moto's server on 127.0.0.1, a closed port, and a local server that denies everything."""

from __future__ import annotations

import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest

from ckpt_tool.errors import AlreadyExistsError, StorageError
from ckpt_tool.storage import s3
from ckpt_tool.storage.s3 import MULTIPART_BYTES, S3FileIO

CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


@pytest.fixture
def fresh_clients():
    """S3 clients made from this test's environment (they are cached per endpoint), and no
    ``--s3-endpoint`` left behind."""
    s3._client_for.cache_clear()
    yield
    os.environ.pop("CKPT_S3_ENDPOINT", None)
    s3._client_for.cache_clear()


@pytest.fixture(scope="module")
def bucket(s3_endpoint) -> str:
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="errors")
    return "errors"


def one_error(code: int, out: str, err: str) -> str:
    """The message of a clean failure: exit code 2, nothing on stdout, one ``ckpt: error:`` line."""
    assert code == 2 and out == "", err
    assert len(err.splitlines()) == 1 and err.startswith("ckpt: error: "), err
    return err.strip()[len("ckpt: error: ") :]


def test_no_credentials(ckpt, bucket, fresh_clients, monkeypatch, tmp_path):
    for name in CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    message = one_error(*ckpt("inspect", f"s3://{bucket}/job/chk-1"))
    assert message == (
        f"cannot read s3://{bucket}/job/chk-1/_metadata: no AWS credentials found "
        "(set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or use an instance role)"
    )


def test_unreachable_endpoint_fails_fast(ckpt, s3_endpoint, fresh_clients):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed once the probe is
    started = time.monotonic()
    message = one_error(*ckpt("--s3-endpoint", endpoint, "inspect", "s3://bucket/job/chk-1"))
    assert time.monotonic() - started < 30
    assert message == f"cannot reach S3 endpoint {endpoint}: Connection refused"


def test_missing_bucket(ckpt, s3_endpoint, fresh_clients):
    message = one_error(*ckpt("inspect", "s3://no-such-bucket/job/chk-1"))
    assert message == "bucket 'no-such-bucket' does not exist"
    with pytest.raises(StorageError, match=r"^bucket 'no-such-bucket' does not exist$"):
        S3FileIO.default().read("s3://no-such-bucket/job/chk-1/_metadata")


def test_missing_object(ckpt, bucket, fresh_clients):
    message = one_error(*ckpt("inspect", f"s3://{bucket}/nothing/chk-1"))
    assert message == f"s3://{bucket}/nothing/chk-1 is not a checkpoint: it has no _metadata file"
    io = S3FileIO.default()
    assert not io.exists(f"s3://{bucket}/nothing/chk-1/_metadata")
    with pytest.raises(StorageError, match=r"no such object$"):
        io.size(f"s3://{bucket}/nothing/chk-1/_metadata")


class DenyingServer(ThreadingHTTPServer):
    """Answers every request with 403 AccessDenied, as S3 does for a bucket policy's deny."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Deny)


class _Deny(BaseHTTPRequestHandler):
    timeout = 10

    def log_message(self, *args) -> None:
        pass

    def _handle(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle


@pytest.fixture
def denying_endpoint():
    server = DenyingServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_access_denied(ckpt, s3_endpoint, fresh_clients, denying_endpoint):
    message = one_error(*ckpt("--s3-endpoint", denying_endpoint, "inspect", "s3://b/job/chk-1"))
    assert message == "access denied to s3://b/job/chk-1/_metadata"
    io = S3FileIO.default()
    with pytest.raises(StorageError, match=r"^access denied to s3://b/k$"):
        io.read("s3://b/k")
    with pytest.raises(StorageError, match=r"^access denied to s3://b/k$"):
        io.write("s3://b/k", b"x")


@pytest.mark.parametrize("size", [10, MULTIPART_BYTES], ids=["small", "multipart"])
def test_writes_are_exclusive(s3_endpoint, bucket, size):
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    io = S3FileIO(s3_endpoint)
    uri = f"s3://{bucket}/exclusive/{size}"
    io.write(uri, bytes(size))
    with pytest.raises(AlreadyExistsError, match=f"^{uri} already exists; ckpt never overwrites files$"):
        io.write(uri, b"\1" * size)
    head = client.head_object(Bucket=bucket, Key=f"exclusive/{size}")
    assert head["ContentLength"] == size and ("-" in head["ETag"]) == (size >= MULTIPART_BYTES)
    assert io.read_range(uri, size - 1, 1) == b"\0", "the first write stays"
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == [], "the refused upload is aborted"


def test_stalled_endpoint_fails_fast(ckpt, s3_endpoint, fresh_clients, monkeypatch):
    """An endpoint that accepts connections and never answers: each try waits CKPT_IO_TIMEOUT
    seconds, CKPT_IO_ATTEMPTS tries in all (by default 10 s x 3: about 30 s, not botocore's 60 s x 10)."""
    from stalled import StalledServer

    from ckpt_tool.storage.patience import Patience

    assert Patience().read * Patience().attempts == 30
    monkeypatch.setenv("CKPT_IO_TIMEOUT", "10")  # the options below set these; restored after the test
    monkeypatch.setenv("CKPT_IO_ATTEMPTS", "3")
    with StalledServer() as server:
        started = time.monotonic()
        code, out, err = ckpt(
            "--io-timeout",
            "1.5",
            "--io-attempts",
            "3",
            "--s3-endpoint",
            f"http://{server.address}",
            "inspect",
            "s3://b/job/chk-1",
        )
        elapsed = time.monotonic() - started
        message = one_error(code, out, err)
        assert len(server.accepted) == 3, "one connection per attempt"
    assert 4.5 <= elapsed < 12, elapsed
    assert message == (
        f"S3 endpoint http://{server.address} stalled: no answer within 1.5 s (3 attempts; CKPT_IO_TIMEOUT sets the wait)"
    )


def test_bad_io_settings_are_one_line(ckpt, fresh_clients, monkeypatch):
    monkeypatch.setenv("CKPT_IO_TIMEOUT", "soon")
    message = one_error(*ckpt("inspect", "s3://b/job/chk-1"))
    assert message == "CKPT_IO_TIMEOUT='soon' is not a number of seconds between 0 and 86400"
