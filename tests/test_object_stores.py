"""Google Cloud Storage and Azure as first-class storage, against real emulators on 127.0.0.1
(gcp-storage-emulator and Azurite, started by the tests: tests/emulators.py): a real fixture is
uploaded with the store's own client, inspected (figures equal Flink's reader's, expected.json),
rescaled into the same store, downloaded and restored by real Flink with the exact count; every
operation works; copies go across stores; keys with ``..``, two writers and a stalled endpoint
are refused in one line."""

from __future__ import annotations

import json
import time

import pytest
from stores import AzureStore, GcsStore, download_tree, upload_tree

import flink_env
from catalog import ALL_FIXTURES

BASE = next(f for f in ALL_FIXTURES if f.name == "flink23-rocksdb-p2")  # RocksDB: shared files too
JOB = BASE.checkpoint.parent.name
CHK = BASE.checkpoint.name
INPUTS = ["--plan", BASE.plan, "--schema", BASE.schema]


@pytest.fixture(scope="module", params=["gcs", "azure"])
def store(request):
    """A bucket or container holding BASE's job directory under ``in/``."""
    if request.param == "gcs":
        request.getfixturevalue("gcs_emulator")
        store = GcsStore("ckpt-stores")
    else:
        request.getfixturevalue("azurite")
        store = AzureStore("ckpt-stores")
    upload_tree(store, BASE.checkpoint.parent, f"in/{JOB}")
    return store


def one_error(code: int, out: str, err: str) -> str:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("ckpt: error: ") and "Traceback" not in err, err
    return err.strip()[len("ckpt: error: ") :]


def figures(report: dict) -> dict:
    """What Flink's own reader says about the checkpoint (expected.json), from an inspect report."""
    return {
        "checkpoint_id": report["checkpoint_id"],
        "metadata_version": report["metadata_version"],
        "operators": {
            op["id"]: (op["parallelism"], op["max_parallelism"], op["finished"], op["channel_state"])
            for op in report["operators"]
        },
    }


EXPECTED = figures(BASE.expected)


def test_inspect_equals_flinks_reader(ckpt, store):
    before = store.keys("in/")
    code, out, err = ckpt("inspect", "--json", store.uri(f"in/{JOB}/{CHK}"), *INPUTS, "--engine", "local")
    assert code == 0, err
    report = json.loads(out)
    assert figures(report) == EXPECTED
    assert report["problems"] == []
    # the same through the other spellings of the location
    if store.name == "azure":
        wasb = store.uri(f"in/{JOB}/{CHK}").replace("abfss://", "wasbs://").replace(".dfs.", ".blob.")
        code, out, err = ckpt("inspect", "--json", wasb + "/_metadata")
        assert code == 0, err
        assert figures(json.loads(out)) == EXPECTED
    assert store.keys("in/") == before, "the input was changed"


def test_every_operation(ckpt, store, tmp_path):
    src = store.uri(f"in/{JOB}/{CHK}")
    code, out, err = ckpt("verify", "--json", src, *INPUTS, "--engine", "local")
    assert code == 0, err
    assert json.loads(out)["status"] == "sound", out
    code, out, err = ckpt("schema", src, "--plan", BASE.plan)
    assert code == 0 and "[[exchange]]" in out, err
    code, _, err = ckpt("records", src, *INPUTS, "--engine", "local", "--out", tmp_path / "records.parquet")
    assert code == 0, err
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "records.parquet").num_rows > 0
    repaired = store.uri(f"repaired/{JOB}/{CHK}")
    code, _, err = ckpt("repair", src, repaired, *INPUTS, "--engine", "local")
    assert code == 0, err
    code, out, err = ckpt("verify", "--json", repaired, *INPUTS, "--engine", "local")
    assert code == 0, err


