"""Evaluate a causal LM on ICL tasks: ``ICLEvaluator(tasks, tokenizer, ...).evaluate(model, device)``.

The evaluator reads the task files and builds every prompt once, at construction; ``evaluate`` can then be called
as often as needed (the trainer calls it at every ``eval_interval``). Metrics come back flat::

    icl/{label}/{n}-shot/accuracy      llm-foundry's rule (MC/schema: lowest mean per-token loss;
                                       LM: greedy match; generation: exact match after normalisation)
    icl/{label}/{n}-shot/acc           MC/schema: lm-evaluation-harness acc (LM tasks: = accuracy)
    icl/{label}/{n}-shot/acc_norm      MC/schema: lm-evaluation-harness acc_norm
    icl/{label}/{n}-shot/{rule}        MC/schema: any other choice rule registered in registry.metrics
    icl/{label}/{n}-shot/{category}/{metric}   tasks with has_categories (the task-level value is then the
                                               unweighted mean over categories, as llm-foundry's gauntlet uses)

Under torch.distributed each data-parallel rank scores every world_size-th example (the ranks of a tensor-parallel
group score the same ones together) and the per-example results are gathered, so every rank returns the same
metrics.

Batches. ``batch_size`` counts sequences, as llm-foundry's ``batch_size`` does: a multiple-choice or schema question
is one sequence per choice and its choices always share a forward pass, so a batch holds
``max(batch_size, choices) // choices`` questions (llm-foundry's effective batch size, choices counted on the
task's first question); language-modeling and generation batches hold ``batch_size`` examples.
``icl_subset_num_batches: N`` keeps the first ``N`` such batches of each rank's examples in file order (what
llm-foundry's evaluator sees from its unshuffled loader); only then are the kept examples sorted by length and
packed for speed (longest first, at most ``batch_size`` sequences and ``max_batch_tokens`` padded tokens per
forward pass, a question's choices sharing their common prefix), which changes how fast the subset runs, never
which examples it holds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as torch_dist

from llmfoundry import registry
from llmfoundry.core import dist
from llmfoundry.core.precision import autocast
from llmfoundry.eval.config import (
    CALIBRATION,
    ICLTaskConfig,
    load_icl_tasks,
    reported_metrics,
    selected_metrics,
    wants_calibration,
)
from llmfoundry.eval.icl.data import read_records
from llmfoundry.eval.icl.metrics import choice_confidence, expected_calibration_error, generation_correct
from llmfoundry.eval.icl.scoring import (
    generate_greedy,
    kv_cache_saving,
    run_scoring,
    supports_kv_cache,
    supports_packed,
)
from llmfoundry.eval.icl.tasks import Example, GenerationTask, ICLTask, build_task
from llmfoundry.models.interface import context_length

log = logging.getLogger(__name__)

# use the shared-prefix path when it saves at least this fraction of token positions
KV_CACHE_MIN_SAVING = 0.15


@dataclass
class TaskRun:
    """One (task, num_fewshot) pair with its prepared examples."""

    cfg: ICLTaskConfig
    num_fewshot: int
    task: ICLTask
    examples: list[Example]
    batch_size: int
    kv_saving: float = 0.0
    results: list[dict[str, Any]] = field(default_factory=list)  # per example, after evaluate()

    @property
    def name(self) -> str:
        return f"{self.cfg.label}/{self.num_fewshot}-shot"


class ICLEvaluator:
    """Prepared ICL tasks, ready to score any causal LM whose ``forward(input_ids, attention_mask=...)`` returns
    ``.logits``.

    ``tasks``: ICLTaskConfig objects, dicts, or a YAML path (anything ``load_icl_tasks`` takes).
    ``batch_size`` / ``max_seq_len``: defaults for tasks that do not set their own.
    ``max_batch_tokens``: cap on (sequences x padded length) per forward, to bound the logits' memory.
    ``subset_num_batches``: score at most this many batches per task (llm-foundry's icl_subset_num_batches).
    """

    def __init__(
        self,
        tasks: Any,
        tokenizer,
        batch_size: int = 8,
        max_seq_len: int = 2048,
        *,
        max_batch_tokens: int = 16384,
        precision: str = "fp32",
        subset_num_batches: int | None = None,
        verbose: bool = False,
    ):
        self.tokenizer = tokenizer
        self.max_batch_tokens = max_batch_tokens
        self.precision = precision
        self.subset_num_batches = subset_num_batches
        self.verbose = verbose
        self.task_cfgs = load_icl_tasks(tasks)
        self.runs: list[TaskRun] = []
        prefix_token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        for cfg in self.task_cfgs:
            seq_len = cfg.max_seq_len or max_seq_len
            records = read_records(
                cfg.dataset_uri,
                strip=cfg.strip_dataset,
                hf_loading_vars=cfg.hf_loading_vars,
                hf_parsing_map=cfg.hf_parsing_map,
                key=f"icl_tasks.{cfg.label}.dataset_uri",
            )
            for shots in cfg.num_fewshot:
                task = build_task(cfg, tokenizer, seq_len)
                examples = task.prepare(records, shots)
                if cfg.limit is not None:
                    examples = examples[: cfg.limit]
                for ex in examples:  # an empty context: condition on BOS/EOS, as lm-evaluation-harness does
                    for s in ex.sequences:
                        if s.cont_start == 0 and prefix_token is not None:
                            s.tokens.insert(0, prefix_token)
                            s.cont_start = 1
                run = TaskRun(cfg, shots, task, examples, cfg.batch_size or batch_size)
                if task.scoring == "choices":
                    run.kv_saving = kv_cache_saving([ex.sequences for ex in examples])
                self.runs.append(run)

    # --- information ------------------------------------------------------------------------------------------
    def sample_counts(self) -> dict[str, int]:
        """Examples per ``label/{n}-shot`` (for the gauntlet's SAMPLE_SZ / LOG_SAMPLE_SZ weighting)."""
        return {run.name: len(run.examples) for run in self.runs}

    # --- evaluation -------------------------------------------------------------------------------------------
    def _share_mode(self, run: TaskRun, model) -> str:
        """How sequences reach the model: 'packed' (questions packed into rows with a 4D mask, each shared prefix
        once, no padding between questions), 'kv' (the prefix's key/value cache copied to each choice) or 'full'
        (each sequence run whole, padded)."""
        if run.task.scoring not in ("choices", "greedy") or run.cfg.kv_cache == "off":
            return "full"
        if supports_packed(model):  # never more positions than running each sequence whole
            return "packed"
        if run.task.scoring != "choices" or run.kv_saving <= 0:
            return "full"
        if run.cfg.kv_cache == "auto" and run.kv_saving < KV_CACHE_MIN_SAVING:
            return "full"
        return "kv" if supports_kv_cache(model) else "full"

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: torch.device | str | None = None,
                 share: dist.DataShare | None = None) -> dict[str, float]:
        """Score ``model`` on every task; returns flat metrics (the same on every rank). ``share``: which share of
        the examples this rank scores (default: its own, by world rank; the ranks of a tensor-parallel group score
        the same examples)."""
        if device is None:
            device = next(model.parameters()).device
        device = torch.device(device)
        rank, world = dist.rank(), dist.world_size()
        share = share or dist.data_share()
        dp_rank, dp_world = share.rank, share.size
        was_training = model.training
        model.eval()
        outer = model
        if world == 1 and isinstance(getattr(model, "hf_model", None), torch.nn.Module):
            model = model.hf_model  # our hf_causal_lm wrapper: call the transformers model (KV cache, generate)

        def sync_calls(n: int) -> int:
            if world == 1:
                return n
            t = torch.tensor([n], device=device if device.type != "cpu" else "cpu")
            torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
            return int(t.item())

        def dummy_forward() -> None:
            model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device))

        metrics: dict[str, float] = {}
        try:
            with autocast(self.precision, device):
                for run in self.runs:
                    start = time.perf_counter()
                    local = run.examples[dp_rank::dp_world]
                    limit = self.subset_num_batches or run.cfg.icl_subset_num_batches
                    if limit is not None:  # the first `limit` batches in file order, before any sorting
                        local = local[: limit * examples_per_batch(run)]
                    if run.task.scoring == "generation":
                        results = self._run_generation(run, local, model, device, world, sync_calls)
                    else:
                        results = self._run_scored(run, local, model, device, sync_calls, dummy_forward)
                    run.results = _gather(results, world)
                    metrics.update(self._metrics(run))
                    if self.verbose and rank == 0:
                        acc = metrics.get(f"icl/{run.name}/accuracy", float("nan"))
                        log.info("%s: %d examples, accuracy %.4f (%.1f s)", run.name, len(run.results), acc,
                                 time.perf_counter() - start)
        finally:
            outer.train(was_training)
        return metrics

    def _run_scored(self, run, local, model, device, sync_calls, dummy_forward) -> list[dict]:
        mode = self._share_mode(run, model)
        scores = run_scoring(
            model,
            [ex.sequences for ex in local],
            device=device,
            batch_size=run.batch_size,
            max_batch_tokens=self.max_batch_tokens,
            use_kv_cache=mode == "kv",
            packed=mode == "packed",
            max_width=context_length(model),
            sync_calls=sync_calls,
            dummy_forward=dummy_forward,
        )
        by_choice = run.task.scoring == "choices"
        names = reported_metrics(run.task.scoring)
        rules = [registry.metrics.get(name).builder for name in names] if by_choice else []
        calibrate = wants_calibration(run.cfg)
        results = []
        for ex, sc in zip(local, scores):
            if sc is None:
                continue
            if by_choice:
                correct = {name: float(rule(sc, ex.choice_texts) == ex.gold) for name, rule in zip(names, rules)}
            else:  # greedy reproduction of the continuation
                correct = dict.fromkeys(names, float(sc[0].greedy))
            result = {"index": ex.index, "category": ex.category, "correct": correct}
            if calibrate:  # (confidence, correct) as llm-foundry's ECE metrics define them
                if by_choice:
                    confidence, pick = choice_confidence(sc)
                    result["calibration"] = (confidence, pick == ex.gold)
                else:
                    result["calibration"] = (sc[0].min_top_prob, sc[0].greedy)
            results.append(result)
        return results

    def _run_generation(self, run, local, model, device, world, sync_calls) -> list[dict]:
        task: GenerationTask = run.task  # type: ignore[assignment]
        order = sorted(range(len(local)), key=lambda i: -len(local[i].prompt or []))
        batches = [order[i : i + run.batch_size] for i in range(0, len(order), run.batch_size)]
        total = sync_calls(len(batches))
        stops = run.cfg.early_stopping_criteria
        results = []
        for b in range(total):
            prompts = [local[i].prompt for i in batches[b]] if b < len(batches) else [[0]]
            outputs = generate_greedy(
                model,
                self.tokenizer,
                prompts,
                device=device,
                max_new_tokens=task.max_new_tokens if b < len(batches) else 1,
                stop_strings=stops,
                generation_kwargs=run.cfg.generation_kwargs,
                synced=world > 1,
                key=f"icl_tasks.{run.cfg.label}.generation_kwargs",
            )
            if b >= len(batches):
                continue
            for i, text in zip(batches[b], outputs):
                ex = local[i]
                ok = generation_correct(
                    text, ex.answers, stop_strings=stops, cot_delimiter=run.cfg.cot_delimiter,
                    normalize=run.cfg.do_normalization,
                )
                correct = dict.fromkeys(reported_metrics(run.task.scoring), float(ok))
                results.append({"index": ex.index, "category": ex.category, "correct": correct, "output": text})
        return results

    def _metrics(self, run: TaskRun) -> dict[str, float]:
        out: dict[str, float] = {}
        if not run.results:
            return out
        keep = selected_metrics(run.cfg)
        names = [n for n in run.results[0]["correct"] if keep is None or n in keep]
        if "calibration" in run.results[0]:
            names.append(CALIBRATION)
        prefix = f"icl/{run.name}"
        if run.cfg.has_categories:
            by_cat: dict[str, list[dict]] = {}
            for r in run.results:
                by_cat.setdefault(str(r["category"]), []).append(r)
            for name in names:
                per_cat = {}
                for cat, rows in sorted(by_cat.items()):
                    per_cat[cat] = _metric_value(rows, name)
                    out[f"{prefix}/{cat}/{name}"] = per_cat[cat]
                out[f"{prefix}/{name}"] = sum(per_cat.values()) / len(per_cat)
        else:
            for name in names:
                out[f"{prefix}/{name}"] = _metric_value(run.results, name)
        return out


def _metric_value(rows: list[dict], name: str) -> float:
    """A metric over examples: the mean of a per-example rule, or the ECE of their (confidence, correct) pairs."""
    if name == CALIBRATION:
        return expected_calibration_error([r["calibration"] for r in rows])
    return sum(r["correct"][name] for r in rows) / len(rows)


def examples_per_batch(run: TaskRun) -> int:
    """Questions (multiple choice, schema) or examples in one of llm-foundry's batches of this task: its
    ``batch_size`` counts sequences, and a question takes one per choice."""
    if run.task.scoring == "choices" and run.examples:
        choices = max(len(run.examples[0].sequences), 1)
        return max(run.batch_size, choices) // choices
    return run.batch_size


def _gather(results: list[dict], world: int) -> list[dict]:
    if world == 1:
        return sorted(results, key=lambda r: r["index"])
    everything = dist.all_gather_object(results)
    merged = {r["index"]: r for part in everything for r in (part or [])}  # a TP group's copies fall together
    return [merged[i] for i in sorted(merged)]
