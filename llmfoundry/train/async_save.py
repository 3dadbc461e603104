"""save_async: checkpoints written in the background; the training loop waits only for a snapshot.

A save takes a :class:`~llmfoundry.train.checkpoint.Snapshot` of the live state, as a synchronous save does. The
small state (trainer time, scheduler, RNG, loader position) and any model tensor that is not a parameter (buffers,
which a forward pass may change) are copied at once; the parameters and the optimizer state, which only an optimizer
step changes, are copied to host memory by a thread of their own (buffers kept from one save to the next; pinned
memory and a stream of their own on a GPU) while the next batch's forward and backward run. The next
optimizer step waits until that copy is done (an optimizer pre-step hook), as torchtitan's async checkpointing does.
A writer thread then writes the copy with the same code as a synchronous save (train.checkpoint.write_snapshot):
the DCP shards, ``rank{r}.pt``, checksums, the failure agreement, and the rename and ``latest`` only once every
rank's files are complete (s3://: then the upload). Its collectives run on a gloo group made for it alone: two
threads issuing collectives on one group (the loop's FSDP/DDP ones and the writer's) could be matched in a
different order on each rank.

One write is in flight at a time: the next save, the end of training (``finish``), a preemption's save and a
restore first wait for it; an error it met is raised there, as the ConfigError a synchronous save raises.
"""

from __future__ import annotations

import copy
import logging
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch
from torch.distributed.tensor import DTensor

from llmfoundry.core import dist
from llmfoundry.train.checkpoint import Snapshot

log = logging.getLogger(__name__)


class TokenizerFiles:
    """A tokenizer's saved files held in memory: written from the writer thread without touching the tokenizer
    object, which the loop may use meanwhile (a fast tokenizer is not safe to use from two threads)."""

    def __init__(self, tokenizer: Any):
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer.save_pretrained(tmp)
            self.files = {p.relative_to(tmp).as_posix(): p.read_bytes() for p in Path(tmp).rglob("*") if p.is_file()}

    def save_pretrained(self, folder: str) -> None:
        for rel, data in self.files.items():
            path = Path(folder) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _parameter_storages(model: torch.nn.Module) -> set[int]:
    return {_local(p).untyped_storage().data_ptr() for p in model.parameters()}


class _Slot(int):
    """Where the i-th tensor goes back into a state's structure."""


class _Skeleton:
    def __init__(self, tree: Any, model_slots: set[int]):
        self.tree = tree
        self.model_slots = model_slots  # tensors of the model state (parameters or buffers)


def _split(state: dict[str, Any]) -> tuple[_Skeleton, list[torch.Tensor]]:
    """``state`` with every tensor replaced by a :class:`_Slot` and other values copied, and the tensors."""
    tensors: list[torch.Tensor] = []

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return _Slot(len(tensors) - 1)
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if type(value) in (list, tuple):
            return type(value)(walk(v) for v in value)
        return copy.deepcopy(value)

    model = walk(state["state"]["model"])
    model_slots = set(range(len(tensors)))
    tree = {"state": {"model": model, **{k: walk(v) for k, v in state["state"].items() if k != "model"}},
            "full": walk(state["full"])}
    return _Skeleton(tree, model_slots), tensors


