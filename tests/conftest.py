"""Shared test fixtures: the committed real-Flink checkpoints and a local S3 server."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
sys.path.insert(0, str(FIXTURES))


class Fixture:
    """One committed checkpoint written by real Flink, with the Java reference's figures."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.name = directory.name
        self.info = json.loads((directory / "fixture.json").read_text())
        self.expected = json.loads((directory / "expected.json").read_text())

    @property
    def checkpoint(self) -> Path:
        return self.directory / self.info["checkpoint"]

    @property
    def metadata_file(self) -> Path:
        return self.checkpoint / "_metadata"

    def __repr__(self) -> str:
        return self.name


ALL_FIXTURES = sorted(
    (Fixture(d) for d in FIXTURES.iterdir() if (d / "fixture.json").exists() and (d / "expected.json").exists()),
    key=lambda f: f.name,
)


# Checkpoints as Flink wrote them (the naive-rescale one is derived, built to be unsound).
CAPTURED = [f for f in ALL_FIXTURES if not f.info.get("naive_rescale")]
# Tests that run real Flink use the versions CI runs; `make compat` covers every version.
CI_FLINK_VERSIONS = ("1.20.3", "2.3.0")
RESTORABLE = [f for f in CAPTURED if f.info["flink_version"] in CI_FLINK_VERSIONS]


def pytest_generate_tests(metafunc):
    if "ci_fixture" in metafunc.fixturenames:
        chosen = [f for f in ALL_FIXTURES if f.info["flink_version"] in CI_FLINK_VERSIONS]
        metafunc.parametrize("ci_fixture", chosen, ids=[f.name for f in chosen])
    if "fixture" in metafunc.fixturenames:
        metafunc.parametrize("fixture", ALL_FIXTURES, ids=[f.name for f in ALL_FIXTURES])
    if "captured" in metafunc.fixturenames:
        metafunc.parametrize("captured", CAPTURED, ids=[f.name for f in CAPTURED])
    if "restorable" in metafunc.fixturenames:
        metafunc.parametrize("restorable", RESTORABLE, ids=[f.name for f in RESTORABLE])


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
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")}
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
