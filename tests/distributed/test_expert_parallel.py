"""Expert parallelism (``model.ffn_config.moe_world_size``) through ``llmfoundry train`` (torchrun, gloo on CPU):
the experts split over 2 ranks (and over a 2x2 (edp, ep) mesh on 4) train the same loss curve as one rank, and
their DCP checkpoints resume on other layouts.

With ``moe_loss_weight: 0`` every layout computes the same global loss (the load-balancing loss is a per-rank,
per-microbatch statistic, so it changes with the layout); a run with it on compares EP with FSDP alone on the same
2 ranks instead.
"""

from __future__ import annotations

import pytest

from tests.distributed.helpers import SharedRuns, checkpoint_weights, losses
from tests.distributed.test_tp_training import assert_same_curve, held, metric, resumed_curve

pytestmark = [pytest.mark.dist, pytest.mark.slow]

STEPS = 5
MOE = {"ffn_type": "mb_dmoe", "ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> SharedRuns:
    return SharedRuns(tmp_path_factory.mktemp("ep-runs"))


@pytest.fixture(scope="module")
def make(mds_root, tokenizer_dir, runs):
    def recipe(name: str, ep: int = 1, fsdp: bool = True, loss_weight: float = 0.0, **extra):
        r = runs.recipe(mds_root, tokenizer_dir, name, STEPS, **extra)
        r["model"]["ffn_config"] = dict(MOE, moe_world_size=ep, moe_loss_weight=loss_weight)
        if fsdp:
            r["fsdp_config"] = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"}
        return r

    return recipe


@pytest.fixture(scope="module")
def one_rank(runs, make) -> dict[int, float]:
    return losses(runs("one", make("one", fsdp=False), 1))


def test_experts_split_over_two_ranks_follow_the_one_rank_loss_curve(one_rank, runs, make):
    log = runs("ep2", make("ep2", ep=2), 2)
    assert_same_curve(losses(log), one_rank)
    w1 = "transformer.blocks.0.ffn.experts.mlp.w1"
    assert held(runs, "one")[w1] == [4, 32, 32] and held(runs, "ep2", rank=1)[w1] == [2, 32, 32]  # 2 experts each
    grad_ep, grad_one = (metric(p, "grad_norm") for p in (log, runs.folder / "one.jsonl"))
    assert all(grad_ep[s] == pytest.approx(grad_one[s], rel=1e-4) for s in grad_one)  # experts' grads counted once
    for key in ("l2_norm/grad/global", "l2_norm/grad/model.transformer.blocks.0.ffn.experts.mlp.w1"):
        norm_ep, norm_one = (metric(p, key) for p in (log, runs.folder / "one.jsonl"))  # optimizer_monitor
        assert norm_one and all(norm_ep[s] == pytest.approx(norm_one[s], rel=1e-4) for s in norm_one), key
    # the checkpoint holds every expert whole, whatever the layout that wrote it
    ep_weights, one_weights = (checkpoint_weights(runs.folder / f"{n}-ckpt" / "ep0-ba3") for n in ("ep2", "one"))
    expert_keys = [k for k in one_weights if ".experts.mlp." in k]
    assert expert_keys and all(ep_weights[k].shape == one_weights[k].shape == (4, 32, 32) for k in expert_keys)
    assert max((ep_weights[k] - one_weights[k]).abs().max().item() for k in one_weights) < 1e-4


def test_checkpoints_resume_across_expert_parallel_layouts(one_rank, runs, make):
    runs("ep2", make("ep2", ep=2), 2)
    # EP-2's batch-3 checkpoint on one rank, and one rank's on 4 ranks as 2 expert-parallel pairs (edp 2 x ep 2,
    # FSDP sharding each pair's experts over edp)
    resumed_curve(runs("ep2-to-1", make("ep2-to-1", fsdp=False, load_path=str(runs.folder / "ep2-ckpt" / "ep0-ba3")),
                       1), one_rank)
    resumed_curve(runs("1-to-2x2", make("1-to-2x2", ep=2, load_path=str(runs.folder / "one-ckpt" / "ep0-ba3")), 4),
                  one_rank)
    w1 = "transformer.blocks.0.ffn.experts.mlp.w1"
    assert held(runs, "1-to-2x2", rank=3)[w1] == [1, 32, 32]  # 2 experts per ep rank, halved again by FSDP over edp


def test_with_the_load_balancing_loss_and_adaptive_clipping_ep_equals_fsdp_alone_on_the_same_ranks(runs, make):
    # adaptive clipping (AGC) sees the experts as FSDP2 shards them after EP (_StridedShard(0)): whole rows per rank
    agc = {"gradient_clipping": {"clipping_type": "adaptive", "clipping_threshold": 0.01}}
    fsdp = runs("fsdp-lbl", make("fsdp-lbl", loss_weight=0.1, algorithms=agc), 2)
    ep = runs("ep2-lbl", make("ep2-lbl", ep=2, loss_weight=0.1, algorithms=agc), 2)
    assert_same_curve(losses(ep), losses(fsdp))
    lbl_ep, lbl_fsdp = (metric(p, "loss/train/lbl") for p in (ep, fsdp))
    assert lbl_ep.keys() == lbl_fsdp.keys() and all(lbl_ep[s] == pytest.approx(lbl_fsdp[s], abs=1e-6) for s in lbl_ep)


def test_layouts_expert_parallelism_cannot_run_are_one_line_errors(make, tmp_path):
    import subprocess
    import sys

    import yaml

    from tests.distributed.helpers import worker_env

    for name, recipe, message in [
        ("one-rank", make("x", ep=2),
         "error: model.ffn_config.moe_world_size: 2 does not divide the world size 1 (use a divisor of it)"),
        ("experts", make("y", ep=3),
         "moe_world_size: the ranks sharing the experts must divide moe_num_experts=4 (each rank keeps as many), "
         "got 3"),
    ]:
        path = tmp_path / f"{name}.yaml"
        del recipe["callbacks"]  # record_shapes is the test worker's; the CLI knows llmfoundry's callbacks only
        path.write_text(yaml.safe_dump(recipe))
        result = subprocess.run([sys.executable, "-m", "llmfoundry.cli", "train", str(path)], env=worker_env(),
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 2, result.stderr[-2000:]
        assert message in result.stderr, result.stderr[-2000:]
