"""ICL tasks and the eval gauntlet inside a training run: built once, scored at every evaluation."""

from __future__ import annotations

import torch

from llmfoundry.train.recipe import TrainConfig


class TrainingICL:
    """The recipe's icl_tasks (and eval_gauntlet), prepared once with the run's tokenizer."""

    def __init__(self, cfg: TrainConfig, tokenizer):
        from llmfoundry.eval.config import load_gauntlet
        from llmfoundry.eval.runner import ICLEvaluator

        self.evaluator = ICLEvaluator(
            cfg.icl_tasks, tokenizer, batch_size=cfg.device_eval_batch_size,
            max_seq_len=cfg.icl_seq_len or cfg.max_seq_len, precision=cfg.precision,
            subset_num_batches=cfg.icl_subset_num_batches,
        )
        self.gauntlet = load_gauntlet(cfg.eval_gauntlet)

    @classmethod
    def from_config(cls, cfg: TrainConfig, tokenizer) -> "TrainingICL | None":
        if not cfg.icl_tasks:
            if cfg.eval_gauntlet is not None:
                from llmfoundry.core.errors import ConfigError

                raise ConfigError("eval_gauntlet: needs icl_tasks (the gauntlet averages ICL task accuracies)")
            return None
        return cls(cfg, tokenizer)

    def evaluate(self, model: torch.nn.Module, device: torch.device) -> dict[str, float]:
        from llmfoundry.eval.gauntlet import compute_gauntlet

        metrics = self.evaluator.evaluate(model, device)
        if self.gauntlet is not None:
            metrics.update(compute_gauntlet(metrics, self.gauntlet, self.evaluator.sample_counts()))
        return metrics

    def tables(self, metrics: dict[str, float], run_name: str) -> str:
        """Markdown: per-task accuracies, then the gauntlet scores when there is a gauntlet."""
        from llmfoundry.eval.gauntlet import gauntlet_table, tasks_table

        text = tasks_table(metrics, run_name)
        if self.gauntlet is not None:
            text += "\n\n" + gauntlet_table({run_name: metrics})
        return text
