"""Run one llm-foundry recipe in mosaicml/llm-foundry (Composer) and here, and compare them batch by batch.

    benchmarks/lf_env.sh /tmp/lf_venv                 # once: a throwaway venv with llm-foundry 0.22.0 on CPU
    python benchmarks/lf_parity.py --lf-python /tmp/lf_venv/bin/python [--recipe NAME ...] [--write-reference]
                                   [--results benchmarks/results/lf_parity_cpu.md]

Both sides train the same recipe (llm-foundry's YAML keys), on CPU in fp32, for a few batches, on data built here
first: the test suite's tiny corpus, a 512-token byte-level BPE trained with `tokenizers` (a Hugging Face folder
both load), MDS shards of 64-token samples and, for hf_causal_lm, a tiny GPT-2 folder with seeded weights
(nothing is downloaded). Each side runs in its own process and records, per batch, the training loss, the learning
rate the optimizer step ran at, the gradient norm before clipping and the step time; then the eval metrics and the
start-up time (process start to the first batch).

--results writes the speed figures (per recipe: the median over the batches of llm-foundry's step time divided by
ours, and each side's start-up time) as a Markdown table with the machine and versions.

--write-reference stores llm-foundry's numbers under tests/fixtures/lf_parity/<recipe>.json (with the recipe, the
command and the versions that made them); tests/train/test_lf_parity.py trains our side of each and compares.

This file imports only the standard library at module level: the same file is the llm-foundry side's entry point
(``--side lf``), run by the venv's Python, where this package is not installed.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "lf_parity"
SEQ = 64

# The recipes, in llm-foundry's format. "{data}", "{tokenizer}" and "{finetuning}" are filled in with the MDS
# folder, the tokenizer folder and the prompt/response JSONL file built here.
BASE: dict = {
    "seed": 17,
    "max_seq_len": SEQ,
    "run_name": "lf-parity",
    "model": {"name": "mpt_causal_lm", "init_device": "cpu", "d_model": 64, "n_heads": 4, "n_layers": 2,
              "expansion_ratio": 4, "max_seq_len": SEQ, "vocab_size": 512, "no_bias": False,
              "attn_config": {"attn_impl": "torch", "alibi": True}, "learned_pos_emb": False,
              "loss_fn": "torch_crossentropy"},
    "tokenizer": {"name": "{tokenizer}", "kwargs": {"model_max_length": SEQ}},
    "train_loader": {"name": "text", "dataset": {"local": "{data}", "split": "train", "shuffle": True,
                                                 "shuffle_seed": 17, "max_seq_len": SEQ},
                     "drop_last": True, "num_workers": 0, "prefetch_factor": None, "persistent_workers": False},
    "optimizer": {"name": "decoupled_adamw", "lr": 6.0e-3, "betas": [0.9, 0.95], "eps": 1.0e-8,
                  "weight_decay": 1.0e-4},
    "scheduler": {"name": "cosine_with_warmup", "t_warmup": "2ba", "alpha_f": 0.1},
    "algorithms": {},
    "max_duration": "8ba",
    "eval_interval": "4ba",
    "eval_first": False,
    "global_train_batch_size": 8,
    "device_train_microbatch_size": 8,
    "device_eval_batch_size": 8,
    "precision": "fp32",
    "progress_bar": False,
    "log_to_console": False,
    "console_log_interval": "1ba",
}
_EVAL_LOADER = {"name": "text", "dataset": {"local": "{data}", "split": "val", "shuffle": False, "max_seq_len": SEQ},
                "drop_last": False, "num_workers": 0, "prefetch_factor": None, "persistent_workers": False}


def _finetuning_loader(**dataset) -> dict:
    """llm-foundry's finetuning loader over the prompt/response JSONL file, unpacked, shuffled."""
    return {"name": "finetuning",
            "dataset": {"hf_name": "json", "hf_kwargs": {"data_files": {"train": "{finetuning}"}}, "split": "train",
                        "max_seq_len": SEQ, "decoder_only_format": True, "shuffle": True, "packing_ratio": None,
                        **dataset},
            "drop_last": True, "num_workers": 0, "prefetch_factor": None, "persistent_workers": False}


def _recipe(**changes) -> dict:
    recipe = copy.deepcopy(BASE)
    recipe.update(copy.deepcopy(changes))
    return recipe


