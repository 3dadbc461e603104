"""A training step's metrics without waiting for the device: they stay tensors until a log interval.

Reading a CUDA tensor on the host (``float()``, ``int()``, ``.item()``, ``.tolist()``, ``if t:``) waits until the
GPU has run everything queued before it, so the host cannot queue the next step's kernels meanwhile. A step
therefore leaves its metrics as device tensors (or :class:`Derived` values computed from them); the trainer keeps
every batch's dict in a :class:`MetricsLog` and, at a log interval (console_log_interval, an evaluation, a
checkpoint, the last batch, a table a callback logs), reads all pending tensors in one transfer and hands the loggers
each batch's float values at its own step, as if they had been logged one by one. The values are the ones the
eager code produced: every tensor is read exactly (float64 holds float32, bf16 and counts below 2**53) and a
value derived from several (``loss - aux``, perplexity) is computed in Python from the read floats.

What must be known on the host every batch is counted on the host: a batch's tokens from the loader's CPU tensors
before the copy to the device, summed over ranks by train.host_sums (a host-side collective, not a device sync).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from llmfoundry.core import dist
from llmfoundry.core.errors import CollectiveError
from llmfoundry.data.batches import count_batch_tokens
from llmfoundry.train.callbacks.base import Callback

log = logging.getLogger(__name__)

MAX_PENDING = 1000  # batches whose metrics wait on the device at most (a few small tensors each)
# devices whose reads at a console interval wait for the next step (MetricsLog's lag); tests add "cpu" to run the
# same bookkeeping without a GPU
LAG_DEVICES = ("cuda",)


class Derived:
    """A metric computed from device tensors once they are read: ``fn(*values)``, the values of ``tensors``
    flattened in order. ``float()`` reads it at once (a device sync: for a callback that needs it every batch)."""

    __slots__ = ("tensors", "fn")

    def __init__(self, tensors: Sequence[torch.Tensor], fn: Callable[..., float]):
        self.tensors = tuple(tensors)
        self.fn = fn

    def resolve(self, read: dict[int, list[float]]) -> float:
        return self.fn(*(v for t in self.tensors for v in read[id(t)]))

    def __float__(self) -> float:
        return self.resolve(read_tensors(list(self.tensors)))

    def __format__(self, spec: str) -> str:  # f"{value:.4f}" as for a float (or a 0-d tensor): a read
        return format(float(self), spec)

    def __repr__(self) -> str:
        return f"Derived({float(self)!r})"

    def __round__(self, ndigits: int | None = None):
        return round(float(self), ndigits)


# A callback (a plugin's too) may compare or compute with a metric as with the float it used to be: each operation
# reads it (a device sync), as float(value) does.
for _name in ("lt", "le", "gt", "ge", "eq", "ne", "add", "radd", "sub", "rsub", "mul", "rmul", "truediv",
              "rtruediv", "pow", "rpow"):
    setattr(Derived, f"__{_name}__", (lambda op: lambda self, other: getattr(float(self), op)(
        float(other) if isinstance(other, Derived) else other))(f"__{_name}__"))
Derived.__neg__ = lambda self: -float(self)  # type: ignore[method-assign]
Derived.__abs__ = lambda self: abs(float(self))  # type: ignore[method-assign]
Derived.__hash__ = None  # type: ignore[assignment]  # compared by value, like the float it stands for


def _concatenated(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, dict[int, tuple[int, int]]]:
    """The tensors (one device) flattened into one float64 tensor, and where each one's values sit in it by id."""
    where, start = {}, 0
    for t in tensors:
        where[id(t)] = (start, start + t.numel())
        start += t.numel()
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors]), where


