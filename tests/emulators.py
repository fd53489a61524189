"""Real storage emulators on 127.0.0.1 for the tests, started by them:

- Google Cloud Storage: ``gcp-storage-emulator`` (PyPI, the JSON API), run in this process. It does
  not implement preconditions, so the one ckpt relies on is added here, as Google's service does
  it: an upload with ``ifGenerationMatch=0`` of an object that exists is refused with 412. Every
  upload's ``ifGenerationMatch`` is recorded (ckpt's writes must all carry it).
- Azure: Azurite (npm package ``azurite``, Microsoft's emulator, Blob service), run by Node. It is
  installed once into ``$CKPT_TOOLS_CACHE/azurite`` (default ``~/.cache/ckpt-tools/azurite``),
  never into the repository (``make azurite`` does the same).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

AZURITE_VERSION = "3"
# Azurite's well-known development account (documented by Microsoft; not a secret)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds} s")


# --- Google Cloud Storage -------------------------------------------------------------------------


@dataclass
class GcsEmulator:
    endpoint: str
    uploads: list[tuple[str, str | None]] = field(default_factory=list)  # (object name, ifGenerationMatch)


def _with_precondition(insert, emulator: GcsEmulator):
    """The emulator's upload handler, refusing ``ifGenerationMatch=0`` for an existing object."""
    from gcp_storage_emulator.exceptions import NotFound

    def guarded(request, response, storage, *args, **kwargs):
        query = request.query
        name = (query.get("name") or [None])[0]
        if name is None and (query.get("uploadType") or [None])[0] in ("multipart", "resumable"):
            data = request.data or {}
            name = (data.get("meta") or data).get("name") if isinstance(data, dict) else None
        generation = (query.get("ifGenerationMatch") or [None])[0]
        emulator.uploads.append((name, generation))
        if generation == "0" and name is not None:
            try:
                storage.get_file_obj(request.params["bucket_name"], name)
            except NotFound:
                pass
            else:
                response.status = HTTPStatus.PRECONDITION_FAILED
                message = "At least one of the pre-conditions you specified did not hold."
                response.json({"error": {"code": 412, "message": message}})
                return None
        return insert(request, response, storage, *args, **kwargs)

    return guarded


@contextmanager
def gcs_emulator() -> Iterator[GcsEmulator]:
    import logging

    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
    port = free_port()
    emulator = GcsEmulator(f"http://127.0.0.1:{port}")
    original = objects.insert
    guarded = _with_precondition(original, emulator)
    patched = [handlers for _, handlers in server.HANDLERS if handlers.get(server.POST) is original]
    for handlers in patched:
        handlers[server.POST] = guarded
    objects.insert = guarded  # the router also names it directly
    instance = server.create_server("127.0.0.1", port, in_memory=True)
    instance.start()
    try:
        yield emulator
    finally:
        instance.stop()
        objects.insert = original
        for handlers in patched:
            handlers[server.POST] = original


# --- Azure (Azurite) -------------------------------------------------------------------------------


def tools_cache() -> Path:
    return Path(os.environ.get("CKPT_TOOLS_CACHE") or Path.home() / ".cache" / "ckpt-tools")


def azurite_command() -> Path:
    """Azurite's Blob service, installed from npm into the tools cache the first time."""
    prefix = tools_cache() / "azurite"
    command = prefix / "node_modules" / ".bin" / "azurite-blob"
    if not command.exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("Azurite needs Node and npm (Debian: apt-get install nodejs npm)")
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), f"azurite@{AZURITE_VERSION}"],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=600,
        )
    return command


@dataclass
class Azurite:
    port: int
    process: subprocess.Popen

    @property
    def blob_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return connection_string(self.blob_endpoint)


def connection_string(blob_endpoint: str, key: str = AZURITE_KEY) -> str:
    return f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};BlobEndpoint={blob_endpoint};"


@contextmanager
def azurite(workdir: Path) -> Iterator[Azurite]:
    port = free_port()
    command = [
        str(azurite_command()),
        *("--blobHost", "127.0.0.1", "--blobPort", str(port)),
        *("--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent"),
    ]
    log = open(workdir / "azurite.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        wait_for_port(port)
        yield Azurite(port, process)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
