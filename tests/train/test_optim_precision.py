"""Optimizers, precision policies, microbatching and meta-device init, checked against hand-computed values."""

from __future__ import annotations

import contextlib
import logging
import math

import pytest
import torch
from torch import nn

from llmfoundry.core import notices
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.precision import autocast, supported_precision
from llmfoundry.train import optim
from llmfoundry.train.recipe import TrainConfig, validate
from llmfoundry.train.settings import FSDPConfig
from llmfoundry.train.compat import device_batch_size
from llmfoundry.train.optim_settings import AdamSettings, ParamGroup
from tests.helpers import make_trainer


def test_lion_step_matches_a_hand_computed_example():
    p = nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = optim.DecoupledLionW([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.0)
    p.grad = torch.tensor([0.5, -0.1])
    opt.step()  # update = sign(0.1 * g) = [1, -1]; momentum = 0.01 * g
    torch.testing.assert_close(p.detach(), torch.tensor([0.9, -1.9]))
    torch.testing.assert_close(opt.state[p]["exp_avg"], torch.tensor([0.005, -0.001]))
    p.grad = torch.tensor([-0.01, 0.2])
    opt.step()  # c = 0.9 * m + 0.1 * g = [0.0035, 0.0191]: momentum outvotes the first gradient's sign
    torch.testing.assert_close(p.detach(), torch.tensor([0.8, -2.0]))


def test_lion_weight_decay_is_decoupled_from_the_learning_rate_size():
    p = nn.Parameter(torch.tensor([2.0]))
    opt = optim.DecoupledLionW([p], lr=0.5, betas=(0.9, 0.99), weight_decay=0.1)
    p.grad = torch.zeros(1)
    opt.step()  # sign(0) = 0: only the decay, by wd * lr / lr0 = 0.1
    torch.testing.assert_close(p.detach(), torch.tensor([1.8]))
    opt.param_groups[0]["lr"] = 0.25  # a schedule halved the lr: the decay halves too
    opt.step()
    torch.testing.assert_close(p.detach(), torch.tensor([1.8 * 0.95]))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(4, 2)
        self.proj = nn.Linear(2, 2)


def test_decoupled_adamw_decays_by_wd_times_the_schedule_not_by_lr_times_wd():
    for name, expected in (("decoupled_adamw", [1 - 0.01, 1 - 0.005]), ("adamw", [1 - 1e-3 * 0.01, 1 - 5e-4 * 0.01])):
        model = Tiny()
        start = model.proj.weight.detach().clone()
        settings = AdamSettings(lr=1e-3, weight_decay=0.01)
        opt = (optim.build_decoupled_adamw if name == "decoupled_adamw" else optim.build_adamw)(settings, model)
        for factor, lr in zip(expected, (1e-3, 5e-4)):
            for group in opt.param_groups:
                group["lr"] = lr
            for p in model.parameters():
                p.grad = torch.zeros_like(p)  # no gradient: the step is the decay alone
            before = model.proj.weight.detach().clone()
            opt.step()
            torch.testing.assert_close(model.proj.weight.detach(), before * factor, rtol=1e-6, atol=0), name
        assert not torch.equal(start, model.proj.weight)


def test_param_groups_and_disable_grad():
    model = Tiny()
    settings = AdamSettings(lr=1e-3, weight_decay=0.1, disable_grad="^wte",
                            param_groups=[ParamGroup(param_str_match=r"\.bias$", lr=0.5, weight_decay=0.0)])
    opt = optim.build_decoupled_adamw(settings, model)
    assert not model.wte.weight.requires_grad
    assert [len(g["params"]) for g in opt.param_groups] == [1, 1]
    assert opt.param_groups[1]["params"][0] is model.proj.bias and opt.param_groups[1]["lr"] == 0.5
    assert opt.param_groups[1]["weight_decay"] == 0.0
    with pytest.raises(ConfigError, match=r"param_groups\[0\].param_str_match: 'nothing' matches no parameter"):
        optim.build_adamw(AdamSettings(param_groups=[ParamGroup(param_str_match="nothing")]), Tiny())


def test_global_batch_must_divide_across_ranks():
    assert device_batch_size(8, 2) == 4
    with pytest.raises(ConfigError, match="global_train_batch_size: 8 does not divide across 3 ranks"):
        device_batch_size(8, 3)


@pytest.mark.parametrize("precision", ["fp32", "amp_bf16", "amp_fp16", "bf16"])
def test_every_precision_trains(recipe, precision):
    trainer = make_trainer(recipe(eval_loader=None, max_duration="2ba", precision=precision))
    metrics = trainer.fit()
    assert math.isfinite(metrics["loss/train/total"])
    assert trainer.model.get_input_embeddings().weight.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
    assert (trainer.scaler is not None) == (precision == "amp_fp16")


def test_auto_microbatch_halves_on_out_of_memory_and_redoes_the_step_exactly(recipe):
    grads = []
    for micro in ("auto", 2):
        trainer = make_trainer(recipe(eval_loader=None, max_duration="1ba", device_train_microbatch_size=micro))
        assert trainer.microbatch_size == (8 if micro == "auto" else 2)
        real = trainer._forward_backward

        def flaky(batch, targets, real=real, trainer=trainer):
            loss = real(batch, targets)  # gradients accumulate, then the "allocation" fails
            if trainer.microbatch_size > 2:
                raise torch.cuda.OutOfMemoryError("simulated")
            return loss

        trainer._forward_backward = flaky
        step = trainer.optimizer.step

        def record(*a, trainer=trainer, step=step, **k):
            grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters()})
            return step(*a, **k)

        trainer.optimizer.step = record
        trainer.fit()
        assert trainer.microbatch_size == 2
    for name in grads[0]:
        assert torch.equal(grads[0][name], grads[1][name]), name


