"""llm-foundry's language-modelling metrics: TokenAccuracy / MaskedAccuracy semantics, train metrics
(``model.use_train_metrics``, ``additional_train_metrics``) and the eval loaders' metrics."""

from __future__ import annotations

import math

import pytest
import torch

from llmfoundry.config.validate import validate
from llmfoundry.core.errors import ConfigError
from llmfoundry.models.metrics import LanguageMetrics, eval_metric_names, train_metric_names
from llmfoundry.models.settings import HFModelSettings
from tests.helpers import make_trainer, tiny_recipe


def test_token_accuracy_counts_shifted_targets_and_skips_ignored_labels():
    # position t predicts labels[t + 1]; the argmax of the logits below is [1, 2, 3, 0]
    logits = torch.full((1, 4, 5), -5.0)
    for t, tok in enumerate([1, 2, 3, 0]):
        logits[0, t, tok] = 5.0
    labels = torch.tensor([[9, 1, 2, 4]])  # targets 1, 2, 4: two right, one wrong
    sums = LanguageMetrics(["token_accuracy", "masked_accuracy", "language_cross_entropy",
                            "language_perplexity"], "cpu")
    sums.update(logits, labels)
    masked = torch.tensor([[9, 1, -100, 4]])  # targets 1 (right), ignored, 4 (wrong): 1 of 2
    sums.update(logits, masked)
    out = sums.compute("m")
    assert out["m/TokenAccuracy"] == pytest.approx(3 / 5)
    assert out["m/MaskedAccuracy"] == out["m/TokenAccuracy"]
    expected_ce = float(torch.nn.functional.cross_entropy(
        torch.cat([logits[0, :3], logits[0, [0, 2]]]), torch.tensor([1, 2, 4, 1, 4]), reduction="mean"))
    assert out["m/LanguageCrossEntropy"] == pytest.approx(expected_ce, rel=1e-6)
    assert out["m/LanguagePerplexity"] == pytest.approx(math.exp(expected_ce), rel=1e-6)


def test_model_metric_keys_choose_train_and_eval_metrics():
    settings = validate({"pretrained_model_name_or_path": "x", "additional_train_metrics": ["masked_accuracy"],
                         "additional_eval_metrics": ["mc_expected_calibration_error"]}, HFModelSettings, "model")
    assert train_metric_names(settings) == ["language_cross_entropy", "language_perplexity", "token_accuracy",
                                            "masked_accuracy"]
    assert eval_metric_names(settings) == train_metric_names(settings)  # ICL names apply to ICL tasks only
    settings.use_train_metrics = False
    assert train_metric_names(settings) == []
    with pytest.raises(ConfigError, match="model.additional_train_metrics: unknown metric 'f1'"):
        validate({"pretrained_model_name_or_path": "x", "additional_train_metrics": ["f1"]}, HFModelSettings, "model")


def _logged(trainer) -> list[dict[str, float]]:
    rows = []

    class Recorder:
        def log_metrics(self, metrics, step):
            rows.append(dict(metrics))

        def log_hyperparameters(self, config):
            pass

        def close(self):
            pass

    trainer.loggers.append(Recorder())
    return rows


def test_train_metrics_are_logged_per_batch_and_match_the_training_loss(mds_root, tokenizer_dir):
    recipe = tiny_recipe(mds_root, tokenizer_dir, max_duration="2ba", eval_interval="2ba")
    recipe["model"]["additional_train_metrics"] = ["masked_accuracy"]
    trainer = make_trainer(recipe)
    rows = _logged(trainer)
    trainer.fit()
    batches = [r for r in rows if "loss/train/total" in r]
    assert len(batches) == 2
    for row in batches:
        assert row["metrics/train/LanguageCrossEntropy"] == pytest.approx(row["loss/train/total"], rel=1e-6)
        assert row["metrics/train/LanguagePerplexity"] == pytest.approx(math.exp(row["loss/train/total"]), rel=1e-6)
        assert 0.0 <= row["metrics/train/TokenAccuracy"] <= 1.0
        assert row["metrics/train/MaskedAccuracy"] == row["metrics/train/TokenAccuracy"]
    evaluated = [r for r in rows if "metrics/eval/LanguageCrossEntropy" in r]
    assert evaluated and "metrics/eval/MaskedAccuracy" in evaluated[-1]


def test_use_train_metrics_false_logs_no_train_metrics(mds_root, tokenizer_dir):
    recipe = tiny_recipe(mds_root, tokenizer_dir, max_duration="1ba", eval_interval=0)
    recipe["model"]["use_train_metrics"] = False
    trainer = make_trainer(recipe)
    rows = _logged(trainer)
    trainer.fit()
    assert rows and not any(k.startswith("metrics/train/") for r in rows for k in r)
