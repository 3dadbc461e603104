"""Prompts and token spans are built exactly as llm-foundry builds them."""

from __future__ import annotations

import random

import pytest

from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.config import ICLTaskConfig
from llmfoundry.eval.icl.data import read_records
from llmfoundry.eval.icl.tasks import build_task, encode, fewshot_indices, needs_prefix_space
from tests.eval.helpers import write_jsonl

MC_ROWS = [
    {"query": "Question: What is red?\n", "choices": ["a color", "a river"], "gold": 0},
    {"query": "Question: What runs?", "choices": ["the dog", "the city"], "gold": 0},
    {"query": "Question: What is blue?", "choices": ["a model", "a color"], "gold": 1},
]


def _task(tmp_path, tokenizer, rows, task_type, max_seq_len=256, **kw):
    uri = write_jsonl(tmp_path / f"{task_type}.jsonl", rows)
    cfg = ICLTaskConfig(label="t", dataset_uri=uri, icl_task_type=task_type, **{"num_fewshot": [0], **kw})
    task = build_task(cfg, tokenizer, max_seq_len)
    return task, read_records(uri, strip=cfg.strip_dataset)


def test_fixture_tokenizer_is_gpt2_like_and_needs_prefix_space(tokenizer):
    assert needs_prefix_space(tokenizer)


def test_fewshot_indices_never_pick_the_example_and_follow_the_seed():
    for idx in range(10):
        picked = fewshot_indices(10, 3, idx, random.Random(idx))
        assert idx not in picked and len(picked) == 3
    assert fewshot_indices(4, 10, 0, random.Random(0)) == {1, 2, 3}  # at most n - 1 shots
    a = [fewshot_indices(50, 5, i, rng) for rng in [random.Random(1234)] for i in range(20)]
    b = [fewshot_indices(50, 5, i, rng) for rng in [random.Random(1234)] for i in range(20)]
    assert a == b


def test_multiple_choice_zero_shot_prompt_and_spans(tmp_path, tokenizer):
    task, records = _task(tmp_path, tokenizer, MC_ROWS, "multiple_choice", continuation_delimiter="\nAnswer: ")
    ex = task.prepare(records, 0)[0]
    # strip_dataset strips the query's trailing newline; the context is rstripped before tokenizing
    assert ex.text == "Question: What is red?\nAnswer: "
    context = encode(tokenizer, "", True) + encode(tokenizer, "Question: What is red?\nAnswer:", False)
    assert [s.tokens for s in ex.sequences] == [
        context + encode(tokenizer, " a color", False),
        context + encode(tokenizer, " a river", False),
    ]
    assert all(s.cont_start == len(context) for s in ex.sequences)
    assert ex.gold == 0 and ex.choice_texts == ["a color", "a river"]


def test_multiple_choice_fewshot_prompt_uses_delimiters_and_gold_answers(tmp_path, tokenizer):
    task, records = _task(tmp_path, tokenizer, MC_ROWS, "multiple_choice", prompt_string="Quiz.",
                          example_delimiter="\n\n", question_prelimiter="Q> ")
    examples = task.prepare(records, 1)
    rng = random.Random(1234)
    for i, ex in enumerate(examples):
        (shot,) = fewshot_indices(3, 1, i, rng)
        r = records[shot]
        expected = f"Quiz.\n\nQ> {r['query']} {r['choices'][r['gold']]}\n\nQ> {records[i]['query']} "
        assert ex.text == expected
        preamble = f"Quiz.\n\nQ> {r['query']} {r['choices'][r['gold']]}"
        ctx = encode(tokenizer, preamble, True) + encode(tokenizer, f"\n\nQ> {records[i]['query']}", False)
        assert ex.sequences[0].tokens[: ex.sequences[0].cont_start] == ctx


def test_fewshot_sampling_is_deterministic_and_seeded(tmp_path, tokenizer):
    rows = [{"query": f"Q{i}", "choices": ["x", "y"], "gold": i % 2} for i in range(30)]
    task, records = _task(tmp_path, tokenizer, rows, "multiple_choice")
    first = [e.text for e in task.prepare(records, 3)]
    assert first == [e.text for e in task.prepare(records, 3)]
    for i, text in enumerate(first):
        *shots, last = text.split("\n")
        assert last == f"Q{i} " and len(shots) == 3
        assert all(not shot.startswith(f"Q{i} ") for shot in shots)  # never its own shot
    other, _ = _task(tmp_path, tokenizer, rows, "multiple_choice", fewshot_random_seed=7)
    assert [e.text for e in other.prepare(records, 3)] != first


def test_language_modeling_prompt_adds_prefix_space_to_the_continuation(tmp_path, tokenizer):
    rows = [{"context": "The cat runs", "continuation": "quickly"}, {"context": "A dog", "continuation": "jumps"}]
    task, records = _task(tmp_path, tokenizer, rows, "language_modeling")
    ex = task.prepare(records, 1)[0]
    assert ex.text == "A dog jumps\nThe cat runs "  # a shot's answer has no extra space; delimiter is " "
    seq = ex.sequences[0]
    assert seq.continuation == encode(tokenizer, " quickly", False)
    assert seq.tokens[: seq.cont_start] == encode(tokenizer, "A dog jumps", True) + encode(
        tokenizer, "\nThe cat runs", False)


