"""Expert parallelism (``model.ffn_config.moe_world_size``) through ``llmfoundry train`` (torchrun, gloo on CPU):
the experts split over 2 ranks (and over a 2x2 (edp, ep) mesh on 4) train the same loss curve as one rank, and
their DCP checkpoints resume on one rank.

With ``moe_loss_weight: 0`` every layout computes the same global loss (the load-balancing loss is a per-rank,
per-microbatch statistic, so it changes with the layout); a run with it on compares EP with FSDP alone on the same
2 ranks instead.
"""

from __future__ import annotations

import pytest

from tests.dist.helpers import checkpoint_weights, losses, run_job
from tests.dist.test_tp_training import STEPS, assert_same_curve, metric

pytestmark = [pytest.mark.dist, pytest.mark.slow]

MOE = {"ffn_type": "mb_dmoe", "ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}


def moe_recipe(dist_recipe, tmp_path, name: str, ep: int = 1, fsdp: bool = True, loss_weight: float = 0.0, **extra):
    recipe = dist_recipe(max_duration=f"{STEPS}ba", global_train_batch_size=4, device_train_microbatch_size=2,
                         save_folder=str(tmp_path / f"{name}-ckpt"), save_interval="3ba",
                         loggers={"jsonl": {"path": str(tmp_path / f"{name}.jsonl")}}, **extra)
    recipe["model"]["ffn_config"] = dict(MOE, moe_world_size=ep, moe_loss_weight=loss_weight)
    if fsdp:
        recipe["fsdp_config"] = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"}
    return recipe


def test_experts_split_over_ranks_follow_the_one_rank_loss_curve_and_resume_on_one_rank(dist_recipe, tmp_path):
    run_job(moe_recipe(dist_recipe, tmp_path, "one", fsdp=False), tmp_path, "one", nproc=1)
    run_job(moe_recipe(dist_recipe, tmp_path, "ep2", ep=2), tmp_path, "ep2", nproc=2)
    one = losses(tmp_path / "one.jsonl")
    assert_same_curve(losses(tmp_path / "ep2.jsonl"), one)
    grad_ep, grad_one = (metric(tmp_path / f"{n}.jsonl", "grad_norm") for n in ("ep2", "one"))
    assert all(grad_ep[s] == pytest.approx(grad_one[s], rel=1e-4) for s in grad_one)  # experts' grads counted once
    # the checkpoint holds every expert whole, whatever the layout that wrote it
    ep_weights, one_weights = (checkpoint_weights(tmp_path / f"{n}-ckpt" / "ep0-ba3") for n in ("ep2", "one"))
    expert_keys = [k for k in one_weights if ".experts.mlp." in k]
    assert expert_keys and all(ep_weights[k].shape == one_weights[k].shape == (4, 32, 32) for k in expert_keys)
    assert max((ep_weights[k] - one_weights[k]).abs().max().item() for k in one_weights) < 1e-4
    # the EP-2 checkpoint of batch 3 continues on one rank without expert parallelism
    resumed = moe_recipe(dist_recipe, tmp_path, "ep2-to-1", fsdp=False, load_path=str(tmp_path / "ep2-ckpt" / "ep0-ba3"))
    run_job(resumed, tmp_path, "ep2-to-1", nproc=1)
    after = losses(tmp_path / "ep2-to-1.jsonl")
    assert sorted(after) == [4, 5] and max(abs(after[s] - one[s]) for s in after) <= 1e-5, (after, one)
    # and on 4 ranks as 2 expert-parallel pairs (edp 2 x ep 2), FSDP sharding each pair's experts over edp
    run_job(moe_recipe(dist_recipe, tmp_path, "2x2", ep=2, load_path=str(tmp_path / "one-ckpt" / "ep0-ba3")),
            tmp_path, "2x2", nproc=4, timeout=600)
    after = losses(tmp_path / "2x2.jsonl")
    assert sorted(after) == [4, 5] and max(abs(after[s] - one[s]) for s in after) <= 1e-5, (after, one)


def test_with_the_load_balancing_loss_ep_equals_fsdp_alone_on_the_same_ranks(dist_recipe, tmp_path):
    run_job(moe_recipe(dist_recipe, tmp_path, "fsdp", loss_weight=0.1), tmp_path, "fsdp", nproc=2)
    run_job(moe_recipe(dist_recipe, tmp_path, "ep2", ep=2, loss_weight=0.1), tmp_path, "ep2", nproc=2)
    assert_same_curve(losses(tmp_path / "ep2.jsonl"), losses(tmp_path / "fsdp.jsonl"))
    lbl_ep, lbl_fsdp = (metric(tmp_path / f"{n}.jsonl", "loss/train/lbl") for n in ("ep2", "fsdp"))
    assert lbl_ep.keys() == lbl_fsdp.keys() and all(lbl_ep[s] == pytest.approx(lbl_fsdp[s], abs=1e-6) for s in lbl_ep)


def test_layouts_expert_parallelism_cannot_run_are_one_line_errors(dist_recipe, tmp_path):
    import subprocess
    import sys

    import yaml

    from tests.dist.helpers import worker_env

    for name, recipe, message in [
        ("no-fsdp", moe_recipe(dist_recipe, tmp_path, "x", ep=2, fsdp=False),
         "error: model.ffn_config.moe_world_size: 2 does not divide the world size 1 (use a divisor of it)"),
        ("experts", moe_recipe(dist_recipe, tmp_path, "y", ep=3),
         "moe_world_size: the ranks sharing the experts must divide moe_num_experts=4 (each rank keeps as many), "
         "got 3"),
    ]:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(recipe))
        result = subprocess.run([sys.executable, "-m", "llmfoundry.cli", "train", str(path)], env=worker_env(),
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 2, result.stderr[-2000:]
        assert message in result.stderr, result.stderr[-2000:]
