"""The checkpoint writer process of save_async, and what it shares with the training process.

Each rank's training process starts one writer process (``python -m llmfoundry.train.checkpoint_writer``) and
talks to it over a Unix socket pair: pickled messages, each preceded by its length, and the file descriptor of a
:class:`SharedRegion` passed with ``SCM_RIGHTS``. The training process copies a snapshot's tensors into the region
(pinned on a GPU) and sends only where each tensor lies in it, with the small state, the config and the tokenizer's
files; the writer rebuilds the snapshot from views of the same memory and writes it with the code a synchronous
save uses (train.checkpoint.write_snapshot), so the guarantees of a synchronous save hold: ``.partial``, checksums,
the failure agreement of every rank, rename and ``latest`` once complete. Its collectives run on a gloo process
group of the writer processes alone. Serialising, hashing, writing and, for an object-store save_folder, uploading
(train.uploads' protocol: per-rank markers, ``.complete``, then ``latest``) happen in the writer's interpreter, so
they never take the training loop's GIL (issue #30: a writer thread made the Python-bound steps after a save 30-80%
of a synchronous save slower on a GPU).

A writer dies with its training process (``PR_SET_PDEATHSIG`` on Linux): a write cut short leaves a ``.partial``
folder, never read. It ignores the signals that ask a job to stop (the training process decides when, and its
preemption save waits for the write in flight).
"""

from __future__ import annotations

import copy
import ctypes
import datetime
import logging
import os
import pickle
import signal
import socket
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from llmfoundry.core import dist
from llmfoundry.core.errors import ConfigError, first_line
from llmfoundry.core.secrets import protect_process
from llmfoundry.train import uploads
from llmfoundry.train.checkpoint import Snapshot, write_job

ALIGN = 64  # bytes: every tensor of the region starts on a cache line, aligned for any dtype
_HEADER = struct.Struct("!Q")


# ----------------------------------------------------------------------------------------------- the wire
def send_message(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)))
    sock.sendall(data)


def _receive_exactly(sock: socket.socket, size: int) -> bytearray:
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise EOFError("the other end of the checkpoint writer's socket closed")
        got += n
    return data


def receive_message(sock: socket.socket) -> Any:
    (size,) = _HEADER.unpack(_receive_exactly(sock, _HEADER.size))
    return pickle.loads(_receive_exactly(sock, size))


class TokenizerFiles:
    """A tokenizer's saved files held in memory: sent to the writer without the tokenizer object (whose class the
    writer may not have, and which the loop may use meanwhile)."""

    def __init__(self, tokenizer: Any):
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer.save_pretrained(tmp)
            self.files = {p.relative_to(tmp).as_posix(): p.read_bytes() for p in Path(tmp).rglob("*") if p.is_file()}

    def save_pretrained(self, folder: str) -> None:
        for rel, data in self.files.items():
            path = Path(folder) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


