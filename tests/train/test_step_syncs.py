"""#30: a training step does not read device tensors on the host (a sync on a GPU) except at log intervals.

On CPU nothing waits, so the test counts the reads themselves: every ``aten._local_scalar_dense`` (what
``.item()``, ``float()``, ``int()`` and ``if tensor:`` run) and every ``.tolist()`` / ``.numpy()``. Reads of the
loader's CPU tensors before they are copied to the device (the token-id check and the token count) are host reads
on a GPU too, and are left out by the function they happen in; so are reads of the optimizer's step counts, which
torch keeps on the CPU unless the optimizer is fused (as on CUDA).
"""

from __future__ import annotations

import traceback
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from llmfoundry.train import optim
from llmfoundry.train.step_metrics import Derived, resolve_metrics
from tests.helpers import make_trainer, tiny_recipe

HOST_BATCH_READS = {"check_token_ids", "host_token_count"}  # they read the loader's CPU tensors, before the copy


class HostReads(TorchDispatchMode):
    """Counts reads of tensor values on the host, by the batch being trained and whether metrics were being logged."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.batch = 0  # the batch train_step is running (1-based); 0 outside it
        self.flushing = False
        self.in_step: list[tuple[int, str]] = []  # (batch, where) of reads inside a step, outside a log
        self.flushed_at: list[int] = []  # batches after which pending metrics were read and logged
        self.optimizer = None
        for name in ("tolist", "numpy"):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(original))

    def _counted(self, original):
        def read(tensor, *args, **kwargs):
            self.record(tensor)
            return original(tensor, *args, **kwargs)
        return read

    def record(self, tensor: torch.Tensor) -> None:
        if self.batch == 0 or self.flushing or self._host_step_count(tensor):
            return
        stack = traceback.extract_stack()
        if not HOST_BATCH_READS & {frame.name for frame in stack}:
            self.in_step.append((self.batch, " <- ".join(f"{f.name}:{f.lineno}" for f in reversed(stack[-8:-2]))))

    def _host_step_count(self, tensor: torch.Tensor) -> bool:
        steps = (state.get("step") for state in self.optimizer.state.values())
        return tensor.device.type == "cpu" and any(tensor is step for step in steps)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.record(args[0])
        return func(*args, **(kwargs or {}))

    def watch(self, trainer) -> None:
        step, log, flush = trainer.train_step, trainer._log, trainer.metrics_log.flush
        self.optimizer = trainer.optimizer

        def train_step(batch):
            self.batch = trainer.time.batch + 1
            try:
                return step(batch)
            finally:
                self.batch = 0

        def logged(metrics, console, flush=False):
            self.batch = trainer.time.batch  # the step's _log is part of the step
            try:
                return log(metrics, console, flush)
            finally:
                self.batch = 0

        def flushed():
            if trainer.metrics_log.pending:
                self.flushed_at.append(trainer.time.batch)
            self.flushing = True
            try:
                return flush()
            finally:
                self.flushing = False

        trainer.train_step, trainer._log, trainer.metrics_log.flush = train_step, logged, flushed


def quickstart_like(mds_root, tokenizer_dir, **overrides):
    """The quickstart's shape of recipe (decoupled_adamw, gradient clipping, train metrics, lr_monitor, periodic
    eval, a console interval) with the monitors llm-foundry's recipes add."""
    keys = {"console_log_interval": "4ba", "log_to_console": True, "loggers": {"inmemory": {}},
            "callbacks": {"lr_monitor": {}, "speed_monitor": {"window_size": 2}, "runtime_estimator": {},
                          "memory_monitor": {}}}
    return tiny_recipe(mds_root, tokenizer_dir, **{**keys, **overrides})


