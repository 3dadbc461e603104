"""save_async: checkpoints written by a process of their own; the training loop waits only for a snapshot.

A save takes a :class:`~llmfoundry.train.checkpoint.Snapshot` of the live state, as a synchronous save does, and
copies its tensors into memory shared with this rank's writer process (train.checkpoint_writer; pinned on a GPU,
where the copies run on a stream of their own). The small state (trainer time, scheduler, RNG, loader position) and
any model tensor that is not a parameter (buffers, which a forward pass may change) are copied at once; the
parameters and the optimizer state, which only an optimizer step changes, are copied by a thread of their own
while the next batch's forward and backward run. The next optimizer step waits until that copy is done (an
optimizer pre-step hook), as torchtitan's async checkpointing does. A courier thread then sends the writer where
each tensor lies and waits, blocked in a socket read (no GIL held), for its answer; for an object store it hands
the staged files to the uploader. The writer serialises, hashes and writes in its own interpreter.

One write is in flight at a time: the next save, the end of training (``release``), a preemption's save and a
restore first wait for it; an error it met is raised there, as the ConfigError a synchronous save raises. The end
of training stops the writer process and reaps it.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

from llmfoundry.core import dist
from llmfoundry.core.errors import ConfigError
from llmfoundry.train import checkpoint_writer as wire
from llmfoundry.train.checkpoint import Snapshot

log = logging.getLogger(__name__)
TokenizerFiles = wire.TokenizerFiles
STOP_TIMEOUT_S = 60.0  # the writer answers "stop" between writes at once; this only bounds a wedged one
# A writer stopped with uploads still pending after wait_at_end_s: its interpreter's exit would wait for the
# object-store client's threads (a request to a store that stopped answering lasts up to its read timeout, per
# attempt). Their checkpoints are incomplete whatever happens, and never "latest": cut them off after this.
CUT_OFF_S = 5.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _parameter_storages(model: torch.nn.Module) -> set[int]:
    return {dist.local_tensor(p).untyped_storage().data_ptr() for p in model.parameters()}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class WriterProcess:
    """This rank's writer process (collective to start: rank 0 chooses where the writers' gloo store listens)."""

    def __init__(self, timeout_s: float = 1800.0):
        store = None
        if dist.world_size() > 1:  # rank 0's writer hosts the store, on rank 0's host, as torch's DCP process does
            host = os.environ.get("MASTER_ADDR", "127.0.0.1")
            store = dist.broadcast_object((host, _free_port()) if dist.rank() == 0 else None)
        self.sock, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH"))
                                                           if p),
               "OMP_NUM_THREADS": "1"}  # hashing and writing need no thread pool; the cores are training's
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llmfoundry.train.checkpoint_writer", str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self.lock = threading.Lock()  # one request on the socket at a time (the courier's, or a status query)
        wire.send_message(self.sock, {"rank": dist.rank(), "world_size": dist.world_size(), "store": store,
                                      "timeout_s": timeout_s})
        # a run that ends without release() (an error in the loop) still stops it when this object goes
        self._finalizer = weakref.finalize(self, _stop, self.process, self.sock)

    @property
    def pid(self) -> int:
        return self.process.pid

    def request(self, message: dict, fd: int | None = None) -> tuple:
        """Send one request (a write, with the region's descriptor when it is new) and wait for its answer:
        status, detail, upload attempt, and how the writer's uploads stand (None when it died). One at a time."""
        with self.lock:
            try:  # a writer that died is a broken pipe here or end-of-file below: one line either way
                wire.send_message(self.sock, message)
                if fd is not None:
                    socket.send_fds(self.sock, [b"R"], [fd])
                return wire.receive_message(self.sock)
            except (EOFError, OSError):
                code = _reap(self.process, STOP_TIMEOUT_S)
                return ("error", f"the checkpoint writer process exited (code {code})", None, None)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ask the writer to stop and reap it, killed if it has not exited within ``timeout_s``."""
        found = self._finalizer.detach()
        if found is not None:
            _, _, args, _ = found
            _stop(*args, timeout_s=timeout_s)


def _reap(process: subprocess.Popen, timeout_s: float) -> int:
    """The process's exit code, once it exits or is killed after ``timeout_s``."""
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def _stop(process: subprocess.Popen, sock: socket.socket, timeout_s: float = STOP_TIMEOUT_S) -> None:
    try:
        wire.send_message(sock, {"op": "stop"})
    except OSError:
        pass  # already gone
    _reap(process, timeout_s)
    sock.close()


class StagingArea:
    """The shared region and where each tensor of a snapshot lies in it; kept from one save to the next while the
    state's tensors keep their shapes (pinned once on a GPU)."""

    def __init__(self):
        self.region: wire.SharedRegion | None = None
        self.offsets: list[int] = []
        self.sent = False  # the writer has this region's descriptor

    def place(self, tensors: list[torch.Tensor]) -> list[int]:
        offsets = wire.layout([dist.local_tensor(t) for t in tensors])
        if self.region is None or offsets != self.offsets:
            self.close()
            self.region, self.offsets, self.sent = wire.SharedRegion(offsets[-1]), offsets, False
            if torch.cuda.is_available():
                self.region.pin()
        return offsets

    def copy(self, offset: int, tensor: torch.Tensor) -> torch.Tensor:
        local = dist.local_tensor(tensor).detach()
        buffer = self.region.view(offset, local.dtype, tuple(local.shape))
        buffer.copy_(local, non_blocking=self.region.pinned and local.is_cuda)
        return buffer

    def close(self) -> None:
        if self.region is not None:
            self.region.close()
        self.region, self.offsets, self.sent = None, [], False


class AsyncSaver:
    """This rank's snapshots in shared memory and its writer process, with one write in flight."""

    def __init__(self):
        # Every rank makes it at the same point (Checkpointer's construction): starting the writer is collective,
        # and started now it is ready by the first save.
        self.writer: WriterProcess | None = WriterProcess()
        self._area = StagingArea()
        self._executor: ThreadPoolExecutor | None = None  # copies the parameters and optimizer state
        self._stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        self._staging: Future | None = None  # the copy the next optimizer step waits for
        self._hooked: set[int] = set()
        self._tokenizer: tuple[Any, TokenizerFiles] | None = None
        self._pending: dict | None = None  # the snapshot's layout, sent to the writer by start()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        # how the writer's uploads stood at its last answer (an object-store save_folder: the writer uploads)
        self.uploads: dict = {"pending": 0, "failed": [], "retries": 0}
        self._earlier: dict = {"failed": [], "retries": 0}  # what the writers released before this one reported
        self._uploads_asked = -float("inf")  # when the writer was last asked (monotonic seconds)
        self.blocked_s = 0.0  # time optimizer steps waited for a copy (the benchmark adds it to the stall)

    def snapshot(self, live: Snapshot, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
                 ) -> Callable[[], Snapshot]:
        """Start copying ``live`` to shared memory; returns the function that gives the copy (views of that memory)
        once it is complete. The parameters and optimizer state are copied before the next step of ``optimizer``
        changes them; without an optimizer, before this returns."""
        if self.writer is None:  # released at the end of a previous fit (collective, as every save is)
            self.writer = WriterProcess()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-copy")
        if self._stream is not None:  # the copy stream must see this step's parameters: queued kernels first
            torch.cuda.current_stream().synchronize()
        params = _parameter_storages(model)
        tensors: list[torch.Tensor] = []
        model_tree = wire.split(live.state["model"], tensors)
        model_slots = len(tensors)
        tree = {"state": {"model": model_tree, **{k: wire.split(v, tensors) for k, v in live.state.items()
                                                  if k != "model"}}, "full": wire.split(live.full, tensors)}
        offsets = self._area.place(tensors)
        later = {i for i, t in enumerate(tensors) if dist.local_tensor(t).untyped_storage().data_ptr() in params
                 or i >= model_slots}  # optimizer state too: only an optimizer step changes it
        now = {i: self._area.copy(offsets[i], t) for i, t in enumerate(tensors) if i not in later}
        if self._stream is not None:
            torch.cuda.current_stream().synchronize()
        future = self._executor.submit(self._copy_later, {i: (offsets[i], tensors[i]) for i in sorted(later)})
        self._staging = future
        small = copy.deepcopy(live.small)
        meshes: dict[int, tuple] = {}  # the snapshot's meshes, described once each (they are alive till then)
        self._pending = {"tree": tree, "small": small,
                         "slots": {i: wire.describe(t, offsets[i], meshes) for i, t in enumerate(tensors)}}
        if optimizer is None:
            self.wait_for_copy()
        elif id(optimizer) not in self._hooked:
            optimizer.register_step_pre_hook(lambda *_: self.wait_for_copy())
            self._hooked.add(id(optimizer))

        def result() -> Snapshot:
            copied = wire.fill(tree, {**now, **future.result()})
            return Snapshot(copied["state"], small, copied["full"])

        return result

    def _copy_later(self, tensors: dict[int, tuple[int, torch.Tensor]]) -> dict[int, torch.Tensor]:
        if self._stream is None:
            return {i: self._area.copy(offset, t) for i, (offset, t) in tensors.items()}
        with torch.cuda.stream(self._stream):
            copies = {i: self._area.copy(offset, t) for i, (offset, t) in tensors.items()}
        self._stream.synchronize()
        return copies

    def wait_for_copy(self) -> None:
        """Block until the copy of the newest snapshot is complete (its error is raised here)."""
        if self._staging is not None:
            start = time.perf_counter()
            try:
                self._staging.result()
            finally:
                self._staging = None
                self.blocked_s += time.perf_counter() - start

    def tokenizer_files(self, tokenizer: Any) -> TokenizerFiles | None:
        """The tokenizer's files, saved once per run (the tokenizer does not change while training)."""
        if tokenizer is None:
            return None
        if self._tokenizer is None or self._tokenizer[0] is not tokenizer:
            self._tokenizer = (tokenizer, TokenizerFiles(tokenizer))
        return self._tokenizer[1]

    def start(self, job: dict) -> None:
        """Have the writer write the newest snapshot as ``job`` (train.checkpoint.write_job's arguments: name,
        folder, remote, overwrite, keep, config, tokenizer; for an object-store save_folder also ``upload``, the
        train.uploads.Uploader settings with which the writer uploads what it staged) once its copy is complete.
        One write at a time."""
        if self._thread is not None:
            raise RuntimeError("a checkpoint write is still in flight (call wait() first)")
        message, self._pending = {"op": "write", "job": job, **self._pending}, None
        fd = None
        if not self._area.sent:
            message["region"], fd, self._area.sent = self._area.region.size, self._area.region.fd, True
        copying, writer = self._staging, self.writer
        self._thread = threading.Thread(target=self._run, args=(writer, copying, message, fd),
                                        name=f"checkpoint-courier-rank{dist.rank()}", daemon=True)
        self._thread.start()

    def _run(self, writer: WriterProcess, copying: Future | None, message: dict, fd: int | None) -> None:
        try:
            if copying is not None:
                copying.result()  # the writer reads the region only once the copy is complete
            status, detail, _, uploads = writer.request(message, fd)
            if uploads is not None:
                self._record(uploads)
            if status == "config":
                raise ConfigError(detail)
            if status != "ok":
                raise ConfigError(f"save_folder: could not write checkpoint '{message['job']['name']}' "
                                  f"({detail}); the checkpoints saved before it are intact: fix the cause and run "
                                  "again to resume from the newest")
        except BaseException as error:  # noqa: BLE001 - kept for the loop's thread, which raises it
            log.error("background checkpoint write failed: %s", error)
            self._error = error

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Block until the write in flight (if any) is done; raise the error it met (after stopping the writer and
        the copy thread, which a later save starts again: the error ends training, which must leave nothing
        running)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._staging = None  # the courier waited for the copy first
        if self._error is not None:
            error, self._error = self._error, None
            self._shut_down()
            raise error

    def _shut_down(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self.writer is not None:
            self.writer.stop(timeout_s)
            self.writer = None
        self._area.close()

    def upload_status(self, wait_s: float | None = 0.0, close: bool = False, max_age_s: float = 0.0) -> dict:
        """How the writer's uploads stand (pending, failed, retries; over every writer of the run). Asked of the
        writer when no write is in flight (answered at once unless ``wait_s`` > 0; None: until they are done;
        ``close`` stops its uploader); else what its last answer said. With ``max_age_s`` (a step's metrics) it is
        asked only while uploads are pending, at most once in that time: an answer waits for the writer's
        interpreter, which may be busy uploading or, before the first save, still starting."""
        asked_lately = time.monotonic() - self._uploads_asked < max_age_s
        if max_age_s and (asked_lately or not self.uploads["pending"]):
            return self.uploads
        if self.writer is not None and not self.busy():
            _, _, _, uploads = self.writer.request({"op": "uploads", "wait_s": wait_s, "close": close})
            self._uploads_asked = time.monotonic()
            if uploads is not None:
                self._record(uploads)
            elif close and self.uploads["pending"]:  # the writer died: what it had not uploaded is lost
                self.uploads = {**self.uploads, "pending": 0,
                                "failed": [*self.uploads["failed"], f"{self.uploads['pending']} in the writer process"]}
        if close:  # the next writer (a later fit) counts on from here
            self._earlier = {"failed": self.uploads["failed"], "retries": self.uploads["retries"]}
        return self.uploads

    def _record(self, uploads: dict) -> None:
        """The writer's answer, added to what earlier writers of the run reported."""
        self.uploads = {"pending": uploads["pending"], "failed": [*self._earlier["failed"], *uploads["failed"]],
                        "retries": self._earlier["retries"] + uploads["retries"]}

    def release(self, upload_timeout_s: float | None = None) -> None:
        """Wait for the write, and up to ``upload_timeout_s`` (None: until done) for the writer's uploads; then stop
        and reap the writer and free the shared memory (the end of training); a later save starts them again.
        ``uploads`` then tells what did not finish."""
        try:
            self.wait()
            self.upload_status(wait_s=upload_timeout_s, close=True)
        finally:  # uploads still pending past their wait are cut off (CUT_OFF_S), not waited for again
            cut_off = upload_timeout_s is not None and self.uploads["pending"] > 0
            self._shut_down(CUT_OFF_S if cut_off else STOP_TIMEOUT_S)