def test_meta_device_model_is_materialised_and_trains(recipe):
    base = recipe()
    trainer = make_trainer(recipe(eval_loader=None, max_duration="3ba", model=dict(base["model"], init_device="meta")))
    assert not any(p.is_meta for p in trainer.model.parameters())
    assert trainer.model.get_input_embeddings().weight.std() > 0
    metrics = trainer.fit()
    assert math.isfinite(metrics["loss/train/total"])


def test_compile_config_compiles_each_block(recipe):
    trainer = make_trainer(recipe(eval_loader=None, max_duration="1ba", compile_config={"backend": "eager"}))
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in trainer.model.blocks())
    assert math.isfinite(trainer.fit()["loss/train/total"])


def test_fsdp_keys_validate_and_unknown_ones_are_named():
    cfg = validate({"sharding_strategy": "HYBRID_SHARD", "mixed_precision": {"param_dtype": "bf16"},
                    "limit_all_gathers": True, "use_orig_params": False}, FSDPConfig)
    assert cfg.sharding_strategy == "HYBRID_SHARD" and cfg.mixed_precision == {"param_dtype": "bf16"}
    with pytest.raises(ConfigError, match="activation_checkpoint: unknown key"):
        validate({"activation_checkpoint": True}, FSDPConfig)
    with pytest.raises(ConfigError, match=r"^mixed_precision.param_dtype: 'fp8' is not a dtype \(use one of fp32,"):
        validate({"mixed_precision": {"param_dtype": "fp8"}}, FSDPConfig)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.is_bf16_supported(), reason="needs a machine without bf16")
def test_default_precision_is_amp_bf16_and_without_a_bf16_gpu_it_trains_in_fp32_with_one_notice(recipe, caplog):
    assert validate(recipe(), TrainConfig).precision == "amp_bf16"  # llm-foundry's default
    notices._seen.clear()
    with caplog.at_level(logging.WARNING, logger="llmfoundry"):
        trainer = make_trainer(recipe(eval_loader=None, max_duration="2ba"))
        assert math.isfinite(trainer.fit()["loss/train/total"])
        make_trainer(recipe(eval_loader=None, max_duration="1ba"))  # a second run in the process: no new notice
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision: ")]
    assert len(said) == 1 and "trains in fp32" in said[0]
    assert trainer.cfg.precision == "fp32" and trainer.scaler is None
    assert isinstance(autocast(trainer.cfg.precision, trainer.device), contextlib.nullcontext)


def test_amp_bf16_runs_as_asked_on_a_bf16_gpu_and_falls_back_on_one_without(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert supported_precision("amp_bf16", torch.device("cuda")) == ("amp_bf16", None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    policy, note = supported_precision("amp_bf16", torch.device("cuda"))
    assert policy == "fp32" and note.startswith("precision: amp_bf16") and "a GPU without bf16" in note
    assert supported_precision("amp_fp16", torch.device("cpu")) == ("amp_fp16", None)  # asked for: kept
