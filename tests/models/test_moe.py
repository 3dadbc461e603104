"""Mixture-of-experts MPT (ffn_type mb_moe / mb_dmoe / torch_dmoe): routing, experts, load-balancing loss, init,
FLOPs, the mbmoe_tok_per_expert callback, training through `llmfoundry train` and FSDP2 on 2 ranks."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
import torch.nn.functional as F

from llmfoundry.core import notices
from llmfoundry.core.errors import ConfigError
from llmfoundry.models.layers.moe import DroplessMoE, ExpertMLP, grouped_matmul, load_balancing_loss
from llmfoundry.config.validate import validate
from llmfoundry.models.mpt.arch import MPTModelSettings
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM
from llmfoundry.registry import models
from tests.helpers import make_trainer, tiny_recipe
from tests.models.helpers import tiny_config, tiny_model

MOE = dict(ffn_type="mb_dmoe", moe_num_experts=4, moe_top_k=2, ffn_hidden_size=48)


def moe_model(seed: int = 0, **ffn) -> MPTForCausalLM:
    return tiny_model(seed, ffn_config={**MOE, **ffn}).train()


def reference_moe(ffn: DroplessMoE, x: torch.Tensor) -> torch.Tensor:
    """llm-foundry's torch_dmoe computation, written out: per expert, gather its tokens, run its FFN, weight the
    outputs and add them back (no sorting, no grouped matmul)."""
    shape, mlp = x.shape, ffn.experts.mlp
    x = x.reshape(-1, shape[-1])
    scores = F.linear(x, ffn.router.layer.weight).softmax(dim=-1)
    weights, experts = scores.topk(ffn.top_k, dim=-1)
    if ffn.router.normalize:
        weights = weights / weights.norm(p=ffn.router.normalize, dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(ffn.num_experts):
        token, choice = torch.where(experts == e)
        h = mlp.act(x[token] @ mlp.w1[e].T)
        if mlp.glu:
            h = h * (x[token] @ mlp.v1[e].T)
        out.index_add_(0, token, (h @ mlp.w2[e]) * weights[token, choice, None])
    if ffn.experts.bias is not None:
        out = out + ffn.experts.bias
    return out.view(shape)


def loss_of(model: MPTForCausalLM, ids: torch.Tensor, reference: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, cross-entropy) of ``model``; with ``reference``, every MoE layer computed by ``reference_moe``
    (its routing statistics, which only the training loss reads, still come from the layer itself)."""
    saved = {}
    if reference:
        for block in model.transformer.blocks:
            forward = saved[block] = block.ffn.forward
            block.ffn.forward = lambda x, ffn=block.ffn, forward=forward: (reference_moe(ffn, x), forward(x)[1])
    try:
        logits = model(ids).logits
    finally:
        for block, forward in saved.items():
            block.ffn.forward = forward
    return logits, F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped_mm", "loop"])
