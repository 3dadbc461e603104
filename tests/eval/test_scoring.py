"""Scoring rules on hand-computed examples, and the batched/KV-cached scorer against a direct computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from llmfoundry.eval.icl.metrics import (
    SequenceScore,
    generation_correct,
    length_normalised_choice,
    mean_token_choice,
    normalize_answer,
    summed_logprob_choice,
)
from llmfoundry.eval.icl.scoring import (
    kv_cache_saving,
    pack_rows,
    packed_width,
    plan_batches,
    run_scoring,
    score_full,
    score_packed,
    score_shared_prefix,
    shared_prefix_len,
    supports_kv_cache,
    supports_packed,
)
from llmfoundry.eval.icl.tasks import Sequence
from llmfoundry.models.interface import context_length
from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM


def test_the_three_choice_rules_disagree_as_computed_by_hand():
    # choice 0: -3.0 over 1 token ("ab", 2 chars);  mean -3.0, sum -3.0, per char -1.5
    # choice 1: -4.0 over 4 tokens ("abcdefgh", 8 chars); mean -1.0, sum -4.0, per char -0.5
    # choice 2: -2.5 over 1 token ("a", 1 char);   mean -2.5, sum -2.5, per char -2.5
    scores = [SequenceScore(-3.0, 1, False), SequenceScore(-4.0, 4, False), SequenceScore(-2.5, 1, False)]
    texts = ["ab", "abcdefgh", "a"]
    assert mean_token_choice(scores, texts) == 1  # llm-foundry: lowest mean per-token loss
    assert summed_logprob_choice(scores, texts) == 2  # lm-eval acc
    assert length_normalised_choice(scores, texts) == 1  # lm-eval acc_norm


def test_acc_norm_divides_by_text_length_not_tokens():
    scores = [SequenceScore(-6.0, 1, False), SequenceScore(-4.0, 4, False)]
    assert length_normalised_choice(scores, ["abcdef", "ab"]) == 0  # -1.0/char beats -2.0/char
    assert summed_logprob_choice(scores, ["abcdef", "ab"]) == 1


def test_ties_go_to_the_first_choice():
    scores = [SequenceScore(-1.0, 1, False), SequenceScore(-1.0, 1, False)]
    assert mean_token_choice(scores, ["a", "b"]) == summed_logprob_choice(scores, ["a", "b"]) == 0


def test_generation_answers_are_cut_at_stop_strings_and_normalised():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffel tower"
    assert generation_correct(" Paris\nQ: next", ["paris"], stop_strings=["\n"])
    assert not generation_correct(" Lyon, not Paris", ["paris"])
    assert generation_correct(" the Paris.", ["Paris"])  # articles and punctuation dropped
    assert not generation_correct(" the Paris.", ["Paris"], normalize=False)
    assert generation_correct("3 plus 4 is 7. #### 7", ["7"], cot_delimiter=" #### ")
    assert not generation_correct("3 plus 4 is 7. #### 8", ["7"], cot_delimiter=" #### ")


@pytest.mark.parametrize("text, expected", [
    # llm-foundry (TriviaQA script): underscore -> space, lowercase, each punctuation char -> space,
    # articles -> space, whitespace collapsed, stripped
    ("The  Eiffel-Tower!", "eiffel tower"),
    ("don't", "don t"),
    ("U.S.A.", "u s"),  # "u s a": the trailing "a" is a whole word, an article
    ("snake_case", "snake case"),
    ("\u2018Quoted\u2019 answer\u00b4s", "quoted answer s"),
    ("A.I.", "i"),  # "a i" -> the article "a" goes
    ("An apple, the theatre", "apple theatre"),  # articles only as whole words
    ("  Paris\n", "paris"),
])
def test_normalize_answer_matches_llm_foundry_by_hand(text, expected):
    assert normalize_answer(text) == expected


def test_punctuation_separates_words_when_matching_answers():
    assert generation_correct(" Eiffel Tower, Paris", ["Eiffel-Tower"])  # "eiffel tower paris" starts with it
    assert not generation_correct(" dont know", ["don't"])  # "dont know" vs "don t"
    assert generation_correct(" don't know", ["don't"])


class BigramLM(torch.nn.Module):
    """logits[t] = table[input_ids[t]]: log-likelihoods can be computed by hand."""

    def __init__(self, vocab: int):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)))

    def forward(self, input_ids, attention_mask=None):
        return type("Out", (), {"logits": self.table[input_ids]})()


def _by_hand(table: torch.Tensor, seq: Sequence) -> tuple[float, bool]:
    lp, greedy = 0.0, True
    for t in range(seq.cont_start, len(seq.tokens)):
        row = F.log_softmax(table[seq.tokens[t - 1]], -1)
        lp += row[seq.tokens[t]].item()
        greedy &= int(row.argmax()) == seq.tokens[t]
    return lp, greedy


def test_full_scoring_matches_a_hand_computed_bigram_model():
    model = BigramLM(12)
    seqs = [Sequence([1, 2, 3, 4], 2), Sequence([5, 6, 7, 8, 9, 10], 3), Sequence([3, 3], 1)]
    best = int(model.table[3].argmax())
    seqs.append(Sequence([3, best], 1))
    for seq, score in zip(seqs, score_full(model, seqs, "cpu")):
        lp, greedy = _by_hand(model.table.detach(), seq)
        assert math.isclose(score.logprob, lp, rel_tol=1e-5)
        assert score.num_tokens == len(seq.tokens) - seq.cont_start and score.greedy == greedy
    assert score_full(model, seqs[-1:], "cpu")[0].greedy


def _reference(model, seq: Sequence) -> float:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq.tokens])).logits[0]
    logp = F.log_softmax(logits.float(), -1)
    return sum(logp[t - 1, seq.tokens[t]].item() for t in range(seq.cont_start, len(seq.tokens)))


@pytest.mark.parametrize("model_name", ["llama", "gpt2"])
def test_shared_prefix_kv_path_equals_running_each_sequence_alone(model_name, request):
    model = request.getfixturevalue(model_name)
    assert supports_kv_cache(model)
    groups = [
        [Sequence([5, 6, 7, 8, 9, 20], 5), Sequence([5, 6, 7, 8, 9, 21, 22, 23], 5)],  # shared prefix of 5
        [Sequence([30, 31, 40, 41], 2), Sequence([30, 32, 40], 2), Sequence([30, 31, 42, 43, 44], 2)],  # of 1
    ]
    assert [shared_prefix_len(g) for g in groups] == [5, 1]
    with torch.no_grad():
        scored = score_shared_prefix(model, groups, "cpu", keep_last_only=model_name == "llama")
        flat = score_full(model, [s for g in groups for s in g], "cpu", trim_logits=model_name == "llama")
    for group, scores in zip(groups, scored):
        for seq, score in zip(group, scores):
            assert math.isclose(score.logprob, _reference(model, seq), rel_tol=1e-4, abs_tol=1e-4)
    for seq, score in zip([s for g in groups for s in g], flat):
        assert math.isclose(score.logprob, _reference(model, seq), rel_tol=1e-4, abs_tol=1e-4)


def test_batches_keep_groups_whole_and_respect_the_limits():
    groups = [[Sequence([1] * n, 1)] * k for n, k in [(5, 4), (50, 2), (10, 4), (7, 3)]]
    batches = plan_batches(groups, batch_size=8, max_batch_tokens=10_000)
    assert sorted(g for b in batches for g in b) == [0, 1, 2, 3]
    assert batches[0][0] == 1  # longest first
    assert all(sum(len(groups[g]) for g in b) <= 8 for b in batches)
    assert all(len(b) == 1 for b in plan_batches(groups, batch_size=8, max_batch_tokens=40))


def test_kv_saving_is_zero_when_a_group_shares_no_prefix():
    assert kv_cache_saving([[Sequence([1, 2, 3], 2), Sequence([4, 2, 3], 2)]]) == 0.0
    assert kv_cache_saving([[Sequence([1, 2, 3], 2), Sequence([1, 2, 4], 2)]]) == pytest.approx(2 / 6)


@pytest.mark.parametrize("model_name", ["llama", "gpt2"])
def test_packed_rows_with_a_4d_mask_equal_running_each_sequence_alone(model_name, request):
    model = request.getfixturevalue(model_name)
    assert supports_packed(model)
    groups = [
        [Sequence([5, 6, 7, 8, 9, 20], 5), Sequence([5, 6, 7, 8, 9, 21, 22, 23], 5)],
        [Sequence([30, 31, 40, 41], 2), Sequence([30, 32, 40], 2), Sequence([30, 31, 42, 43, 44], 2)],
        [Sequence([50, 51], 1)],
    ]
    with torch.no_grad():
        scored = score_packed(model, groups, "cpu", trim_logits=model_name == "llama")
    for group, scores in zip(groups, scored):
        for seq, score in zip(group, scores):
            assert math.isclose(score.logprob, _reference(model, seq), rel_tol=1e-4, abs_tol=1e-4)
            assert score.num_tokens == len(seq.tokens) - seq.cont_start


def test_pack_rows_fills_the_widest_rows_with_short_questions():
    rows = pack_rows([10, 4, 6, 3, 9, 1])
    assert sorted(g for r in rows for g in r) == list(range(6))
    assert all(sum([10, 4, 6, 3, 9, 1][g] for g in r) <= 10 for r in rows)
    assert len(rows) == 4  # 10 | 9+1 | 6+4 | 3


@pytest.mark.parametrize("model_name", ["llama", "gpt2"])
def test_several_questions_in_one_packed_row_score_as_if_alone(model_name, request):
    """Questions sharing a row (block-diagonal mask, positions restarting per question), single-token choices
    predicted from the prefix's last position, and language-modelling sequences (one per question)."""
    model = request.getfixturevalue(model_name)
    groups = [
        [Sequence(list(range(10, 30)) + [40, 41], 20)],  # one long sequence sets the row width
        [Sequence([5, 6, 7, 8], 3), Sequence([5, 6, 7, 9], 3)],  # single-token choices: the prefix is all
        [Sequence([30, 31, 40, 41], 2), Sequence([30, 31, 42], 2)],
        [Sequence([50, 51, 52], 2)],
    ]
    widths = [packed_width(g) for g in groups]
    assert widths == [21, 3, 3, 2]  # the last token of each sequence is never an input
    assert len(pack_rows(widths)) == 2
    with torch.no_grad():
        scored = score_packed(model, groups, "cpu", trim_logits=True)
    for group, scores in zip(groups, scored):
        for seq, score in zip(group, scores):
            assert math.isclose(score.logprob, _reference(model, seq), rel_tol=1e-4, abs_tol=1e-4)
            assert score.num_tokens == len(seq.tokens) - seq.cont_start


