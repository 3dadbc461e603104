"""``oci://`` (Oracle Cloud Infrastructure Object Storage) through OCI's S3 compatibility API: where the requests go
and with which key. core/objectstore.py makes the client (boto3's S3 client, as for ``s3://``).

The URL is ``oci://bucket/path``, as llm-foundry and Composer write it (Composer's OCIObjectStore takes the
namespace from the tenancy); ``oci://bucket@namespace/path``, as streaming writes it, names the namespace too.

The endpoint is ``OCI_S3_ENDPOINT_URL``, or is built from the namespace (the URL's, else ``OCI_NAMESPACE``) and the
region (``OCI_REGION``, else ``region`` in the OCI config file's profile): ``https://<namespace>.compat.
objectstorage.<region>.oraclecloud.com``. The S3 API takes a customer secret key (an access key id and a secret),
not the API signing key of ``~/.oci/config``: ``OCI_S3_ACCESS_KEY_ID`` / ``OCI_S3_SECRET_ACCESS_KEY``, else
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``. Every missing piece is a one-line error naming the variable.
"""

from __future__ import annotations

import base64
import configparser
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from llmfoundry.core.errors import ConfigError

SCHEME = "oci://"
ENDPOINT_ENV = "OCI_S3_ENDPOINT_URL"
NAMESPACE_ENV = "OCI_NAMESPACE"
REGION_ENV = "OCI_REGION"
KEY_ENV = ("OCI_S3_ACCESS_KEY_ID", "OCI_S3_SECRET_ACCESS_KEY")
AWS_KEY_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
CREDENTIALS = ("OCI_S3_ACCESS_KEY_ID / OCI_S3_SECRET_ACCESS_KEY (a customer secret key; or AWS_ACCESS_KEY_ID / "
               "AWS_SECRET_ACCESS_KEY)")
SETTING = f"{ENDPOINT_ENV} (or {NAMESPACE_ENV} and {REGION_ENV})"
_BUCKET = re.compile(r"[A-Za-z0-9._-]{1,256}")  # OCI's rule for bucket names
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")
# https://<namespace>.compat.objectstorage.<region>.oraclecloud.com (and the sovereign realms' domains)
_COMPAT_HOST = re.compile(r"^https?://(?P<namespace>[^./]+)\.compat\.objectstorage\.(?P<region>[^./]+)\.",
                          re.IGNORECASE)


def split(url: str) -> tuple[str, str | None, str]:
    """``oci://bucket@namespace/a/b`` -> (``bucket``, ``namespace`` or None, ``a/b``)."""
    first, _, path = url[len(SCHEME):].partition("/")
    bucket, at, namespace = first.partition("@")
    return bucket, (namespace if at else None), path.strip("/")


def check(url: str, key: str) -> None:
    """A one-line ConfigError unless ``url`` is ``oci://bucket/path`` or ``oci://bucket@namespace/path``."""
    bucket, namespace, _ = split(url)
    if not _BUCKET.fullmatch(bucket):
        raise ConfigError(f"{key}: '{url}': '{bucket}' is not an OCI bucket name (letters, digits, '-', '_' and '.'; "
                          "write oci://bucket/path or oci://bucket@namespace/path)")
    if namespace is not None and not _NAMESPACE.fullmatch(namespace):
        raise ConfigError(f"{key}: '{url}': '{namespace}' is not an Object Storage namespace (write "
                          "oci://bucket@namespace/path with the namespace `oci os ns get` prints, or "
                          f"oci://bucket/path with {NAMESPACE_ENV} set)")


class NotConfigured(Exception):
    """A piece of the set-up is missing (objectstore.client_for says it under the key)."""


@dataclass(frozen=True)
class Settings:
    endpoint: str
    region: str  # the region requests are signed for (OCI checks it)
    access_key_id: str
    secret_access_key: str

    def credentials(self) -> dict[str, str | None]:
        """boto3's client arguments: this key and region only (no AWS session token, profile or region leaks in)."""
        return {"region_name": self.region, "aws_access_key_id": self.access_key_id,
                "aws_secret_access_key": self.secret_access_key, "aws_session_token": None}


def config_file() -> Path:
    """The OCI config file: ``OCI_CONFIG_FILE`` (Composer reads it), ``OCI_CLI_CONFIG_FILE`` (the oci CLI's), else
    ``~/.oci/config``."""
    named = os.environ.get("OCI_CONFIG_FILE") or os.environ.get("OCI_CLI_CONFIG_FILE")
    return Path(named).expanduser() if named else Path.home() / ".oci" / "config"


