"""Registering streaming's shared memory: stale blocks of killed jobs and jobs starting together
(llmfoundry.data.shm_registration)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from llmfoundry.core import notices
from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
from llmfoundry.data.shm_registration import (SHM_REGISTRATION_LOCK, open_shared_lock_file, remove_stale_blocks,
                                              shm_registration_lock)
from llmfoundry.data.streaming_guard import import_streaming
from llmfoundry.data.text import build_text_dataloader
from tests.helpers import run_as_nobody

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="POSIX shared memory in /dev/shm (Linux)")
NAMES = import_streaming().base.constant.SHM_TO_CLEAN
CORE = [n for n in NAMES if n not in ("resume", "epoch_shape", "epoch_data")]
SHM = Path("/dev/shm")


def loader(local, tokenizer):
    settings = TextLoaderSettings(dataset=TextDatasetSettings(local=str(local), max_seq_len=32), drop_last=True)
    return build_text_dataloader(settings, tokenizer, 4)


def block(prefix: int, name: str) -> Path:
    path = SHM / f"{prefix:06d}_{name}"
    path.write_bytes(b"\0" * 64)  # a file in /dev/shm is a POSIX shared-memory block
    return path


@pytest.fixture
def blocks():
    """Blocks a test lays out, removed afterwards whatever happened."""
    made: list[Path] = []
    yield lambda prefix, names: made.extend(block(prefix, n) for n in names)
    for path in made:
        path.unlink(missing_ok=True)


def streaming_choice() -> int:
    """The prefix streaming's registration would pick now: for each block name the first free prefix, the largest."""
    scan = import_streaming().base.shared.prefix._check_and_find
    return max(scan([], [None], name) for name in NAMES)


_HOLD_OPEN = """
import sys, time
handle = open(sys.argv[1], "rb")
print("open", flush=True)
time.sleep(60)
"""


def test_only_unused_blocks_of_incomplete_prefixes_are_removed(blocks):
    base = 990000 + os.getpid() % 9000  # far above the prefixes jobs use
    blocks(base, ["locals", "barrier"])  # a job killed while registering: stale
    blocks(base + 1, ["locals", "barrier"])  # incomplete too, but a live process holds it open
    blocks(base + 2, CORE)  # complete: every scan steps over it, and it may be a job /proc does not show
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_OPEN, str(SHM / f"{base + 1:06d}_locals")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        removed = remove_stale_blocks()
    finally:
        holder.kill()
        holder.wait()
    assert {f"{base:06d}_locals", f"{base:06d}_barrier"} <= set(removed)
    assert not (SHM / f"{base:06d}_locals").exists()
    assert (SHM / f"{base + 1:06d}_locals").exists() and (SHM / f"{base + 1:06d}_barrier").exists()
    assert all((SHM / f"{base + 2:06d}_{n}").exists() for n in CORE)


def test_a_loader_builds_where_a_killed_job_left_blocks_that_break_streaming(blocks, mds_folder, tokenizer):
    """streaming scans each block name for its first free prefix and takes the largest: with one prefix holding
    every block but locals, and the next only locals, it picks the next one and fails to create its locals
    (FileExistsError), as after a job killed between creating its blocks."""
    laid: list[int] = []
    for _ in range(200):  # lay it out above whatever this machine's /dev/shm holds already (one prefix a round)
        chosen = streaming_choice()
        if (SHM / f"{chosen:06d}_locals").exists():
            break
        blocks(chosen, [n for n in NAMES if n != "locals" and not (SHM / f"{chosen:06d}_{n}").exists()])
        if not (SHM / f"{chosen + 1:06d}_locals").exists():
            blocks(chosen + 1, ["locals"])
        laid += [chosen, chosen + 1]
    assert (SHM / f"{chosen:06d}_locals").exists()  # streaming alone would now fail to register
    built = loader(mds_folder, tokenizer)
    assert next(iter(built))["input_ids"].shape == (4, 32)
    for prefix in laid:  # the stale blocks are gone (a prefix may now hold the new dataset's own, complete set)
        present = {n for n in CORE if (SHM / f"{prefix:06d}_{n}").exists()}
        assert present in (set(), set(CORE)), (prefix, present)


_HOLD_LOCK = """
import fcntl, sys, time
handle = open(sys.argv[1], "a")
fcntl.flock(handle, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
print("released", time.monotonic(), flush=True)  # the machine-wide clock: comparable with the test's
fcntl.flock(handle, fcntl.LOCK_UN)
"""