def test_schema_prompts_score_the_shared_continuation_after_each_option(tmp_path, tokenizer):
    rows = [
        {"context_options": ["The cat ran because the cat", "The cat ran because the dog"],
         "continuation": "was fast.", "gold": 1},
        {"context_options": ["A river", "A city"], "continuation": "is blue.", "gold": 0},
    ]
    task, records = _task(tmp_path, tokenizer, rows, "schema")
    zero = task.prepare(records, 0)[0]
    cont = encode(tokenizer, " was fast.", False)
    assert [s.tokens for s in zero.sequences] == [
        encode(tokenizer, "", True) + encode(tokenizer, o, False) + cont for o in rows[0]["context_options"]
    ]
    assert zero.choice_texts == rows[0]["context_options"]
    one = task.prepare(records, 1)[0]
    preamble = "A river is blue."
    assert one.text == preamble + "\nThe cat ran because the dog"
    assert one.sequences[0].tokens == encode(tokenizer, preamble, True) + encode(
        tokenizer, "\nThe cat ran because the cat", False) + cont
    assert one.sequences[0].continuation == cont


def test_generation_prompt_answers_and_token_budget(tmp_path, tokenizer):
    rows = [{"context": "Q: two plus two?", "answer": "four", "aliases": ["4", "four"]},
            {"context": "Q: one plus one?", "answer": "two", "aliases": []}]
    task, records = _task(tmp_path, tokenizer, rows, "generation_task_with_answers",
                          continuation_delimiter="\nA:")
    ex = task.prepare(records, 1)[0]
    assert ex.text == "Q: one plus one?\nA:two\nQ: two plus two?\nA:"
    assert ex.prompt == encode(tokenizer, "Q: one plus one?\nA:two", True) + encode(
        tokenizer, "\nQ: two plus two?\nA:", False)
    assert ex.answers == ["four", "4"]
    longest = max(len(encode(tokenizer, a, True)) for a in ["four", "4", "two"])
    assert task.max_new_tokens == longest


def test_chain_of_thought_shots_include_reasoning_and_delimiter(tmp_path, tokenizer):
    rows = [{"context": "Q: 1+1?", "chain_of_thought": "one and one", "answer": "2"},
            {"context": "Q: 2+2?", "chain_of_thought": "two and two", "answer": "4"}]
    task, records = _task(tmp_path, tokenizer, rows, "generation_task_with_answers", cot_delimiter=" #### ")
    ex = task.prepare(records, 1)[0]
    assert ex.text == "Q: 2+2? two and two #### 4\nQ: 1+1? "
    longest = max(len(encode(tokenizer, f"{r['chain_of_thought']} #### {r['answer']}", True)) for r in rows)
    assert task.max_new_tokens == longest + 10


def test_long_contexts_are_truncated_on_the_left_and_keep_the_answer(tmp_path, tokenizer):
    rows = [{"query": " ".join(["the model learns"] * 40), "choices": ["cat", "dog runs quickly"], "gold": 0}]
    task, records = _task(tmp_path, tokenizer, rows, "multiple_choice", max_seq_len=16)
    ex = task.prepare(records, 0)[0]
    full_ctx = encode(tokenizer, "", True) + encode(tokenizer, rows[0]["query"], False)
    for seq, choice in zip(ex.sequences, [" cat", " dog runs quickly"]):
        cont = encode(tokenizer, choice, False)
        assert len(seq.tokens) == 16 and seq.continuation == cont
        assert seq.tokens[: seq.cont_start] == full_ctx[-(16 - len(cont)):]


def test_an_answer_longer_than_max_seq_len_is_a_config_error(tmp_path, tokenizer):
    rows = [{"context": "a", "continuation": " ".join(["river"] * 30)}]
    task, records = _task(tmp_path, tokenizer, rows, "language_modeling", max_seq_len=8)
    with pytest.raises(ConfigError, match="longer than max_seq_len"):
        task.prepare(records, 0)


def test_strip_dataset_strips_strings_but_not_lists(tmp_path):
    uri = write_jsonl(tmp_path / "s.jsonl", [{"query": " q \n", "choices": [" a ", "b\n"], "gold": 0}])
    assert read_records(uri) == [{"query": "q", "choices": [" a ", "b\n"], "gold": 0}]
    assert read_records(uri, strip=False)[0]["query"] == " q \n"


def test_missing_record_keys_are_reported(tmp_path, tokenizer):
    task, records = _task(tmp_path, tokenizer, [{"context": "x", "answer": "y"}], "multiple_choice")
    with pytest.raises(ConfigError, match="lacks query, choices, gold"):
        task.prepare(records, 0)


def test_missing_task_file_is_a_config_error(tokenizer):
    cfg = ICLTaskConfig(label="t", dataset_uri="eval/local_data/nope.jsonl", icl_task_type="schema", num_fewshot=[0])
    with pytest.raises(ConfigError, match="prepare_data.py"):
        read_records(cfg.dataset_uri)
