"""eval/prepare_data.py's builders on small in-memory rows with the public datasets' field names (no download)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from llmfoundry.eval.config import load_icl_tasks
from llmfoundry.eval.runner import ICLEvaluator

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prep():
    spec = importlib.util.spec_from_file_location("prepare_data", ROOT / "eval" / "prepare_data.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _bigbench(task: str) -> list[dict]:
    if task in ("strange_stories", "strategyqa", "elementary_math_qa"):
        return [{"inputs": f"Q{i}: is it so?", "targets": ["Yes"], "multiple_choice_targets": ["Yes", "No"],
                 "multiple_choice_scores": [1, 0] if i % 2 else [0, 1], "idx": i} for i in range(3)]
    return [{"inputs": f"{task} input {i}:", "targets": [f"out{i}", "alt"], "multiple_choice_targets": [],
             "multiple_choice_scores": [], "idx": i} for i in range(3)]


ROWS: dict[tuple[str, str | None], list[dict]] = {
    ("allenai/ai2_arc", "ARC-Easy"): [{"id": "1", "question": "Which is a gas?", "answerKey": "B",
                                       "choices": {"text": ["rock", "air", "wood"], "label": ["A", "B", "C"]}}] * 2,
    ("cais/mmlu", "all"): [{"question": "2+2?", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1}] * 2,
    ("mandarjoshi/trivia_qa", "rc.nocontext"): [
        {"question": "Capital of France?", "question_id": "q1",
         "answer": {"value": "Paris", "aliases": ["Paris", "Paree"], "normalized_value": "paris",
                    "normalized_aliases": ["paris", "paree"]}}] * 2,
    ("ybisk/piqa", None): [{"goal": "Open a jar", "sol1": "twist the lid", "sol2": "hit it", "label": 0}] * 2,
    ("aps/super_glue", "copa"): [{"premise": "The man fell.", "choice1": "He slipped.", "choice2": "He ate.",
                                  "question": "cause", "idx": 0, "label": 0}] * 2,
    ("allenai/openbookqa", "main"): [{"id": "1", "question_stem": "Sun is a", "answerKey": "A",
                                      "choices": {"text": ["star", "planet"], "label": ["A", "B"]}}] * 2,
    ("allenai/social_i_qa", None): [{"context": "Alex gave Sam a gift.", "question": "How does Sam feel?",
                                     "answerA": "sad", "answerB": "thankful", "answerC": "angry", "label": "2"}] * 2,
    ("tau/commonsense_qa", None): [{"id": "1", "question": "Where do fish live?", "question_concept": "fish",
                                    "choices": {"label": ["A", "B"], "text": ["water", "sky"]}, "answerKey": "A"}] * 2,
    ("google/boolq", None): [{"question": "Is water wet", "answer": True, "passage": "Water is wet."}] * 2,
    ("rajpurkar/squad", None): [{"id": "1", "title": "T", "context": "Paris is in France.",
                                 "question": "Where is Paris?", "answers": {"text": ["France"], "answer_start": [12]}}] * 2,
    ("stanfordnlp/coqa", None): [{"source": "wiki", "story": "Ann has a red ball.",
                                  "questions": ["Who has a ball?", "What color?"],
                                  "answers": {"input_text": ["Ann", "red"], "answer_start": [0, 10],
                                              "answer_end": [3, 13]}}] * 2,
    ("Rowan/hellaswag", None): [{"ind": 0, "activity_label": "Cooking", "ctx_a": "A man cuts onions.",
                                 "ctx_b": "he", "ctx": "", "endings": ["cries.", "flies.", "sings.", "runs."],
                                 "source_id": "x", "split": "val", "split_type": "indomain", "label": "0"}] * 2,
    ("allenai/winogrande", "winogrande_xl"): [{"sentence": "Ann helped Sue because _ was kind.", "option1": "Ann",
                                               "option2": "Sue", "answer": "1"}] * 2,
    ("ErnestSDavis/winograd_wsc", "wsc273"): [
        {"text": "The trophy does not fit in the suitcase because it is too big.", "pronoun": "it",
         "pronoun_loc": 48, "quote": "it is too big", "quote_loc": 48, "options": ["the trophy", "the suitcase"],
         "label": 0, "source": "x"}] * 2,
    ("EleutherAI/lambada_openai", "default"): [{"text": "She opened the door and saw her friend"}] * 2,
    ("openai/gsm8k", "main"): [{"question": f"What is {i} + {i}?",
                                "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i:,}"}
                               for i in (1, 2, 1500)],
    ("ChilleD/SVAMP", None): [{"ID": "1", "Body": "Tom has 3 apples.", "Question": "He eats 1. How many are left?",
                               "Equation": "( 3.0 - 1.0 )", "Answer": 2.0, "Type": "Subtraction"}] * 2,
}
for _name in ("lsat-ar", "lsat-lr", "lsat-rc", "sat-en"):
    ROWS[(f"hails/agieval-{_name}", None)] = [
        {"query": "Passage: ...\nQ: Which one? Answer Choices: (A)x (B)y\nA: Among A through B, the answer is",
         "choices": ["(A)x", "(B)y"], "gold": [1]}] * 2
for _task in ("qa_wikidata", "strange_stories", "strategyqa", "elementary_math_qa", "dyck_languages",
              "cs_algorithms", "operators"):
    ROWS[("tasksource/bigbench", _task)] = _bigbench(_task)
ROWS[("allenai/ai2_arc", "ARC-Challenge")] = ROWS[("allenai/ai2_arc", "ARC-Easy")]


def fake_load(name, config, split):
    if (name, config) not in ROWS:
        raise KeyError(f"no rows for {name} {config}")
    return [json.loads(json.dumps(r)) for r in ROWS[(name, config)]]


def test_converters_on_hand_checked_rows(prep):
    (wsc,) = list(prep.Source("x", None, "test", prep.winograd_wsc)(lambda *a: ROWS[("ErnestSDavis/winograd_wsc",
                                                                                    "wsc273")][:1]))
    assert wsc == {"context_options": ["The trophy does not fit in the suitcase because the trophy",
                                       "The trophy does not fit in the suitcase because the suitcase"],
                   "continuation": "is too big.", "gold": 0}
    assert prep.siqa(ROWS[("allenai/social_i_qa", None)][0])["gold"] == 1  # label "2" is the second answer
    assert prep.triviaqa(ROWS[("mandarjoshi/trivia_qa", "rc.nocontext")][0]) == {
        "context": "Capital of France?", "answer": "Paris", "aliases": ["Paris", "Paree"]}
    assert prep.bigbench_mc(_bigbench("strategyqa")[0])["gold"] == 1  # scores [0, 1]
    assert prep.bigbench_mc({**_bigbench("strategyqa")[0], "multiple_choice_targets": []}) is None
    assert prep.agieval(ROWS[("hails/agieval-sat-en", None)][0])["choices"] == ["x", "y"]
    assert prep.svamp(ROWS[("ChilleD/SVAMP", None)][0])["answer"] == "2"
    assert prep.coqa(ROWS[("stanfordnlp/coqa", None)][0]) == {
        "context": "Ann has a red ball.\n\nQ: Who has a ball?\nA: Ann\nQ: What color?\nA:", "continuation": "red"}
    gsm = list(prep.gsm8k(fake_load, shots=2))
    assert gsm[2]["answer"] == "3000" and gsm[2]["chain_of_thought"] == " 1500 + 1500 = 3000 "
    assert gsm[0]["context"].startswith("Question: What is 1 + 1?\n\nA: 1 + 1 = 2 The answer is 2.\n\nQuestion: ")
    for spaces in (False, True):
        records = list(prep.simple_arithmetic(spaces, n=50))
        assert records == list(prep.simple_arithmetic(spaces, n=50))  # deterministic
        for r in records:
            assert r["context"].endswith(" =" if spaces else "=") and (" " in r["context"]) == spaces
            assert eval(r["context"].rstrip("=")) == int(r["continuation"])  # noqa: S307


def test_every_v03_task_file_but_jeopardy_builds_and_loads_as_its_task_type(prep, tmp_path, tokenizer):
    failed = prep.build(tmp_path, load=fake_load)
    assert list(failed) == ["world_knowledge/jeopardy_all.jsonl"]
    tasks = [dataclasses.replace(t, dataset_uri=str(tmp_path / t.dataset_uri.removeprefix("eval/local_data/")))
             for t in load_icl_tasks(str(ROOT / "eval" / "yamls" / "tasks_v0.3.yaml")) if t.label != "jeopardy"]
    assert len(tasks) == 31
    evaluator = ICLEvaluator(tasks, tokenizer, max_seq_len=512)  # reads every file, checks its fields, builds prompts
    assert all(n > 0 for n in evaluator.sample_counts().values())


def test_the_script_reports_what_it_could_not_build(prep, tmp_path, monkeypatch, capsys):
    def half_offline(name, config, split):
        if name == "google/boolq":
            raise ConnectionError("offline")
        return fake_load(name, config, split)

    monkeypatch.setattr(prep, "hf_loader", half_offline)
    assert prep.main(["--out", str(tmp_path), "--tasks", "boolq", "piqa", "jeopardy_all", "nope"]) == 1
    out = capsys.readouterr().out
    assert "commonsense_reasoning/piqa.jsonl: 2 records" in out
    assert "could not build 3 task file(s)" in out
    assert "reading_comprehension/boolq.jsonl: ConnectionError: offline" in out
    assert "world_knowledge/jeopardy_all.jsonl: llm-foundry's Jeopardy! file" in out
    assert "nope: not a task file" in out
    assert not (tmp_path / "reading_comprehension" / "boolq.jsonl").exists()  # no partial file
