"""fsdp_config.activation_checkpointing_mode (#30): torchtitan's per-op selective checkpointing and every-Nth-block
checkpointing give the gradients of no checkpointing, holding fewer activations than none and more than full;
compile_config.scope: model compiles the whole model and matches eager."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.utils._python_dispatch import TorchDispatchMode

from llmfoundry.core.errors import ConfigError
from llmfoundry.train import parallel
from llmfoundry.train.recipe import validate
from llmfoundry.train.settings import CompileConfig, FSDPConfig
from tests.models.helpers import tiny_model

CPU = torch.device("cpu")
MODES = ["full", "selective_op", "selective_layer_2"]


def _model(fsdp: dict | None, n_layers: int = 4, compile_cfg: dict | None = None):
    model = tiny_model(n_layers=n_layers, d_model=64, n_heads=4).train()
    parallel.parallelize(model, fsdp=None if fsdp is None else validate(fsdp, FSDPConfig),
                         compile_cfg=None if compile_cfg is None else validate(compile_cfg, CompileConfig),
                         precision="fp32", device=CPU, world_size=1, seed=0)
    return model


def _batch():
    return torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(1))


def _loss_and_grads(model):
    x = _batch()
    loss = model(x, labels=x).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def _activation_bytes(model) -> int:
    """Activation bytes autograd holds between forward and backward (torch's MemTracker)."""
    x = _batch()
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        loss = model(x, labels=x).loss
        held = next(iter(tracker.get_tracker_snapshot("current").values()))[_MemRefType.ACT]
        loss.backward()
    return held


def _mode(mode: str) -> dict:
    return {"activation_checkpointing": True, "activation_checkpointing_mode": mode}


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_gives_the_loss_and_gradients_of_no_checkpointing_bitwise(mode):
    loss, grads = _loss_and_grads(_model(None))
    ckpt_loss, ckpt_grads = _loss_and_grads(_model(_mode(mode)))
    assert torch.equal(loss, ckpt_loss)
    assert grads.keys() == ckpt_grads.keys()
    for name in grads:
        assert torch.equal(grads[name], ckpt_grads[name]), name


def test_selective_modes_hold_fewer_activations_than_none_and_more_than_full():
    held = {mode: _activation_bytes(_model(_mode(mode))) for mode in MODES}
    held["none"] = _activation_bytes(_model(None))
    assert held["full"] < held["selective_op"] < held["none"], held
    assert held["full"] < held["selective_layer_2"] < held["none"], held


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func] += 1
        return func(*args, **(kwargs or {}))


def _backward_counts(model) -> collections.Counter:
    x = _batch()
    loss = model(x, labels=x).loss
    with _CountOps() as counter:
        loss.backward()
    return counter.counts


def test_selective_op_recomputes_every_second_matmul_and_pointwise_ops_but_no_attention_kernel():
    aten = torch.ops.aten
    mm, attention, gelu = aten.mm.default, aten._scaled_dot_product_flash_attention_for_cpu.default, aten.gelu.default
    none, full, op = (_backward_counts(_model(fsdp)) for fsdp in (None, _mode("full"), _mode("selective_op")))
    # a block's forward matmuls: Wqkv, out_proj, up_proj, down_proj. The recompute stops once backward has what it
    # needs (torch's early_stop), and nothing needs down_proj's output: full recomputes 3 of them per block; the
    # per-op policy saves the 1st and 3rd and recomputes the 2nd (and would the 4th): 1 per block
    assert full[mm] - none[mm] == 3 * 4
    assert op[mm] - none[mm] == 1 * 4
    assert full[attention] == 4 and op[attention] == none[attention] == 0
    assert full[gelu] == op[gelu] == 4 and none[gelu] == 0  # pointwise ops are recomputed, not saved


@pytest.mark.parametrize("scope", ["block", "model"])
def test_selective_op_under_compile_gives_the_eager_gradients(scope):
    """Compile traces the per-op policy into its graph (as torchtitan compiles its blocks after selective
    checkpointing); aot_eager: the graphs without inductor's kernels, so the numbers must not move at all."""
    loss, grads = _loss_and_grads(_model(None, n_layers=2))
    model = _model(_mode("selective_op"), n_layers=2, compile_cfg={"backend": "aot_eager", "scope": scope})
    compiled_loss, compiled_grads = _loss_and_grads(model)
    assert torch.equal(loss, compiled_loss)
    for name in grads:
        assert torch.equal(grads[name], compiled_grads[name]), name


def test_selective_layer_n_checkpoints_every_nth_block_as_torchtitan_counts():
    model = _model(_mode("selective_layer_2"), n_layers=5)
    wrapped = [name for name, m in model.named_modules() if "forward" in vars(m)]
    assert wrapped == ["transformer.blocks.1", "transformer.blocks.3"]


@pytest.mark.parametrize(
    ("fsdp", "message"),
    [
        (_mode("selective"), r"^activation_checkpointing_mode: 'selective' is not a mode \(use one of full, "
                             r"selective_op, selective_layer_N\) \(did you mean 'selective_op'\?\)$"),
        (_mode("selective_layer_0"), r"'selective_layer_0': N must be a whole number of at least 1"),
        ({"activation_checkpointing_mode": "selective_op"},
         r"^activation_checkpointing_mode: selective_op applies only with activation_checkpointing: true"),
    ],
)
def test_a_bad_mode_is_one_line_naming_the_key_and_the_fix(fsdp, message):
    with pytest.raises(ConfigError, match=message):
        validate(fsdp, FSDPConfig)


def test_selective_op_with_reentrant_checkpointing_is_refused():
    with pytest.raises(ConfigError, match="activation_checkpointing_reentrant: true cannot apply a per-op policy"):
        _model(dict(_mode("selective_op"), activation_checkpointing_reentrant=True))


def test_compile_scope_is_checked_with_the_recipe():
    with pytest.raises(ConfigError, match=r"^scope: 'blocks' is not one of"):
        validate({"scope": "blocks"}, CompileConfig)


def test_whole_model_compile_compiles_the_model_not_each_block():
    """scope: model (aot_eager: the compile path without inductor's C++ kernels, a minute and more cold on 2 cores;
    inductor's numbers are a GPU matter, benchmarks/gpu_check.sh)."""
    eager_loss, eager_grads = _loss_and_grads(_model(None, n_layers=1))
    model = _model(None, n_layers=1, compile_cfg={"scope": "model", "backend": "aot_eager"})
    assert model._compiled_call_impl is not None  # the whole model, not each block
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in model.blocks())
    loss, grads = _loss_and_grads(model)
    assert torch.equal(loss, eager_loss)
    for name in grads:
        assert torch.equal(grads[name], eager_grads[name]), name