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
from llmfoundry.data.shm_registration import SHM_REGISTRATION_LOCK, remove_stale_blocks, shm_registration_lock
from llmfoundry.data.streaming_guard import import_streaming
from llmfoundry.data.text import build_text_dataloader

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


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
def test_a_second_user_takes_the_lock_file_another_user_created():
    """A sticky, world-writable folder like /dev/shm: root's job creates the lock file (with a umask of 077), then a
    job of another user (nobody) opens and flocks the same file."""
    shared = Path(tempfile.mkdtemp(prefix="llmfoundry-shm-", dir="/tmp"))  # pytest's own folders are root's only
    os.chmod(shared, 0o1777)
    lock = str(shared / "registration.lock")
    previous = os.umask(0o077)
    try:
        from llmfoundry.data.shm_registration import open_shared_lock_file

        open_shared_lock_file(lock).close()
    finally:
        os.umask(previous)
    def as_nobody(action) -> int:  # a forked child that drops to user nobody; its exit code says how it went
        pid = os.fork()
        if pid == 0:
            try:
                os.setgid(65534)
                os.setuid(65534)
                action()
                os._exit(0)
            except PermissionError:
                os._exit(13)
            except BaseException:
                os._exit(1)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    def take_lock():
        import fcntl

        fcntl.flock(open_shared_lock_file(lock), fcntl.LOCK_EX | fcntl.LOCK_NB)

    try:
        assert as_nobody(lambda: open(lock, "a")) == 13  # what the lock file used to be opened with
        assert as_nobody(take_lock) == 0
    finally:
        shutil.rmtree(shared, ignore_errors=True)