@pytest.mark.flink
def test_rescale_in_the_store_restores_in_flink(ckpt, store, tmp_path):
    before = store.keys("in/")
    dst = f"rescaled/{JOB}/{CHK}"
    code, out, err = ckpt(
        "rescale", store.uri(f"in/{JOB}/{CHK}"), store.uri(dst), "-p", "3", *INPUTS, "--engine", "local", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["inflation"] == 1.0
    assert store.keys("in/") == before, "the input was changed"
    written = store.keys(dst + "/")
    assert f"{dst}/_metadata" in written and not any(k.endswith("_ckpt_lock") for k in written)
    local = download_tree(store, dst, tmp_path / "job" / CHK)
    count = flink_env.restore_count("2.3.0", local, 3, backend="rocksdb")
    assert count == BASE.info["source_records"]


def test_cross_store_copies(ckpt, gcs_emulator, azurite, s3_endpoint, tmp_path):
    """gs:// -> abfss:// -> local -> gs://, and S3 -> Azure: each output verifies."""
    import boto3

    gcs, azure = GcsStore("ckpt-cross"), AzureStore("ckpt-cross", scheme="wasb")
    upload_tree(gcs, BASE.checkpoint.parent, f"in/{JOB}")
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="ckpt-cross")
    for path in BASE.checkpoint.parent.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), "ckpt-cross", f"in/{JOB}/{path.relative_to(BASE.checkpoint.parent)}")
    hops = [
        (gcs.uri(f"in/{JOB}/{CHK}"), azure.uri(f"from-gcs/{JOB}/{CHK}"), "3"),
        (azure.uri(f"from-gcs/{JOB}/{CHK}"), str(tmp_path / "from-azure" / CHK), "2"),
        (str(tmp_path / "from-azure" / CHK), gcs.uri(f"from-local/{JOB}/{CHK}"), "4"),
        (f"s3://ckpt-cross/in/{JOB}/{CHK}", azure.uri(f"from-s3/{JOB}/{CHK}"), "3"),
    ]
    for src, dst, parallelism in hops:
        code, _, err = ckpt("rescale", src, dst, "-p", parallelism, *INPUTS, "--engine", "local")
        assert code == 0, (src, dst, err)
        code, out, err = ckpt("verify", "--json", dst, *INPUTS, "--engine", "local", "--target-parallelism", parallelism)
        assert code == 0 and json.loads(out)["status"] == "sound", (dst, err, out)


# --- hostile cases ---------------------------------------------------------------------------------


def test_keys_with_dotdot_are_refused(ckpt, store, tmp_path):
    """A URI with a ``..`` segment (an object store keeps it literally) and a handle whose key
    climbs out of the checkpoint: one line, exit 2, nothing written."""
    code, out, err = ckpt("inspect", store.uri(f"in/x/../{JOB}/{CHK}"))
    assert "an object key with a '.' or '..' segment is refused" in one_error(code, out, err)
    code, out, err = ckpt("rescale", store.uri(f"in/{JOB}/{CHK}"), store.uri("out/../escaped"), "-p", "3", *INPUTS)
    assert "'..' segment is refused" in one_error(code, out, err)
    from test_hostile import copy_job, rewrite_metadata

    checkpoint = copy_job(tmp_path)
    rewrite_metadata(checkpoint, lambda h: setattr(h, "relative_path", "../../../other/" + h.relative_path))
    upload_tree(store, checkpoint, "hostile/job/chk-3")
    code, out, err = ckpt("rescale", store.uri("hostile/job/chk-3"), store.uri("hostile-out/chk-3"), "-p", "3", *INPUTS)
    assert "leads out of the checkpoint; refused" in one_error(code, out, err)
    assert store.keys("hostile-out/") == {} and store.keys("other/") == {}


def test_two_writers_to_one_destination(ckpt, store):
    """A second run into a destination another run holds is refused (the claim is an exclusive
    create: ifGenerationMatch=0, If-None-Match: *); the first run's claim stays."""
    from ckpt_tool.errors import AlreadyExistsError
    from ckpt_tool.storage import io_for
    from ckpt_tool.writer.claim import take_claim

    dst = store.uri(f"busy/{JOB}/{CHK}")
    claim = take_claim(dst)
    try:
        code, out, err = ckpt("rescale", store.uri(f"in/{JOB}/{CHK}"), dst, "-p", "3", *INPUTS, "--engine", "local")
        assert "is claimed by another ckpt run" in one_error(code, out, err)
        with pytest.raises(AlreadyExistsError):
            io_for(dst).write(claim.lock_uri, b"{}")
    finally:
        claim.release()
    assert store.keys(f"busy/{JOB}/{CHK}/") == {}


