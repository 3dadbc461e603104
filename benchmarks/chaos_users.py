"""benchmarks/chaos.py's ``users`` row: a second Unix user's 2-rank job on the same node, started at a random moment
of the first user's (root's) job. Both stream their data through streaming's shared memory in /dev/shm and register
it under llmfoundry's machine-wide lock file (llmfoundry.data.shm_registration), which the first user's job or an
older version may have created. The second user (``llmf-chaos``, a system user made when missing) trains the same
recipe from its own copy of the data, tokenizer and folders, with its own HOME, and the same /tmp.

The moment is drawn per trial: both jobs launched together (their registrations meet at the lock), or after a
random batch of the first job, which then waits at that batch until the second job has mapped its blocks (the second
job's start, imports and registration, takes longer on a small machine than the first's whole run) and then trains
on beside it. Trials, one per state of the lock file: as found on the machine; removed, so that the first job
creates it under umask 077 (the first job runs under that umask); left 0600 by another user, as a version before
shm_registration.open_shared_lock_file would have left it under umask 077. A trial survives when both jobs exit 0,
the first is bitwise equal to the reference with no checkpoint lost (as every row), and so is the second."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.chaos_world import (BATCHES, REPO, SAVE_EVERY, Job, Row, World, bitwise_equal, complete_checkpoints,
                                    final_weights, launch, recipe, sample_errors, wait_for)
from llmfoundry.data.shm_registration import SHM_REGISTRATION_LOCK
from tests.distributed.helpers import descendants, kill_tree

SECOND_USER = "llmf-chaos"
PYTHON_MOUNT = Path("/opt/llmf-chaos-python")  # this Python, where a user who cannot enter /root reaches it
LOCK_STATES = ("as found", "created by the first job under umask 077", "left 0600 by another user")
_SHM_BLOCK = re.compile(r" /dev/shm/(\d{6})_\w+")


class SecondUser:
    """A second Unix user that can run this checkout's Python, with a folder of its own (HOME, data, runs)."""

    def __init__(self, world: World):
        try:
            entry = pwd.getpwnam(SECOND_USER)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SECOND_USER],
                           check=True)
            entry = pwd.getpwnam(SECOND_USER)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        self.mounted = False
        self.root = Path(tempfile.mkdtemp(prefix="chaos-user-"))
        (self.root / "home").mkdir()
        self.mds = self.root / "mds"
        self.tokenizer = self.root / "tokenizer"
        shutil.copytree(world.mds, self.mds)
        shutil.copytree(world.tokenizer, self.tokenizer)
        self.own(self.root)
        self.python, self.library_path = sys.executable, None
        try:
            if not self._runs_python():
                self._mount_python()
        except BaseException:
            self.close(keep=False)
            raise

    def own(self, path: Path) -> None:
        subprocess.run(["chown", "-R", f"{self.uid}:{self.gid}", str(path)], check=True)

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` (a run's environment) as this user's: its HOME and name, and what its Python needs."""
        home = str(self.root / "home")
        env = dict(base, HOME=home, USER=SECOND_USER, LOGNAME=SECOND_USER, XDG_CACHE_HOME=f"{home}/.cache",
                   PYTHONPATH=str(REPO))
        if self.library_path:
            env["LD_LIBRARY_PATH"] = self.library_path
        return env

    def popen(self) -> dict:
        """subprocess.Popen's arguments that run a process as this user."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def _runs_python(self) -> bool:
        try:
            check = subprocess.run([self.python, "-c", "import torch, llmfoundry.data.text"], cwd=self.root,
                                   env=self.env(dict(os.environ)), capture_output=True, timeout=300, **self.popen())
        except PermissionError:  # not this user's to run
            return False
        return check.returncode == 0

    def _mount_python(self) -> None:
        """This Python lives where other users may not enter (pyenv under /root): bind-mount its installation
        read-only at PYTHON_MOUNT. Its executable looks for libpython by an absolute path under /root first, so
        LD_LIBRARY_PATH names the mounted lib folder."""
        if sys.prefix != sys.base_prefix:
            raise RuntimeError(f"the second user cannot run {sys.executable} (a virtual environment)")
        base = Path(sys.base_prefix).resolve()
        PYTHON_MOUNT.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(base), str(PYTHON_MOUNT)], check=True)
        self.mounted = True
        subprocess.run(["mount", "-o", "remount,bind,ro", str(PYTHON_MOUNT)], check=True)
        self.python = str(PYTHON_MOUNT / Path(sys.executable).resolve().relative_to(base))
        self.library_path = str(PYTHON_MOUNT / "lib")
        if not self._runs_python():
            raise RuntimeError(f"the second user cannot run {self.python} (bind-mounted from {base})")

    def close(self, keep: bool) -> None:
        if self.mounted:
            subprocess.run(["umount", str(PYTHON_MOUNT)])
            with contextlib.suppress(OSError):
                PYTHON_MOUNT.rmdir()
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def _holding_lock_file():
    """The registration lock file, flocked (no job is registering), for replacing it."""
    handle = os.fdopen(os.open(SHM_REGISTRATION_LOCK, os.O_RDONLY | os.O_CREAT, 0o644), "rb")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        handle.close()


def _set_lock_file(state: str) -> str:
    """Put the lock file in ``state`` (LOCK_STATES); returns how it was found."""
    try:
        found = os.stat(SHM_REGISTRATION_LOCK)
        was = f"{found.st_mode & 0o777:04o}, uid {found.st_uid}"
    except FileNotFoundError:
        was = "absent"
    if state == LOCK_STATES[0]:
        return was
    with _holding_lock_file():
        os.unlink(SHM_REGISTRATION_LOCK)
        if state == LOCK_STATES[2]:
            previous = os.umask(0o077)
            try:
                os.close(os.open(SHM_REGISTRATION_LOCK, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o666))
            finally:
                os.umask(previous)
    return was


def _lock_file_now() -> str:
    try:
        now = os.stat(SHM_REGISTRATION_LOCK)
    except FileNotFoundError:
        return "absent"
    return f"{now.st_mode & 0o777:04o}, uid {now.st_uid}"


def _mapped_prefixes(job: Job) -> set[str]:
    """The /dev/shm prefixes whose blocks the job's processes have mapped now."""
    prefixes: set[str] = set()
    for pid in descendants(job.proc.pid):
        with contextlib.suppress(OSError):
            prefixes.update(_SHM_BLOCK.findall(Path(f"/proc/{pid}/maps").read_text()))
    return prefixes


def second_user(world: World, row: Row, user: SecondUser | None, state: str, trial: int, rng: random.Random) -> None:
    """One trial: root's job, and at a random moment of it the second user's job of the same recipe."""
    if user is None:
        row.notes.append("skipped: needs root to make a second user")
        return
    first_dir = world.work / f"first-user-{trial}"
    second_dir = user.root / f"second-user-{trial}"
    (second_dir / "attempt1").mkdir(parents=True)
    user.own(second_dir)
    first_save = str(first_dir / "ckpt")
    second_save = str(second_dir / "ckpt")
    first_run = recipe(world, f"first-user-{trial}", first_save)
    second_run = recipe(world, f"second-user-{trial}", second_save)
    second_run["train_loader"]["dataset"]["local"] = str(user.mds)
    second_run["tokenizer"]["name"] = str(user.tokenizer)
    second_run["checkpoint_upload"]["staging_folder"] = str(second_dir / "staging")
    was = _set_lock_file(state)
    # the moment: -1 = both jobs launched together (their registrations meet at the lock); else after that many
    # batches of the first job, which then waits until the second job has mapped its blocks (the second job's
    # start, imports and registration, takes longer here than the first's whole run) and then trains on beside it
    after = rng.randint(-1, BATCHES - 2)
    flag = first_dir / "second-registered"
    env = dict(world.env(), CHAOS_HOLD_AT=str(after + 1), CHAOS_HOLD_FLAG=str(flag)) if after >= 0 else world.env()
    first = launch(world, first_run, first_dir, 1, env, umask=0o077 if state == LOCK_STATES[1] else -1)
    if after >= 0:
        wait_for(lambda: first.steps() >= after and bool(_mapped_prefixes(first)), first, poll=0.05)
        time.sleep(rng.uniform(0, 0.5))
    aimed = first.proc.poll() is None
    second = launch(world, second_run, second_dir, 1, user.env(world.env()), python=user.python, **user.popen())
    shared: set[tuple[str, ...]] = set()  # the prefixes of both jobs, whenever both had blocks mapped at once
    held_s = 0.0
    launched = time.monotonic()
    while first.proc.poll() is None or second.proc.poll() is None:
        if time.monotonic() - launched > 900:  # a hang: both jobs end, and the trial counts as failed
            kill_tree(first.proc)
            kill_tree(second.proc)
            break
        mine, theirs = _mapped_prefixes(first), _mapped_prefixes(second)
        if mine and theirs:
            shared.add((*sorted(mine), "/", *sorted(theirs)))
        if (theirs or second.proc.poll() is not None) and after >= 0 and not flag.exists():
            flag.touch()
            held_s = time.monotonic() - launched
        time.sleep(0.1)
    if after >= 0 and not flag.exists():
        flag.touch()
    lock_after = _lock_file_now()
    if state == LOCK_STATES[2]:  # give the machine back a lock file every user can take
        with contextlib.suppress(OSError):
            os.chmod(SHM_REGISTRATION_LOCK, 0o644)
    expected = {f"ep0-ba{b}" for b in range(SAVE_EVERY, BATCHES + 1, SAVE_EVERY)}
    lost_first = len(expected - complete_checkpoints(world, first_save))
    lost_second = len(expected - complete_checkpoints(world, second_save))
    second_same = bitwise_equal(world, final_weights(world, second_save))
    second_lost, second_repeated = sample_errors(world, second_dir)
    said = any("registration lock file" in line and "chmod 644" in line for line in second.log.read_text().splitlines())
    both_mapped = "; ".join(sorted({" ".join(p) for p in shared})[:2]) or "never"
    moment = "with the first" if after < 0 else f"after batch {after} of the first (held {held_s:.0f} s till it registered)"
    note = (f"lock file {state} ({was} -> {lock_after}): second user's job started {moment}"
            f"{'' if aimed else ', missed: the first had ended'}; exit {second.proc.returncode}"
            + (f" `{second.last_line()[:150]}`" if second.proc.returncode else "")
            + f", bitwise equal {second_same}, lost checkpoints {lost_second}, lost/repeated samples "
            f"{second_lost}/{second_repeated}{', said how to fix the lock file' if said else ''}; /dev/shm prefixes "
            f"mapped at once (first / second): {both_mapped}")
    survived = (first.proc.returncode == 0 and second.proc.returncode == 0 and second_same and lost_second == 0
                and second_lost == second_repeated == 0)
    row.add(world, first_dir, first_save, survived, lost_first, note)


def second_user_rows(world: World, rows: list[Row], seed: int, keep: bool) -> None:
    row = Row("a second Unix user's job on the same node")
    rows.append(row)
    if os.geteuid() != 0:
        second_user(world, row, None, LOCK_STATES[0], 0, random.Random(seed))
        return
    try:
        user = SecondUser(world)
    except RuntimeError as error:
        row.notes.append(f"not run: {error}")
        return
    try:
        rng = random.Random(seed)
        for trial, state in enumerate(LOCK_STATES):
            second_user(world, row, user, state, trial, rng)
    finally:
        user.close(keep)
