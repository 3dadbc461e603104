"""Expected calibration error of ICL tasks, with llm-foundry's definitions (InContextLearningMCExpectedCalibrationError,
InContextLearningLMExpectedCalibrationError): checked against a direct computation from the model's logits."""

from __future__ import annotations

import pytest
import torch

from llmfoundry.eval.icl.metrics import expected_calibration_error
from llmfoundry.eval.runner import ICLEvaluator
from tests.eval.helpers import TINY_DATA

MC = {"label": "mc", "dataset_uri": str(TINY_DATA / "tiny_arithmetic_mc.jsonl"), "icl_task_type": "multiple_choice",
      "num_fewshot": [1], "continuation_delimiter": "\nAnswer: "}
LM = {"label": "lm", "dataset_uri": str(TINY_DATA / "tiny_sequences_lm_cat.jsonl"),
      "icl_task_type": "language_modeling", "num_fewshot": [0]}


def test_ece_weights_each_bucket_by_its_size_and_compares_with_the_bucket_midpoint():
    pairs = [(0.05, False), (0.08, True), (0.95, True), (1.0, True), (0.55, False)]
    # bucket 0 (midpoint 0.05): accuracy 1/2; bucket 9 (0.95): 2/2; bucket 5 (0.55): 0/1
    expected = 2 / 5 * abs(0.5 - 0.05) + 2 / 5 * abs(1.0 - 0.95) + 1 / 5 * abs(0.0 - 0.55)
    assert expected_calibration_error(pairs) == pytest.approx(expected)
    assert expected_calibration_error([(0.95, True)] * 4) == pytest.approx(0.05)


def _continuation_probs(model, seq) -> torch.Tensor:
    """Softmax over the vocabulary at each position that predicts a continuation token: (n_cont, vocab)."""
    ids = torch.tensor([seq.tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    return torch.softmax(logits[seq.cont_start - 1 : len(seq.tokens) - 1], dim=-1)


def test_multiple_choice_ece_matches_a_direct_computation(tokenizer, llama):
    evaluator = ICLEvaluator([{**MC, "metric_names": ["InContextLearningMultipleChoiceAccuracy",
                                                      "InContextLearningMCExpectedCalibrationError"]}],
                             tokenizer, max_seq_len=256)
    metrics = evaluator.evaluate(llama, "cpu")
    assert sorted(metrics) == ["icl/mc/1-shot/accuracy", "icl/mc/1-shot/expected_calibration_error"]
    pairs = []
    for ex in evaluator.runs[0].examples:
        # llm-foundry: each choice's mean probability of its continuation tokens; confidence = max / sum
        means = []
        for seq in ex.sequences:
            probs = _continuation_probs(llama, seq)
            targets = torch.tensor(seq.tokens[seq.cont_start :])
            means.append(float(probs.gather(1, targets[:, None]).mean()))
        best = means.index(max(means))
        pairs.append((max(means) / sum(means), best == ex.gold))
    assert metrics["icl/mc/1-shot/expected_calibration_error"] == pytest.approx(
        expected_calibration_error(pairs), abs=1e-6)


def test_language_modeling_ece_uses_the_least_confident_continuation_token(tokenizer, llama):
    evaluator = ICLEvaluator([{**LM, "metric_names": ["lm_expected_calibration_error", "accuracy"],
                               "has_categories": True}], tokenizer, max_seq_len=256)
    metrics = evaluator.evaluate(llama, "cpu")
    by_category: dict[str, list] = {}
    for ex in evaluator.runs[0].examples:
        seq = ex.sequences[0]
        probs = _continuation_probs(llama, seq)
        targets = torch.tensor(seq.tokens[seq.cont_start :])
        correct = bool((probs.argmax(-1) == targets).all())
        by_category.setdefault(str(ex.category), []).append((float(probs.max(-1).values.min()), correct))
    per_category = {cat: expected_calibration_error(pairs) for cat, pairs in by_category.items()}
    for cat, value in per_category.items():
        assert metrics[f"icl/lm/0-shot/{cat}/expected_calibration_error"] == pytest.approx(value, abs=1e-6)
    assert metrics["icl/lm/0-shot/expected_calibration_error"] == pytest.approx(
        sum(per_category.values()) / len(per_category), abs=1e-6)
    assert "icl/lm/0-shot/accuracy" in metrics


def test_ece_is_reported_only_when_asked_for(tokenizer, llama):
    metrics = ICLEvaluator([MC, LM], tokenizer, max_seq_len=256).evaluate(llama, "cpu")
    assert not any(k.endswith("expected_calibration_error") for k in metrics)
