"""inspect, verify, rescale and repair from and to S3 (moto's server on 127.0.0.1, behind a proxy
that fails the first attempts of requests with throttling and 5xx answers)."""

from __future__ import annotations

import http.client
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import boto3
import pytest

import flink_env
from catalog import ALL_FIXTURES

BASE = next(f for f in ALL_FIXTURES if f.name == "flink23-rocksdb-p2")  # RocksDB: shared files too
FAULTS = [(503, "SlowDown"), (500, "InternalError")]


class FaultyProxy(ThreadingHTTPServer):
    """Forwards to moto; the first attempt of every request path fails with a throttling or 5xx
    answer, so every boto3 call needs its retries."""

    def __init__(self, target: str):
        self.target = urlparse(target)
        self.failed: set[tuple[str, str]] = set()
        self.injected = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _handle(self) -> None:
        server: FaultyProxy = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with server.lock:
            first = (self.command, self.path) not in server.failed
            if first:
                server.failed.add((self.command, self.path))
                status, code = FAULTS[server.injected % len(FAULTS)]
                server.injected += 1
        if first:
            payload = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        connection = http.client.HTTPConnection(server.target.hostname, server.target.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        headers["Host"] = server.target.netloc
        connection.request(self.command, self.path, body=body, headers=headers)
        answer = connection.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        length = answer.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", length or str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle


@pytest.fixture(scope="module")
def s3(s3_endpoint):
    """A bucket holding BASE, and the environment pointed at the faulty proxy."""
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="e2e")
    job_dir = BASE.checkpoint.parent
    for path in job_dir.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), "e2e", f"in/{path.relative_to(job_dir.parent)}")
    proxy = FaultyProxy(s3_endpoint)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    saved = os.environ["AWS_ENDPOINT_URL"]
    os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.server_address[1]}"
    yield client, proxy, f"s3://e2e/in/{job_dir.name}/{BASE.checkpoint.name}"
    os.environ["AWS_ENDPOINT_URL"] = saved
    proxy.shutdown()


def etags(client, prefix: str) -> dict[str, str]:
    listed = client.list_objects_v2(Bucket="e2e", Prefix=prefix).get("Contents", [])
    return {item["Key"]: item["ETag"] for item in listed}


def inputs():
    return ["--plan", BASE.plan, "--schema", BASE.schema]


def local_form(text: str, uri: str) -> dict:
    return json.loads(text.replace(uri.rsplit("/", 2)[0], str(BASE.checkpoint.parent.parent)))


def test_inspect_and_verify_from_s3_equal_local(ckpt, s3):
    client, proxy, uri = s3
    before = etags(client, "in/")
    for command in (["inspect", "--engine", "local"], ["verify", "--engine", "local"]):
        code, remote, err = ckpt(command[0], "--json", uri, *command[1:], *inputs())
        assert code == 0, err
        code, local, err = ckpt(command[0], "--json", str(BASE.checkpoint), *command[1:], *inputs())
        assert code == 0, err
        remote = remote.replace(uri.rsplit("/", 2)[0], str(BASE.directory))
        assert json.loads(remote) == json.loads(local.replace(str(BASE.checkpoint), str(BASE.checkpoint)))
    assert proxy.injected > 0, "faults were injected and retried"
    assert etags(client, "in/") == before


def download(client, prefix: str, target: Path) -> Path:
    for key in etags(client, prefix):
        path = target / key[len(prefix) :]
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download_file("e2e", key, str(path))
    return target


@pytest.mark.flink
def test_rescale_and_repair_on_s3_restore_in_flink(ckpt, s3, spark, tmp_path):
    client, _, uri = s3
    before = etags(client, "in/")
    rescaled = "s3://e2e/out-rescaled/job/" + BASE.checkpoint.name
    code, out, err = ckpt(
        "rescale", uri, rescaled, "-p", "3", "--engine", "spark", "--spark-master", "local[2]", "--json", *inputs()
    )
    assert code == 0, err
    report = json.loads(out)
    code, local_out, err = ckpt(
        "rescale", str(BASE.checkpoint), str(tmp_path / "local" / "chk"), "-p", "3", "--engine", "local", "--json", *inputs()
    )
    assert code == 0, err
    local_report = json.loads(local_out)
    assert report["exchanges"] == local_report["exchanges"] and report["inflation"] == 1.0
    repaired = "s3://e2e/out-repaired/job/" + BASE.checkpoint.name
    code, out, err = ckpt("repair", rescaled, repaired, "--engine", "local", "--json", *inputs())
    assert code == 0, err
    code, local_repair, err = ckpt(
        "repair", str(tmp_path / "local" / "chk"), str(tmp_path / "local-repaired"), "--engine", "local", "--json", *inputs()
    )
    assert code == 0, err
    assert json.loads(out)["exchanges"] == json.loads(local_repair)["exchanges"]
    assert etags(client, "in/") == before, "the input objects were changed"
    for prefix, parallelism in (("out-rescaled/", 3), ("out-repaired/", 3)):
        local = download(client, prefix, tmp_path / prefix.strip("/"))
        checkpoint = local / "job" / BASE.checkpoint.name
        count = flink_env.restore_count("2.3.0", checkpoint, parallelism, backend="rocksdb")
        assert count == BASE.info["source_records"], prefix


def test_missing_object_is_a_clean_error(ckpt, s3, tmp_path):
    client, _, uri = s3
    code, out, err = ckpt("inspect", "s3://e2e/in/nothing/chk-1")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "is not a checkpoint" in err
    # a checkpoint whose channel-state object is gone: clean error, nothing written
    client.copy_object(
        Bucket="e2e",
        CopySource={"Bucket": "e2e", "Key": uri[len("s3://e2e/") :] + "/_metadata"},
        Key="broken/job/chk-3/_metadata",
    )
    code, _, err = ckpt(
        "rescale", "s3://e2e/broken/job/chk-3", "s3://e2e/broken-out/chk-3", "-p", "3", "--engine", "local", *inputs()
    )
    assert code == 2 and "is missing" in err and "Traceback" not in err
    assert etags(client, "broken-out/") == {}


def test_s3_endpoint_option(ckpt, s3):
    _, _, uri = s3
    endpoint = os.environ.pop("AWS_ENDPOINT_URL")
    try:
        code, out, err = ckpt("--s3-endpoint", endpoint, "inspect", "--json", uri)
    finally:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        os.environ.pop("CKPT_S3_ENDPOINT", None)
    assert code == 0, err
    assert json.loads(out)["checkpoint_id"] == BASE.expected["checkpoint_id"]


def test_large_outputs_are_uploaded_in_parts(s3):
    from ckpt_tool.storage.s3 import S3FileIO

    client, _, _ = s3
    S3FileIO.default().write("s3://e2e/large/object", bytes(20 * 1024 * 1024))
    etag = client.head_object(Bucket="e2e", Key="large/object")["ETag"]
    assert "-" in etag, "a multipart upload's ETag names its parts"