def test_gcs_writes_are_conditional_creates(ckpt, gcs_emulator):
    """Every object ckpt uploads to GCS carries ifGenerationMatch=0."""
    gcs = GcsStore("ckpt-conditional")
    upload_tree(gcs, BASE.checkpoint.parent, f"in/{JOB}")
    code, _, err = ckpt("repair", gcs.uri(f"in/{JOB}/{CHK}"), gcs.uri("out/chk-3"), *INPUTS, "--engine", "local")
    assert code == 0, err
    written = [(name, generation) for name, generation in gcs_emulator.uploads if name and name.startswith("out/")]
    assert len(written) >= 3 and all(generation == "0" for _, generation in written), written


# --- error classes ---------------------------------------------------------------------------------


def test_missing_bucket_container_and_object(ckpt, store):
    if store.name == "gcs":
        message = one_error(*ckpt("inspect", "gs://no-such-bucket/job/chk-1"))
        assert message == "bucket 'no-such-bucket' does not exist"
    else:
        message = one_error(*ckpt("inspect", "abfss://nosuch@devstoreaccount1.dfs.core.windows.net/job/chk-1"))
        assert message == "container 'nosuch' does not exist in account 'devstoreaccount1'"
    uri = store.uri("nothing/chk-1")
    assert one_error(*ckpt("inspect", uri)) == f"{store.uri('nothing/chk-1')} is not a checkpoint: it has no _metadata file"
    from ckpt_tool.errors import StorageError
    from ckpt_tool.storage import io_for

    with pytest.raises(StorageError, match=r"no such object$"):
        io_for(uri).read(uri + "/_metadata")


def test_gcs_connection_failures(ckpt, gcs_emulator, monkeypatch, tmp_path):
    from emulators import free_port
    from stalled import StalledServer

    monkeypatch.setenv("CKPT_IO_TIMEOUT", "10")
    monkeypatch.setenv("CKPT_IO_ATTEMPTS", "3")
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    started = time.monotonic()
    message = one_error(*ckpt("--io-attempts", "2", "inspect", "gs://b/job/chk-1"))
    assert message == f"cannot reach Google Cloud Storage endpoint {endpoint}: Connection refused"
    assert time.monotonic() - started < 15
    with StalledServer() as server:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://{server.address}")
        started = time.monotonic()
        message = one_error(*ckpt("--io-timeout", "1", "--io-attempts", "3", "inspect", "gs://b/job/chk-1"))
        elapsed = time.monotonic() - started
        assert message == (
            f"Google Cloud Storage endpoint http://{server.address} stalled: "
            "no answer within 1 s (3 attempts; CKPT_IO_TIMEOUT sets the wait)"
        )
        assert len(server.accepted) >= 3
    assert 3 <= elapsed < 15, elapsed


def test_gcs_credentials_and_access(ckpt, monkeypatch, tmp_path):
    """No credentials anywhere (and no metadata server asked); a store that denies access."""
    from denying import denying_server

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    message = one_error(*ckpt("inspect", "gs://b/job/chk-1"))
    assert message.startswith(
        f"cannot read gs://b/job/chk-1/_metadata: GOOGLE_APPLICATION_CREDENTIALS names {tmp_path / 'no-such-key.json'}, "
        "not a usable credentials file"
    ), message
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no gcloud login
    message = one_error(*ckpt("inspect", "gs://b/job/chk-1"))
    assert message.startswith("cannot read gs://b/job/chk-1/_metadata: no Google Cloud credentials found"), message
    with denying_server("gcs") as endpoint:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        assert one_error(*ckpt("inspect", "gs://b/job/chk-1")) == "access denied to gs://b/job/chk-1/_metadata"