def config_region() -> str | None:
    """``region`` of the OCI config file's profile (``OCI_CLI_PROFILE``, else DEFAULT), or None."""
    path = config_file()
    if not path.is_file():
        return None
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except configparser.Error:
        return None
    profile = os.environ.get("OCI_CLI_PROFILE") or "DEFAULT"
    section = parser.defaults() if profile == "DEFAULT" else (parser[profile] if parser.has_section(profile) else {})
    return (section.get("region") or "").strip() or None


def endpoint(url: str | None = None) -> str:
    """The S3-compatibility endpoint for ``url`` (its namespace, if it names one, else the environment's)."""
    explicit = os.environ.get(ENDPOINT_ENV, "").strip()
    namespace = (split(url)[1] if url else None) or os.environ.get(NAMESPACE_ENV, "").strip() or None
    if explicit:
        found = _COMPAT_HOST.match(explicit)
        if found and namespace and found["namespace"].lower() != namespace.lower():
            raise NotConfigured(f"the URL's namespace '{namespace}' is not that of {ENDPOINT_ENV} "
                                f"('{found['namespace']}'); write oci://bucket/path or set {ENDPOINT_ENV} for it")
        return explicit.rstrip("/")
    region = region_of()
    if not namespace and not region:
        raise NotConfigured(f"OCI Object Storage is reached through its S3 compatibility API: set {ENDPOINT_ENV}="
                            "https://<namespace>.compat.objectstorage.<region>.oraclecloud.com, or "
                            f"{NAMESPACE_ENV} and {REGION_ENV}")
    if not namespace:
        raise NotConfigured(f"no Object Storage namespace: set {NAMESPACE_ENV} (`oci os ns get` prints it), write "
                            f"oci://bucket@namespace/path, or set {ENDPOINT_ENV}")
    if not region:
        raise NotConfigured(f"no OCI region: set {REGION_ENV} (e.g. us-ashburn-1), region= in {config_file()}, or "
                            f"{ENDPOINT_ENV}")
    return f"https://{namespace.lower()}.compat.objectstorage.{region}.oraclecloud.com"


def region_of(explicit_endpoint: str | None = None) -> str | None:
    """The region: the one an OCI endpoint's host names, else ``OCI_REGION``, else the config file's."""
    found = _COMPAT_HOST.match(explicit_endpoint or "")
    return (found["region"] if found else None) or os.environ.get(REGION_ENV, "").strip() or config_region()


def settings(url: str | None = None) -> Settings:
    """Where ``url``'s requests go, signed for which region, with which key; NotConfigured names what is missing."""
    where = endpoint(url)
    for names in (KEY_ENV, AWS_KEY_ENV):
        key_id, secret = (os.environ.get(name, "").strip() for name in names)
        if key_id and secret:
            break
        if key_id or secret:
            missing = names[1] if key_id else names[0]
            raise NotConfigured(f"{missing} is not set (the other half of the customer secret key is)")
    else:
        raise NotConfigured(f"no customer secret key for OCI's S3 compatibility API: set {CREDENTIALS}; the API "
                            f"signing key of {config_file()} is not used")
    # a region only signs the requests; an endpoint of another kind (a stand-in) takes any
    return Settings(where, region_of(where) or "us-east-1", key_id, secret)


_CRC_HEADERS = ("x-amz-checksum-", "x-amz-sdk-checksum-algorithm")


def md5_instead_of_crc(request, **_) -> None:
    """Where an operation requires a checksum (DeleteObjects), botocore >= 1.36 sends a CRC32 header even with
    ``when_required``; OCI's S3 API takes none of them. Such a request carries Content-MD5 instead (what S3 asked
    for before CRCs, and what S3-compatible stores check), computed before the request is signed."""
    names = [name for name in request.headers if name.lower().startswith(_CRC_HEADERS)]
    body = request.body
    if not names or not isinstance(body, (bytes, bytearray)):
        return
    for name in names:
        del request.headers[name]
    request.headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()


def configured(url: str, key: str) -> Settings:
    """``settings(url)``, or a one-line ConfigError under ``key`` naming what is missing."""
    try:
        return settings(url)
    except NotConfigured as error:
        raise ConfigError(f"{key}: '{url}': {error}") from None


def described(url: str) -> tuple[str, str, str, str]:
    """(bucket, endpoint, the setting that says where, the credential variables) for messages about ``url``."""
    try:
        where = endpoint(url)
    except NotConfigured:
        where = "OCI Object Storage"
    return split(url)[0], where, SETTING, CREDENTIALS
