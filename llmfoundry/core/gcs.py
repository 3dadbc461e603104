"""``gs://`` through gcsfs (fsspec): the Google Cloud Storage part of core/fsspec_store.py's adapter.

Credentials are google-auth's usual chain (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's login, the metadata
server). ``STORAGE_EMULATOR_HOST`` points every client at an emulator (the tests' gcp-storage-emulator), and then
no credentials are used.
"""

from __future__ import annotations

import os

from llmfoundry.core.fsspec_store import FsspecClient, Store

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def emulator() -> str | None:
    return os.environ.get(EMULATOR_ENV) or None


def _filesystem():
    # gcsfs's bucket-type probe (gRPC, for zonal/hierarchical buckets) waits 60 s where it is not answered (an
    # emulator, a firewall); plain buckets do not need it. Read when gcsfs is first imported.
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    import gcsfs  # optional (the gcs extra): only gs:// URLs need it

    # fsspec keeps one instance per process and arguments (credentials are found once; a forked rank makes its
    # own). No listing cache: "latest" and completion markers are read again and again and must be current.
    # consistency="md5": an upload is checked against the store's checksum of what it received.
    return gcsfs.GCSFileSystem(token="anon" if emulator() else None, endpoint_url=emulator(),
                               use_listings_cache=False, consistency="md5")


def _status(error: BaseException) -> tuple[int, str | None] | None:
    code = getattr(error, "code", None)  # gcsfs's HttpError
    if code is None and isinstance(error, OSError) and str(error).startswith("Forbidden"):
        code = 403  # gcsfs raises a 403 as a plain OSError("Forbidden: ...")
    return (code, None) if isinstance(code, int) else None


GCS = Store("gs", _filesystem, _status)


class GCSClient(FsspecClient):
    """The S3 client calls objectstore makes, for ``gs://`` buckets."""

    def __init__(self):
        super().__init__(GCS)
