"""Tensor parallelism (tp_config) under torchrun with gloo on CPU: per-step losses of TP-2 (strategies ffn and
block), FSDP x TP on a 2x2 mesh and a DCP checkpoint written at TP-2 and resumed on one rank all equal the 1-rank
run's within 1e-5, gradient clipping (algorithms.GradientClipping over gradients on several meshes) included.

The model and the training step are driven here directly (parallel.parallelize, checkpoint.save/load_checkpoint,
AdamW): the data each rank gets follows core.dist.data_parallel (the TP ranks of a group share a microbatch),
which is the rule the trainer's data loader has to follow. Every collective the DTensor ops need (all-reduce,
all-gather, reduce-scatter) runs on gloo. This file is also the worker: ``torchrun ... test_tensor_parallel.py``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

STEPS = 5
GLOBAL_BATCH, SEQ, VOCAB = 4, 8, 64


def model_config(strategy: str) -> dict:
    # block: separate q/k/v projections, grouped-query attention with 2 kv heads (each rank keeps 2 q + 1 kv head)
    attn = {"fused_qkv": strategy != "block", "attn_type": "grouped_query_attention", "kv_n_heads": 2,
            "attn_impl": "torch"}
    return dict(d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=SEQ, vocab_size=VOCAB,
                attn_config=attn, ffn_config={"ffn_type": "mptglu"}, norm_type="low_precision_layernorm")


def worker(spec: dict) -> None:
    """Train STEPS steps (or resume at spec['resume'] and train the rest); rank 0 writes {step: loss}."""
    import torch
    import torch.nn.functional as F

    from llmfoundry.core import dist
    from llmfoundry.models.mpt.model import MPTConfig, MPTForCausalLM
    from llmfoundry.train import checkpoint, parallel
    from llmfoundry.train.algorithms import GradientClipping, GradientClippingSettings
    from llmfoundry.train.settings import FSDPConfig, TPConfig

    torch.distributed.init_process_group("gloo")
    rank, world = dist.rank(), dist.world_size()
    tp = TPConfig(strategy=spec["strategy"], tensor_parallel_degree=spec["tp"]) if spec["tp"] > 1 else None
    fsdp = FSDPConfig(mixed_precision="FULL") if spec.get("fsdp") else None
    torch.manual_seed(0)  # the same initial weights on every rank
    model = MPTForCausalLM(MPTConfig(**model_config(spec["model_strategy"])))
    parallel.parallelize(model, fsdp=fsdp, compile_cfg=None, precision="fp32", device=torch.device("cpu"),
                         world_size=world, seed=0, tp=tp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dist.set_replication(spec["tp"])
    dp_rank, dp = dist.data_parallel()
    tp_degree = world // dp
    first = 1
    if spec.get("resume"):
        restored = checkpoint.load_checkpoint(spec["resume"], model=model, optimizer=optimizer)
        first = restored["trainer"]["step"] + 1
    losses = {}
    for step in range(first, STEPS + 1):
        batch = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=torch.Generator().manual_seed(step % 2))
        mine = batch.chunk(dp)[dp_rank]  # the TP ranks of one group: the same rows
        logits = model(input_ids=mine).logits
        loss_sum = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), mine[:, 1:].reshape(-1), reduction="sum")
        targets = GLOBAL_BATCH * (SEQ - 1)
        (loss_sum * dp / targets).backward()  # FSDP2 averages the gradients over the dp ranks
        # gradient clipping over gradients on two meshes (FSDP x TP) or plain and DTensor ones (TP alone)
        GradientClipping(GradientClippingSettings(clipping_threshold=1.0)).clip(model)
        optimizer.step()
        optimizer.zero_grad()
        total = loss_sum.detach().clone()
        torch.distributed.all_reduce(total)  # each TP group's sum is counted once per TP rank
        losses[step] = float(total) / tp_degree / targets
        if spec.get("save_at") == step:
            checkpoint.save_checkpoint(spec["save_folder"], f"ba{step}", config={}, tokenizer=None, overwrite=True,
                                       model=model, optimizer=optimizer, trainer_state={"step": step},
                                       loader_state=None)
    if rank == 0:  # also what rank 0 holds of the first block's weights (the TP split, with FSDP also the dp one)
        block = model.blocks()[0]
        held = {name: list(getattr(p, "_local_tensor", p).shape) for name, p in block.named_parameters()}
        Path(spec["out"]).write_text(json.dumps({"losses": losses, "held": held}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
    sys.exit(0)


dist = pytest.mark.dist


def run_worker(tmp_path: Path, name: str, nproc: int, **spec) -> tuple[dict[int, float], dict[str, list[int]]]:
    """Losses by step, and the shapes rank 0 holds of the first block's parameters."""
    import subprocess

    from tests.dist.helpers import torchrun_args, worker_env

    spec = {"tp": 1, "strategy": "ffn", "model_strategy": "ffn", **spec, "out": str(tmp_path / f"{name}.json")}
    log = tmp_path / f"{name}.log"
    with open(log, "w") as out:
        rc = subprocess.run([*torchrun_args(nproc), __file__, json.dumps(spec)], cwd=tmp_path, env=worker_env(),
                            stdout=out, stderr=subprocess.STDOUT, timeout=600).returncode
    assert rc == 0, log.read_text()[-4000:]
    result = json.loads(Path(spec["out"]).read_text())
    return {int(k): v for k, v in result["losses"].items()}, result["held"]