RECIPES: dict[str, dict] = {
    "alibi_adamw_cosine": _recipe(),
    "alibi_clipping": _recipe(algorithms={"gradient_clipping": {"clipping_type": "norm", "clipping_threshold": 0.5}}),
    "alibi_lionw_linear": _recipe(
        optimizer={"name": "decoupled_lionw", "lr": 1.0e-3, "betas": [0.9, 0.99], "weight_decay": 1.0e-3},
        scheduler={"name": "linear_decay_with_warmup", "t_warmup": "3ba", "alpha_f": 0.0}),
    "alibi_microbatch_eval": _recipe(device_train_microbatch_size=2, eval_loader=_EVAL_LOADER,
                                     scheduler={"name": "constant_with_warmup", "t_warmup": "1ba"}),
    # times in tokens: 512 tokens a batch, so warmup ends inside batch 2 and the schedule reads tokens, not batches
    "alibi_inv_sqrt_tokens": _recipe(
        max_duration="4096tok", eval_interval="2048tok",
        scheduler={"name": "inv_sqrt_with_warmup", "t_warmup": "1000tok", "t_scale": "512tok",
                   "t_cooldown": "1024tok", "alpha_f_decay": 0.1, "alpha_f_cooldown": 0.0}),
    # prompt/response pairs padded to 64 tokens: Composer counts the tokens of the attention mask, so a schedule
    # in tokens sees fewer than 64 tokens a sample
    "finetune_padded_tokens": _recipe(
        train_loader=_finetuning_loader(shuffle_seed=17),
        scheduler={"name": "linear_decay_with_warmup", "t_warmup": "600tok", "t_max": "4000tok"}),
    # as finetune_padded_tokens without shuffle_seed: the finetuning loader's default (0 for hf_name records, as
    # llm-foundry's) decides the order
    "finetune_default_shuffle_seed": _recipe(
        train_loader=_finetuning_loader(),
        scheduler={"name": "linear_decay_with_warmup", "t_warmup": "600tok", "t_max": "4000tok"}),
    # Llama-style blocks; qk_ln's norms are llm-foundry's low_precision_layernorm even though norm_type is rmsnorm
    "rope_gqa_glu_rmsnorm": _recipe(
        model={**BASE["model"], "no_bias": True, "norm_type": "rmsnorm",
               "attn_config": {"attn_impl": "torch", "rope": True, "rope_impl": "hf", "qk_ln": True, "clip_qkv": 6,
                               "attn_type": "grouped_query_attention", "kv_n_heads": 2},
               "ffn_config": {"ffn_type": "mptglu", "ffn_act_fn": {"name": "silu"}}},
        algorithms={"gradient_clipping": {"clipping_type": "norm", "clipping_threshold": 1.0}}),
    # microbatches of 2 padded prompt/response samples, so they hold different numbers of target tokens: without
    # accumulate_train_batch_on_tokens each microbatch's mean loss is weighted by its samples, with it by its tokens
    "finetune_microbatch_samples": _recipe(
        train_loader=_finetuning_loader(shuffle_seed=17), device_train_microbatch_size=2,
        accumulate_train_batch_on_tokens=False),
    "finetune_microbatch_tokens": _recipe(
        train_loader=_finetuning_loader(shuffle_seed=17), device_train_microbatch_size=2,
        accumulate_train_batch_on_tokens=True),
    "alibi_clipping_value": _recipe(
        algorithms={"gradient_clipping": {"clipping_type": "value", "clipping_threshold": 0.01}}),
    "alibi_clipping_adaptive": _recipe(
        algorithms={"gradient_clipping": {"clipping_type": "adaptive", "clipping_threshold": 0.05}}),
    # hf_causal_lm: a tiny GPT-2 folder with seeded weights ("{hf_model}", tests.helpers.write_tiny_gpt2), loaded
    # with pretrained: true; eager attention on both sides (llm-foundry's default when attn_implementation is unset);
    # eval loss over the same prompt/response pairs in file order
    "hf_gpt2_finetune": _recipe(
        model={"name": "hf_causal_lm", "pretrained_model_name_or_path": "{hf_model}", "pretrained": True,
               "attn_implementation": "eager"},
        train_loader=_finetuning_loader(shuffle_seed=17), device_train_microbatch_size=4,
        eval_loader={**_finetuning_loader(shuffle=False), "drop_last": False},
        scheduler={"name": "linear_decay_with_warmup", "t_warmup": "2ba", "alpha_f": 0.0}),
    # max_duration and eval_interval in tokens on padded prompt/response rows: Composer counts the attention mask's
    # tokens, so training stops (and evaluates) at the batch whose real tokens reach them, not 64 tokens a sample
    "finetune_padded_duration_tokens": _recipe(
        train_loader=_finetuning_loader(shuffle_seed=17), max_duration="2000tok", eval_interval="700tok",
        eval_loader={**_finetuning_loader(shuffle=False), "drop_last": False},
        scheduler={"name": "cosine_with_warmup", "t_warmup": "300tok", "alpha_f": 0.1}),
    # the same with packing_ratio 2.0: each batch packs 16 prompt/response examples into 8 rows by llm-foundry's
    # rule (largest first, rows that do not fit carried into the next batch); GPT-2 gets no sequence_id there, so
    # packed examples attend to each other (our hf_causal_lm's default, with a notice)
    "hf_gpt2_packing": _recipe(
        model={"name": "hf_causal_lm", "pretrained_model_name_or_path": "{hf_model}", "pretrained": True,
               "attn_implementation": "eager"},
        train_loader=_finetuning_loader(shuffle_seed=17, packing_ratio=2.0), device_train_microbatch_size=4,
        scheduler={"name": "linear_decay_with_warmup", "t_warmup": "2ba", "alpha_f": 0.0}),
}
# Recipes the harness runs but that have no reference yet (known differences, with their measured size).
WITHOUT_REFERENCE: dict[str, dict] = {}
# Asked for, but not a recipe llm-foundry 0.22.0 can run: its optimizer registry holds adalr_lion, clip_lion,
# decoupled_adamw, decoupled_lionw and no_op, so `optimizer.name: adamw` fails there before training (ours accepts
# it: torch's AdamW, whose weight decay is scaled by the lr, unlike decoupled_adamw's).
NOT_IN_LLM_FOUNDRY: dict[str, str] = {"adamw": "llm-foundry 0.22.0 registers no 'adamw' optimizer"}


