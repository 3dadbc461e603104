"""`llmfoundry plan`: bad input is one line and exit code 2; the estimate's fake-tensor measurement agrees with
real tensors; its memory figures are within 10% of what torch's MemTracker (FSDPMemTracker under FSDP2) records
around a real training step, for a tiny and a 125M-shaped model, one rank and two FSDP2 ranks, without activation
checkpointing and with each of its modes (full, selective_op, selective_layer_2; tests/train/_plan_worker.py's
`record_memory` callback). Two FSDP2 ranks train a 3-block 768-wide model (the 125M's blocks, fewer of them: the
root and two prefetched blocks gathered, a third block to extrapolate to) with one microbatch per batch, then, in
the same job, with two (gradients accumulating: FSDP2 holds every sharded gradient from the first microbatch); the
125M shape itself is checked on one rank."""

from __future__ import annotations

import pytest
import torch

from llmfoundry.cli import main as cli_main
from llmfoundry.commands.check import main as check_main
from llmfoundry.train.recipe import TrainConfig, validate

RECIPE = "yamls/mpt/125m.yaml"


@pytest.mark.parametrize("flags, message", [
    (["--nodes", "0", "--gpus-per-node", "8"], "error: --nodes: 0 (use 1 or more)"),
    (["--nodes", "1", "--gpus-per-node", "0"], "error: --gpus-per-node: 0 (use 1 or more)"),
    (["--nodes", "1", "--gpus-per-node", "8", "--gpu", "x100"], "error: --gpu: 'x100' is not a GPU kind plan "
     "knows (use one of h100, h200, a100, a100-40gb, b200, l40s)"),
])
def test_bad_flags_are_one_line_errors(flags, message, capsys):
    assert cli_main(["plan", RECIPE, *flags]) == 2
    assert capsys.readouterr().err.strip() == message