@pytest.mark.parametrize("ffn", [
    dict(ffn_type="mb_dmoe"),
    dict(ffn_type="torch_dmoe", mlp_type="glu", moe_normalize_expert_weights=1),
    dict(ffn_type="mb_moe", moe_top_k=1, ffn_act_fn={"name": "silu"}),
], ids=["mb_dmoe_top2", "torch_dmoe_glu_normalized", "mb_moe_top1_silu"])
def test_moe_loss_matches_a_loop_over_experts_reference(ffn, grouped):
    model = tiny_model(0, no_bias=False, ffn_config={**MOE, **ffn}).eval()
    with torch.no_grad():
        for block in model.transformer.blocks:
            block.ffn.experts.mlp.grouped = grouped
            if block.ffn.experts.bias is not None:
                block.ffn.experts.bias.normal_()
    ids = torch.randint(0, 512, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, loss = loss_of(model, ids)
        ref_logits, ref_loss = loss_of(model, ids, reference=True)
    assert abs(float(loss) - float(ref_loss)) <= 1e-5
    assert (logits - ref_logits).abs().max() <= 1e-5


def test_grouped_mm_and_the_per_expert_fallback_agree_in_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    counts = torch.tensor([3, 0, 5, 1])  # an expert without tokens too
    x, w = torch.randn(9, 16, generator=g), torch.randn(4, 16, 8, generator=g)
    results = []
    for grouped in (True, False):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        grouped_matmul(xi, wi, counts, grouped).sum().backward()  # sum(): a stride-0 gradient
        results.append((grouped_matmul(x, w, counts, grouped), xi.grad, wi.grad))
    for a, b in zip(*results):
        assert torch.allclose(a, b, atol=1e-6)
    assert (results[0][2][1] == 0).all()


@pytest.mark.parametrize("glu", [False, True], ids=["mlp", "glu"])
def test_identical_experts_with_top_k_all_equal_the_dense_model(glu):
    E = 4
    moe = tiny_model(0, ffn_config={"ffn_type": "torch_dmoe", "moe_num_experts": E, "moe_top_k": E,
                                    "moe_normalize_expert_weights": 1, "ffn_hidden_size": 48,
                                    "mlp_type": "glu" if glu else "mlp"})
    dense = tiny_model(1, ffn_config={"ffn_type": "mptglu" if glu else "mptmlp", "ffn_hidden_size": 48})
    state = dense.state_dict()
    with torch.no_grad():
        for name, p in moe.named_parameters():
            if ".ffn." not in name:
                p.copy_(state[name])
        for i, block in enumerate(moe.transformer.blocks):
            mlp, pre = block.ffn.experts.mlp, f"transformer.blocks.{i}.ffn."
            block.ffn.router.layer.weight.normal_()  # any router: the weights of all experts sum to 1
            mlp.w1.copy_(state[pre + ("gate_proj" if glu else "up_proj") + ".weight"].expand_as(mlp.w1))
            mlp.w2.copy_(state[pre + "down_proj.weight"].T.expand_as(mlp.w2))
            if glu:
                mlp.v1.copy_(state[pre + "up_proj.weight"].expand_as(mlp.v1))
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(2))
    assert (moe(ids).logits - dense(ids).logits).abs().max() <= 1e-5


def test_moe_blocks_compile_to_one_graph_with_the_same_loss():
    model = moe_model(0)
    ids = torch.randint(0, 512, (2, 16))
    with torch.autocast("cpu", torch.bfloat16):  # bf16: torch._grouped_mm inside the compiled graph
        eager = model(ids, labels=ids)
        for block in model.transformer.blocks:
            block.compile(backend="aot_eager", fullgraph=True)
        compiled = model(ids, labels=ids)
    compiled.loss.backward()
    assert torch.equal(compiled.loss.detach(), eager.loss.detach())
    assert torch.equal(compiled.aux_loss.detach(), eager.aux_loss.detach())
    assert model.transformer.blocks[1].ffn.experts.mlp.w1.grad.abs().sum() > 0


