"""``tp_config`` through ``llmfoundry train`` (torchrun, gloo on CPU): tensor-parallel runs follow the one-rank
loss curve, their checkpoints resume on another layout and continue the same curve.

The library-level plans are tested in test_tensor_parallel.py; here the trainer's side is: the ranks of a TP group
get the same batches (text loader replication, the batch split over data-parallel ranks), the loss normalisation,
gradient clipping over gradients on two meshes, sample/token counts, eval loss, and DCP checkpoints. The runs are
shared by the tests of this module (SharedRuns): each starts once.
"""

from __future__ import annotations

import json

import pytest

from tests.distributed.helpers import SharedRuns, losses
from tests.eval.helpers import TINY_DATA as TINY_ICL

pytestmark = [pytest.mark.dist, pytest.mark.slow]

STEPS = 5


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> SharedRuns:
    return SharedRuns(tmp_path_factory.mktemp("tp-runs"))


@pytest.fixture(scope="module")
def make(mds_root, tokenizer_dir, runs):
    def recipe(name: str, tp: int = 1, strategy: str = "ffn", fsdp: bool = False, evaluate: bool = False, **extra):
        """A tiny MPT (rope, separate q/k/v: what the block strategy can split; 4 query and 2 key/value heads, GLU
        FFN), global batch 4, 5 batches."""
        r = runs.recipe(mds_root, tokenizer_dir, name, STEPS, **extra)
        r["model"].update(n_heads=4, ffn_config={"ffn_type": "mptglu"},
                          attn_config={"attn_impl": "torch", "alibi": False, "rope": True, "fused_qkv": False,
                                       "attn_type": "grouped_query_attention", "kv_n_heads": 2})
        if evaluate:
            r["eval_loader"] = {"name": "text", "dataset": dict(r["train_loader"]["dataset"], split="val",
                                                                shuffle=False), "drop_last": False}
            r["eval_interval"] = f"{STEPS}ba"
            # ICL batches of any width, and generation one token at a time (block pads T to the degree)
            r["icl_tasks"] = [
                {"label": "mc", "dataset_uri": str(TINY_ICL / "tiny_arithmetic_mc.jsonl"),
                 "icl_task_type": "multiple_choice", "num_fewshot": [0]},
                {"label": "qa", "dataset_uri": str(TINY_ICL / "tiny_multiplication_qa.jsonl"),
                 "icl_task_type": "generation_task_with_answers", "num_fewshot": [0],
                 "continuation_delimiter": "\nA: ", "generation_kwargs": {"max_new_tokens": 3}},
            ]
        if tp > 1:
            r["tp_config"] = {"strategy": strategy, "tensor_parallel_degree": tp}
        if fsdp:
            r["fsdp_config"] = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "FULL"}
        return r

    return recipe


def held(runs: SharedRuns, name: str, rank: int = 0) -> dict[str, list[int]]:
    """The shape of each parameter's part that ``rank`` of run ``name`` holds (record_shapes)."""
    return json.loads((runs.folder / name / f"shapes-rank{rank}.json").read_text())


def metric(path, key: str) -> dict[int, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: r[key] for r in rows if key in r}


def assert_same_curve(a: dict[int, float], b: dict[int, float], steps=range(1, STEPS + 1), tol: float = 1e-5) -> None:
    assert sorted(a) == sorted(b) == list(steps), (a, b)
    worst = max(abs(a[s] - b[s]) for s in a)
    print(f"largest loss difference over steps {list(steps)}: {worst:.2e}")  # shown with pytest -s
    assert worst <= tol, f"largest loss difference {worst:.2e}: {a} vs {b}"


def assert_same_norms(log, one) -> None:
    """optimizer_monitor's gradient norms (the global one, and each parameter's) as on one rank: a part that several
    ranks hold (replicated over TP, or over the other TP ranks of an FSDP-over-dp tensor) is counted once."""
    rows = {r["step"]: r for r in map(json.loads, one.read_text().splitlines()) if "l2_norm/grad/global" in r}
    keys = [k for k in rows[STEPS] if k.startswith("l2_norm/grad/")]
    assert len(keys) > 10
    for key in keys:
        mine = metric(log, key)
        assert mine.keys() == rows.keys() and all(mine[s] == pytest.approx(rows[s][key], rel=1e-4) for s in rows), key


def resumed_curve(path, reference: dict[int, float]) -> None:
    """A run resumed from the batch-3 checkpoint trains batches 4 and 5 as the uninterrupted run did."""
    after = losses(path)
    assert_same_curve(after, {s: reference[s] for s in (4, 5)}, steps=(4, 5))


@pytest.fixture(scope="module")
def one_rank(runs, make) -> dict[int, float]:
    """The 1-rank run every layout is compared with (with its checkpoint at batch 3 and eval at the end)."""
    return losses(runs("one", make("one", evaluate=True), 1))