def assert_same_curve(a: dict[int, float], b: dict[int, float]) -> None:
    assert sorted(a) == sorted(b)
    for step in a:
        assert a[step] == pytest.approx(b[step], abs=1e-5), (step, a, b)


@dist
@pytest.mark.parametrize("strategy", ["ffn", "block"])
def test_tp2_follows_the_one_rank_loss_curve(strategy, tmp_path):
    one, full = run_worker(tmp_path, "one", 1, model_strategy=strategy)
    two, held = run_worker(tmp_path, "tp2", 2, tp=2, strategy=strategy, model_strategy=strategy)
    assert sorted(one) == list(range(1, STEPS + 1)) and one[STEPS] < one[1]
    assert_same_curve(one, two)
    columns = ["ffn.up_proj", "ffn.gate_proj"] + (["attn.q_proj", "attn.k_proj", "attn.v_proj"] * (strategy == "block"))
    rows = ["ffn.down_proj"] + (["attn.out_proj"] * (strategy == "block"))
    for name, shape in held.items():  # column-parallel: half the outputs (weight rows, bias); row-parallel: inputs
        module, kind = name.rsplit(".", 1)
        expected = list(full[name])
        if module in columns:
            expected[0] //= 2
        elif module in rows and kind == "weight":
            expected[1] //= 2
        assert shape == expected, name


@dist
def test_fsdp_x_tp_on_a_2x2_mesh_follows_the_one_rank_loss_curve(tmp_path):
    one, full = run_worker(tmp_path, "one", 1, model_strategy="block")
    mesh, held = run_worker(tmp_path, "2x2", 4, tp=2, strategy="block", model_strategy="block", fsdp=True)
    assert_same_curve(one, mesh)
    assert held["attn.q_proj.weight"] == [full["attn.q_proj.weight"][0] // 4, 32]  # TP, then FSDP, on dim 0
    assert held["norm_1.weight"] == [16]  # replicated over TP, sharded by FSDP


@dist
def test_a_tp2_checkpoint_resumes_on_one_rank(tmp_path):
    one, _ = run_worker(tmp_path, "one", 1, model_strategy="block")
    folder = tmp_path / "ckpt"
    tp2, _ = run_worker(tmp_path, "tp2", 2, tp=2, strategy="block", model_strategy="block", save_at=3,
                        save_folder=str(folder))
    resumed, _ = run_worker(tmp_path, "resumed", 1, model_strategy="block", resume=str(folder / "ba3"))
    assert sorted(resumed) == [4, 5]
    assert_same_curve(one, {**{s: tp2[s] for s in (1, 2, 3)}, **resumed})


# ----------------------------------------------------------------------------------------------- bad input
def mpt(strategy: str = "block", **changes):
    from llmfoundry.models.mpt.model import MPTConfig, MPTForCausalLM

    return MPTForCausalLM(MPTConfig(**{**model_config(strategy), **changes}))


@pytest.mark.parametrize("degree, world, model, message", [
    (3, 4, lambda: mpt(), "tensor_parallel_degree: 3 does not divide the world size 4"),
    (4, 4, lambda: mpt(attn_config={"fused_qkv": False, "attn_type": "grouped_query_attention", "kv_n_heads": 2}),
     "does not divide the model's kv heads (2)"),
    (2, 2, lambda: mpt("ffn"), "fused_qkv: false"),
    (2, 2, lambda: mpt(attn_config={"fused_qkv": False, "alibi": True}), "ALiBi"),
    (2, 4, lambda: mpt(), "2 data-parallel groups need fsdp_config"),
])
def test_what_tp_cannot_split_is_a_one_line_config_error(degree, world, model, message):
    from llmfoundry.core.errors import ConfigError
    from llmfoundry.train.settings import TPConfig
    from llmfoundry.train.tensor_parallel import check_tensor_parallel

    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        check_tensor_parallel(model(), TPConfig(strategy="block", tensor_parallel_degree=degree), None, world)
    assert "\n" not in str(error.value)


def test_tp_config_of_a_model_other_than_mpt_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    from llmfoundry.core.errors import ConfigError
    from llmfoundry.train.settings import TPConfig
    from llmfoundry.train.tensor_parallel import check_tensor_parallel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16))
    with pytest.raises(ConfigError, match="plan for MPT models only, not GPT2LMHeadModel"):
        check_tensor_parallel(gpt2, TPConfig(tensor_parallel_degree=2), None, 2)


def test_a_layer_plan_is_refused_and_the_ranks_of_a_tp_group_share_their_data(monkeypatch):
    from llmfoundry.core import dist
    from llmfoundry.train.settings import TPConfig

    assert TPConfig(layer_plan={"ffn": "colwise"}).check_settings("tp_config") == [
        "tp_config.layer_plan: explicit plans are not supported; use tp_config.strategy: ffn | block"]
    positions = []
    try:
        for rank in range(4):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", "4")
            dist.set_replication(2)
            positions.append(dist.data_parallel())
        dist.set_replication(1)
        assert dist.data_parallel() == (3, 4)
    finally:
        dist.set_replication(1)
    assert positions == [(0, 2), (0, 2), (1, 2), (1, 2)]
