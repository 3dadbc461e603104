"""Composer's algorithm names: adaptive gradient clipping (also on FSDP2 shards) and the model-surgery ones."""

from __future__ import annotations

import subprocess
import textwrap

import pytest
import torch
from torch import nn

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.algorithm_settings import GradientClippingSettings
from llmfoundry.train.algorithms import GradientClipping, clip_adaptive_
from llmfoundry.train.recipe import TrainConfig, validate
from tests.distributed.helpers import torchrun_args, worker_env
from tests.helpers import make_trainer, tiny_recipe


def test_adaptive_clipping_scales_each_row_to_threshold_times_its_weight_norm():
    layer = nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[3.0, 4.0], [0.0, 1.0]]))
        layer.bias.copy_(torch.tensor([0.0, 2.0]))
    layer.weight.grad = torch.tensor([[30.0, 40.0], [0.0, 0.05]])
    layer.bias.grad = torch.tensor([3.0, 4.0])
    clip = GradientClipping(GradientClippingSettings(clipping_type="adaptive", clipping_threshold=0.1))
    assert clip.clip(layer) is None
    # row 0: |w| = 5, |g| = 50 > 0.1 * 5, scaled by 0.5 / 50; row 1: |g| = 0.05 < 0.1 * 1, kept
    torch.testing.assert_close(layer.weight.grad, torch.tensor([[0.3, 0.4], [0.0, 0.05]]))
    # the bias is one unit: |w| = 2, |g| = 5, scaled by 0.2 / 5
    torch.testing.assert_close(layer.bias.grad, torch.tensor([0.12, 0.16]))


def test_adaptive_clipping_zeroes_gradients_of_zero_weights_and_keeps_zero_gradients():
    p = nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    clip_adaptive_(p, 0.5)  # Composer's AGC has no epsilon: a zero weight allows no gradient
    assert torch.equal(p.grad, torch.zeros(3))
    q = nn.Parameter(torch.zeros(2))
    q.grad = torch.zeros(2)
    clip_adaptive_(q, 0.5)  # 0 / 0 counts as within the threshold
    assert torch.equal(q.grad, torch.zeros(2))


def test_adaptive_clipping_trains(recipe):
    trainer = make_trainer(recipe(eval_loader=None, max_duration="2ba",
                                  algorithms={"gradient_clipping": {"clipping_type": "adaptive",
                                                                    "clipping_threshold": 0.01}}))
    metrics = trainer.fit()
    assert "grad_norm" not in metrics


_FSDP_WORKER = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from llmfoundry.train.algorithm_settings import GradientClippingSettings
    from llmfoundry.train.algorithms import GradientClipping

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 3))
    x = torch.randn(5, 4)
    clip = GradientClipping(GradientClippingSettings(clipping_type="adaptive", clipping_threshold=0.02))
    whole = make()
    (whole(x) ** 2).sum().backward()
    clip.clip(whole)
    sharded = make()
    for layer in sharded:
        fully_shard(layer)
    fully_shard(sharded)
    (sharded(x) ** 2).sum().backward()
    clip.clip(sharded)
    for (name, a), b in zip(whole.named_parameters(), sharded.parameters()):
        assert b.grad.placements[0].is_shard(), name
        torch.testing.assert_close(b.grad.full_tensor(), a.grad, msg=name)
    # value: unsharded, each element is clamped; under FSDP, Composer scales by the largest magnitude instead
    value = GradientClipping(GradientClippingSettings(clipping_type="value", clipping_threshold=0.05))
    for model in (whole, sharded):
        model.zero_grad()
        (model(x) ** 2).sum().backward()
    grads = [p.grad.clone() for p in whole.parameters()]
    largest = max(float(g.abs().max()) for g in grads)
    assert largest > 0.05
    value.clip(sharded)
    for g, b in zip(grads, sharded.parameters()):
        torch.testing.assert_close(b.grad.full_tensor(), g * (0.05 / (largest + 1e-6)))
    print("OK", dist.get_rank())
    dist.destroy_process_group()
""")


@pytest.mark.dist
def test_adaptive_clipping_on_fsdp2_shards_equals_clipping_the_whole_model(tmp_path):
    script = tmp_path / "agc_worker.py"
    script.write_text(_FSDP_WORKER)
    done = subprocess.run([*torchrun_args(2), str(script)], cwd=tmp_path, env=worker_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("OK") == 2


@pytest.mark.parametrize("name, key", [
    ("alibi", "model.attn_config.alibi: true"),
    ("gated_linear_units", "model.ffn_config.ffn_type: mptglu"),
    ("low_precision_layernorm", "model.norm_type: low_precision_layernorm"),
])
def test_model_surgery_algorithms_point_to_the_model_key(mds_root, tokenizer_dir, name, key):
    settings = {"max_sequence_length": 2048} if name == "alibi" else {}
    r = tiny_recipe(mds_root, tokenizer_dir, algorithms={name: settings})
    with pytest.raises(ConfigError, match=f"algorithms.{name}: Composer's model surgery .*{key}") as error:
        validate(r, TrainConfig)
    assert "\n" not in str(error.value)
