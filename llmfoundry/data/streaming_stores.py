"""streaming's downloads of ``gs://``, Azure and ``oci://`` shards, and its MDSWriter's uploads to them (the
converters' output), go through our storage layer (core/objectstore.py, core/fsspec_store.py, core/oci.py).

streaming picks a downloader by URL scheme from ``streaming.base.storage.download.DOWNLOADER_MAPPINGS``. Its own
GCS downloader asks google.auth for credentials even where ``STORAGE_EMULATOR_HOST`` is set and takes HMAC keys
through boto3 otherwise; its Azure downloaders (``azure``, ``azure-dl``) hard-code the public cloud's endpoint
(``https://<account>.blob.core.windows.net``), read the account from the URL's host and know no ``az://``,
``abfs://`` or ``abfss://``. Ours use the same client as checkpoints (gcsfs: google-auth's chain or the emulator;
adlfs: the AZURE_STORAGE_* variables, a connection string, azure-identity), so data and checkpoints on one store
need one set-up. Its OCI downloader needs the oci SDK and an API signing key in ``~/.oci/config`` and strips the
namespace from ``bucket@namespace`` only when it is the tenancy's; ours speaks OCI's S3 compatibility API with the
customer secret key that checkpoints use (core/oci.py). Its ``hf`` downloader knows dataset repos only
(``hf://datasets/ORG/NAME/path``), takes no revision (``@v1``), says a missing file with an error streaming asks
again about, and leaves huggingface_hub's ``.cache/`` folder in the loader's ``local``; ours reads every Hub URL
with the client of load_path (core/hf_store.py, read-only: hf:// has no uploader). Its uploaders
(``streaming.base.storage.upload.UPLOADERS``, class names by scheme) have the same limits and know no ``az://``,
``abfs://`` or ``abfss://``; ours upload each shard with the client above. ``s3://`` stays with streaming's own
downloader and uploader.
"""

from __future__ import annotations

import os
import types

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError

# every store of a loader's remote that is not S3, by the scheme streaming looks up (urlparse's: no "://")
ROUTED = tuple(scheme.removesuffix("://") for scheme in objectstore.ROUTED_STORES)


def route_store_downloads(streaming: types.ModuleType) -> None:
    """Make ``streaming`` download gs://, Azure, oci:// and hf:// objects with our clients (idempotent)."""
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


UPLOADER = "LLMFoundryStoreUploader"  # the name streaming's upload module looks up for our schemes (UPLOADERS)
WRITTEN_STORES = (objectstore.GS, *objectstore.AZURE, objectstore.OCI)  # the stores whose uploads are ours
WRITTEN = tuple(scheme.removesuffix("://") for scheme in WRITTEN_STORES)


def route_store_uploads(streaming: types.ModuleType) -> None:
    """Make ``streaming``'s writers (MDSWriter) upload to gs://, Azure and oci:// with our clients (idempotent)."""
    upload = streaming.base.storage.upload
    if hasattr(upload, UPLOADER) and all(upload.UPLOADERS.get(scheme) == UPLOADER for scheme in WRITTEN):
        return

    class StoreUploader(upload.CloudUploader):
        """One writer's uploads: each finished shard file (then index.json) from its local folder to the remote."""

        def __init__(self, out, keep_local: bool = False, progress_bar: bool = False, retry: int = 2,
                     exist_ok: bool = False):
            super().__init__(out, keep_local, progress_bar, retry, exist_ok)
            key = "MDS output"  # the converters check their own flag first (prep/common.check_output)
            self.folder = objectstore.ObjectFolder(self.remote, key, max_attempts=objectstore.UPLOAD_REQUEST_RETRIES,
                                                   stores=WRITTEN_STORES)
            try:  # as streaming's S3 uploader checks its bucket: no shard is written for nowhere
                self.folder.probe()
            except ConfigError:
                raise
            except Exception as error:  # noqa: BLE001 - botocore's, gcsfs' and adlfs' errors
                raise objectstore.explain(error, self.remote, key) from None

        def upload_file(self, filename: str) -> None:
            local = os.path.join(self.local, filename)

            # streaming's retry of a whole file (``retry`` attempts), as its S3 uploader does; the clients ask
            # again for each request first (botocore's retries, gcsfs' and Azure's own)
            @upload.retry(num_attempts=self.retry)
            def send() -> None:
                self.folder.client.upload_file(local, self.folder.bucket, self.folder.key(filename))

            send()
            self.clear_local(local)

        def list_objects(self, prefix: str | None = None) -> list[str]:
            """Keys (bucket-relative, as streaming's S3 uploader gives them) under the remote folder + ``prefix``."""
            start = self.folder.key(prefix or "")
            return [key for key in self.folder.list_keys() if key.startswith(start)]

    StoreUploader.__name__ = StoreUploader.__qualname__ = UPLOADER
    setattr(upload, UPLOADER, StoreUploader)
    for scheme in WRITTEN:
        upload.UPLOADERS[scheme] = UPLOADER
