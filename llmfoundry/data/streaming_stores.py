"""streaming's downloads of ``gs://``, Azure and ``oci://`` shards go through our storage layer (core/objectstore.py,
core/fsspec_store.py, core/oci.py).

streaming picks a downloader by URL scheme from ``streaming.base.storage.download.DOWNLOADER_MAPPINGS``. Its own
GCS downloader asks google.auth for credentials even where ``STORAGE_EMULATOR_HOST`` is set and takes HMAC keys
through boto3 otherwise; its Azure downloaders (``azure``, ``azure-dl``) hard-code the public cloud's endpoint
(``https://<account>.blob.core.windows.net``), read the account from the URL's host and know no ``az://``,
``abfs://`` or ``abfss://``. Ours use the same client as checkpoints (gcsfs: google-auth's chain or the emulator;
adlfs: the AZURE_STORAGE_* variables, a connection string, azure-identity), so data and checkpoints on one store
need one set-up. Its OCI downloader needs the oci SDK and an API signing key in ``~/.oci/config`` and strips the
namespace from ``bucket@namespace`` only when it is the tenancy's; ours speaks OCI's S3 compatibility API with the
customer secret key that checkpoints use (core/oci.py). ``s3://`` stays with streaming's own downloader.
"""

from __future__ import annotations

import os
import types

from llmfoundry.core import objectstore

# every store of a loader's remote that is not S3, by the scheme streaming looks up (urlparse's: no "://")
ROUTED = tuple(scheme.removesuffix("://") for scheme in objectstore.ROUTED_STORES)


def route_store_downloads(streaming: types.ModuleType) -> None:
    """Make ``streaming`` download gs://, Azure and oci:// objects with our clients (idempotent)."""
    download = streaming.base.storage.download
    if all(getattr(download.DOWNLOADER_MAPPINGS.get(scheme), "ours", False) for scheme in ROUTED):
        return

    class StoreDownloader(download.CloudDownloader):
        ours = True

        def __init__(self):
            super().__init__()
            self._clients = {}  # by scheme: one downloader may be asked for several stores' objects

        @staticmethod
        def _client_identifier() -> str:
            return ROUTED[0]

        def clean_up(self) -> None:
            self._clients = {}

        def _validate_remote_path(self, remote: str) -> None:  # streaming's wants the one scheme of the class
            if remote.split("://", 1)[0] not in ROUTED:
                raise ValueError(f"Expected a URL of {', '.join(ROUTED)}, got {remote}")

        def _download_file_impl(self, remote: str, local: str, timeout: float) -> None:
            # streaming retries (download_retry) and reads a missing object as FileNotFoundError, which ours raises
            bucket, key = objectstore.split_url(remote, stores=objectstore.ROUTED_STORES)
            # one client per store (per namespace on OCI: oci://bucket@namespace picks the endpoint)
            store = "/".join(remote.split("/", 3)[:3]) if remote.startswith(objectstore.OCI) else remote.split(":")[0]
            if store not in self._clients:
                self._clients[store] = objectstore.client_for(remote)
            tmp = f"{local}.{os.getpid()}.tmp"
            try:
                self._clients[store].download_file(bucket, key, tmp)
            except Exception as error:  # noqa: BLE001 - botocore's ClientError (404) on OCI's S3 API
                if objectstore.is_missing(error) and not isinstance(error, FileNotFoundError):
                    raise FileNotFoundError(f"{remote}: not found") from error
                raise
            os.replace(tmp, local)

    for scheme in ROUTED:
        download.DOWNLOADER_MAPPINGS[scheme] = StoreDownloader