def test_a_question_wider_packed_than_the_model_was_built_for_is_scored_unpacked(tokenizer):
    """GPT-Neo sizes its causal mask by max_position_embeddings: a packed row wider than that cannot run. A
    question whose choices together outgrow it is scored one sequence at a time, the others stay packed."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(2)
    model = GPTNeoForCausalLM(GPTNeoConfig(vocab_size=len(tokenizer), hidden_size=32, num_layers=2, num_heads=4,
                                           attention_types=[[["global", "local"], 1]], window_size=8,
                                           max_position_embeddings=16, intermediate_size=64)).eval()
    assert supports_packed(model) and context_length(model) == 16
    wide = [Sequence(list(range(10, 20)) + [40 + i, 50 + i, 60 + i], 10) for i in range(4)]  # 10 + 4 * 2 = 18
    narrow = [Sequence([5, 6, 7, 8], 3), Sequence([5, 6, 7, 9], 3)]
    groups = [wide, narrow]
    assert [packed_width(g) for g in groups] == [18, 3]
    with torch.no_grad():
        with pytest.raises(RuntimeError):  # what the cap prevents
            score_packed(model, [wide], "cpu")
        scored = run_scoring(model, groups, device="cpu", batch_size=8, packed=True, max_width=context_length(model))
    for group, scores in zip(groups, scored):
        for seq, score in zip(group, scores):
            assert math.isclose(score.logprob, _reference(model, seq), rel_tol=1e-4, abs_tol=1e-4)


def test_our_mpt_model_scores_the_same_on_every_path(tokenizer):
    """MPTForCausalLM (ALiBi, 2D masks only): the KV-cache path and the plain path agree; no 4D-mask packing."""
    torch.manual_seed(0)
    model = MPTForCausalLM(MPTConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=len(tokenizer),
                                     max_seq_len=64)).eval()
    assert not supports_packed(model)
    groups = [
        [Sequence([5, 6, 7, 8, 9, 20], 5), Sequence([5, 6, 7, 8, 9, 21, 22, 23], 5)],
        [Sequence([30, 31, 40, 41], 2), Sequence([30, 32, 40], 2), Sequence([30, 31, 42, 43, 44], 2)],
    ]
    with torch.no_grad():
        full = score_full(model, [s for g in groups for s in g], "cpu")
        if supports_kv_cache(model):
            kv = [s for g in score_shared_prefix(model, groups, "cpu", keep_last_only=False) for s in g]
            for a, b in zip(full, kv):
                assert math.isclose(a.logprob, b.logprob, rel_tol=1e-4, abs_tol=1e-4)
    for seq, score in zip([s for g in groups for s in g], full):
        assert math.isclose(score.logprob, _reference(model, seq), rel_tol=1e-4, abs_tol=1e-4)
