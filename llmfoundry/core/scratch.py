"""Default scratch folders (caches, staging) under the system's temporary directory: one per user.

The temporary directory is shared by every user of a node, and a folder made there belongs to its first user, with
that user's umask: a second user's job on the same node (a shared Slurm or Kubernetes node) could not write into it
and would fail with PermissionError. So each user gets a folder of their own, named with their uid, made private
(0700). A folder of that name that another user made first, or a link, could hand this user's staged checkpoints and
cached shards to someone else: it is refused, never used.
"""

from __future__ import annotations

import getpass
import os
import stat
import tempfile

from llmfoundry.core.errors import ConfigError


def user_temp_folder(name: str, variable: str) -> str:
    """``<temp dir>/<name>-<uid>``, this user's private folder ``name`` under the system's temporary directory
    (made when missing). ``variable``: the environment variable that moves it, named in the error when the folder
    there is not this user's own."""
    if not hasattr(os, "getuid"):  # no uids (Windows): the temporary directory is the user's own already
        return os.path.join(tempfile.gettempdir(), f"{name}-{getpass.getuser()}")
    folder = os.path.join(tempfile.gettempdir(), f"{name}-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
        raise ConfigError(f"{variable}: the default folder '{folder}' is not a private folder of this user (another "
                          f"user or a link made it: owner uid {found.st_uid}, mode {stat.filemode(found.st_mode)}); "
                          f"set {variable} to a folder of your own, or remove it")
    return folder
