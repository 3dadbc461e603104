"""llm-foundry's fsdp_config keys on FSDP2: mapped where they mean something, a one-time notice where they cannot."""

from __future__ import annotations

import logging
import socket

import pytest
import torch
import torch.distributed as torch_dist
from torch.distributed.fsdp import FSDPModule

from llmfoundry.core import notices
from llmfoundry.core.errors import ConfigError
from llmfoundry.models.mpt.act_ckpt import mark_checkpointed
from llmfoundry.train import parallel
from llmfoundry.train.recipe import TrainConfig, validate
from llmfoundry.train.settings import FSDPConfig
from tests.helpers import make_trainer
from tests.models.helpers import tiny_model

CPU = torch.device("cpu")


def _checkpointed(model) -> list[str]:
    """Names of the modules whose forward was replaced by the activation-checkpointing wrapper."""
    return [name for name, m in model.named_modules() if "forward" in vars(m)]


def _parallelize(model, **fsdp):
    return parallel.parallelize(model, fsdp=validate(fsdp, FSDPConfig), compile_cfg=None, precision="fp32",
                                device=CPU, world_size=1, seed=0)


def test_without_a_target_every_block_is_checkpointed():
    model = tiny_model(n_layers=3)
    _parallelize(model, activation_checkpointing=True)
    assert _checkpointed(model) == ["transformer.blocks.0", "transformer.blocks.1", "transformer.blocks.2"]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("grouped_query_attention", ["transformer.blocks.0.attn", "transformer.blocks.1.attn",
                                     "transformer.blocks.2.attn", "transformer.blocks.3.attn"]),
        (["mptmlp"], [f"transformer.blocks.{i}.ffn" for i in range(4)]),  # mptmlp also matches mptglu
        ({"mptblock": "first-1", "multihead_attention": [3], "low_precision_layernorm": "range-1-3"},
         ["transformer.blocks.0", "transformer.blocks.1.norm_1", "transformer.blocks.1.norm_2",
          "transformer.blocks.2.norm_1", "transformer.blocks.2.norm_2", "transformer.blocks.3.attn"]),
        ({"MPTBlock": "last-2"}, ["transformer.blocks.2", "transformer.blocks.3"]),
        ({"mptglu": 1, "layernorm": "middle-1"}, ["transformer.blocks.0.ffn", "transformer.blocks.1.norm_1",
                                                  "transformer.blocks.1.norm_2"]),
        ({"mptblock": [7]}, []),  # out of range: nothing, as in llm-foundry
    ],
)
def test_activation_checkpointing_target_selects_modules_as_llm_foundry_does(target, expected):
    model = tiny_model(n_layers=4, ffn_config={"ffn_type": "mptglu"})
    mark_checkpointed(model.blocks(), target, "multihead_attention")
    _parallelize(model, activation_checkpointing=True)
    assert _checkpointed(model) == expected
    x = torch.randint(0, 512, (2, 8))
    model.train()
    model(x, labels=x).loss.backward()  # nested / partial checkpointing still trains
    assert all(p.grad is not None for p in model.parameters())


def test_the_target_is_a_model_key_that_reaches_the_trainer(recipe):
    base = recipe()
    model = dict(base["model"], activation_checkpointing_target=["grouped_query_attention"])
    trainer = make_trainer(recipe(eval_loader=None, max_duration="1ba", model=model,
                                  fsdp_config={"activation_checkpointing": True}))
    assert _checkpointed(trainer.model) == ["transformer.blocks.0.attn", "transformer.blocks.1.attn"]
    trainer.fit()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("mlp", r"model\.activation_checkpointing_target: 'mlp' is not a module name \(use one of mptblock,"),
        (["mptblock", "mptmlp"], r"block 0 is assigned to both mptmlp and mptblock"),
        ({"mptblock": "first-x"}, r"activation_checkpointing_target\.mptblock: 'first-x' is not a block id"),
    ],
)
def test_a_bad_target_is_a_validation_error_naming_the_key(recipe, target, message):
    base = recipe()
    with pytest.raises(ConfigError, match=message):
        validate(recipe(model=dict(base["model"], activation_checkpointing_target=target)), TrainConfig)


