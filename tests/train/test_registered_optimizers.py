"""llm-foundry's other optimizer names (clip_lion, adalr_lion, no_op) and amsgrad, against hand-computed steps."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from llmfoundry.core.errors import ConfigError
from llmfoundry.train import optim
from llmfoundry.train.optim_settings import DecoupledAdamSettings, NoOpSettings, TorchAdamSettings
from llmfoundry.train.recipe import TrainConfig, validate
from tests.distributed.helpers import run_job
from tests.helpers import make_trainer, tiny_recipe, weights

D = optim.DELAY  # observations before the delayed mean exists


def _run(opt, p, grad, steps=1):
    for _ in range(steps):
        p.grad = grad.clone()
        opt.step()


def test_clip_lion_clips_an_outlier_gradient_to_threshold_times_the_delayed_mean():
    p = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = optim.DecoupledClipLion([p], lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, outlier_threshold=5.0)
    g = torch.tensor([0.6, 0.8], dtype=torch.float64)  # norm 1
    _run(opt, p, g, D)  # no delayed mean yet: nothing is clipped, and the momentum is (1 - 0.99^D) g
    momentum = (1 - 0.99**D) * g
    torch.testing.assert_close(opt.state[p]["exp_avg"], momentum)
    _run(opt, p, 4 * g)  # norm 4 < 5 * mean(1): kept
    momentum = 0.99 * momentum + 0.01 * 4 * g
    torch.testing.assert_close(opt.state[p]["exp_avg"], momentum)
    assert float(opt.state[p]["clipped_batches"]) == 0
    _run(opt, p, 10 * g)  # norm 10 > 5 * 1: rescaled to norm 5
    momentum = 0.99 * momentum + 0.01 * 5 * g
    torch.testing.assert_close(opt.state[p]["exp_avg"], momentum)
    assert float(opt.state[p]["clipped_batches"]) == 1


def test_delayed_mean_covers_observations_2d_to_d_old():
    state: dict = {}
    means = [optim._observe(state, float(n)) for n in range(1, 3 * D + 1)]  # observation n has the value n
    assert means[D - 1] is None
    assert means[D] == 1.0  # observation D + 1 sees observation 1
    assert means[2 * D] == pytest.approx(sum(range(2, D + 2)) / D)  # observation 2D + 1 sees 2 .. D + 1
    assert means[3 * D - 1] == pytest.approx(sum(range(D + 1, 2 * D + 1)) / D)


def test_adalr_lion_lowers_the_lr_for_timeout_steps_after_an_outlier_momentum():
    p = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    # beta2 = 0: the new momentum is the gradient itself, so its norm is the gradient's
    opt = optim.DecoupledAdaLRLion([p], lr=1e-3, betas=(0.9, 0.0), weight_decay=0.0, outlier_threshold=10.0,
                                   timeout=2, lr_penalty=0.5, min_scale=1e-4)
    g = torch.tensor([0.6, 0.8], dtype=torch.float64)
    _run(opt, p, g, D)
    moves = []
    for scale in (20, 1, 1, 1):  # one outlier, then the two steps of its timeout, then the full lr again
        before = p.detach().clone()
        _run(opt, p, scale * g)
        moves.append(float((before - p.detach())[0]))
    assert moves == pytest.approx([0.5e-3, 0.5e-3, 0.5e-3, 1e-3])


def test_adalr_lion_never_scales_below_min_scale():
    p = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = optim.DecoupledAdaLRLion([p], lr=1.0, betas=(0.9, 0.0), weight_decay=0.0, outlier_threshold=1.5,
                                   timeout=100, lr_penalty=0.1, min_scale=0.05)
    _run(opt, p, torch.ones(1, dtype=torch.float64), D)
    growing = [2.0**k for k in range(1, 4)]  # each is an outlier against the delayed mean of 1
    for value in growing:
        before = float(p.detach())
        _run(opt, p, torch.tensor([value], dtype=torch.float64))
        last = before - float(p.detach())
    assert last == pytest.approx(0.05)  # 0.1^3 would be below min_scale


def test_lion_decays_by_wd_when_the_initial_lr_is_zero_like_llm_foundry():
    p = nn.Parameter(torch.tensor([2.0]))
    opt = optim.DecoupledLionW([p], lr=0.0, betas=(0.9, 0.99), weight_decay=0.1)
    _run(opt, p, torch.zeros(1))
    torch.testing.assert_close(p.detach(), torch.tensor([1.8]))


def test_no_op_leaves_the_weights_alone():
    model = nn.Linear(2, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = optim.build_no_op(NoOpSettings(), model)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert opt.param_groups[0]["lr"] == 0.0


@pytest.mark.parametrize("name", ["decoupled_adamw", "adamw"])
def test_amsgrad_divides_by_the_largest_second_moment_seen(name):
    lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
    p = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    model = nn.Module()
    model.p = p
    settings = (DecoupledAdamSettings if name == "decoupled_adamw" else TorchAdamSettings)(
        lr=lr, betas=[b1, b2], eps=eps, weight_decay=0.0, amsgrad=True)
    opt = (optim.build_decoupled_adamw if name == "decoupled_adamw" else optim.build_adamw)(settings, model)
    m = v = vmax = 0.0
    x = 1.0
    for t, g in enumerate((1.0, 0.01), start=1):  # the second, small gradient would shrink v but not vmax
        _run(opt, p, torch.tensor([g], dtype=torch.float64))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        vmax = max(vmax, v)
        x -= lr * (m / (1 - b1**t)) / (math.sqrt(vmax) / math.sqrt(1 - b2**t) + eps)
        assert float(p.detach()) == pytest.approx(x, rel=1e-12)


def test_decoupled_adamw_defaults_are_composers(mds_root, tokenizer_dir):
    cfg = validate(tiny_recipe(mds_root, tokenizer_dir, optimizer={"name": "decoupled_adamw"}), TrainConfig)
    settings = cfg.optimizer.settings
    assert (settings.lr, settings.weight_decay, settings.amsgrad) == (1e-3, 1e-5, False)


@pytest.mark.parametrize("section", [
    {"name": "clip_lion", "lr": 1e-4, "outlier_threshold": 5.0},
    {"name": "adalr_lion", "lr": 1e-4, "timeout": 50, "lr_penalty": 0.5, "min_scale": 0.01},
    {"name": "no_op"},
    {"name": "decoupled_adamw", "amsgrad": True},
])
def test_recipes_with_llm_foundry_optimizer_names_validate(mds_root, tokenizer_dir, section):
    validate(tiny_recipe(mds_root, tokenizer_dir, optimizer=section), TrainConfig)


def test_no_op_takes_no_keys(mds_root, tokenizer_dir):
    with pytest.raises(ConfigError, match="optimizer.lr"):
        validate(tiny_recipe(mds_root, tokenizer_dir, optimizer={"name": "no_op", "lr": 1e-3}), TrainConfig)


@pytest.mark.parametrize("section", [
    {"name": "clip_lion", "lr": 1e-3},
    {"name": "adalr_lion", "lr": 1e-3, "timeout": 3},
    {"name": "no_op"},
])
def test_resume_keeps_the_optimizer_history(recipe, tmp_path, section):
    straight = make_trainer(recipe(eval_loader=None, max_duration="6ba", optimizer=section,
                                   save_folder=str(tmp_path / "a"), save_interval="3ba"))
    straight.fit()
    resumed = make_trainer(recipe(eval_loader=None, max_duration="6ba", optimizer=section,
                                  load_path=str(tmp_path / "a" / "ep0-ba3")))
    if section["name"] != "no_op":
        state = next(iter(resumed.optimizer.state.values()))
        assert int(state["observations"]) == 3  # the norm history came back with the checkpoint
    resumed.fit()
    expected, got = weights(straight), weights(resumed)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.dist
def test_outlier_aware_lion_on_fsdp2_shards_trains_saves_and_resumes_on_another_world_size(recipe, tmp_path):
    section = {"name": "adalr_lion", "lr": 1e-3, "timeout": 3}
    sharded = recipe(eval_loader=None, max_duration="4ba", optimizer=section, save_folder=str(tmp_path / "a"),
                     save_interval="2ba", python_log_level=None, fsdp_config={"sharding_strategy": "FULL_SHARD"},
                     algorithms={"gradient_clipping": {"clipping_type": "adaptive", "clipping_threshold": 0.05}})
    run_job(sharded, tmp_path, "fsdp")
    resumed = make_trainer(recipe(eval_loader=None, max_duration="4ba", optimizer=section,
                                  load_path=str(tmp_path / "a" / "ep0-ba2")))
    state = next(iter(resumed.optimizer.state.values()))
    assert int(state["observations"]) == 2 and int(state["step"]) == 2
    resumed.fit()


def test_the_outlier_history_keeps_its_dtypes_through_a_bf16_state_dict():
    def make():
        p = nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
        return p, optim.DecoupledAdaLRLion([p], lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, outlier_threshold=10.0,
                                           timeout=5, lr_penalty=0.5, min_scale=0.01)
    p, opt = make()
    _run(opt, p, torch.full((3,), 0.5, dtype=torch.bfloat16), 257)  # 257 is not a bf16 number
    q, fresh = make()
    fresh.load_state_dict(opt.state_dict())
    state = fresh.state[q]
    assert state["observations"].dtype == torch.int64 and int(state["observations"]) == 257
    assert state["norm_history"].dtype == torch.float64 and state["outliers"].dtype == torch.bool
    assert state["exp_avg"].dtype == torch.bfloat16
    torch.testing.assert_close(state["norm_history"], opt.state[p]["norm_history"])
