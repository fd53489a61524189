"""The object stores the tests put checkpoints in, each reached with its vendor's own client
(never through ckpt's storage code): upload a directory, list, download."""

from __future__ import annotations

import hashlib
from pathlib import Path


class GcsStore:
    name = "gcs"

    def __init__(self, bucket: str):
        from google.cloud import storage

        self.client = storage.Client(project="test")
        self.bucket_name = bucket
        self.bucket = self.client.bucket(bucket)
        if self.client.lookup_bucket(bucket) is None:
            self.client.create_bucket(bucket)

    def uri(self, key: str) -> str:
        return f"gs://{self.bucket_name}/{key}"

    def put(self, key: str, data: bytes) -> None:
        self.bucket.blob(key).upload_from_string(data)

    def get(self, key: str) -> bytes:
        return self.bucket.blob(key).download_as_bytes()

    def keys(self, prefix: str) -> dict[str, str]:
        """Key -> digest of its bytes, below ``prefix``."""
        return {
            b.name: hashlib.sha256(self.get(b.name)).hexdigest() for b in self.client.list_blobs(self.bucket_name, prefix=prefix)
        }


class AzureStore:
    name = "azure"

    def __init__(self, container: str, scheme: str = "abfss"):
        import os

        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
        self._service_url = service.url.rstrip("/")
        self.container_name = container
        self.container = service.get_container_client(container)
        try:
            self.container.create_container()
        except ResourceExistsError:
            pass
        host = "dfs" if scheme.startswith("abfs") else "blob"
        self.base = f"{scheme}://{container}@devstoreaccount1.{host}.core.windows.net"

    def uri(self, key: str) -> str:
        return f"{self.base}/{key}"

    def blob_endpoint(self) -> str:
        """The account's blob endpoint (Azurite's: http://127.0.0.1:<port>/devstoreaccount1)."""
        return self._service_url

    def put(self, key: str, data: bytes) -> None:
        self.container.upload_blob(key, data)

    def get(self, key: str) -> bytes:
        return self.container.download_blob(key).readall()

    def keys(self, prefix: str) -> dict[str, str]:
        return {b.name: hashlib.sha256(self.get(b.name)).hexdigest() for b in self.container.list_blobs(name_starts_with=prefix)}


def upload_tree(store, directory: Path, prefix: str) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            store.put(f"{prefix}/{path.relative_to(directory)}", path.read_bytes())


def download_tree(store, prefix: str, target: Path) -> Path:
    for key in store.keys(prefix + "/"):
        path = target / key[len(prefix) + 1 :]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.get(key))
    return target