def test_a_uniform_router_has_a_load_balancing_loss_of_one():
    model = moe_model(0, moe_loss_weight=0.25)
    with torch.no_grad():
        for block in model.transformer.blocks:
            block.ffn.router.layer.weight.zero_()  # every expert gets probability 1/E
    ids = torch.randint(0, 512, (2, 16))
    with torch.no_grad():
        out = model(ids, labels=ids)
    assert float(out.aux_loss) == pytest.approx(0.25, abs=1e-6)  # moe_loss_weight * 1.0
    ce = F.cross_entropy(out.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    assert float(out.loss) == pytest.approx(float(ce) + 0.25, abs=1e-5)
    # MegaBlocks' value per layer: E / (N k) * sum_e tokens_e * mean_prob_e, whatever the counts are
    counts, scores = torch.tensor([32, 0, 16, 16]), torch.full((4,), 0.25)
    assert float(load_balancing_loss([(counts, scores)] * 3, 32, 2, in_fp32=True)) == pytest.approx(1.0)
    # all tokens on one expert that also takes all the probability: E times the uniform value
    assert float(load_balancing_loss([(torch.tensor([32, 0, 0, 0]), torch.tensor([1.0, 0, 0, 0]))], 32, 1, True)) == 4.0


def test_load_balancing_loss_is_trained_only_in_training_and_has_gradients_for_the_router():
    model = moe_model(0)
    ids = torch.randint(0, 512, (2, 16))
    out = model(ids)
    assert out.aux_loss is not None and out.aux_loss.requires_grad
    out.aux_loss.backward()
    assert model.transformer.blocks[0].ffn.router.layer.weight.grad.abs().sum() > 0
    assert model.eval()(ids).aux_loss is None
    # torch_dmoe adds none by default (llm-foundry's has none); moe_loss_weight turns it on
    assert moe_model(0, ffn_type="torch_dmoe")(ids).aux_loss is None
    assert moe_model(0, ffn_type="torch_dmoe", moe_loss_weight=0.1)(ids).aux_loss is not None


def test_tokens_per_expert_sum_to_tokens_times_top_k_and_uniform_assignment_balances_them():
    model = moe_model(0)
    ids = torch.randint(0, 512, (3, 16))
    model(ids)
    model(ids[:1])
    counts = model.tokens_per_expert
    assert counts.shape == (2, 4) and counts.sum(dim=1).tolist() == [(48 + 16) * 2] * 2
    model = moe_model(0, uniform_expert_assignment=True)
    model(ids)
    assert model.tokens_per_expert.tolist() == [[24] * 4] * 2


def test_experts_are_initialised_like_dense_ffns_of_their_width():
    torch.manual_seed(0)
    config = tiny_config(d_model=64, n_layers=4, ffn_config={**MOE, "moe_num_experts": 8, "ffn_hidden_size": 256},
                         init_config={"name": "kaiming_normal_"})
    mlp = MPTForCausalLM(config).transformer.blocks[0].ffn.experts.mlp
    assert isinstance(mlp, ExpertMLP)
    w1, w2 = mlp.w1.detach(), mlp.w2.detach()
    # kaiming normal (relu): std sqrt(2 / fan_in); up: fan_in d_model; down: fan_in hidden, / sqrt(2 * n_layers)
    assert float(w1.std()) == pytest.approx(math.sqrt(2 / 64), rel=0.05)
    assert float(w2.std()) == pytest.approx(math.sqrt(2 / 256) / math.sqrt(8), rel=0.05)
    for e in range(8):  # every expert drawn on its own, not one fan-in over the stack
        assert float(w1[e].std()) == pytest.approx(math.sqrt(2 / 64), rel=0.15)
    assert not torch.equal(w1[0], w1[1])


def test_flops_per_token_count_the_active_experts_and_the_router():
    moe, seq = moe_model(0), 16
    dense = tiny_model(0, ffn_config={"ffn_type": "mptmlp", "ffn_hidden_size": 48})
    L, E, k, d, h = 2, 4, 2, 32, 48
    # two active experts of a dense MLP's size each, plus the router (d x E) and the experts' bias (mb_*: none
    # here, TINY sets no_bias)
    extra = L * ((k - 1) * 2 * d * h + d * E)
    assert moe.flops_per_token(seq) == dense.flops_per_token(seq) + 6 * extra


def test_moe_keys_are_checked():
    def problems(**ffn):
        with pytest.raises(ConfigError) as error:
            MPTConfig(d_model=32, n_heads=2, n_layers=2, vocab_size=64, ffn_config=ffn)
        return str(error.value)

    assert "ffn_config.moe_num_experts: only used with ffn_type mb_moe" in problems(moe_num_experts=4)
    assert "moe_top_k: between 1 and moe_num_experts=4" in problems(**{**MOE, "moe_top_k": 5})
    assert f"moe_world_size: the ranks sharing the experts must divide moe_num_experts={MOE['moe_num_experts']}" in \
        problems(**{**MOE, "moe_world_size": MOE["moe_num_experts"] + 1})
    assert "weight parallelism is not implemented yet (#15)" in problems(**{**MOE, "moe_weight_parallelism": True})
    assert "moe_jitter_eps: in [0, 1)" in problems(**{**MOE, "moe_jitter_eps": 1.5})


def test_a_saved_moe_model_loads_back_with_the_same_outputs(tmp_path):
    model = moe_model(0, mlp_type="glu").eval()
    model.save_pretrained(tmp_path)
    loaded = MPTForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 512, (1, 12))
    assert torch.equal(model(ids).logits, loaded(ids).logits)


# ----- training -----
@pytest.fixture
def recipe(mds_root, tokenizer_dir):
    def make(**overrides):
        r = tiny_recipe(mds_root, tokenizer_dir, eval_loader=None, max_duration="6ba")
        r["model"]["ffn_config"] = {"ffn_type": "mb_dmoe", "moe_num_experts": 4, "moe_top_k": 2,
                                    "moe_loss_weight": 0.01, "moe_jitter_eps": 0.01}
        r.update(overrides)
        return r

    return make