def test_building_a_dataset_waits_while_another_job_registers_its_shared_memory(mds_folder, tokenizer):
    """streaming picks its /dev/shm prefix by scanning and then creating, so two jobs starting together on one
    machine could pick the same one (FileExistsError '/000123_locals'): a local leader registers under a
    machine-wide lock, and while another process holds it, building a loader waits for it."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, SHM_REGISTRATION_LOCK, "3"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        batch = next(iter(loader(mds_folder, tokenizer)))
        built_at = time.monotonic()
        word, released_at = holder.stdout.readline().split()
        assert word == "released" and built_at >= float(released_at), \
            "the loader was built while another process held the registration lock"
        assert batch["input_ids"].shape == (4, 32)
    finally:
        holder.kill()
        holder.wait()


def test_a_registration_lock_held_too_long_is_passed_with_a_notice(caplog):
    """Two multi-node jobs sharing nodes could each hold one node's lock while waiting at their barrier for the
    other: a leader stops waiting after wait_s and goes on as streaming alone would."""
    notices._seen.clear()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, SHM_REGISTRATION_LOCK, "30"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with caplog.at_level(logging.WARNING, logger="llmfoundry"):
            with shm_registration_lock(wait_s=0.5):
                assert holder.poll() is None  # entered while the other process still holds the lock
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("streaming: waited 0 s")]
        assert len(said) == 1 and SHM_REGISTRATION_LOCK in said[0]
    finally:
        holder.kill()
        holder.wait()


_CHURN = """
import contextlib, os, sys, time
names = [f"/dev/shm/{prefix:06d}_barrier" for prefix in range(int(sys.argv[1]), int(sys.argv[1]) + 300)]
print("churning", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    for name in names:
        open(name, "wb").close()
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
"""


def test_blocks_unlinked_while_stale_blocks_are_looked_for_are_passed_over():
    """Another job that ends unlinks its blocks while this job's leader lists /dev/shm: a name listed a moment ago
    may be gone when its owner is read (that read used to raise FileNotFoundError out of the dataset's build)."""
    base = 970000 + os.getpid() % 9000 // 300 * 300
    churn = subprocess.Popen([sys.executable, "-c", _CHURN, str(base), "1.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert churn.stdout.readline().strip() == "churning"
        rounds = 0
        while churn.poll() is None:
            remove_stale_blocks()
            rounds += 1
        assert churn.returncode == 0 and rounds > 0
    finally:
        churn.kill()
        churn.wait()
        for prefix in range(base, base + 300):
            (SHM / f"{prefix:06d}_barrier").unlink(missing_ok=True)


_HOLD_UNTIL_TOLD = """
import fcntl, sys, time
handle = open(sys.argv[1], "a")
fcntl.flock(handle, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
print("released", time.monotonic(), flush=True)
fcntl.flock(handle, fcntl.LOCK_UN)
"""


def test_a_lock_file_removed_while_a_job_waits_is_not_held_twice(tmp_path):
    """A job waiting for the lock has the file open when it is removed (a cleanup of /dev/shm, systemd-logind's
    RemoveIPC when its owner logs out) and another job creates and takes a new one: once the first holder lets go,
    the waiting job must take the new file's lock, not the removed file's, which would exclude nobody."""
    import threading

    lock = str(tmp_path / "registration.lock")
    first = subprocess.Popen([sys.executable, "-c", _HOLD_UNTIL_TOLD, lock], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    second = None
    entered: list[float] = []

    def register():
        with shm_registration_lock(wait_s=60, lock_path=lock):
            entered.append(time.monotonic())

    waiting = threading.Thread(target=register)
    try:
        assert first.stdout.readline().strip() == "held"
        waiting.start()
        deadline = time.monotonic() + 30
        while not any(os.readlink(f"/proc/self/fd/{fd}") == lock for fd in os.listdir("/proc/self/fd")
                      if os.path.islink(f"/proc/self/fd/{fd}")):
            assert time.monotonic() < deadline, "the waiting job never opened the lock file"
            time.sleep(0.01)
        os.unlink(lock)
        second = subprocess.Popen([sys.executable, "-c", _HOLD_UNTIL_TOLD, lock], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert second.stdout.readline().strip() == "held"
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.stdout.readline().startswith("released")
        time.sleep(0.5)
        assert not entered, "the waiting job took the lock of a removed file while another job held the new one"
        second.stdin.write("\n")
        second.stdin.flush()
        word, released_at = second.stdout.readline().split()
        waiting.join(30)
        assert word == "released" and entered and entered[0] >= float(released_at)
    finally:
        for holder in (first, second):
            if holder is not None:
                holder.kill()
                holder.wait()
        waiting.join(60)


def _sticky_folder() -> Path:
    """A world-writable sticky folder like /dev/shm (pytest's own folders are root's only)."""
    shared = Path(tempfile.mkdtemp(prefix="llmfoundry-shm-", dir="/tmp"))
    os.chmod(shared, 0o1777)
    return shared


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
def test_a_second_user_takes_the_lock_file_another_user_created():
    """A sticky, world-writable folder like /dev/shm: root's job creates the lock file (with a umask of 077), then a
    job of another user (nobody) opens and flocks the same file."""
    shared = _sticky_folder()
    lock = str(shared / "registration.lock")
    previous = os.umask(0o077)
    try:
        open_shared_lock_file(lock).close()
    finally:
        os.umask(previous)

    def take_lock():
        import fcntl

        fcntl.flock(open_shared_lock_file(lock), fcntl.LOCK_EX | fcntl.LOCK_NB)

    try:
        assert run_as_nobody(lambda: open(lock, "a")) == 13  # what the lock file used to be opened with
        assert run_as_nobody(take_lock) == 0
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
def test_a_second_user_registers_where_the_lock_file_was_left_unreadable():
    """The lock file persists in /dev/shm until the machine restarts: one left 0600 by another user (a version
    before open_shared_lock_file, run under umask 077) must not fail every later job of other users with a
    PermissionError. Their leaders register without the lock and say how to fix the file."""
    shared = _sticky_folder()
    lock = shared / "registration.lock"
    lock.touch(mode=0o600)
    os.chmod(lock, 0o600)

    def register():
        notices._seen.clear()
        with shm_registration_lock(wait_s=5, lock_path=str(lock)):
            pass
        if not any(str(lock) in said and f"chmod 644 {lock}" in said for said in notices._seen):
            os._exit(2)

    try:
        assert run_as_nobody(register) == 0
    finally:
        shutil.rmtree(shared, ignore_errors=True)
