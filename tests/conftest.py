"""Shared test fixtures: the committed real-Flink checkpoints, the ckpt command, one Spark
engine for the whole run, and a local S3 server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))
# Not on Google Cloud: Google's credential chain must not ask its metadata server (a non-local address);
# read when google.auth is first imported, so set before any test imports it.
os.environ.setdefault("NO_GCE_CHECK", "true")

from catalog import ALL_FIXTURES, CAPTURED, CI_FLINK_VERSIONS, FILE_MERGING, IN_FLIGHT, RESTORABLE, SNAPSHOTS


def pytest_generate_tests(metafunc):
    if "ci_fixture" in metafunc.fixturenames:
        chosen = [f for f in ALL_FIXTURES if f.info["flink_version"] in CI_FLINK_VERSIONS]
        metafunc.parametrize("ci_fixture", chosen, ids=[f.name for f in chosen])
    if "fixture" in metafunc.fixturenames:
        metafunc.parametrize("fixture", ALL_FIXTURES, ids=[f.name for f in ALL_FIXTURES])
    if "inflight" in metafunc.fixturenames:
        metafunc.parametrize("inflight", IN_FLIGHT, ids=[f.name for f in IN_FLIGHT])
    if "snapshot" in metafunc.fixturenames:
        metafunc.parametrize("snapshot", SNAPSHOTS, ids=[f.name for f in SNAPSHOTS])
    if "file_merging" in metafunc.fixturenames:
        metafunc.parametrize("file_merging", FILE_MERGING, ids=[f.name for f in FILE_MERGING])
    if "captured" in metafunc.fixturenames:
        metafunc.parametrize("captured", CAPTURED, ids=[f.name for f in CAPTURED])
    if "restorable" in metafunc.fixturenames:
        metafunc.parametrize("restorable", RESTORABLE, ids=[f.name for f in RESTORABLE])


@pytest.fixture
def ckpt(capsys):
    """Run the ckpt command in-process: ``ckpt("inspect", ...)`` -> (exit code, stdout, stderr)."""
    from ckpt_tool.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture(scope="session")
def spark(s3_endpoint):
    """One Spark engine (local[2], as CI has two cores) for every test that needs Spark. It
    starts after the local S3 server, so that its workers inherit the server's settings; ckpt
    commands run in this process reuse it and leave it running."""
    from ckpt_tool.engine import SparkEngine

    engine = SparkEngine("local[2]")
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def record_multiset():
    """The records (stream-element tags 0 and 1) of every exchange a session describes, as a
    multiset of their bytes."""
    from collections import Counter

    from ckpt_tool.engine.tasks import channel_tasks, read_channel
    from ckpt_tool.flink.channel_state import ChannelStateReader

    def multiset(session) -> Counter:
        records: Counter = Counter()
        with ChannelStateReader() as reader:
            for task in channel_tasks(session.checkpoint, session.exchanges):
                channel = read_channel(reader, task)
                records.update(channel.element(i) for i in channel.is_record.nonzero()[0].tolist())
        return records

    return multiset


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server on 127.0.0.1, with dummy credentials in the environment."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint
    )
    yield endpoint
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _set_environment(values: dict[str, str | None]) -> dict[str, str | None]:
    saved = {k: os.environ.get(k) for k in values}
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return saved


@pytest.fixture(scope="session")
def gcs_emulator():
    """gcp-storage-emulator on 127.0.0.1 (see tests/emulators.py), reached through STORAGE_EMULATOR_HOST."""
    from emulators import gcs_emulator as start

    with start() as emulator:
        saved = _set_environment({"STORAGE_EMULATOR_HOST": emulator.endpoint})
        yield emulator
        _set_environment(saved)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    """Azurite's Blob service on 127.0.0.1 (see tests/emulators.py), reached through
    AZURE_STORAGE_CONNECTION_STRING."""
    from emulators import azurite as start

    with start(tmp_path_factory.mktemp("azurite")) as server:
        saved = _set_environment({"AZURE_STORAGE_CONNECTION_STRING": server.connection_string})
        yield server
        _set_environment(saved)
