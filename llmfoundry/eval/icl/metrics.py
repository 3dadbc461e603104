"""Scoring rules: from per-choice log-likelihoods (or a generated text) to correct/incorrect per example.

Tasks scored by choices (multiple choice, schema) report every *choice rule* registered in ``registry.metrics``:
a function ``rule(scores: list[SequenceScore], choice_texts: list[str]) -> int`` that returns the index of the
choice it picks; an example counts as correct under a rule when that index is the gold one, and the rule's name
is the metric's name (``icl/{label}/{n}-shot/{name}``). A plugin adds one with
``@registry.metrics.register("my_rule")``. The built-in rules:

* ``accuracy`` — llm-foundry's rule: the choice with the lowest mean per-token loss (= highest mean log-prob).
* ``acc`` — lm-evaluation-harness: the highest summed log-likelihood.
* ``acc_norm`` — lm-evaluation-harness: the highest summed log-likelihood divided by the length of the choice's
  text (``len(str)``, as lm-eval computes it: characters, which equal bytes for ASCII text). For schema tasks the
  "choice" is the context option, as in lm-eval's multiple-input tasks.

Ties go to the first choice, like ``list.index(min(...))`` and ``numpy.argmax``.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from llmfoundry.registry import metrics


@dataclass
class SequenceScore:
    """Log-likelihood of one sequence's continuation."""

    logprob: float  # summed over continuation tokens
    num_tokens: int
    greedy: bool  # every continuation token is the argmax of the model's prediction
    # for expected calibration error (llm-foundry's confidences): the mean probability of the continuation's
    # tokens (multiple choice), and the smallest top-1 probability over its positions (language modeling)
    mean_prob: float = 0.0
    min_top_prob: float = 0.0


def _argmax(values: list[float]) -> int:
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


@metrics.register("accuracy")
def mean_token_choice(scores: list[SequenceScore], choice_texts: list[str]) -> int:
    """llm-foundry: lowest mean per-token loss."""
    return _argmax([s.logprob / max(s.num_tokens, 1) for s in scores])


@metrics.register("acc")
def summed_logprob_choice(scores: list[SequenceScore], choice_texts: list[str]) -> int:
    """lm-evaluation-harness ``acc``: highest summed log-likelihood."""
    return _argmax([s.logprob for s in scores])


@metrics.register("acc_norm")
def length_normalised_choice(scores: list[SequenceScore], choice_texts: list[str]) -> int:
    """lm-evaluation-harness ``acc_norm``: highest log-likelihood per character of the choice text."""
    return _argmax([s.logprob / max(len(t), 1) for s, t in zip(scores, choice_texts)])


# llm-foundry's set (TriviaQA's evaluation script): ASCII punctuation plus typographic quotes and accents.
_PUNCTUATION = frozenset(string.punctuation + "‘’´`")


def normalize_answer(text: str) -> str:
    """llm-foundry's (TriviaQA's) answer normalisation, step for step: underscores become spaces, lowercase,
    every punctuation character becomes a space (so ``Eiffel-Tower`` -> ``eiffel tower``), the articles a/an/the
    become spaces, runs of whitespace collapse to one space, and the ends are stripped."""
    text = text.replace("_", " ").lower()
    text = "".join(" " if ch in _PUNCTUATION else ch for ch in text)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def generation_correct(
    output: str,
    answers: list[str],
    *,
    stop_strings: list[str] | None = None,
    cot_delimiter: str = "",
    normalize: bool = True,
) -> bool:
    """Whether a generated text counts as right: cut at the first stop string, keep what follows the last
    ``cot_delimiter``, then it must start with one of the answers (all normalised when ``normalize``)."""
    final = output
    if stop_strings:
        final = re.split("|".join(re.escape(s) for s in stop_strings), final)[0]
    if cot_delimiter:
        final = final.split(cot_delimiter)[-1]
    if normalize:
        final = normalize_answer(final)
        answers = [normalize_answer(a) for a in answers]
    return any(final.startswith(a) for a in answers)


def expected_calibration_error(pairs: list[tuple[float, bool]], n_buckets: int = 10) -> float:
    """llm-foundry's ECE over ``(confidence, correct)`` pairs: confidences fall into ``n_buckets`` equal-width
    buckets (1.0 into the last); the result is the mean, weighted by bucket size, of |accuracy - the bucket's
    midpoint| (llm-foundry compares with the midpoint, not with the mean confidence in the bucket)."""
    totals, correct = [0] * n_buckets, [0] * n_buckets
    for confidence, ok in pairs:
        bucket = min(int(confidence * n_buckets), n_buckets - 1)
        totals[bucket] += 1
        correct[bucket] += int(ok)
    n = sum(totals)
    error = 0.0
    for i, count in enumerate(totals):
        if count:
            midpoint = (i + 0.5) / n_buckets
            error += count / n * abs(correct[i] / count - midpoint)
    return error


def choice_confidence(scores: list[SequenceScore]) -> tuple[float, int]:
    """llm-foundry's multiple-choice confidence: the largest mean token probability over the sum of them all, and
    the choice that has it (the first on ties)."""
    probs = [s.mean_prob for s in scores]
    best = _argmax(probs)
    total = sum(probs)
    return (probs[best] / total if total > 0 else 0.0), best