def read_tensors(tensors: list[torch.Tensor]) -> dict[int, list[float]]:
    """{id(tensor): its values as floats}: one concatenation and one device-to-host transfer per device."""
    by_device: dict[torch.device, dict[int, torch.Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, {})[id(t)] = t
    read: dict[int, list[float]] = {}
    for group in by_device.values():
        flat, where = _concatenated(list(group.values()))
        values = flat.tolist()
        read.update({key: values[a:b] for key, (a, b) in where.items()})
    return read


def _tensors_of(metrics: dict[str, Any]) -> list[torch.Tensor]:
    """The device tensors a metrics dict's values are read from."""
    tensors: list[torch.Tensor] = []
    for value in metrics.values():
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, Derived):
            tensors.extend(value.tensors)
    return tensors


def resolve_metrics(pending: list[dict[str, Any]], read: dict[int, list[float]] | None = None) -> list[dict[str, float]]:
    """Every pending metrics dict with its tensors and Derived values as floats (``read``: the tensors' values by
    id; default: read them now, in one transfer)."""
    if read is None:
        read = read_tensors([t for metrics in pending for t in _tensors_of(metrics)])
    out = []
    for metrics in pending:
        values = {}
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                (values[key],) = read[id(value)]  # a 0-d metric, as float(tensor) read it
            elif isinstance(value, Derived):
                values[key] = value.resolve(read)
            else:
                values[key] = value
        out.append(values)
    return out


class MetricsLog:
    """Batches' metrics waiting for the next log interval, handed to the loggers in order when read.

    On a GPU a log interval does not stall the loop either (``lag``): the pending values are copied to pinned host
    memory behind the step's kernels and read after the next step has been queued (``land``), so the device always
    has the next step's work while the host waits; such a batch's console line comes one step late. Evaluations,
    checkpoints, tables and the last batch read everything at once (``flush``)."""

    def __init__(self, loggers: list, console: Callable[[dict[str, float], int], None] | None = None):
        self.loggers = loggers
        self.console = console  # (values, step): prints a console batch's line once its values are read
        self.pending: list[tuple[int, dict[str, Any], bool]] = []  # (step, metrics, has a console line)
        self.staged: tuple[list, dict[int, tuple[int, int]], torch.Tensor, Any] | None = None  # copy in flight
        self.last: dict[str, float] = {}  # every key's newest logged value (what fit returns)

    def log(self, step: int, metrics: dict[str, Any], flush: bool, console: bool = False,
            lag: bool = False) -> dict[str, float] | None:
        """Queue a batch's metrics; when ``flush``, log every queued batch and return this one's values (None when
        ``lag`` defers the read of CUDA tensors to :meth:`land`)."""
        self.pending.append((step, metrics, console))
        if flush and lag and self._stageable():
            self.land()
            self._stage()
            return None
        # a long console_log_interval (or none due for long) still reads the device now and then: the queued tensors
        # hold device memory
        return self.flush() if flush or len(self.pending) >= MAX_PENDING else None

    def _stageable(self) -> bool:
        """Whether the pending values can be staged: all on one device of LAG_DEVICES, as plain tensors (one
        concatenation and one copy; anything else is read at once)."""
        tensors = [t for _, metrics, _ in self.pending for t in _tensors_of(metrics)]
        devices = {t.device for t in tensors}
        return (len(devices) == 1 and next(iter(devices)).type in LAG_DEVICES
                and all(type(t) is torch.Tensor for t in tensors))

    def _stage(self) -> None:
        """Start the copy of every pending tensor to pinned host memory, behind what the device has queued."""
        pending, self.pending = self.pending, []
        unique = list({id(t): t for _, metrics, _ in pending for t in _tensors_of(metrics)}.values())
        flat, where = _concatenated(unique)
        host = flat.to("cpu", non_blocking=True)  # into pinned memory: the host does not wait here
        done = None
        if flat.is_cuda:
            done = torch.cuda.Event()
            done.record()
        self.staged = (pending, where, host, done)

    def land(self) -> None:
        """Log the staged batches once their copy has arrived (waits for that copy only, not for later steps)."""
        if self.staged is None:
            return
        pending, where, host, done = self.staged
        self.staged = None
        if done is not None:
            done.synchronize()
        values = host.tolist()
        self._hand_out(pending, {key: values[a:b] for key, (a, b) in where.items()})

    def flush(self) -> dict[str, float] | None:
        """Read every pending batch's metrics (one device sync), log them at their steps; the newest's values."""
        self.land()
        if not self.pending:
            return None
        pending, self.pending = self.pending, []
        read = read_tensors([t for _, metrics, _ in pending for t in _tensors_of(metrics)])
        return self._hand_out(pending, read)

    def _hand_out(self, pending: list, read: dict[int, list[float]]) -> dict[str, float]:
        resolved = resolve_metrics([metrics for _, metrics, _ in pending], read)
        for (step, _, console), values in zip(pending, resolved):
            loss = values.get("loss/train/total")
            if loss is not None and not math.isfinite(loss):  # checked here, not in the step: no sync there
                log.warning("non-finite training loss at batch %d", step)
            for logger in self.loggers:
                logger.log_metrics(values, step=step)
            self.last.update(values)
            if console and self.console is not None:
                self.console(values, step)
        return resolved[-1]

    @contextlib.contextmanager
    def flushed_on_error(self) -> Iterator[None]:
        """On an error (a callback's TrainingStopped, a preemption's exit, ...), log what can still be read: the
        batches trained before it were logged when the metrics were read every batch."""
        try:
            yield
        except BaseException as failure:
            if isinstance(failure, CollectiveError) or dist.is_collective_failure(failure):
                raise  # a device read could wait forever behind the collective that failed
            steps = [step for step, _, _ in self.pending]
            try:
                self.flush()
            except Exception as error:  # the device may be what failed; the original error is the one to report
                log.warning("the metrics of batches %s could not be read after the error (%s)", steps, error)
            raise