def test_a_training_step_reads_no_device_tensor_between_log_intervals(mds_root, tokenizer_dir, monkeypatch, capsys):
    trainer = make_trainer(quickstart_like(mds_root, tokenizer_dir))
    reads = HostReads(monkeypatch)
    reads.watch(trainer)
    with reads:
        trainer.fit()
    assert reads.in_step == []
    # read once per console interval (4ba) and at the end; the eval at 6ba merges into batch 6's metrics
    assert reads.flushed_at == [4, 8, 12]
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[batch ")]
    assert [line.split("]")[0] for line in printed] == ["[batch 4/12", "[batch 8/12", "[batch 12/12"]
    logger = trainer.loggers[0]
    assert [t.batch for t, _ in logger.data["loss/train/total"]] == list(range(1, 13))  # every batch, at its step
    assert all(isinstance(v, float) for _, v in logger.data["metrics/train/LanguagePerplexity"])


def test_logged_values_are_the_same_whether_read_every_batch_or_at_intervals(mds_root, tokenizer_dir):
    def logged(interval: str) -> dict:
        trainer = make_trainer(quickstart_like(mds_root, tokenizer_dir, console_log_interval=interval,
                                               callbacks={"lr_monitor": {}}))
        result = trainer.fit()
        return {k: [(t, v) for t, v in series] for k, series in trainer.loggers[0].data.items()}, result

    every, every_result = logged("1ba")
    intervals, intervals_result = logged("5ba")
    assert every.keys() == intervals.keys() and "grad_norm" in every and "metrics/train/TokenAccuracy" in every
    assert every == intervals  # bitwise: the same floats at the same steps
    assert every_result == intervals_result


def test_a_callback_that_decides_on_skipping_reads_the_loss_every_batch(mds_root, tokenizer_dir, monkeypatch):
    """loss_spike_guard needs the loss on the host to decide; the step reads it then, and only then."""
    trainer = make_trainer(quickstart_like(mds_root, tokenizer_dir, max_duration="3ba",
                                           callbacks={"loss_spike_guard": {}}))
    reads = HostReads(monkeypatch)
    reads.watch(trainer)
    with reads:
        trainer.fit()
    assert sorted({batch for batch, _ in reads.in_step}) == [1, 2, 3]
    assert all("should_skip" in where for _, where in reads.in_step)


def test_metrics_read_at_once_are_the_eager_values():
    loss, aux = torch.tensor(2.5, dtype=torch.float32) / 3, torch.tensor(0.1, dtype=torch.float32) / 7
    sums = torch.tensor([10.0, 4.0, 3.0], dtype=torch.float64)
    pending = [{"loss/train/total": loss, "loss/train/loss": Derived([loss, aux], lambda t, a: t - a),
                "ratio": Derived([sums], lambda a, b, c: a / b), "time/batch": 1.0}]
    (values,) = resolve_metrics(pending)
    assert values == {"loss/train/total": float(loss), "loss/train/loss": float(loss) - float(aux), "ratio": 2.5,
                      "time/batch": 1.0}
    assert float(pending[0]["loss/train/loss"]) == float(loss) - float(aux)  # a callback's read, at once
    assert f"{pending[0]['ratio']:.2f}" == "2.50"


def test_adamw_stays_the_per_tensor_loop_on_cpu_and_a_checkpoint_from_a_gpu_does_not_change_that():
    model = torch.nn.Linear(4, 3)
    settings = type("S", (), {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 1e-5,
                              "param_groups": [], "disable_grad": None})()
    opt = optim.build_decoupled_adamw(settings, model)
    assert opt.param_groups[0]["fused"] is None and opt.param_groups[0]["foreach"] is None  # torch's CPU default
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = opt.state_dict()
    state["param_groups"][0]["fused"] = True  # as a GPU run writes it
    opt.load_state_dict(state)
    assert opt.param_groups[0]["fused"] is None
    assert all(s["step"].device.type == "cpu" for s in opt.state.values())
    # decoupled weight decay: wd / lr_0, so torch's lr_t * wd' is wd * lr_t / lr_0 (llm-foundry's rule)
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(1e-5 / 1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_step_makes_no_synchronizing_call_between_log_intervals(mds_root, tokenizer_dir):
    """What the CPU test counts, seen by CUDA itself: torch's sync debug mode warns on every call that waits for the
    device (a read, a blocking copy)."""
    trainer = make_trainer(quickstart_like(mds_root, tokenizer_dir, eval_interval="100ba"))
    assert trainer.device.type == "cuda"
    syncs: list[tuple[int, str]] = []
    step, log = trainer.train_step, trainer._log

    def watched(call, *args, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return call(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                syncs.extend((trainer.time.batch, str(w.message)[:200]) for w in caught
                             if "synchroniz" in str(w.message))

    trainer.train_step = lambda batch: watched(step, batch)
    trainer._log = lambda metrics, console, flush=False: (log(metrics, console, flush) if console or flush
                                                          else watched(log, metrics, console, flush))
    trainer.fit()
    print("synchronizing calls by batch:", syncs)
    assert [(batch, what) for batch, what in syncs if batch > 1] == []  # the first step also sets things up


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_adamw_is_fused_on_cuda_and_matches_the_loop_closely():
    torch.manual_seed(0)
    results = {}
    for device in ("cpu", "cuda"):
        model = torch.nn.Linear(64, 32).to(device)
        settings = type("S", (), {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 1e-4,
                                  "param_groups": [], "disable_grad": None})()
        torch.manual_seed(1)
        with torch.no_grad():
            model.weight.copy_(torch.randn(32, 64))
            model.bias.zero_()
        opt = optim.build_decoupled_adamw(settings, model)
        assert opt.param_groups[0]["fused"] is (True if device == "cuda" else None)
        for i in range(5):
            torch.manual_seed(10 + i)
            x = torch.randn(8, 64).to(device)
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        results[device] = model.weight.detach().cpu()
    torch.testing.assert_close(results["cuda"], results["cpu"], rtol=1e-5, atol=1e-6)


def test_a_derived_metric_computes_and_compares_like_the_float_it_stands_for():
    """A plugin callback's arithmetic on a metric keeps working now that metrics are read lazily."""
    from llmfoundry.train.step_metrics import Derived

    value = Derived([torch.tensor(2.0), torch.tensor(0.5)], lambda total, lbl: total - lbl)
    assert value > 1 and value <= 1.5 and value == 1.5 and not value < 1.5
    assert (value - 1, 1 - value, value * 2, 3 / value, value + value) == (0.5, -0.5, 3.0, 2.0, 3.0)
    assert (round(value, 2), -value, abs(value), f"{value:.2f}") == (1.5, -1.5, 1.5, "1.50")


def test_console_intervals_read_a_step_late_on_a_gpu_with_the_same_lines_and_values(mds_root, tokenizer_dir,
                                                                                  monkeypatch, capsys):
    """On CUDA a console interval is read after the next step is queued (MetricsLog's lag: a copy to pinned memory
    behind the step, read one step later). The same bookkeeping on CPU tensors must print the same console, in
    the same order, and log the same values at the same steps as reading at once."""
    from llmfoundry.train import step_metrics

    def run(lag_devices):
        monkeypatch.setattr(step_metrics, "LAG_DEVICES", lag_devices)
        trainer = make_trainer(quickstart_like(mds_root, tokenizer_dir, console_log_interval="1ba",
                                               callbacks={"lr_monitor": {}}, save_interval="5ba",
                                               save_folder=str(mds_root.parent / f"lag-{len(lag_devices)}")))
        staged = []
        stage = trainer.metrics_log._stage
        monkeypatch.setattr(trainer.metrics_log, "_stage", lambda: (staged.append(trainer.time.batch), stage()))
        result = trainer.fit()
        return capsys.readouterr().out.splitlines(), trainer.loggers[0].data, result, staged

    at_once, logged_at_once, result_at_once, _ = run(("cuda",))
    lagged, logged_lagged, result_lagged, staged = run(("cuda", "cpu"))
    assert staged == list(range(1, 12))  # every console batch but the last (read at once)
    assert [line.replace("lag-2", "lag-1") for line in lagged] == at_once
    assert logged_lagged == logged_at_once and result_lagged == result_at_once


def test_a_step_sums_its_host_numbers_in_one_collective(mds_root, tokenizer_dir, monkeypatch):
    """The trainer's token count and speed_monitor's FLOPs (Callback.host_numbers) are summed over ranks in one host
    collective per batch, not one each: at a thousand ranks each is a round trip of the gloo group."""
    from llmfoundry.train import host_sums

    calls: list[list[str]] = []
    summed = host_sums.host_sums

    def counted(values, dtype=torch.int64):
        calls.append(list(values))
        return summed(values, dtype)

    monkeypatch.setattr(host_sums, "host_sums", counted)
    recipe = tiny_recipe(mds_root, tokenizer_dir, max_duration="3ba", callbacks={"speed_monitor": {"window_size": 1}})
    trainer = make_trainer(recipe)
    trainer.fit()
    assert len(calls) == 3 and all(len(values) == 2 for values in calls), calls
    assert trainer.state.host_sums["speed_monitor/flops"] == calls[-1][1] > 0
    assert trainer.state.host_sums["tokens"] == calls[-1][0] > 0
