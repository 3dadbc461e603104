"""Default scratch folders are per user: a second user's job on the same node writes its caches and staged
uploads without meeting folders the first user made (core/scratch.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from llmfoundry.core.objectstore import staging_root
from llmfoundry.data.safe_load import download_folder
from llmfoundry.data.text import cache_root
from tests.helpers import run_as_nobody


def _default_folders() -> list[Path]:
    return [staging_root("s3://bucket/run"), Path(cache_root()), Path(download_folder())]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
def test_a_second_user_gets_default_scratch_folders_of_their_own(monkeypatch):
    for name in ("LLMFOUNDRY_STAGING_DIR", "LLMFOUNDRY_CACHE"):
        monkeypatch.delenv(name, raising=False)
    shared = Path(tempfile.mkdtemp(prefix="llmfoundry-scratch-", dir="/tmp"))
    os.chmod(shared, 0o1777)  # world-writable and sticky, like /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    old = os.umask(0o077)  # the first user's folders: private
    try:
        mine = _default_folders()
        for folder in mine:
            folder.mkdir(parents=True, exist_ok=True)
    finally:
        os.umask(old)

    def write_in_own_folders():
        theirs = _default_folders()
        if set(theirs) & set(mine):
            os._exit(3)
        for folder in theirs:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "shard.mds").write_bytes(b"x")

    def refused_a_folder_made_for_it():
        from llmfoundry.core.errors import ConfigError

        try:
            cache_root()
        except ConfigError as error:
            os._exit(7 if "LLMFOUNDRY_CACHE" in str(error) and "\n" not in str(error) else 1)

    try:
        assert all(str(folder).startswith(str(shared)) for folder in mine)
        assert all(folder.stat().st_mode & 0o777 == 0o700 for folder in mine[1:])  # made private
        assert run_as_nobody(write_in_own_folders) == 0  # 3: the same folders; 13: PermissionError
        # a folder of nobody's name that another user made (open to all) would hand nobody's cache to that user
        planted = shared / f"llmfoundry-mds-cache-{65534}"
        shutil.rmtree(planted)
        planted.mkdir(mode=0o777)
        os.chmod(planted, 0o777)
        assert run_as_nobody(refused_a_folder_made_for_it) == 7
    finally:
        shutil.rmtree(shared, ignore_errors=True)