def _fill(tree: Any, tensors: dict[int, torch.Tensor]) -> Any:
    if isinstance(tree, _Slot):
        return tensors[int(tree)]
    if isinstance(tree, dict):
        return {k: _fill(v, tensors) for k, v in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(_fill(v, tensors) for v in tree)
    return tree


class HostCopies:
    """Copies of tensors in host memory, one buffer per slot kept from one save to the next (pinned when CUDA is
    used, so that the copies from the GPU run asynchronously, on a stream of their own)."""

    def __init__(self):
        self.pin = torch.cuda.is_available()
        self.buffers: dict[int, torch.Tensor] = {}

    def copy(self, slot: int, tensor: torch.Tensor, keep: bool = True) -> torch.Tensor:
        local = _local(tensor).detach()
        buffer = self.buffers.get(slot) if keep else None
        if buffer is None or buffer.shape != local.shape or buffer.dtype != local.dtype:
            buffer = torch.empty(local.shape, dtype=local.dtype, device="cpu", pin_memory=self.pin and local.is_cuda)
            if keep:
                self.buffers[slot] = buffer
        buffer.copy_(local, non_blocking=buffer.is_pinned())
        if isinstance(tensor, DTensor):  # the same shard of the same global tensor, in host memory
            return DTensor.from_local(buffer, tensor.device_mesh, tensor.placements, run_check=False,
                                      shape=tensor.shape, stride=tensor.stride())
        return buffer


class AsyncSaver:
    """This rank's snapshots in host memory and its one background write."""

    def __init__(self):
        # Every rank makes it at the same point (Checkpointer's construction), as new_group requires.
        self.group = torch.distributed.new_group(backend="gloo") if dist.world_size() > 1 else None
        self._copies = HostCopies()
        self._executor: ThreadPoolExecutor | None = None  # copies the parameters and optimizer state
        self._stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        self._staging: Future | None = None  # the copy the next optimizer step waits for
        self._hooked: set[int] = set()
        self._tokenizer: tuple[Any, TokenizerFiles] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.blocked_s = 0.0  # time optimizer steps waited for a copy (the benchmark adds it to the stall)

    def snapshot(self, live: Snapshot, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
                 ) -> Callable[[], Snapshot]:
        """Start copying ``live`` to host memory; returns the function that gives the copy once it is complete
        (called by the writer thread). The parameters and optimizer state are copied before the next step of
        ``optimizer`` changes them; without an optimizer, before this returns."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-copy")
        if self._stream is not None:  # the copy stream must see this step's parameters: queued kernels first
            torch.cuda.current_stream().synchronize()
        params = _parameter_storages(model)
        skeleton, tensors = _split({"state": live.state, "full": live.full})
        later = {i for i, t in enumerate(tensors) if _local(t).untyped_storage().data_ptr() in params
                 or i not in skeleton.model_slots}  # optimizer state too: only an optimizer step changes it
        now = {i: self._copies.copy(i, t, keep=False) for i, t in enumerate(tensors) if i not in later}
        if self._stream is not None:
            torch.cuda.current_stream().synchronize()
        future = self._executor.submit(self._copy_later, {i: tensors[i] for i in sorted(later)})
        self._staging = future
        small = copy.deepcopy(live.small)
        if optimizer is None:
            self.wait_for_copy()
        elif id(optimizer) not in self._hooked:
            optimizer.register_step_pre_hook(lambda *_: self.wait_for_copy())
            self._hooked.add(id(optimizer))

        def result() -> Snapshot:
            copied = _fill(skeleton.tree, {**now, **future.result()})
            return Snapshot(copied["state"], small, copied["full"])

        return result

    def _copy_later(self, tensors: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        if self._stream is None:
            return {i: self._copies.copy(i, t) for i, t in tensors.items()}
        with torch.cuda.stream(self._stream):
            copies = {i: self._copies.copy(i, t) for i, t in tensors.items()}
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

    def start(self, write: Callable[[], Any]) -> None:
        """Run ``write`` in the background (after :meth:`wait`: one write at a time)."""
        if self._thread is not None:
            raise RuntimeError("a checkpoint write is still in flight (call wait() first)")
        self._thread = threading.Thread(target=self._run, args=(write,), name=f"checkpoint-write-rank{dist.rank()}",
                                        daemon=True)  # a crashed run exits; its .partial folder is never read
        self._thread.start()

    def _run(self, write: Callable[[], Any]) -> None:
        try:
            write()
        except BaseException as error:  # noqa: BLE001 - kept for the loop's thread, which raises it
            log.error("background checkpoint write failed: %s", error)
            self._error = error

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Block until the write in flight (if any) is done; raise the error it met."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._staging = None  # the writer waited for the copy first
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def release(self) -> None:
        """Wait, then free the host copy (the end of training); a later save makes a new one."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            self._copies = HostCopies()