def console_line(values: dict[str, float], step: int, max_batches: int) -> str:
    """The console's line for a batch: every metric but the time/... ones."""
    text = ", ".join(f"{k}: {v:.4g}" for k, v in values.items() if not k.startswith("time/"))
    return f"[batch {step}/{max_batches}] {text}"


def host_token_count(host_batch: dict[str, torch.Tensor]) -> int:
    """The batch's tokens (count_batch_tokens) read from the loader's tensors before they are copied to the
    device: on CPU tensors this is no device sync."""
    return int(count_batch_tokens(host_batch))


def train_metrics(metrics, prefix: str) -> dict[str, Derived]:
    """The model's train metrics (LanguageMetrics) of this batch, read at the next log interval: the sums are
    reduced over ranks now (every rank, every batch: a device collective, no sync) and divided when read."""
    if not metrics:
        return {}
    sums = dist.all_reduce_sum(metrics.sums.clone())
    names = metrics.values(prefix, 0.0, 1.0, 0.0)
    return {name: Derived([sums], lambda loss, tokens, correct, name=name: metrics.values(
        prefix, loss, tokens, correct)[name]) for name in names}


def loss_metrics(loss: torch.Tensor, aux: torch.Tensor | None) -> dict[str, Any]:
    """loss/train/total and, for a model with a load-balancing loss, loss/train/loss and loss/train/lbl."""
    out: dict[str, Any] = {"loss/train/total": loss}
    if aux is not None:  # the difference of the two read floats, as the eager code computed it
        out["loss/train/loss"] = Derived([loss, aux], lambda total, lbl: total - lbl)
        out["loss/train/lbl"] = aux
    return out


def should_skip(callbacks: list, state, loss: torch.Tensor) -> bool:
    """Whether a callback skips this step. Only callbacks that decide (they override should_skip_step:
    loss_spike_guard, nan_monitor, ...) are asked, so the loss is read on the host (a device sync) only with one."""
    deciding = [cb for cb in callbacks
                if getattr(type(cb), "should_skip_step", Callback.should_skip_step) is not Callback.should_skip_step]
    if not deciding:
        return False
    value = float(loss)
    return any(cb.should_skip_step(state, value) for cb in deciding)
