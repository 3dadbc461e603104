"""``tp_config`` through ``llmfoundry train`` (torchrun, gloo on CPU): tensor-parallel runs follow the one-rank
loss curve, their checkpoints resume on another layout and continue the same curve.

The library-level plans are tested in test_tensor_parallel.py; here the trainer's side is: the ranks of a TP group
get the same batches (text loader replication, the batch split over data-parallel ranks), the loss normalisation,
gradient clipping over gradients on two meshes, sample/token counts, eval loss, and DCP checkpoints.
"""

from __future__ import annotations

import pytest

from tests.dist.helpers import losses, run_job

pytestmark = [pytest.mark.dist, pytest.mark.slow]

STEPS = 5


def tp_recipe(dist_recipe, tmp_path, name: str, tp: int = 1, strategy: str = "ffn", fsdp: bool = False, **extra):
    """A tiny MPT (rope, separate q/k/v: what the block strategy can split), global batch 4, eval at the end."""
    recipe = dist_recipe(max_duration=f"{STEPS}ba", global_train_batch_size=4, device_train_microbatch_size=2,
                         save_folder=str(tmp_path / f"{name}-ckpt"), save_interval="3ba",
                         loggers={"jsonl": {"path": str(tmp_path / f"{name}.jsonl")}}, **extra)
    recipe["model"].update(n_heads=4, attn_config={"attn_impl": "torch", "alibi": False, "rope": True,
                                                   "fused_qkv": False})
    if tp > 1:
        recipe["tp_config"] = {"strategy": strategy, "tensor_parallel_degree": tp}
    if fsdp:
        recipe["fsdp_config"] = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"}
    return recipe


def metric(path, key: str) -> dict[int, float]:
    import json

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: r[key] for r in rows if key in r}


def assert_same_curve(a: dict[int, float], b: dict[int, float], tol: float = 1e-5) -> None:
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1)), (a, b)
    worst = max(abs(a[s] - b[s]) for s in a)
    assert worst <= tol, f"largest loss difference {worst:.2e}: {a} vs {b}"


@pytest.fixture
def one_rank(dist_recipe, tmp_path):
    """The 1-rank run every layout is compared with (with its checkpoint at batch 3)."""
    recipe = tp_recipe(dist_recipe, tmp_path, "one")
    recipe["eval_loader"] = {"name": "text", "dataset": dict(recipe["train_loader"]["dataset"], split="val",
                                                             shuffle=False), "drop_last": False}
    recipe["eval_interval"] = f"{STEPS}ba"
    run_job(recipe, tmp_path, "one", nproc=1)
    return recipe


@pytest.mark.parametrize("strategy", ["ffn", "block"])
def test_tp2_training_follows_the_one_rank_loss_curve(strategy, one_rank, dist_recipe, tmp_path):
    recipe = tp_recipe(dist_recipe, tmp_path, "tp2", tp=2, strategy=strategy, eval_loader=one_rank["eval_loader"],
                       eval_interval=one_rank["eval_interval"])
    run_job(recipe, tmp_path, "tp2", nproc=2)
    assert_same_curve(losses(tmp_path / "tp2.jsonl"), losses(tmp_path / "one.jsonl"))
    for key in ("time/sample", "time/token"):  # one TP group: counted once, not once per TP rank
        assert metric(tmp_path / "tp2.jsonl", key) == metric(tmp_path / "one.jsonl", key)
    assert metric(tmp_path / "tp2.jsonl", "time/sample")[STEPS] == 4 * STEPS
    eval_tp, eval_one = (metric(tmp_path / f"{n}.jsonl", "metrics/eval/LanguageCrossEntropy") for n in ("tp2", "one"))
    assert eval_tp.keys() == eval_one.keys() == {STEPS}
    assert eval_tp[STEPS] == pytest.approx(eval_one[STEPS], abs=1e-5)
    grad_tp, grad_one = (metric(tmp_path / f"{n}.jsonl", "grad_norm") for n in ("tp2", "one"))
    assert grad_tp.keys() == grad_one.keys() and all(grad_tp[s] == pytest.approx(grad_one[s], rel=1e-4)
                                                      for s in grad_one)


def test_fsdp_x_tp_on_four_ranks_follows_the_one_rank_loss_curve_and_resumes_as_fsdp_alone(
        one_rank, dist_recipe, tmp_path):
    recipe = tp_recipe(dist_recipe, tmp_path, "2x2", tp=2, strategy="block", fsdp=True)
    run_job(recipe, tmp_path, "2x2", nproc=4, timeout=600)
    assert_same_curve(losses(tmp_path / "2x2.jsonl"), losses(tmp_path / "one.jsonl"))
    # the 2x2 checkpoint of batch 3 resumed on 4 data-parallel ranks (4x1): batches 4 and 5 continue the curve
    resumed = tp_recipe(dist_recipe, tmp_path, "4x1", fsdp=True, load_path=str(tmp_path / "2x2-ckpt" / "ep0-ba3"))
    run_job(resumed, tmp_path, "4x1", nproc=4, timeout=600)
    after = losses(tmp_path / "4x1.jsonl")
    assert sorted(after) == [4, 5]
    one = losses(tmp_path / "one.jsonl")
    assert max(abs(after[s] - one[s]) for s in after) <= 1e-5, (after, one)


def test_a_tp2_checkpoint_resumes_on_one_rank_and_a_one_rank_checkpoint_on_tp2(one_rank, dist_recipe, tmp_path):
    one = losses(tmp_path / "one.jsonl")
    run_job(tp_recipe(dist_recipe, tmp_path, "tp2", tp=2), tmp_path, "tp2", nproc=2)
    for name, tp, nproc, source in (("tp2-to-1", 1, 1, "tp2"), ("1-to-tp2", 2, 2, "one")):
        recipe = tp_recipe(dist_recipe, tmp_path, name, tp=tp, load_path=str(tmp_path / f"{source}-ckpt" / "ep0-ba3"))
        run_job(recipe, tmp_path, name, nproc=nproc)
        after = losses(tmp_path / f"{name}.jsonl")
        assert sorted(after) == [4, 5], name
        assert max(abs(after[s] - one[s]) for s in after) <= 1e-5, (name, after, one)


def test_tp_config_that_cannot_run_is_a_one_line_error(dist_recipe, tmp_path):
    import subprocess
    import sys

    import yaml

    from tests.dist.helpers import worker_env

    recipe = tp_recipe(dist_recipe, tmp_path, "bad", tp=2)
    recipe["global_train_batch_size"] = 3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = subprocess.run([sys.executable, "-m", "llmfoundry.cli", "train", str(path)], env=worker_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: tp_config.tensor_parallel_degree: 2 does not divide the world size 1 (use a divisor of it)")