def test_a_tiny_moe_mpt_trains_and_logs_tokens_per_expert(recipe, tmp_path):
    trainer = make_trainer(recipe(callbacks={"mbmoe_tok_per_expert": {"log_interval": 2, "log_every_layer": True,
                                                                      "normalize": False}},
                                  loggers={"jsonl": {"path": str(tmp_path / "m.jsonl")}}))
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    losses = [r["loss/train/total"] for r in rows if "loss/train/total" in r]
    assert len(losses) == 6 and losses[-1] < losses[0]
    callback = trainer.callbacks[-1]
    tokens = 8 * trainer.cfg.max_seq_len  # global batch 8 on one process
    assert callback.counts.sum(dim=1).tolist() == [tokens * 2] * 2  # every token to top_k = 2 experts
    logged = [r for r in rows if "mb_moe/all_layers_max_tpe" in r]
    assert len(logged) == 3  # batches 2, 4, 6
    assert {"mb_moe/layer0_median_tpe", "mb_moe/layer1_std_tpe", "mb_moe/all_layers_min_tpe"} <= set(logged[0])
    assert logged[-1]["mb_moe/all_layers_max_tpe"] == float(callback.counts.max())


def test_the_callback_needs_a_moe_model(recipe):
    r = recipe(callbacks={"mbmoe_tok_per_expert": {}})
    r["model"].pop("ffn_config")
    with pytest.raises(ConfigError, match="mbmoe_tok_per_expert: the model has no mixture-of-experts layers"):
        make_trainer(r).fit()


@pytest.mark.dist
def test_fsdp2_on_two_ranks_shards_the_experts_and_matches_one_process(recipe, tmp_path):
    from tests.distributed.helpers import checkpoint_weights, losses, run_job

    one = recipe(max_duration="3ba", python_log_level=None, loggers={"jsonl": {"path": str(tmp_path / "one.jsonl")}})
    one["model"]["ffn_config"].pop("moe_jitter_eps")  # the same routing on any number of ranks
    fsdp = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL", "activation_checkpointing": True}
    two = dict(one, loggers={"jsonl": {"path": str(tmp_path / "two.jsonl")}}, fsdp_config=fsdp)
    run_job(one, tmp_path, "one", nproc=1)
    run_job(two, tmp_path, "two", nproc=2)
    a, b = losses(tmp_path / "one.jsonl"), losses(tmp_path / "two.jsonl")
    assert sorted(a) == sorted(b) == [1, 2, 3]
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-4), step
    # a meta-device model: each rank materialises and initialises only its experts (whole experts per shard)
    meta = dict(two, max_duration="1ba", model=dict(one["model"], init_device="meta"), save_folder=str(tmp_path / "ck"),
                save_interval="1ba", loggers={"jsonl": {"path": str(tmp_path / "meta.jsonl")}})
    run_job(meta, tmp_path, "meta", nproc=2)
    assert 0 < losses(tmp_path / "meta.jsonl")[1] < 10
    w1 = checkpoint_weights(tmp_path / "ck" / "ep0-ba1")["transformer.blocks.0.ffn.experts.mlp.w1"]
    assert w1.shape == (4, 64, 32) and all(float(w1[e].std()) > 0 for e in range(4))


def test_moe_world_size_is_a_training_layout_that_evaluation_leaves_to_fsdp():
    """Training with moe_world_size: 2 on one process cannot split the experts (a one-line error); evaluation of
    the same model shards the experts with FSDP2 alone (no expert parallelism), so any world size runs it."""
    from llmfoundry.train import parallel

    def place(**kwargs):
        model = moe_model(moe_world_size=2)
        return parallel.parallelize(model, fsdp=None, compile_cfg=None, precision="fp32", device=torch.device("cpu"),
                                    world_size=1, seed=0, **kwargs)

    with pytest.raises(ConfigError, match="moe_world_size: 2 does not divide the world size 1"):
        place()
    model = place(expert_parallel_ok=False)
    assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape[:2] == (1, 3)


@pytest.mark.parametrize("ffn_type, said", [("mb_moe", True), ("mb_dmoe", False), ("torch_dmoe", False)])
def test_building_mb_moe_notes_that_megablocks_would_drop_tokens_over_capacity(ffn_type, said, caplog):
    """MegaBlocks' mb_moe drops routed tokens over its capacity (factor 1); ours is dropless: a notice says so."""
    notices._seen.clear()
    settings = validate(dict(d_model=32, n_heads=2, n_layers=2, vocab_size=64,
                             ffn_config={**MOE, "ffn_type": ffn_type}), MPTModelSettings, "model")
    with caplog.at_level(logging.WARNING, logger="llmfoundry"):
        models.get("mpt_causal_lm").builder(settings, None)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model.ffn_config.ffn_type: mb_moe")]
    assert len(lines) == int(said) and all("\n" not in line and "moe_capacity_factor" in line for line in lines)