def test_azure_connection_failures(ckpt, azurite, monkeypatch):
    from emulators import connection_string, free_port
    from stalled import StalledServer

    monkeypatch.setenv("CKPT_IO_TIMEOUT", "10")
    monkeypatch.setenv("CKPT_IO_ATTEMPTS", "3")
    uri = "abfss://ckpt-stores@devstoreaccount1.dfs.core.windows.net/job/chk-1"
    endpoint = f"http://127.0.0.1:{free_port()}/devstoreaccount1"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection_string(endpoint))
    started = time.monotonic()
    message = one_error(*ckpt("--io-attempts", "2", "inspect", uri))
    assert message == f"cannot reach Azure endpoint {endpoint}: Connection refused", message
    assert time.monotonic() - started < 15
    with StalledServer() as server:
        endpoint = f"http://{server.address}/devstoreaccount1"
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection_string(endpoint))
        started = time.monotonic()
        message = one_error(*ckpt("--io-timeout", "1", "--io-attempts", "3", "inspect", uri))
        elapsed = time.monotonic() - started
        assert message == f"Azure endpoint {endpoint} stalled: no answer within 1 s (3 attempts; CKPT_IO_TIMEOUT sets the wait)"
        assert len(server.accepted) == 3
    assert 3 <= elapsed < 15, elapsed


def test_azure_credentials_and_access(ckpt, azurite, monkeypatch, tmp_path):
    """A wrong account key; a SAS token that may only read; no credentials at all (and no
    managed identity endpoint asked but a closed local port)."""
    from datetime import UTC, datetime, timedelta

    from azure.storage.blob import ContainerSasPermissions, generate_container_sas
    from emulators import AZURITE_ACCOUNT, AZURITE_KEY, connection_string, free_port

    store = AzureStore("ckpt-access")
    upload_tree(store, BASE.checkpoint.parent, f"in/{JOB}")
    src = store.uri(f"in/{JOB}/{CHK}")
    wrong = connection_string(azurite.blob_endpoint, key="d3Jvbmc=" * 11)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong)
    # Azure answers a wrong key with AuthenticationFailed (the credentials were rejected); Azurite with
    # AuthorizationFailure, as for a credential without the permission
    assert one_error(*ckpt("inspect", src)) == f"access denied to {src}/_metadata"
    sas = generate_container_sas(
        AZURITE_ACCOUNT,
        "ckpt-access",
        account_key=AZURITE_KEY,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", f"BlobEndpoint={azurite.blob_endpoint};SharedAccessSignature={sas}")
    code, _, err = ckpt("inspect", "--json", src)
    assert code == 0, err  # reading is allowed
    dst = store.uri("denied/chk-3")
    assert one_error(*ckpt("rescale", src, dst, "-p", "3", *INPUTS, "--engine", "local")) == f"access denied to {dst}/_ckpt_lock"
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("HOME", str(tmp_path))  # no az login
    message = one_error(*ckpt("inspect", "abfss://c1@nosuchaccount.dfs.core.windows.net/job/chk-1"))
    assert message.startswith(
        "cannot read abfss://c1@nosuchaccount.dfs.core.windows.net/job/chk-1/_metadata: no Azure credentials"
    ), message


def test_throttling_and_server_errors_are_retried(ckpt, store, monkeypatch):
    """Behind a proxy that fails the first attempt of every request with 503 or 500, inspect gives
    Flink's figures and an exclusive create succeeds: the stores' clients retried."""
    import os
    import threading

    from emulators import connection_string
    from test_s3_end_to_end import FaultyProxy

    endpoint = os.environ["STORAGE_EMULATOR_HOST"] if store.name == "gcs" else store.blob_endpoint()
    proxy = FaultyProxy(endpoint)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        address = f"http://127.0.0.1:{proxy.server_address[1]}"
        if store.name == "gcs":
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", address)
        else:
            account = endpoint.rsplit("/", 1)[1]
            monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection_string(f"{address}/{account}"))
        src = store.uri(f"in/{JOB}/{CHK}")
        code, out, err = ckpt("inspect", "--json", src)
        assert code == 0, err
        assert figures(json.loads(out)) == EXPECTED
        from ckpt_tool.storage import io_for

        written = store.uri("retried/object")
        io_for(written).write(written, b"retried")  # a conditional create, retried after a 5xx
        assert store.get("retried/object") == b"retried"
        assert proxy.injected > 5
    finally:
        proxy.shutdown()
        proxy.server_close()
