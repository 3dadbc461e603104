"""One model of an eval recipe, evaluated: loaded (and sharded with ``fsdp_config``), its eval loaders scored,
its ICL tasks and gauntlet run, the recipe's callbacks called around it.

Callbacks see a TrainState, as in training: ``run_name``, ``dist``, ``loggers``, ``time.batch`` (the model's
index, the step its metrics are logged at), ``icl_evaluator`` (its ``runs``, what eval_output_logging reads),
``eval_loaders``, ``model``, ``tokenizer``; it cannot save or restore checkpoints. Their ``on_eval_start`` and
``on_eval_end(state, metrics)`` hooks run; the training hooks do not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from llmfoundry.eval.config import EvalConfig
from llmfoundry.eval.gauntlet import compute_gauntlet
from llmfoundry.eval.loaders import evaluate_loader
from llmfoundry.eval.runner import ICLEvaluator
from llmfoundry.eval.sections import eval_sections
from llmfoundry.loading import load_eval_model
from llmfoundry.models.hf import HFCausalLM
from llmfoundry.models.metrics import eval_metric_names
from llmfoundry.train import parallel
from llmfoundry.train.builders import build_dataloader
from llmfoundry.train.state import TrainState


@dataclass
class EvalRun:
    """One model of an eval recipe: the recipe, its callbacks, and the state they see (a TrainState whose
    ``time.batch`` is the model's index, the step its metrics are logged at)."""

    cfg: EvalConfig
    callbacks: list
    state: TrainState


def shard_for_eval(model: torch.nn.Module, cfg: EvalConfig, device: torch.device, world_size: int) -> torch.nn.Module:
    """FSDP2 over the model's blocks, then the root, with the training recipe's fsdp_config (validated by
    commands/eval.read_config); a transformers model's blocks are its decoder layers. One process: on the device."""
    if world_size == 1:
        return model.to(device)
    if not callable(getattr(model, "blocks", None)):  # a transformers model: what parallel.apply_fsdp asks for
        layers = HFCausalLM(model).blocks()
        model.blocks = lambda: layers
    # (an MoE model's moe_world_size is a training layout: FSDP2 shards its experts here, with the same results)
    return parallel.parallelize(model, fsdp=cfg.fsdp_config, compile_cfg=None, precision=cfg.precision,
                                device=device, world_size=world_size, seed=cfg.seed, expert_parallel_ok=False)


def evaluate_model(run: EvalRun, spec) -> dict[str, Any]:
    """``{"metrics", "gauntlet", "sample_counts", "seconds"}`` of one ``models`` entry."""
    cfg, state = run.cfg, run.state
    info = state.dist
    start = time.perf_counter()
    sharded = cfg.fsdp_config is not None
    model, tokenizer = load_eval_model(spec, "cpu" if sharded else info.device, max_seq_len=cfg.max_seq_len,
                                       precision=cfg.precision)
    if sharded:
        model = shard_for_eval(model, cfg, info.device, info.world_size)
    state.model, state.tokenizer = model, tokenizer
    share = state.data_share  # every rank scores its own share (evaluation has no tensor parallelism)
    state.eval_loaders = [(prefix, build_dataloader(section, tokenizer, cfg.device_eval_batch_size, key, share))
                          for prefix, key, section in eval_sections(cfg)]
    subset = cfg.eval_subset_num_batches  # as Composer's trainer.eval: -1 keeps icl_subset_num_batches
    evaluator = None
    if cfg.icl_tasks:
        evaluator = ICLEvaluator(cfg.icl_tasks, tokenizer, batch_size=cfg.device_eval_batch_size,
                                 max_seq_len=cfg.max_seq_len, precision=cfg.precision,
                                 subset_num_batches=subset if subset >= 0 else cfg.icl_subset_num_batches,
                                 verbose=True)
    state.icl_evaluator = evaluator
    for cb in run.callbacks:
        cb.on_eval_start(state)
    metrics: dict[str, float] = {}
    names = eval_metric_names(spec.model or {})
    # a transformers model is called through hf_causal_lm's wrapper, which keeps packed documents apart
    # (sequence_id), as the trainer's evaluation does
    loader_model = model if hasattr(model, "supports_sequence_id") else HFCausalLM(model).eval()
    for prefix, loader in state.eval_loaders:
        metrics.update(evaluate_loader(loader_model, loader, prefix=prefix, names=names, device=info.device,
                                       precision=cfg.precision, subset_num_batches=subset))
    if state.eval_loaders:
        state.print(f"## {spec.model_name}: " + ", ".join(f"{k}: {v:.4f}" for k, v in metrics.items()))
    if evaluator is not None:
        metrics.update(evaluator.evaluate(model, info.device, share))
    gauntlet = compute_gauntlet(metrics, cfg.eval_gauntlet, evaluator.sample_counts()) if cfg.eval_gauntlet else {}
    for cb in run.callbacks:
        cb.on_eval_end(state, metrics)
    return {
        "metrics": metrics,
        "gauntlet": gauntlet,
        "sample_counts": evaluator.sample_counts() if evaluator is not None else {},
        "seconds": round(time.perf_counter() - start, 2),
    }
