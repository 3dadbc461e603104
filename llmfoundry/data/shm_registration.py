"""Registering a StreamingDataset's shared memory safely on a machine that runs (or ran) other jobs.

streaming names each dataset's shared-memory blocks ``/dev/shm/<prefix>_<name>`` (``locals``, ``barrier``, ...). To
register, every rank scans the prefixes from 0, for each name separately, for the first one that is free, takes the
largest of those, and the local leader creates ``<prefix>_locals`` there. Two things break that:

* a job killed before it unlinked its blocks (a crash, SIGKILL, a preempted node) can leave a prefix with some
  names and not others; the per-name scans then disagree, the largest lands on a prefix whose ``locals`` block
  exists, and the leader fails with ``FileExistsError: '/000123_locals'`` (its other ranks with "shared memory
  registered does not match local leader"). llm-foundry's answer is streaming's ``clean_stale_shared_memory()``,
  which unlinks every block, also those of jobs still running on the machine. Here only the blocks of such
  incomplete prefixes are removed, and only those that no process of this user has mapped or open. (A complete
  stale prefix is harmless: every scan steps over it. Leaving it also spares a live job of another PID namespace
  that shares /dev/shm, whose processes /proc does not show.)
* two jobs that start together can both pick the same free prefix.

``shm_registration_lock()`` covers both: each job's local leader takes a machine-wide file lock, removes stale
blocks, and the job's ranks meet at a barrier, so no rank scans while another job registers or while stale blocks
are still there. The lock file is shared by every user of the machine (jobs of several users share /dev/shm): any
user can open it whoever created it, a lock file removed meanwhile (a cleanup of /dev/shm, systemd-logind's
RemoveIPC when its owner logs out) is replaced rather than held twice, and a leader that cannot open it (left
unreadable by another tool or an older version) registers without it, with a notice that says how to fix it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import time

try:
    import fcntl
except ImportError:  # no flock (Windows): streaming's own scan is all there is
    fcntl = None

from llmfoundry.core import dist
from llmfoundry.core.notices import notice_once
from llmfoundry.data.streaming_guard import import_streaming

streaming = import_streaming()
log = logging.getLogger("llmfoundry")

SHM_ROOT = "/dev/shm"
# /dev/shm is where the blocks live: jobs that share it share this file, whatever TMPDIR each one has
SHM_REGISTRATION_LOCK = os.path.join(SHM_ROOT if os.path.isdir(SHM_ROOT) else tempfile.gettempdir(),
                                     "llmfoundry-streaming-registration.lock")
SHM_LOCK_WAIT_S = 120.0
_BLOCK = re.compile(r"(\d{6})_(%s)" % "|".join(map(re.escape, streaming.base.constant.SHM_TO_CLEAN)))
# the blocks every registered dataset has from its constructor on (resume and the epoch blocks come and go)
_CORE = set(streaming.base.constant.SHM_TO_CLEAN) - {"resume", "epoch_shape", "epoch_data"}


def _in_use_by(uid: int) -> set[str]:
    """Names of the /dev/shm files that processes of ``uid`` have mapped or open."""
    used: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/maps") as maps:
                used.update(line.split(f"{SHM_ROOT}/", 1)[1].split()[0] for line in maps if f" {SHM_ROOT}/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(f"{SHM_ROOT}/"):
                    used.add(target[len(SHM_ROOT) + 1:].split()[0])
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return used


def remove_stale_blocks() -> list[str]:
    """Unlink the blocks of incomplete streaming prefixes (some of a registered dataset's blocks there, not all)
    that belong to this user and of which no process of this user has a block mapped or open (what killed jobs left behind;
    blocks are created 0600, so no other user's process can hold them). Returns their names. Needs Linux's /proc;
    elsewhere nothing is removed."""
    if not (os.path.isdir(SHM_ROOT) and os.path.isdir("/proc")):
        return []
    uid = os.getuid()
    by_prefix: dict[str, dict[str, str]] = {}
    for entry in os.scandir(SHM_ROOT):
        match = _BLOCK.fullmatch(entry.name)
        if not match:
            continue
        try:
            owner = entry.stat().st_uid
        except FileNotFoundError:  # a job that ended meanwhile unlinked it
            continue
        if owner == uid:
            by_prefix.setdefault(match[1], {})[match[2]] = entry.name
    incomplete = [blocks for blocks in by_prefix.values() if _CORE & blocks.keys() != _CORE]
    if not incomplete:
        return []
    used = _in_use_by(uid)  # a prefix with a block in use is someone's: all of its blocks stay
    stale = sorted(name for blocks in incomplete if not used & set(blocks.values()) for name in blocks.values())
    for name in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_ROOT, name))
    if stale:
        log.info("streaming: removed %d shared-memory blocks left by jobs that ended without cleaning up (%s)",
                 len(stale), ", ".join(stale[:3]) + (", ..." if len(stale) > 3 else ""))
    return stale


def open_shared_lock_file(path: str):
    """The machine-wide lock file, opened read-only (flock needs no more) so that every user's job can take it,
    whoever created it: created readable by all, and opened without O_CREAT when it exists (in a sticky directory
    such as /dev/shm, fs.protected_regular refuses O_CREAT on another user's file). None when it exists but this
    user may not read it (another user's file left 0600, by another tool or a version before this one)."""
    while True:
        try:
            return os.fdopen(os.open(path, os.O_RDONLY), "rb")
        except FileNotFoundError:
            pass
        except PermissionError:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:  # another job created it meanwhile
            continue
        os.fchmod(fd, 0o644)  # whatever this process's umask
        return os.fdopen(fd, "rb")


def _still_named(handle, path: str) -> bool:
    """Whether ``path`` still names the file ``handle`` has open (a lock on a removed file excludes nobody)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(handle.fileno())
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _take_lock(path: str, wait_s: float):
    """The lock file at ``path``, flocked; None (with a notice) when it cannot be opened or stays taken ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        handle = open_shared_lock_file(path)
        if handle is None:
            notice_once(f"streaming: the registration lock file {path} is another user's and not readable by this "
                        f"one (uid {os.getuid()}); registering the dataset without it. Its owner or root can fix "
                        f"that for every job: chmod 644 {path}")
            return None
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.close()
                    notice_once(f"streaming: waited {wait_s:.0f} s for another job to register its dataset "
                                f"({path}); going on without the lock")
                    return None
                time.sleep(0.05)
        if _still_named(handle, path):
            return handle
        handle.close()  # removed (and maybe created again) while this job waited: take the one there now


@contextlib.contextmanager
def shm_registration_lock(wait_s: float = SHM_LOCK_WAIT_S, lock_path: str | None = None):
    """Hold while the ranks of a job build a StreamingDataset (every rank enters; see the module docstring).

    A leader that waits longer than ``wait_s`` for the lock (e.g. two multi-node jobs sharing nodes, each holding
    one node's lock while waiting at its barrier for the other) goes on without it, as streaming alone would.
    ``lock_path``: the lock file (default ``SHM_REGISTRATION_LOCK``)."""
    if fcntl is None:
        yield
        return
    handle = None
    if streaming.base.world.World.detect().is_local_leader:
        handle = _take_lock(lock_path or SHM_REGISTRATION_LOCK, wait_s)
        if handle is not None:
            remove_stale_blocks()
    try:
        dist.barrier("streaming dataset registration")
        yield
    finally:
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