# ----- data: the test suite's corpus, tokenizer and MDS shards (tests/conftest.py builds the same) -----
def build_data(work: Path) -> tuple[Path, Path]:
    """(mds root with train/ and val/, tokenizer folder), built once per work folder with this package; also
    work/finetuning.jsonl (prompt/response pairs from the same corpus) and work/hf_model (a tiny GPT-2)."""
    sys.path.insert(0, str(REPO))
    from llmfoundry.data.tokenizer_training import train_bpe_tokenizer
    from tests.helpers import (
        TINY_RECIPE_SEQ,
        convert_text_folder,
        make_corpus,
        write_prompt_response_jsonl,
        write_text_folder,
        write_tiny_gpt2,
    )

    assert TINY_RECIPE_SEQ == SEQ
    tokenizer_dir, mds = work / "tokenizer", work / "mds"
    corpus = make_corpus()
    if not (tokenizer_dir / "tokenizer.json").exists():
        train_bpe_tokenizer(corpus, vocab_size=512, out_dir=tokenizer_dir)
        # transformers 5 names its own class here; llm-foundry's transformers 4 loads the same tokenizer.json as this
        config_file = tokenizer_dir / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(config, indent=1))
    for split, docs in {"train": corpus[:160], "val": corpus[160:]}.items():
        if not (mds / split / "index.json").exists():
            source = write_text_folder(work / "text" / split, docs)
            convert_text_folder(source, mds / split, tokenizer_dir, SEQ)
    write_prompt_response_jsonl(work / "finetuning.jsonl", corpus)
    write_tiny_gpt2(work / "hf_model")
    return mds, tokenizer_dir


def fill(recipe: dict, data: Path, tokenizer: Path, finetuning: Path, hf_model: Path | None = None) -> dict:
    """The recipe with "{data}", "{tokenizer}", "{finetuning}" and "{hf_model}" replaced by the paths."""
    text = json.dumps(recipe).replace("{data}", str(data)).replace("{tokenizer}", str(tokenizer))
    text = text.replace("{finetuning}", str(finetuning))
    return json.loads(text.replace("{hf_model}", str(hf_model or finetuning.parent / "hf_model")))


