"""ICL tasks and the eval gauntlet inside a training run: built once, scored at every evaluation."""

from __future__ import annotations

import torch

from llmfoundry.core.dist import DataShare
from llmfoundry.eval.config import load_gauntlet
from llmfoundry.eval.gauntlet import compute_gauntlet, gauntlet_table, tasks_table
from llmfoundry.eval.runner import ICLEvaluator


class TrainingICL:
    """The recipe's icl_tasks (and eval_gauntlet), prepared once with the run's tokenizer."""

    def __init__(self, tasks: list, gauntlet, tokenizer, *, batch_size: int, max_seq_len: int, precision: str,
                 subset_num_batches: int | None):
        self.evaluator = ICLEvaluator(tasks, tokenizer, batch_size=batch_size, max_seq_len=max_seq_len,
                                      precision=precision, subset_num_batches=subset_num_batches)
        self.gauntlet = load_gauntlet(gauntlet)

    def evaluate(self, model: torch.nn.Module, device: torch.device, share: DataShare) -> dict[str, float]:
        metrics = self.evaluator.evaluate(model, device, share)
        if self.gauntlet is not None:
            metrics.update(compute_gauntlet(metrics, self.gauntlet, self.evaluator.sample_counts()))
        return metrics

    def tables(self, metrics: dict[str, float], run_name: str) -> str:
        """Markdown: per-task accuracies, then the gauntlet scores when there is a gauntlet."""
        text = tasks_table(metrics, run_name)
        if self.gauntlet is not None:
            text += "\n\n" + gauntlet_table({run_name: metrics})
        return text


def icl_subset(icl_subset_num_batches: int | None, eval_subset_num_batches: int) -> int | None:
    """Batches scored per ICL task: icl_subset_num_batches, else eval_subset_num_batches (as Composer gives an
    evaluator without its own subset the trainer's), else all."""
    if icl_subset_num_batches is not None:
        return icl_subset_num_batches
    return eval_subset_num_batches if eval_subset_num_batches >= 0 else None