@pytest.mark.parametrize("strategy", ["ffn", "block"])
def test_tp2_training_follows_the_one_rank_loss_curve(strategy, one_rank, runs, make):
    name = f"tp2-{strategy}"
    log = runs(name, make(name, tp=2, strategy=strategy, evaluate=True), 2)
    one = runs.folder / "one.jsonl"
    assert_same_curve(losses(log), one_rank)
    # the split happened: column-parallel layers hold half the outputs (weight rows and bias), row-parallel ones
    # half the inputs (weight columns; their bias is whole)
    full, mine = held(runs, "one"), held(runs, name, rank=1)
    columns = ["ffn.up_proj", "ffn.gate_proj"] + (["attn.q_proj", "attn.k_proj", "attn.v_proj"] if strategy == "block" else [])
    rows = ["ffn.down_proj"] + (["attn.out_proj"] if strategy == "block" else [])
    for param, shape in full.items():
        module, kind = param.rsplit(".", 1)
        expected = list(shape)
        if ".blocks." in module and any(module.endswith(c) for c in columns):
            expected[0] //= 2
        elif ".blocks." in module and any(module.endswith(r) for r in rows) and kind == "weight":
            expected[1] //= 2
        assert mine[param] == expected, param
    for key in ("time/sample", "time/token"):  # one TP group: counted once, not once per TP rank
        assert metric(log, key) == metric(one, key)
    assert metric(log, "time/sample")[STEPS] == 4 * STEPS
    icl = sorted({k for line in one.read_text().splitlines() if line.strip() for k in json.loads(line) if "icl/" in k})
    assert any("/mc/" in k for k in icl) and any("/qa/" in k for k in icl), icl
    for key in icl:  # the TP group scores the same questions as the one rank did
        assert metric(log, key) == pytest.approx(metric(one, key), abs=1e-6), key
    eval_tp, eval_one = (metric(p, "metrics/eval/LanguageCrossEntropy") for p in (log, one))
    assert eval_tp.keys() == eval_one.keys() == {STEPS}
    assert eval_tp[STEPS] == pytest.approx(eval_one[STEPS], abs=1e-5)
    grad_tp, grad_one = (metric(p, "grad_norm") for p in (log, one))  # clipping sees the norm of both meshes
    assert grad_tp.keys() == grad_one.keys() and all(grad_tp[s] == pytest.approx(grad_one[s], rel=1e-4)
                                                      for s in grad_one)
    assert_same_norms(log, one)


def test_fsdp_x_tp_on_four_ranks_follows_the_one_rank_loss_curve_and_resumes_as_fsdp_alone(one_rank, runs, make):
    log = runs("2x2", make("2x2", tp=2, strategy="block", fsdp=True), 4)
    assert_same_curve(losses(log), one_rank)
    q = "transformer.blocks.0.attn.q_proj.weight"
    rows = held(runs, "one")[q][0]
    assert held(runs, "2x2", rank=3)[q] == [rows // 4, held(runs, "one")[q][1]]  # TP by head, then FSDP on dim 0
    assert_same_norms(log, runs.folder / "one.jsonl")
    # the 2x2 checkpoint of batch 3 resumed on 4 data-parallel ranks (4x1): batches 4 and 5 continue the curve
    resumed = make("4x1", fsdp=True, load_path=str(runs.folder / "2x2-ckpt" / "ep0-ba3"))
    resumed_curve(runs("4x1", resumed, 4), one_rank)


def test_a_tp2_checkpoint_resumes_on_one_rank_and_a_one_rank_checkpoint_on_tp2(one_rank, runs, make):
    runs("tp2-ffn", make("tp2-ffn", tp=2, evaluate=True), 2)
    for name, tp, nproc, source in (("tp2-to-1", 1, 1, "tp2-ffn"), ("1-to-tp2", 2, 2, "one")):
        recipe = make(name, tp=tp, load_path=str(runs.folder / f"{source}-ckpt" / "ep0-ba3"))
        resumed_curve(runs(name, recipe, nproc), one_rank)


def test_tp_config_that_cannot_run_is_a_one_line_error(make, tmp_path):
    import subprocess
    import sys

    import yaml

    from tests.distributed.helpers import worker_env

    path = tmp_path / "bad.yaml"
    recipe = make("bad", tp=2)
    del recipe["callbacks"]  # record_shapes is the test worker's; the CLI knows llmfoundry's callbacks only
    path.write_text(yaml.safe_dump(recipe))
    result = subprocess.run([sys.executable, "-m", "llmfoundry.cli", "train", str(path)], env=worker_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: tp_config.tensor_parallel_degree: 2 does not divide the world size 1 (use a divisor of it)")