def test_a_recipe_problem_is_the_line_check_prints(capsys):
    assert cli_main(["plan", RECIPE, "model.n_layerz=3", "--nodes", "1", "--gpus-per-node", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert check_main([RECIPE, "model.n_layerz=3"]) == 2
    assert err[len("error: "):] in capsys.readouterr().out


def test_a_hugging_face_model_is_refused_in_one_line_before_anything_is_downloaded(capsys):
    # yamls/finetune/lora.yaml: hf_causal_lm with pretrained weights on the Hub (HF_HUB_OFFLINE=1 in the tests)
    assert cli_main(["plan", "yamls/finetune/lora.yaml", "--nodes", "1", "--gpus-per-node", "8"]) == 2
    assert capsys.readouterr().err.strip() == ("error: model.name: hf_causal_lm: plan measures mpt_causal_lm models "
                                               "only so far")


def test_fake_tensors_measure_what_real_tensors_hold():
    from llmfoundry.train import plan_memory

    recipe = {"max_seq_len": 64, "tokenizer": {"name": "gpt2"},
              "model": {"name": "mpt_causal_lm", "d_model": 64, "n_heads": 2, "n_layers": 2, "expansion_ratio": 4,
                        "max_seq_len": 64, "vocab_size": 512, "attn_config": {"attn_impl": "sdpa"}},
              "train_loader": {"name": "text", "dataset": {"local": "unused", "split": "train", "max_seq_len": 64}},
              "optimizer": {"name": "decoupled_adamw", "lr": 1e-3}, "max_duration": "2ba",
              "global_train_batch_size": 2, "device_train_microbatch_size": 2, "precision": "fp32"}
    cfg = validate(recipe, TrainConfig)
    for mode in (None, "full"):  # selective_op: against a real step below
        fake = plan_memory.measure(cfg, 2, 2, mode, torch.float32, fake=True)
        real = plan_memory.measure(cfg, 2, 2, mode, torch.float32, fake=False)
        assert fake == real


@pytest.mark.parametrize("strategy, activations", [("ffn", 2), ("block", 5)])
def test_the_fake_run_counts_what_the_tensor_parallel_plan_sends(strategy, activations):
    """One block on a fake process group of 2 TP ranks, fp32, one microbatch of B x T x d = 2 x 64 x 64 (an
    activation: 32 KiB). ffn: the FFN output's all-reduce in forward and its input gradient's in backward, each
    sending 2 (n - 1) / n of it: 2 activations. block (sequence parallel): 6 all-gathers each send the other rank's
    half (the attention's and the FFN's input and the block's output in forward; in backward the gradients of
    out_proj's and down_proj's outputs and of the block's input): 3; 4 reduce-scatters half of a whole activation
    (out_proj, down_proj in forward; the attention's and the FFN's input gradients in backward): 2. A second block
    sends as much again."""
    from llmfoundry.train import plan_memory

    recipe = {"max_seq_len": 64, "tokenizer": {"name": "gpt2"},
              "model": {"name": "mpt_causal_lm", "d_model": 64, "n_heads": 2, "n_layers": 2, "expansion_ratio": 4,
                        "max_seq_len": 64, "vocab_size": 512,
                        "attn_config": {"attn_impl": "sdpa", "fused_qkv": False}},
              "train_loader": {"name": "text", "dataset": {"local": "unused", "split": "train", "max_seq_len": 64}},
              "optimizer": {"name": "decoupled_adamw", "lr": 1e-3}, "max_duration": "2ba",
              "global_train_batch_size": 2, "device_train_microbatch_size": 2, "precision": "fp32",
              "tp_config": {"tensor_parallel_degree": 2, "strategy": strategy}}
    cfg = validate(recipe, TrainConfig)
    one, two = (plan_memory.measure(cfg, 2, n, None, torch.float32) for n in (1, 2))
    activation = 2 * 64 * 64 * 4
    assert one.comm == activations * activation
    assert two.comm == 2 * one.comm
    assert not torch.distributed.is_initialized()  # the fake process group is gone


# ------------------------------------------------------------------ the estimate against a real step's MemTracker
SHAPES = {"tiny": {}, "125m": {"d_model": 768, "n_heads": 12, "n_layers": 12, "expansion_ratio": 4},
          "768x3": {"d_model": 768, "n_heads": 12, "n_layers": 3, "expansion_ratio": 4}}


@pytest.fixture(scope="module")
def fake_runs() -> dict:
    """The plan's fake-tensor runs, shared by this module's predictions (Planner's ``measured``): they build 1 and 2
    blocks of the model at the microbatch, checkpointing and dtype they are keyed by, so shapes that differ only in
    n_layers (125m, 768x3), the checkpointing settings and the number of ranks all share them (keyed by width and
    vocabulary)."""
    return {}


def memory_recipe(mds_root, tokenizer_dir, folder, shape: str, mode: str | None, ranks: int) -> dict:
    """tests/helpers.tiny_recipe with ``shape``'s model, fp32, two batches of 2 samples per rank (64 tokens each),
    activation checkpointing ``mode`` (None: off) and the `record_memory` callback tracking the second batch."""
    import tests.train._plan_worker  # noqa: F401  (registers record_memory)
    from tests.helpers import tiny_recipe

    recipe = tiny_recipe(mds_root, tokenizer_dir, precision="fp32", max_duration="2ba",
                         global_train_batch_size=2 * ranks, device_train_microbatch_size=2,
                         fsdp_config={"activation_checkpointing": mode is not None,
                                      "activation_checkpointing_mode": mode or "full"},
                         callbacks={"record_memory": {"folder": str(folder)}})
    del recipe["eval_loader"], recipe["eval_interval"]
    recipe["model"].update(SHAPES[shape])
    return recipe


def predicted(recipe: dict, ranks: int, fake_runs: dict):
    from llmfoundry.train.plan import Planner, recipe_choice
    from llmfoundry.train.plan_hardware import GPUS

    cfg = validate(recipe, TrainConfig)
    shape = (recipe["model"]["d_model"], recipe["model"]["vocab_size"])  # the fake runs' model, whatever n_layers
    return Planner(cfg, 1, ranks, GPUS["h100"], fake_runs.setdefault(shape, {})).estimate(recipe_choice(cfg))


def compare(est, measured: dict, sharded: bool) -> dict[str, tuple[float, float]]:
    """(predicted, measured) MB. Parameters, gradients (all made: just after the backward) and optimizer state;
    one rank: the peak of activations + temporaries in forward/backward (MemTracker's categories); under FSDP2,
    all that is above the sharded parameters and state at the peak (gradients made by then, gathered blocks,
    collective buffers, one block's backward: the plan's split of it is approximate, the sum counts); the peak of
    the whole step."""
    fb, after, step = measured["forward_backward"], measured["after_backward"], measured["step"]
    params, grads, opt = (("Sharded Param", "Sharded Grad", "OptState") if sharded else
                          ("Parameter", "Gradient", "Optstate"))
    figures = {
        "parameters": (est.params, after[params]),
        "gradients": (est.grads, after[grads]),
        "optimizer state": (est.optimizer, fb[opt]),
        **({"above sharded state": (est.peak - est.params - est.optimizer, fb["Total"] - fb[params] - fb[opt])}
           if sharded else
           {"activations": (est.activations, measured["activation_peak"][0])}),
        "peak": (est.peak, step["Total"]),
    }
    return {name: (p / 1e6, m / 1e6) for name, (p, m) in figures.items()}


def assert_within_10_percent(figures: dict) -> None:
    print("\n".join(f"  {name:<26} predicted {p:9.3f} MB  measured {m:9.3f} MB" for name, (p, m) in figures.items()))
    wrong = {name: (p, m) for name, (p, m) in figures.items() if abs(p - m) > 0.1 * m}
    assert not wrong, f"more than 10% off: {wrong}"


# 125M-shaped without checkpointing is left out for time: at 2 x 64 tokens its peak is the end of the backward (all
# gradients, few activations left) and its figures equal those with checkpointing to the byte. The tiny model's
# activations are most of its peak, so the modes are checked there: selective_op measured with the trainer's
# per-op policy, selective_layer_2 (one of its 2 blocks checkpointed) composed from the none and full runs.
@pytest.mark.parametrize("shape, mode", [("tiny", None), ("tiny", "full"), ("tiny", "selective_op"),
                                         ("tiny", "selective_layer_2"), ("125m", "full")])
def test_predicted_memory_is_within_10_percent_of_a_real_step(shape, mode, mds_root, tokenizer_dir, tmp_path,
                                                              fake_runs):
    import json

    from tests.helpers import make_trainer

    recipe = memory_recipe(mds_root, tokenizer_dir, tmp_path, shape, mode, 1)
    make_trainer(recipe).fit()
    measured = json.loads((tmp_path / "memory-rank0.json").read_text())
    assert_within_10_percent(compare(predicted(recipe, 1, fake_runs), measured, sharded=False))


def test_each_checkpointing_mode_is_estimated_and_proposed(mds_root, tokenizer_dir, tmp_path, fake_runs):
    """The tiny model's estimate per mode orders as the modes do (activations: none > selective_op,
    selective_layer_2 > full; recomputed FLOPs and step time: none < selective_op < selective_layer_2 < full),
    selective_op's recompute is what FlopCounterMode counts (a small share, well under full's third), and a recipe
    with full checkpointing is offered selective_op (fits, faster) as an override, checked by the same estimate.
    The tiny model's step would be HBM-bound on an H100; on one with unlimited HBM bandwidth it is compute-bound,
    as every MPT recipe at its scale is (docs/plan-table.md)."""
    import dataclasses

    from llmfoundry.train.plan import Choice, Planner
    from llmfoundry.train.plan_proposals import checkpointing_candidates, proposals
    from llmfoundry.train.plan_hardware import GPUS
    from llmfoundry.train.plan_report import table

    cfg = validate(memory_recipe(mds_root, tokenizer_dir, tmp_path, "tiny", "full", 1), TrainConfig)
    gpu = dataclasses.replace(GPUS["h100"], hbm_bytes_per_s=float("inf"))
    planner = Planner(cfg, 1, 1, gpu, fake_runs.setdefault((cfg.model.settings.d_model, cfg.model.settings.vocab_size),
                                                             {}))
    est = {mode: planner.estimate(Choice(2, mode, "FULL_SHARD"))
           for mode in (None, "full", "selective_op", "selective_layer_2")}
    acts = {mode: e.activations for mode, e in est.items()}
    assert acts[None] > acts["selective_layer_2"] > acts["full"]
    assert acts[None] > acts["selective_op"] > acts["full"]
    shares = [planner.recompute_share(2, mode, torch.float32) for mode in (None, "selective_op", "full")]
    assert shares[0] == 0 and 0.005 < shares[1] < 0.2 and shares[2] == 1 / 3, shares
    steps = [est[mode].step_s for mode in (None, "selective_op", "selective_layer_2", "full")]
    assert steps == sorted(steps) and len(set(steps)) == 4, steps
    assert "activation_checkpointing selective_layer_2" in table(est["selective_layer_2"], "H100")[0]
    # the checkpointing changes only: the microbatch ones would measure another microbatch (time)
    changes = dict(proposals(planner, est["full"], checkpointing_candidates(planner, est["full"].choice)))
    assert set(changes) == {"fsdp_config.activation_checkpointing=false",
                            "fsdp_config.activation_checkpointing_mode=selective_op"}, set(changes)
    assert changes["fsdp_config.activation_checkpointing_mode=selective_op"].step_s < est["full"].step_s


@pytest.mark.dist
def test_predicted_memory_of_two_fsdp_ranks_is_within_10_percent_of_a_real_step(mds_root, tokenizer_dir, tmp_path,
                                                                                fake_runs):
    import json
    from pathlib import Path

    from tests.distributed.helpers import forked_ranks_args, run_job

    recipe = memory_recipe(mds_root, tokenizer_dir, tmp_path, "768x3", "full", 2)
    worker = Path(__file__).with_name("_plan_worker.py")
    # one job, four runs: one microbatch per batch, then two of the same size (a device batch of 4; the same fake
    # runs), then the two ranks as one tensor-parallel group, with each strategy (the fake runs apply the same plan
    # on a fake process group)
    accumulating = ["global_train_batch_size=8", "callbacks.record_memory.name=accumulating"]
    tensor_parallel = {strategy: tensor_parallel_recipe(recipe, strategy) for strategy in ("ffn", "block")}
    parts = ["--then", *accumulating]
    for strategy, tp_recipe in tensor_parallel.items():
        parts += ["--then", "global_train_batch_size=2", "tp_config.tensor_parallel_degree=2",
                  f"tp_config.strategy={strategy}", "model.attn_config.alibi=false",
                  "model.attn_config.fused_qkv=false", f"callbacks.record_memory.name=tp-{strategy}"]
    for ep in (1, 2):  # an MoE model, its experts sharded by FSDP2 alone, then split over the two ranks
        parts += ["--then", *(f"model.ffn_config.{key}={value}" for key, value in moe_ffn(ep).items()),
                  f"callbacks.record_memory.name=moe-ep{ep}"]
    run_job(recipe, tmp_path, "memory", nproc=2, overrides=parts, entry=[*forked_ranks_args(2), str(worker)])
    cases = [("memory", predicted(recipe, 2, fake_runs)),
             ("accumulating", predicted({**recipe, "global_train_batch_size": 8}, 2, fake_runs))]
    cases += [(f"tp-{strategy}", predicted(tp_recipe, 2, fake_runs)) for strategy, tp_recipe in tensor_parallel.items()]
    moe_runs: dict = {}  # another model: its own fake runs, shared by both layouts
    cases += [(f"moe-ep{ep}", predicted({**recipe, "model": {**recipe["model"], "ffn_config": moe_ffn(ep)}}, 2,
                                        moe_runs)) for ep in (1, 2)]
    for name, est in cases:
        assert (est.grads_held == est.grads) == (name == "accumulating")  # accumulating: every sharded gradient
        for rank in (0, 1):
            print(f"{name}, rank {rank}:")
            measured = json.loads((tmp_path / f"{name}-rank{rank}.json").read_text())
            figures = compare(est, measured, sharded="Sharded Param" in measured["step"])
            if name.startswith("moe"):  # what is above the sharded state varies by rank with an MoE: each rank's
                # tokens route differently and the peak moment moves (one CI run: 134.3 MB on rank 0, 146.2 on rank
                # 1 of the same layout): the whole peak, the figure a plan is for, is checked
                print(f"  (not checked) above sharded state: {figures.pop('above sharded state')}")
            assert_within_10_percent(figures)
    # the split is real: a TP rank holds less than the whole model, attention too with block
    whole = cases[0][1].params * 2  # FULL_SHARD over the two ranks
    assert cases[3][1].params < cases[2][1].params < 0.75 * whole, [c[1].params for c in cases]


def moe_ffn(ep: int) -> dict:
    """A dropless MoE FFN of 4 experts (top 2, each 768 wide), split over ``ep`` ranks."""
    return {"ffn_type": "mb_dmoe", "ffn_hidden_size": 768, "moe_num_experts": 4, "moe_top_k": 2,
            "moe_world_size": ep}


def tensor_parallel_recipe(recipe: dict, strategy: str) -> dict:
    """``recipe`` on two ranks as one tensor-parallel group of ``strategy`` (block splits q/k/v by head: unfused,
    and no ALiBi), one microbatch of 2 samples."""
    model = {**recipe["model"], "attn_config": {**recipe["model"]["attn_config"], "alibi": False, "fused_qkv": False}}
    return {**recipe, "model": model, "global_train_batch_size": 2,
            "tp_config": {"tensor_parallel_degree": 2, "strategy": strategy}}


def test_the_start_of_the_backward_bounds_a_peak_that_every_block_has_passed(mds_root, tokenizer_dir, tmp_path):
    """1B at microbatch 1 (seq 2048, 50k vocabulary): 1 and 2 blocks peak at the same 787 MiB in the embedding's
    backward, past every block, but 24 blocks' saved tensors outweigh it at the start of the backward (selective_op:
    about 72 MiB each). The saved activations' own peak is extrapolated too and bounds the estimate from below."""
    from llmfoundry.train.plan import Planner
    from llmfoundry.train.plan_hardware import GPUS
    from llmfoundry.train.plan_memory import Measured

    recipe = memory_recipe(mds_root, tokenizer_dir, tmp_path, "tiny", None, 1)
    recipe["model"]["n_layers"] = 24
    head, block = 800 * 2**20, 72 * 2**20
    runs = [Measured(layers=n, activations=head, grads_at_peak=0, optimizer_temp=0, saved=2**20 + n * block,
                     params=0, flops=0) for n in (1, 2)]
    planner = Planner(validate(recipe, TrainConfig), 1, 1, GPUS["h100"], {(2, None, torch.float32): runs})
    assert planner._extrapolated(2, None, torch.float32)[0] == 2**20 + 24 * block


def test_float8_is_planned_as_bf16_and_the_table_says_so(mds_root, tokenizer_dir, tmp_path):
    """amp_fp8's float8 matmuls are not modelled: its estimate is amp_bf16's, and the report says so in one line
    with the H200's measured ratios."""
    from llmfoundry.train.plan import Planner, recipe_choice
    from llmfoundry.train.plan_hardware import GPUS
    from llmfoundry.train.plan_report import FLOAT8_NOTE, report

    recipes = {p: {**memory_recipe(mds_root, tokenizer_dir, tmp_path, "tiny", "full", 8), "precision": p}
               for p in ("amp_bf16", "amp_fp8")}
    cfgs = {p: validate(r, TrainConfig) for p, r in recipes.items()}
    peaks = {p: Planner(cfg, 1, 8, GPUS["h100"]).estimate(recipe_choice(cfg)).peak for p, cfg in cfgs.items()}
    assert peaks["amp_fp8"] == peaks["amp_bf16"]
    lines = report(cfgs["amp_fp8"], "tiny.yaml", 1, 8, "h100", propose=False).splitlines()
    assert f"  note: {FLOAT8_NOTE}" in lines
    assert FLOAT8_NOTE not in report(cfgs["amp_bf16"], "tiny.yaml", 1, 8, "h100", propose=False)


def test_a_recipe_that_does_not_fit_is_offered_tensor_parallelism(mds_root, tokenizer_dir, tmp_path, fake_runs):
    """On a GPU too small for the tiny recipe on 8 ranks, TP of degree 2 (the ffn plan, measured on a fake process
    group: each rank keeps half of the FFN's activations and weights) fits, and is proposed as the override that
    sets it; a degree the model cannot take is not offered (with block, 4 does not divide a 2-head model's heads:
    only 1 is)."""
    import dataclasses

    from llmfoundry.train.plan import Planner, recipe_choice
    from llmfoundry.train.plan_proposals import proposals, tensor_parallel_candidates
    from llmfoundry.train.plan_hardware import GPUS

    recipe = memory_recipe(mds_root, tokenizer_dir, tmp_path, "tiny", None, 8)
    recipe["global_train_batch_size"] = 32  # 4 samples per rank: 2 microbatches, or one per TP group of 2
    cfg = validate(recipe, TrainConfig)
    shape = (cfg.model.settings.d_model, cfg.model.settings.vocab_size)
    planner = Planner(cfg, 1, 8, GPUS["h100"], fake_runs.setdefault(shape, {}))
    base = planner.estimate(recipe_choice(cfg))
    ((change, choice, tp2),) = tensor_parallel_candidates(planner, base.choice, fits=False)
    assert change == "tp_config.tensor_parallel_degree=2"
    split = tp2.estimate(choice)
    assert split.peak < base.peak and split.activations < base.activations
    small = dataclasses.replace(GPUS["h100"], memory_bytes=(base.peak + split.peak) / 2 / 0.95)
    planner.gpu = tp2.gpu = small
    base = planner.estimate(recipe_choice(cfg))
    assert not base.fits
    assert change in dict(proposals(planner, base, [(change, choice, tp2)]))
    block = validate({**tensor_parallel_recipe(recipe, "block"), "global_train_batch_size": 32}, TrainConfig)
    offered = tensor_parallel_candidates(Planner(block, 1, 8, small, {}), choice, fits=False)
    assert [change for change, *_ in offered] == ["tp_config.tensor_parallel_degree=1"]


def twelve_blocks(**changes) -> dict:
    """A tiny recipe of 12 blocks (no ALiBi, q/k/v unfused: TP's block strategy takes it), 2 samples a microbatch."""
    recipe = {"max_seq_len": 64, "tokenizer": {"name": "gpt2"},
              "model": {"name": "mpt_causal_lm", "d_model": 64, "n_heads": 2, "n_layers": 12, "expansion_ratio": 4,
                        "max_seq_len": 64, "vocab_size": 512,
                        "attn_config": {"attn_impl": "sdpa", "fused_qkv": False, "alibi": False}},
              "train_loader": {"name": "text", "dataset": {"local": "unused", "split": "train", "max_seq_len": 64}},
              "optimizer": {"name": "decoupled_adamw", "lr": 1e-3}, "max_duration": "2ba",
              "global_train_batch_size": 4, "device_train_microbatch_size": 2, "precision": "fp32",
              "fsdp_config": {"sharding_strategy": "FULL_SHARD"}}
    recipe.update(changes)
    return recipe


def test_selective_layer_tensor_parallel_traffic_recomputes_only_its_checkpointed_blocks():
    """selective_layer_2 on 12 blocks recomputes 6 of them (activation_ckpt.py): its TP traffic is the uncheckpointed
    run's plus 6 blocks' recompute, i.e. halfway between none and full. The commit measures 1 and 2 blocks with the
    selective_layer mode itself (1 block: none checkpointed, 2 blocks: the second) would extrapolate the difference
    as if every block were checkpointed."""
    from llmfoundry.train.plan import Planner
    from llmfoundry.train.plan_hardware import GPUS

    cfg = validate(twelve_blocks(tp_config={"tensor_parallel_degree": 2, "strategy": "block"}), TrainConfig)
    planner = Planner(cfg, 1, 2, GPUS["h100"], {})
    none, full = (planner._comm_per_microbatch(2, mode, torch.float32) for mode in (None, "full"))
    assert full > none
    per_block = (full - none) / 12
    for every in (2, 3, 12):
        expected = none + (12 // every) * per_block
        got = planner._comm_per_microbatch(2, f"selective_layer_{every}", torch.float32)
        assert abs(got - expected) <= 1e-6 * expected, (every, got, expected)


def test_expert_parallel_experts_are_sharded_over_edp_whatever_the_strategy():
    """layouts.ep_mesh is (world / ep, ep) whatever fsdp_config says: parallel.apply_fsdp shards each block's experts
    over all world / ep edp ranks, the rest over the strategy's shard group. On 2 nodes x 2 GPUs, ep = 2, HYBRID_SHARD
    (shard 2): a rank holds (n - E) / 2 + E / 4 parameters (not n / 2, as edp = shard // ep would give)."""
    from llmfoundry.train.plan import Planner, recipe_choice
    from llmfoundry.train.plan_hardware import GPUS

    ffn = {"ffn_type": "mb_dmoe", "ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2, "moe_world_size": 2}
    recipe = twelve_blocks(fsdp_config={"sharding_strategy": "HYBRID_SHARD"}, global_train_batch_size=8)
    recipe["model"] = {**recipe["model"], "n_layers": 2, "ffn_config": ffn}
    cfg = validate(recipe, TrainConfig)
    planner = Planner(cfg, 2, 2, GPUS["h100"], {})
    est = planner.estimate(recipe_choice(cfg))
    experts = planner.layers * planner.block_experts
    expected = ((planner.n_params - experts) / 2 + experts / 4) * 4  # fp32 bytes
    assert abs(est.params - expected) <= 1e-6 * expected, (est.params, expected)


def test_a_tensor_parallel_rank_computes_only_what_its_plan_splits():
    """FLOPs per token of one TP rank (degree 2): ffn leaves attention's projections and scores whole on every rank,
    block splits them by head; embeddings and head stay whole with either."""
    from llmfoundry.train.plan import Planner
    from llmfoundry.train.plan_hardware import GPUS

    flops = {}
    for strategy in ("ffn", "block"):
        cfg = validate(twelve_blocks(tp_config={"tensor_parallel_degree": 2, "strategy": strategy}), TrainConfig)
        planner = Planner(cfg, 1, 2, GPUS["h100"], {})
        n_local, _, _ = planner._local_params(2, None, torch.float32)
        flops[strategy] = planner._rank_flops_per_token(n_local)
    whole = planner.flops_per_token
    assert whole / 2 < flops["block"] < flops["ffn"] < whole, (flops, whole)
