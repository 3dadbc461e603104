"""Azure Blob Storage (``azure://``, ``az://``, ``abfs://``, ``abfss://``, ``azure-dl://``) through adlfs (fsspec):
the Azure part of core/fsspec_store.py's adapter.

In every one of these URLs the first component is the container: ``azure://container/path``. The account and its
credentials come from the environment, as adlfs reads them: ``AZURE_STORAGE_CONNECTION_STRING`` (its
``BlobEndpoint`` points at an emulator such as Azurite), or ``AZURE_STORAGE_ACCOUNT_NAME`` with
``AZURE_STORAGE_ACCOUNT_KEY``, ``AZURE_STORAGE_SAS_TOKEN``, a service principal (``AZURE_STORAGE_CLIENT_ID`` /
``_SECRET`` / ``TENANT_ID``) or azure-identity's default chain (``az login``, a managed identity, workload
identity). None of these values ever appears in a message.
"""

from __future__ import annotations

import os
import re

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.fsspec_store import FsspecClient, Store

SCHEMES = ("azure://", "az://", "abfs://", "abfss://", "azure-dl://")
# What adlfs reads from the environment (passed explicitly so that fsspec's per-process instance cache keys on them:
# a changed variable gives a new client).
_ENV = {"connection_string": "AZURE_STORAGE_CONNECTION_STRING", "account_name": "AZURE_STORAGE_ACCOUNT_NAME",
        "account_key": "AZURE_STORAGE_ACCOUNT_KEY", "sas_token": "AZURE_STORAGE_SAS_TOKEN",
        "client_id": "AZURE_STORAGE_CLIENT_ID", "client_secret": "AZURE_STORAGE_CLIENT_SECRET",
        "tenant_id": "AZURE_STORAGE_TENANT_ID"}
_CONTAINER = re.compile(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]")  # Azure's rule for container names
CREDENTIALS = ("AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY, "
               "AZURE_STORAGE_SAS_TOKEN or an azure-identity login (az login, a managed identity)")


def check_container(url: str, key: str) -> None:
    """A one-line ConfigError unless ``url``'s first component is a container name: the account-in-URL forms
    (``abfss://container@account.dfs.core.windows.net/path``, ``azure://account.blob.core.windows.net/...``) are
    refused with how to write them."""
    scheme, rest = url.split("://", 1)
    first, _, path = rest.partition("/")
    container, at, host = first.partition("@")
    account = (host if at else first if "." in first else "").split(".")[0]
    if account:
        inside = f"{container}/{path}" if at else path
        raise ConfigError(f"{key}: '{url}': the account goes in the environment, not the URL; write "
                          f"{scheme}://{inside.rstrip('/')} and set AZURE_STORAGE_ACCOUNT_NAME={account} (or "
                          "AZURE_STORAGE_CONNECTION_STRING)")
    if not _CONTAINER.fullmatch(container):
        raise ConfigError(f"{key}: '{url}': '{container}' is not an Azure container name (3-63 lowercase letters, "
                          f"digits and single hyphens; write {scheme}://container/path)")


def _settings() -> dict[str, str | None]:
    return {name: os.environ.get(variable) or None for name, variable in _ENV.items()}


def endpoint() -> str:
    """Where requests go, for messages: the connection string's BlobEndpoint (an emulator), else the account's
    public endpoint. Never a credential."""
    settings = _settings()
    fields = dict(part.split("=", 1) for part in (settings["connection_string"] or "").split(";") if "=" in part)
    if fields.get("BlobEndpoint"):
        return fields["BlobEndpoint"]
    account = fields.get("AccountName") or settings["account_name"]
    return f"https://{account}.blob.core.windows.net" if account else "Azure Blob Storage (no account set)"


def setting() -> str:
    """The variable that says where the store is."""
    return "AZURE_STORAGE_CONNECTION_STRING" if _settings()["connection_string"] else "AZURE_STORAGE_ACCOUNT_NAME"


class NoAccount(Exception):
    """Neither a connection string nor an account name is set (objectstore.client_for says it under the key)."""


def _filesystem():
    settings = _settings()
    if not settings["connection_string"] and not settings["account_name"]:
        raise NoAccount(f"no Azure storage account is set; set {CREDENTIALS}")
    import adlfs  # optional (the azure extra): only Azure URLs need it

    # One instance per process and settings (fsspec's cache; a forked rank makes its own). No listing cache:
    # "latest" and completion markers are read again and again and must be current.
    # anon=False: older adlfs (2024.4) defaults to anonymous access when no key is given, which would turn an
    # azure-identity login (az login, a managed identity) into "container not found" / "access refused"
    fs = adlfs.AzureBlobFileSystem(**settings, anon=False, use_listings_cache=False)
    _ask_again_sooner(fs.service_client)
    return fs


# azure-storage's default policy waits 15 s, then 18 s, then 24 s (plus up to 3 s of jitter) before asking again:
# a minute per request in a storm of 503s, past the deadline of our own retries (objectstore.ObjectFolder's reads,
# the uploader's), which then give up on a store that had recovered. Ask again within seconds (0.2 s, 1.7 s,
# 2.45 s: initial + base ** n), as botocore does, and leave longer waits to those deadlines.
AZURE_RETRY = {"initial_backoff": 0.2, "increment_base": 1.5, "random_jitter_range": 0.2}


def _ask_again_sooner(service_client) -> None:
    """Shorten the waits of ``service_client``'s retry policy in place. adlfs builds the client without a way to
    pass a policy; the container and blob clients made from it share this policy object."""
    policy = getattr(getattr(service_client, "_config", None), "retry_policy", None)
    if policy is None or not all(hasattr(policy, name) for name in AZURE_RETRY):
        return  # another azure-storage layout: keep its own policy (slower, still retrying)
    for name, value in AZURE_RETRY.items():
        setattr(policy, name, value)


def _status(error: BaseException) -> tuple[int, str | None] | None:
    status = getattr(error, "status_code", None)  # azure-core's HttpResponseError
    if not isinstance(status, int):
        return None
    code = str(getattr(error, "error_code", "") or "")
    if code.endswith("ContainerNotFound") or code.endswith("CONTAINER_NOT_FOUND"):
        return status, "NoSuchBucket"
    return status, None


# validate_content: every upload request carries the MD5 of its bytes, which the store checks
AZURE = Store("azure", _filesystem, _status, upload_options=(("validate_content", True),))


class AzureClient(FsspecClient):
    """The S3 client calls objectstore makes, for Azure containers."""

    def __init__(self):
        super().__init__(AZURE)
