"""``dataset.safe_load``: finetuning records only from plain data files, as llm-foundry's ``safe_load`` does.

With ``safe_load: true`` nothing that can run code while being read is loaded: a hub dataset is downloaded with
only its ``.csv``/``.json``/``.jsonl``/``.parquet`` files (no loading script, no pickle or arrow file), and a
local folder, or the files named by ``hf_kwargs.data_files``, must hold only those types (plus the ``.lock`` and
``.metadata`` files of a hub download, and ``.gitignore``). Anything else is a one-line error naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import snapshot_download

from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.core.scratch import user_temp_folder

SAFE_EXTENSIONS = (".csv", ".json", ".jsonl", ".parquet")
HUB_BOOKKEEPING_EXTENSIONS = (".lock", ".metadata")  # written by huggingface_hub next to downloaded files


def _is_safe_file(name: str) -> bool:
    return name == ".gitignore" or Path(name).suffix in SAFE_EXTENSIONS + HUB_BOOKKEEPING_EXTENSIONS


def _refused(what: str, key: str) -> ConfigError:
    return ConfigError(f"{key}.safe_load: refusing '{what}' (safe_load reads only {', '.join(SAFE_EXTENSIONS)} "
                       "files); convert the data to one of those types or set safe_load: false if you trust it")


def check_files(files: list[str], key: str) -> None:
    """Refuse any of ``files`` (local paths or s3:// URLs) that is not a plain data file type."""
    for file in files:
        if not _is_safe_file(os.path.basename(file.rstrip("/"))):
            raise _refused(file, key)


def check_folder(folder: str, key: str) -> None:
    """Refuse ``folder`` when any file under it is not a plain data file type."""
    for root, _, names in os.walk(folder):
        for name in sorted(names):
            if not _is_safe_file(name):
                raise _refused(os.path.join(root, name), key)


def download_folder() -> str:
    """Where hub datasets are downloaded for safe loading (``LLMFOUNDRY_CACHE``, default: this user's temp
    folder)."""
    root = os.environ.get("LLMFOUNDRY_CACHE")
    return os.path.join(root, "llmfoundry-safe-datasets") if root else user_temp_folder("llmfoundry-safe-datasets", "LLMFOUNDRY_CACHE")


def safe_dataset_folder(hf_name: str, hf_kwargs: dict, key: str) -> str:
    """A local folder holding only the plain data files of ``hf_name`` (a local folder, or a hub id downloaded
    with only those file types); checked file by file."""
    if objectstore.is_remote(hf_name):
        raise ConfigError(f"{key}.hf_name: safe_load reads an object-store folder's {{split}}.jsonl only; "
                          f"'{hf_name}' is handled that way without safe_load")
    if os.path.isdir(hf_name):
        folder = os.path.abspath(hf_name)
    else:
        folder = os.path.join(download_folder(), hf_name.replace("/", "--"))
        if not os.path.isdir(folder) or not os.listdir(folder):
            try:
                snapshot_download(hf_name, repo_type="dataset", allow_patterns=[f"*{ext}" for ext in SAFE_EXTENSIONS],
                                  token=hf_kwargs.get("token"), revision=hf_kwargs.get("revision"), local_dir=folder)
            except Exception as error:  # noqa: BLE001 - offline, unknown repo, no access: all one line
                raise ConfigError(f"{key}.hf_name: cannot download hub dataset '{hf_name}' for safe_load "
                                  f"({type(error).__name__}: {first_line(error)[:160]}); download it where there is "
                                  "network and point hf_name at the folder") from None
        if not os.path.isdir(folder) or not any(files for _, _, files in os.walk(folder)):
            raise ConfigError(f"{key}.hf_name: hub dataset '{hf_name}' has no {', '.join(SAFE_EXTENSIONS)} files, "
                              "so safe_load cannot read it")
    check_folder(folder, key)
    return folder