@pytest.mark.parametrize(
    ("key", "value"),
    [("limit_all_gathers", False), ("use_orig_params", False), ("load_monolith_rank0_only", True),
     ("verbose", True), ("activation_checkpointing_fn", "my_fn"), ("backward_prefetch", "BACKWARD_POST")],
)
def test_an_fsdp1_only_key_set_to_another_value_gets_one_notice(key, value, caplog):
    notices._seen.clear()
    with caplog.at_level(logging.WARNING, logger="llmfoundry"):
        for _ in range(2):
            _parallelize(tiny_model(), **{key: value})
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"fsdp_config.{key}: ")]
    assert len(said) == 1 and "FSDP2" in said[0]


def test_fsdp1_keys_at_values_fsdp2_honours_say_nothing(caplog):
    notices._seen.clear()
    with caplog.at_level(logging.WARNING, logger="llmfoundry"):
        _parallelize(tiny_model(), limit_all_gathers=True, use_orig_params=True, backward_prefetch="BACKWARD_PRE",
                     sync_module_states=False, forward_prefetch=False, auto_wrap=True)
    assert not [r for r in caplog.records if r.getMessage().startswith("fsdp_config.")]


@pytest.fixture
def one_rank_group():
    """A single-process gloo group, so that fully_shard can run inside the test process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    torch_dist.destroy_process_group()


def test_prefetch_keys_map_to_fsdp2_explicit_prefetching(one_rank_group, monkeypatch):
    calls = {"forward": [], "backward": []}
    monkeypatch.setattr(FSDPModule, "set_modules_to_forward_prefetch",
                        lambda self, mods: calls["forward"].append((self, list(mods))))
    monkeypatch.setattr(FSDPModule, "set_modules_to_backward_prefetch",
                        lambda self, mods: calls["backward"].append((self, list(mods))))
    model = tiny_model(n_layers=4)
    cfg = validate({"forward_prefetch": True, "forward_prefetch_limit": 2, "backward_prefetch_limit": 2}, FSDPConfig)
    parallel.apply_fsdp(model, cfg, "fp32", CPU, world_size=1)
    b = model.blocks()
    assert calls["forward"] == [(b[0], [b[1], b[2]]), (b[1], [b[2], b[3]]), (b[2], [b[3]])]
    assert calls["backward"] == [(b[1], [b[0]]), (b[2], [b[1], b[0]]), (b[3], [b[2], b[1]])]


def test_auto_wrap_false_shards_only_the_root(one_rank_group):
    model = tiny_model()
    parallel.apply_fsdp(model, validate({"auto_wrap": False}, FSDPConfig), "fp32", CPU, world_size=1)
    assert isinstance(model, FSDPModule) and not any(isinstance(b, FSDPModule) for b in model.blocks())
    wrapped = tiny_model()
    parallel.apply_fsdp(wrapped, validate({}, FSDPConfig), "fp32", CPU, world_size=1)
    assert all(isinstance(b, FSDPModule) for b in wrapped.blocks())


def test_sync_module_states_broadcasts_rank0s_weights_before_sharding(monkeypatch):
    sent, order = [], []
    monkeypatch.setattr(torch_dist, "broadcast", lambda tensor, src: sent.append((tensor.data_ptr(), src)))
    monkeypatch.setattr(parallel, "apply_fsdp", lambda *a, **k: order.append("shard"))
    model = tiny_model()
    parallel.parallelize(model, fsdp=validate({"sync_module_states": True}, FSDPConfig), compile_cfg=None,
                         precision="fp32", device=CPU, world_size=2, seed=0)
    assert sorted(sent) == sorted((p.data_ptr(), 0) for p in [*model.parameters(), *model.buffers()])
    assert order == ["shard"]
    sent.clear()
    parallel.parallelize(tiny_model(), fsdp=validate({}, FSDPConfig), compile_cfg=None, precision="fp32",
                         device=CPU, world_size=2, seed=0)
    assert sent == []  # off by default, as in llm-foundry
