"""streaming's downloads of ``gs://`` shards go through our storage layer (core/objectstore.py, core/gcs.py).

streaming picks a downloader by URL scheme from ``streaming.base.storage.download.DOWNLOADER_MAPPINGS``. Its own
GCS downloader asks google.auth for credentials even where ``STORAGE_EMULATOR_HOST`` is set and takes HMAC keys
through boto3 otherwise; ours uses the same client as gs:// checkpoints (gcsfs: google-auth's chain, or the
emulator), so data and checkpoints on GCS need one set-up. ``s3://`` stays with streaming's own downloader.
"""

from __future__ import annotations

import os
import types

from llmfoundry.core import objectstore


def route_gcs_downloads(streaming: types.ModuleType) -> None:
    """Make ``streaming`` download gs:// objects with our client (idempotent)."""
    download = streaming.base.storage.download
    if getattr(download.DOWNLOADER_MAPPINGS.get("gs"), "ours", False):
        return

    class GCSDownloader(download.CloudDownloader):
        ours = True

        def __init__(self):
            super().__init__()
            self._client = None

        @staticmethod
        def _client_identifier() -> str:
            return "gs"

        def clean_up(self) -> None:
            self._client = None

        def _download_file_impl(self, remote: str, local: str, timeout: float) -> None:
            # streaming retries (download_retry) and reads a missing object as FileNotFoundError, which ours raises
            bucket, key = objectstore.split_url(remote, stores=(objectstore.GS,))
            if self._client is None:
                self._client = objectstore.client_for(remote)
            tmp = f"{local}.{os.getpid()}.tmp"
            self._client.download_file(bucket, key, tmp)
            os.replace(tmp, local)

    download.DOWNLOADER_MAPPINGS["gs"] = GCSDownloader