# ----------------------------------------------------------------------------------------------- shared memory
class SharedRegion:
    """Anonymous shared memory (memfd; elsewhere an unlinked temporary file) mapped as one uint8 tensor. Nothing
    of it is left behind by a process that dies: the memory goes with the last descriptor and mapping."""

    def __init__(self, size: int, fd: int | None = None):
        self.size = max(size, 1)
        if fd is None:
            if hasattr(os, "memfd_create"):
                fd = os.memfd_create("llmfoundry-checkpoint", os.MFD_CLOEXEC)
            else:
                fd, name = tempfile.mkstemp(prefix="llmfoundry-checkpoint-")
                os.unlink(name)
            os.ftruncate(fd, self.size)
        self.fd = fd
        self.tensor = torch.from_file(f"/dev/fd/{fd}", shared=True, size=self.size, dtype=torch.uint8)
        self.pinned = False

    def pin(self) -> None:
        """Page-lock it for the GPU, so copies from the device run asynchronously on a stream of their own."""
        result = int(torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), self.size, 1))  # 1: portable
        if result != 0:
            raise RuntimeError(f"cudaHostRegister of {self.size} bytes for save_async failed (cudaError {result})")
        self.pinned = True

    def view(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        numel = 1
        for n in shape:
            numel *= n
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        return self.tensor[offset:offset + nbytes].view(dtype).view(shape)

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
            self.pinned = False
        self.tensor = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Slot(int):
    """Where the i-th tensor goes back into a state's structure."""


def layout(tensors: list[torch.Tensor]) -> list[int]:
    """Each tensor's offset in the region, and the region's size last."""
    offsets, end = [], 0
    for t in tensors:
        offsets.append(end)
        end += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return offsets + [end]


def describe(tensor: torch.Tensor, offset: int, meshes: dict[int, tuple]) -> tuple:
    """What the writer needs to rebuild ``tensor`` from the region: offset, dtype, local shape and, for a DTensor,
    its mesh (global ranks), placements and global shape and stride. ``meshes``: each mesh's ranks and names by the
    mesh's id, filled as met (one snapshot's tensors share a few meshes; reading one's ranks costs ~0.3 ms)."""
    local = dist.local_tensor(tensor)
    mesh = None
    if isinstance(tensor, DTensor):
        m = tensor.device_mesh
        if id(m) not in meshes:
            meshes[id(m)] = (m.mesh.tolist(), m.mesh_dim_names)
        mesh = (*meshes[id(m)], tuple(tensor.placements), tuple(tensor.shape), tuple(tensor.stride()))
    return offset, local.dtype, tuple(local.shape), mesh


def rebuild(region: SharedRegion, description: tuple, meshes: dict) -> torch.Tensor:
    offset, dtype, shape, mesh = description
    local = region.view(offset, dtype, shape)
    if mesh is None:
        return local
    ranks, names, placements, global_shape, global_stride = mesh
    key = (repr(ranks), names)
    if key not in meshes:  # the writer's ranks are the training ranks; no group is made: DCP needs the layout only
        meshes[key] = DeviceMesh("cpu", ranks, mesh_dim_names=names, _init_backend=False)
    return DTensor.from_local(local, meshes[key], placements, run_check=False, shape=torch.Size(global_shape),
                              stride=global_stride)


def fill(tree: Any, tensors: dict[int, torch.Tensor]) -> Any:
    if isinstance(tree, Slot):
        return tensors[int(tree)]
    if isinstance(tree, dict):
        return {k: fill(v, tensors) for k, v in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(fill(v, tensors) for v in tree)
    return tree


def split(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """``tree`` with every tensor replaced by a :class:`Slot` (appended to ``tensors``) and other values copied."""
    if isinstance(tree, torch.Tensor):
        tensors.append(tree)
        return Slot(len(tensors) - 1)
    if isinstance(tree, dict):
        return {k: split(v, tensors) for k, v in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(split(v, tensors) for v in tree)
    return copy.deepcopy(tree)


# ----------------------------------------------------------------------------------------------- the writer
def _die_with_parent(parent: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass  # elsewhere: the socket's end-of-file stops it between writes
    if os.getppid() != parent:  # the parent died before the line above ran
        os._exit(1)


def _write(request: dict, region: SharedRegion, meshes: dict) -> tuple[str | None, str | None]:
    tensors = {i: rebuild(region, d, meshes) for i, d in request["slots"].items()}
    tree = fill(request["tree"], tensors)
    snapshot = Snapshot(tree["state"], request["small"], tree["full"])
    staged, attempt = write_job(snapshot, **{k: v for k, v in request["job"].items() if k != "upload"})
    return (str(staged) if staged is not None else None), attempt


class Uploads:
    """This rank's uploads of the checkpoints the writer staged (an object-store save_folder): the uploader's
    thread runs in the writer process, so its requests, hashing and retries never take the training loop's GIL.
    The training process learns how they stand from every answer (:meth:`status`) and waits for them at the end
    of training (the ``uploads`` request)."""

    def __init__(self):
        self.uploader: uploads.Uploader | None = None

    def submit(self, job: dict, staged: str, attempt: str) -> None:
        if self.uploader is None:  # started by the first upload, with the Checkpointer's settings
            self.uploader = uploads.Uploader(**job["upload"])
        self.uploader.submit(uploads.UploadJob(job["name"], Path(staged), dist.world_size(), job["keep"], attempt))

    def status(self, wait_s: float | None = 0.0, close: bool = False) -> dict:
        """Pending uploads, failed ones and retried requests; waits up to ``wait_s`` (None: until done) first, and
        with ``close`` stops the uploader's thread (what is still pending is then cut off with the process)."""
        if self.uploader is None:
            return {"pending": 0, "failed": [], "retries": 0}
        if wait_s != 0.0:
            self.uploader.wait(wait_s)
        status = {"pending": self.uploader.pending(), "failed": list(self.uploader.failed),
                  "retries": self.uploader.retries}
        if close:
            self.uploader.close(0)
            self.uploader = None
        return status


def serve(sock: socket.socket) -> None:
    setup = receive_message(sock)
    if setup["world_size"] > 1:
        timeout = datetime.timedelta(seconds=setup["timeout_s"])
        host, port = setup["store"]
        store = torch.distributed.TCPStore(host, port, setup["world_size"], is_master=setup["rank"] == 0,
                                           timeout=timeout)
        torch.distributed.init_process_group("gloo", store=store, rank=setup["rank"],
                                             world_size=setup["world_size"], timeout=timeout)
    region, meshes, staged_uploads = None, {}, Uploads()
    try:
        while True:
            request = receive_message(sock)
            if request["op"] == "stop":
                return
            if request["op"] == "uploads":  # how the uploads stand; at the end of training: wait for them
                send_message(sock, ("ok", None, None, staged_uploads.status(request["wait_s"], request["close"])))
                continue
            if request.get("region"):
                _, fds, _, _ = socket.recv_fds(sock, 1, 1)
                if region is not None:
                    region.close()
                region = SharedRegion(request["region"], fd=fds[0])
            try:
                staged, attempt = _write(request, region, meshes)
                if staged is not None and request["job"].get("upload"):
                    staged_uploads.submit(request["job"], staged, attempt)
                reply = ("ok", staged, attempt)
            except ConfigError as error:
                reply = ("config", str(error), None)
            except Exception as error:  # noqa: BLE001 - any failure is reported to the training process, in one line
                reply = ("error", f"{type(error).__name__}: {first_line(error)}", None)
            send_message(sock, (*reply, staged_uploads.status()))
    finally:
        if region is not None:
            region.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def main(argv: list[str]) -> int:
    fd, parent = int(argv[0]), int(argv[1])
    _die_with_parent(parent)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"):  # the training process decides when to stop
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    # Background work: where cores are short, the training process (which launches the GPU's kernels) comes first.
    # Only 5: at 10 or 19, on a host whose cores are all busy, the write starved until the next save waited for it.
    os.nice(5)
    protect_process([])  # what it writes (an upload's warnings) is masked as the training process's output is
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s checkpoint writer: %(message)s")
    with socket.socket(fileno=fd) as sock:
        try:
            serve(sock)
        except EOFError:  # the training process went away between writes
            return 0
    return 0


if __name__ == "__main__":  # run as the package's module, so that what arrives pickled is of the same classes
    from llmfoundry.train import checkpoint_writer

    sys.exit(checkpoint_writer.main(sys.argv[1:]))