# ----- the two sides; each writes {"batches": [...], "eval": {...}, "startup_s": ..., "versions": {...}} -----
def _versions(names: list[str]) -> dict[str, str]:
    import importlib.metadata as md

    found = {}
    for name in names:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return found


def run_lf_side(recipe: dict, out: Path, started: float) -> None:
    """llm-foundry: its ``train`` function, with a Composer callback that records what we compare."""
    import torch
    from composer.core import Callback, Event
    from llmfoundry.command_utils import train
    from llmfoundry.registry import callbacks
    from omegaconf import OmegaConf

    record: dict = {"batches": [], "eval": {}}

    class ParityRecorder(Callback):
        def __init__(self, **_):
            self.norm = None
            self.t0 = 0.0
            self.lr = 0.0

        def run_event(self, event, state, logger):
            if event == Event.BATCH_START:
                record.setdefault("startup_s", time.time() - started)
                self.t0, self.lr = time.perf_counter(), state.optimizers[0].param_groups[0]["lr"]
            elif event == Event.AFTER_BACKWARD:  # the last microbatch's leaves the whole batch's gradients
                grads = [p.grad for p in state.model.parameters() if p.grad is not None]
                self.norm = float(torch.nn.utils.get_total_norm(grads))
            elif event == Event.BATCH_END:
                record["batches"].append({"loss": float(state.total_loss_dict["loss/train/total"]), "lr": self.lr,
                                          "grad_norm": self.norm, "step_s": time.perf_counter() - self.t0})
            elif event == Event.EVAL_END:
                batch = int(state.timestamp.batch)
                for label, metrics in state.eval_metrics.items():
                    for name, metric in metrics.items():
                        record["eval"][f"{batch}:metrics/{label}/{name}"] = float(metric.compute())

    callbacks.register("parity_recorder", func=ParityRecorder)
    cfg = copy.deepcopy(recipe)
    cfg.setdefault("callbacks", {})["parity_recorder"] = {}
    cfg.setdefault("loggers", {})
    train(OmegaConf.create(cfg))
    record["versions"] = _versions(["llm-foundry", "mosaicml", "torch", "transformers", "mosaicml-streaming"])
    out.write_text(json.dumps(record, indent=1))


def run_our_side(recipe: dict, started: float | None = None) -> dict:
    """This package: the same recipe through validation and the Trainer, with a recording callback."""
    import torch

    from llmfoundry.train.callbacks.base import Callback
    from llmfoundry.train.recipe import TrainConfig, validate
    from llmfoundry.train.trainer import Trainer

    record: dict = {"batches": [], "eval": {}}

    class ParityRecorder(Callback):
        def on_batch_start(self, trainer):
            if started is not None:
                record.setdefault("startup_s", time.time() - started)
            self.t0, self.lr = time.perf_counter(), trainer.optimizer.param_groups[0]["lr"]

        def should_skip_step(self, trainer, loss):  # after backward, before clipping and the optimizer step
            grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
            self.norm = float(torch.nn.utils.get_total_norm(grads))
            return False

        def on_batch_end(self, trainer, metrics):
            record["batches"].append({"loss": metrics["loss/train/total"], "lr": self.lr, "grad_norm": self.norm,
                                      "step_s": time.perf_counter() - self.t0})

        def on_eval_end(self, trainer, metrics):
            for key, value in metrics.items():
                if key.startswith("metrics/eval/"):
                    record["eval"][f"{trainer.time.batch}:{key}"] = float(value)

    trainer = Trainer(validate(copy.deepcopy(recipe), TrainConfig), copy.deepcopy(recipe))
    trainer.callbacks.append(ParityRecorder())
    trainer.fit()
    record["versions"] = _versions(["llmfoundry", "torch", "transformers", "streaming-community"])
    return record


