"""Default scratch folders (caches, staging) under the system's temporary directory: one per user.

The temporary directory is shared by every user of a node, and a folder made there belongs to its first user, with
that user's umask: a second user's job on the same node (a shared Slurm or Kubernetes node) could not write into it
and would fail with PermissionError. So each user gets folders of their own, named with their uid.
"""

from __future__ import annotations

import getpass
import os
import tempfile


def user_temp_folder(name: str) -> str:
    """``<temp dir>/<name>-<uid>``: this user's folder ``name`` under the system's temporary directory."""
    who = str(os.getuid()) if hasattr(os, "getuid") else getpass.getuser()
    return os.path.join(tempfile.gettempdir(), f"{name}-{who}")