# ----- driver -----
def _side(python: str, name: str, recipe: dict, work: Path) -> dict:
    """Run one side in a fresh process; returns its record."""
    out = work / f"{name}.{'lf' if python != sys.executable else 'ours'}.json"
    recipe_file = work / f"{name}.recipe.json"
    recipe_file.write_text(json.dumps(recipe))
    side = "lf" if python != sys.executable else "ours"
    command = [python, str(Path(__file__).resolve()), "--side", side, "--recipe-file", str(recipe_file),
               "--out", str(out), "--started", repr(time.time())]
    env = dict(os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO) if side == "ours" else "")
    done = subprocess.run(command, cwd=str(work), env=env, capture_output=True, text=True)
    for _ in range(2):  # streaming's shared-memory names can collide with another process's on a shared machine
        if done.returncode == 0 or "FileExistsError: [Errno 17] File exists: '/" not in done.stdout + done.stderr:
            break
        print(f"({side} side of {name}: streaming's shared memory collided with another process; running it again)")
        done = subprocess.run(command, cwd=str(work), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise SystemExit(f"{side} side of {name} failed (exit {done.returncode}):\n{tail}")
    return json.loads(out.read_text())


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def report(name: str, lf: dict, ours: dict) -> None:
    print(f"\n== {name}")
    print(f"{'batch':>5} | {'loss lf':>10} {'loss ours':>10} {'rel':>8} | {'lr lf':>10} {'lr ours':>10} | "
          f"{'gnorm lf':>9} {'gnorm ours':>10} | {'ms lf':>7} {'ms ours':>7}")
    for i, (a, b) in enumerate(zip(lf["batches"], ours["batches"]), start=1):
        print(f"{i:>5} | {a['loss']:>10.5f} {b['loss']:>10.5f} {_rel(b['loss'], a['loss']):>8.1e} | "
              f"{a['lr']:>10.3e} {b['lr']:>10.3e} | {a['grad_norm']:>9.4f} {b['grad_norm']:>10.4f} | "
              f"{1e3 * a['step_s']:>7.1f} {1e3 * b['step_s']:>7.1f}")
    pairs = list(zip(lf["batches"], ours["batches"]))
    worst = max((_rel(b["loss"], a["loss"]) for a, b in pairs), default=0.0)
    lr_worst = max((abs(b["lr"] - a["lr"]) for a, b in pairs), default=0.0)
    print(f"largest loss difference {worst:.1e} (relative), largest lr difference {lr_worst:.1e}")
    if len(lf["batches"]) != len(ours["batches"]):
        print(f"batches: lf {len(lf['batches'])}, ours {len(ours['batches'])}")
    for key in sorted(set(lf["eval"]) | set(ours["eval"])):
        a, b = lf["eval"].get(key), ours["eval"].get(key)
        print(f"eval {key}: lf {a if a is None else f'{a:.5f}'}, ours {b if b is None else f'{b:.5f}'}")
    print(f"start-up (process start to first batch): lf {lf.get('startup_s', float('nan')):.1f}s, "
          f"ours {ours.get('startup_s', float('nan')):.1f}s")


def fastest(runs: list[dict]) -> dict:
    """One side's record with each batch's step time and the start-up time the fastest over repeated runs (on a
    shared machine the other jobs only ever add time)."""
    best = copy.deepcopy(runs[0])
    for run in runs[1:]:
        for kept, batch in zip(best["batches"], run["batches"]):
            kept["step_s"] = min(kept["step_s"], batch["step_s"])
        best["startup_s"] = min(best.get("startup_s", float("inf")), run.get("startup_s", float("inf")))
    return best


def speed(lf: dict, ours: dict) -> dict:
    """Median over the batches of llm-foundry's step time / ours (> 1: ours is faster), and both start-up times."""
    ratios = [a["step_s"] / b["step_s"] for a, b in zip(lf["batches"], ours["batches"]) if b["step_s"] > 0]
    return {"step_ratio": statistics.median(ratios) if ratios else float("nan"),
            "lf_step_ms": 1e3 * statistics.median(b["step_s"] for b in lf["batches"]),
            "ours_step_ms": 1e3 * statistics.median(b["step_s"] for b in ours["batches"]),
            "lf_startup_s": lf.get("startup_s", float("nan")), "ours_startup_s": ours.get("startup_s", float("nan"))}


def write_results(path: Path, rows: dict[str, dict], lf_versions: dict, our_versions: dict, command: str) -> None:
    """The speed figures as a Markdown table (benchmarks/results/)."""
    lines = [
        "# Per-batch speed and start-up time against llm-foundry (CPU)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()}-core CPU ({platform.processor() or platform.machine()}), shared with other jobs, "
        f"Python {platform.python_version()}, fp32, the harness's tiny recipes (d_model 64, 2 layers or a tiny "
        "GPT-2, 8 samples of 64 tokens a batch).",
        f"llm-foundry side: {', '.join(f'{k} {v}' for k, v in sorted(lf_versions.items()))}.",
        f"Our side: {', '.join(f'{k} {v}' for k, v in sorted(our_versions.items()))}.",
        "",
        "Step time: from the batch's start to its end (forward, backward, clipping, optimizer step, logging), "
        "each batch's fastest over the repeated runs, median over the batches; speed ratio = llm-foundry's step time / ours, the median over the batches of "
        "the per-batch ratios (> 1: ours is faster). Start-up: process start to the first batch (imports, data, "
        "model, optimizer), the fastest run's. The recipes are tiny (a step takes milliseconds), so these figures "
        "measure per-step overheads more than model compute, and the shared machine's other jobs add noise.",
        "",
        "| recipe | speed ratio (median) | step ms, llm-foundry | step ms, ours | start-up s, llm-foundry | "
        "start-up s, ours |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['step_ratio']:.2f} | {row['lf_step_ms']:.1f} | {row['ours_step_ms']:.1f} | "
                     f"{row['lf_startup_s']:.1f} | {row['ours_startup_s']:.1f} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def write_reference(name: str, recipe: dict, lf: dict, command: list[str]) -> Path:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    path = FIXTURES / f"{name}.json"
    reference = {
        "recipe": recipe,  # with "{data}", "{tokenizer}", "{finetuning}" and "{hf_model}" placeholders
        "made_by": " ".join(command),
        "versions": lf["versions"],
        "batches": [{k: b[k] for k in ("loss", "lr", "grad_norm")} for b in lf["batches"]],
        "eval": lf["eval"],
    }
    path.write_text(json.dumps(reference, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lf-python", default="/tmp/lf_venv/bin/python", help="the llm-foundry venv's python")
    parser.add_argument("--recipe", action="append", choices=sorted(RECIPES | WITHOUT_REFERENCE | NOT_IN_LLM_FOUNDRY),
                        help="default: all that have references")
    parser.add_argument("--work", default=None, help="folder for data and outputs (default: a temporary one)")
    parser.add_argument("--write-reference", action="store_true", help="store llm-foundry's numbers as fixtures")
    parser.add_argument("--results", default=None, help="write the speed figures as a Markdown table to this file")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each side this many times, alternating; times are the fastest of the runs")
    parser.add_argument("--side", choices=["lf", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--recipe-file", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.side:  # one side, in its own process
        recipe = json.loads(Path(args.recipe_file).read_text())
        if args.side == "lf":
            run_lf_side(recipe, Path(args.out), args.started)
        else:
            Path(args.out).write_text(json.dumps(run_our_side(recipe, args.started), indent=1))
        return 0

    work = Path(args.work or tempfile.mkdtemp(prefix="lf_parity_"))
    work.mkdir(parents=True, exist_ok=True)
    data, tokenizer = build_data(work)
    print(f"data and outputs in {work}")
    speeds: dict[str, dict] = {}
    versions: tuple[dict, dict] = ({}, {})
    for name in args.recipe or sorted(RECIPES):
        if name in NOT_IN_LLM_FOUNDRY:
            print(f"\n== {name}: skipped ({NOT_IN_LLM_FOUNDRY[name]})")
            continue
        recipe = fill((RECIPES | WITHOUT_REFERENCE)[name], data, tokenizer, work / "finetuning.jsonl")
        lf_runs, our_runs = [], []
        for _ in range(max(1, args.repeat)):
            lf_runs.append(_side(args.lf_python, name, recipe, work))
            our_runs.append(_side(sys.executable, name, recipe, work))
        lf, ours = fastest(lf_runs), fastest(our_runs)
        report(name, lf, ours)
        speeds[name], versions = speed(lf, ours), (lf["versions"], ours["versions"])
        if args.results:  # after each recipe, so that an interrupted run keeps what it measured
            command = " ".join(["python", "benchmarks/lf_parity.py", "--lf-python", args.lf_python, "--repeat",
                                str(args.repeat), "--results", args.results] + [f"--recipe {n}" for n in args.recipe or []])
            write_results(Path(args.results), speeds, *versions, command)
        if args.write_reference and name in RECIPES:
            command = ["python", "benchmarks/lf_parity.py", "--lf-python", args.lf_python, "--recipe", name,
                       "--write-reference"]
            print(f"wrote {write_reference(name, RECIPES[name], lf, command)}")
        elif args.write_reference:
            print(f"no reference written for {name}: it is not in RECIPES")
    if args.results and speeds:
        print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
