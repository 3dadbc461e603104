"""Build ICL task files (llm-foundry's JSONL formats) under eval/local_data/ from public Hugging Face datasets.

    python eval/prepare_data.py [--out eval/local_data] [--tasks arc_easy piqa ...]

Needs network access and the `datasets` package (pip install datasets). Each builder maps upstream rows to records
in the format eval/yamls/tasks_v0.3.yaml expects (see eval/README.md); the two simple_arithmetic files are
generated here (no download). The layout of the prompts follows the files llm-foundry distributes (e.g. ARC
queries are "Question: ...", BoolQ queries are "Passage: ...\\nQuestion: ...?"), but upstream datasets change and
llm-foundry's own files were made by its authors' scripts (some from subsets or with their own few-shot
preambles), so numbers can differ from runs on llm-foundry's files; to reproduce llm-foundry exactly, copy its
scripts/eval/local_data folder to eval/local_data instead. Each benchmark keeps its own license.

At the end the script lists every task file of tasks_v0.3.yaml that it could not build (no public source, or the
download or conversion failed) and exits with status 1 if there is one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Record = dict[str, Any]
# (dataset name, config, split) -> rows; the real one is hf_loader, tests pass in-memory rows
Loader = Callable[[str, "str | None", str], Iterable[dict]]


def arc(row: dict) -> Record:
    labels = list(row["choices"]["label"])
    return {"query": f"Question: {row['question']}", "choices": list(row["choices"]["text"]),
            "gold": labels.index(row["answerKey"])}


def piqa(row: dict) -> Record:
    return {"query": f"Question: {row['goal']}\n", "choices": [row["sol1"], row["sol2"]], "gold": int(row["label"])}


def boolq(row: dict) -> Record:
    question = row["question"].strip()
    question = question[0].lower() + question[1:] if question else question
    return {"query": f"Passage: {row['passage']}\nQuestion: {question}?", "choices": ["no", "yes"],
            "gold": int(bool(row["answer"]))}


def copa(row: dict) -> Record:
    connector = {"cause": "because", "effect": "therefore"}[row["question"]]
    premise = row["premise"].strip().rstrip(".")

    def lower_first(text: str) -> str:
        return text[0].lower() + text[1:] if text else text

    return {"query": f"{premise}, {connector}", "choices": [lower_first(row["choice1"]), lower_first(row["choice2"])],
            "gold": int(row["label"])}


def openbook_qa(row: dict) -> Record:
    labels = list(row["choices"]["label"])
    return {"query": row["question_stem"], "choices": list(row["choices"]["text"]), "gold": labels.index(row["answerKey"])}


def hellaswag(row: dict) -> Record:
    def clean(text: str) -> str:
        text = text.replace(" [title]", ". ")
        text = re.sub(r"\[.*?\]", "", text)
        return text.replace("  ", " ").strip()

    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    return {"query": clean(row["activity_label"] + ": " + ctx), "choices": [clean(e) for e in row["endings"]],
            "gold": int(row["label"])}


def winogrande(row: dict) -> Record:
    sentence = row["sentence"]
    cut = sentence.index("_")
    before, after = sentence[:cut], sentence[cut + 1 :].strip()
    return {"context_options": [before + row["option1"], before + row["option2"]], "continuation": after,
            "gold": int(row["answer"]) - 1}


def lambada(row: dict) -> Record:
    context, _, word = row["text"].rpartition(" ")
    return {"context": context, "continuation": word}


def mmlu(row: dict) -> Record:
    letters = "ABCD"
    options = "\n".join(f"{letters[i]}. {c}" for i, c in enumerate(row["choices"]))
    return {"query": f"{row['question']}\n{options}", "choices": list(letters), "gold": int(row["answer"]),
            "category": row.get("subject", "all")}


def siqa(row: dict) -> Record:
    return {"query": f"{row['context']} {row['question']}",
            "choices": [row["answerA"], row["answerB"], row["answerC"]], "gold": int(row["label"]) - 1}


def commonsense_qa(row: dict) -> Record:
    labels = list(row["choices"]["label"])
    return {"query": row["question"], "choices": list(row["choices"]["text"]), "gold": labels.index(row["answerKey"])}


def triviaqa(row: dict) -> Record:
    answer = row["answer"]
    aliases = [a for a in dict.fromkeys(answer.get("aliases") or []) if a != answer["value"]]
    return {"context": row["question"], "answer": answer["value"], "aliases": [answer["value"], *aliases]}


def bigbench_mc(row: dict) -> Record | None:
    """A BIG-bench multiple-choice example (tasksource/bigbench): the choice scored 1 is gold."""
    choices, scores = list(row["multiple_choice_targets"]), list(row["multiple_choice_scores"])
    if not choices or scores.count(1) != 1:
        return None
    return {"query": row["inputs"], "choices": choices, "gold": scores.index(1)}


def bigbench_lm(row: dict) -> Record | None:
    """A BIG-bench generative example as language modeling: the first target continues the input."""
    if not row["targets"]:
        return None
    return {"context": row["inputs"], "continuation": row["targets"][0]}


def winograd_wsc(row: dict) -> Record:
    """WSC273: the pronoun is replaced by each candidate; the rest of the sentence is the shared continuation."""
    text, start = row["text"], int(row["pronoun_loc"])
    before, after = text[:start], text[start + len(row["pronoun"]) :]
    return {"context_options": [before + option for option in row["options"]], "continuation": after.strip(),
            "gold": int(row["label"])}


def agieval(row: dict) -> Record:
    """AGIEval (hails/agieval-*): the query already lists the options; the choices lose their "(A)" labels."""
    choices = [re.sub(r"^\([A-Z]\)\s*", "", c) for c in row["choices"]]
    gold = row["gold"][0] if isinstance(row["gold"], list) else row["gold"]
    return {"query": row["query"], "choices": choices, "gold": int(gold)}


def _number(value: Any) -> str:
    number = float(value)
    return str(int(number)) if number.is_integer() else str(number)


def svamp(row: dict) -> Record:
    return {"context": f"{row['Body'].strip()} {row['Question'].strip()}", "chain_of_thought": row["Equation"].strip(),
            "answer": _number(row["Answer"])}


def squad(row: dict) -> Record:
    return {"context": f"Context: {row['context']}\nQuestion: {row['question']}\nAnswer:",
            "continuation": row["answers"]["text"][0]}


def coqa(row: dict) -> Record:
    """CoQA: the story and the conversation so far; the last question's answer is the continuation."""
    questions, answers = list(row["questions"]), list(row["answers"]["input_text"])
    turns = "".join(f"Q: {q}\nA: {a}\n" for q, a in zip(questions[:-1], answers[:-1]))
    return {"context": f"{row['story']}\n\n{turns}Q: {questions[-1]}\nA:", "continuation": answers[-1]}


def _gsm8k_parts(answer: str) -> tuple[str, str]:
    reasoning, _, final = answer.rpartition("####")
    reasoning = re.sub(r"<<[^>]*>>", "", reasoning).strip().replace("\n", " ")
    return reasoning, final.strip().replace(",", "")


def gsm8k(load: Loader, shots: int = 8) -> Iterator[Record]:
    """GSM8K test questions, each after the same 8 solved train questions (a chain of thought ending in "The answer
    is N."), like llm-foundry's gsm8k_prepended_8shot file (whose 8 examples are its own)."""
    exemplars = []
    for row in list(load("openai/gsm8k", "main", "train"))[:shots]:
        reasoning, final = _gsm8k_parts(row["answer"])
        exemplars.append(f"Question: {row['question']}\n\nA: {reasoning} The answer is {final}.")
    preamble = "\n\n".join(exemplars)
    for row in load("openai/gsm8k", "main", "test"):
        reasoning, final = _gsm8k_parts(row["answer"])
        yield {"context": f"{preamble}\n\nQuestion: {row['question']}", "chain_of_thought": f" {reasoning} ",
               "answer": final}


def simple_arithmetic(spaces: bool, n: int = 1000, seed: int = 1234) -> Iterator[Record]:
    """Generated expressions of 2-4 one- or two-digit numbers with + - * (Python's precedence), e.g.
    "3+4*2=" -> "11" (with spaces: "3 + 4 * 2 =" -> "11"); deterministic for a seed. llm-foundry generated its
    files the same way with its own random draws, so the expressions differ from its files."""
    rng = random.Random(seed)
    for _ in range(n):
        numbers = [rng.randint(0, 99 if rng.random() < 0.5 else 9) for _ in range(rng.randint(2, 4))]
        ops = [rng.choice("+-*") for _ in numbers[1:]]
        expr = str(numbers[0]) + "".join(f"{op}{num}" for op, num in zip(ops, numbers[1:]))
        value = eval(expr)  # noqa: S307 - digits and + - * only, built above
        shown = re.sub(r"([+\-*])", r" \1 ", expr) + " =" if spaces else expr + "="
        yield {"context": shown, "continuation": str(value)}


@dataclass(frozen=True)
class Source:
    """Rows of one public dataset split, each converted to one record (rows the converter rejects are skipped)."""

    dataset: str
    config: str | None
    split: str
    convert: Callable[[dict], Record | None]
    limit: int | None = None  # keep the first N records (llm-foundry's *_sm_sub files are subsets)

    def __call__(self, load: Loader) -> Iterator[Record]:
        kept = 0
        for row in load(self.dataset, self.config, self.split):
            record = self.convert(dict(row))
            if record is None:
                continue
            yield record
            kept += 1
            if self.limit is not None and kept >= self.limit:
                return

    def describe(self) -> str:
        return f"{self.dataset} ({self.config or 'default'}, {self.split})"


def _bigbench(task: str, convert: Callable[[dict], Record | None]) -> Source:
    return Source("tasksource/bigbench", task, "train+validation", convert)


def _agieval(name: str) -> Source:
    return Source(f"hails/agieval-{name}", None, "test", agieval)


# task file (relative to eval/local_data) -> builder(load) -> records
BUILDERS: dict[str, Callable[[Loader], Iterable[Record]]] = {
    "world_knowledge/arc_easy.jsonl": Source("allenai/ai2_arc", "ARC-Easy", "test", arc),
    "world_knowledge/arc_challenge.jsonl": Source("allenai/ai2_arc", "ARC-Challenge", "test", arc),
    "world_knowledge/mmlu.jsonl": Source("cais/mmlu", "all", "test", mmlu),
    "world_knowledge/bigbench_qa_wikidata.jsonl": _bigbench("qa_wikidata", bigbench_lm),
    "world_knowledge/triviaqa_sm_sub.jsonl": Source("mandarjoshi/trivia_qa", "rc.nocontext", "validation", triviaqa,
                                                    limit=3000),
    "commonsense_reasoning/piqa.jsonl": Source("ybisk/piqa", None, "validation", piqa),
    "commonsense_reasoning/copa.jsonl": Source("aps/super_glue", "copa", "validation", copa),
    "commonsense_reasoning/openbook_qa.jsonl": Source("allenai/openbookqa", "main", "test", openbook_qa),
    "commonsense_reasoning/siqa.jsonl": Source("allenai/social_i_qa", None, "validation", siqa),
    "commonsense_reasoning/commonsense_qa.jsonl": Source("tau/commonsense_qa", None, "validation", commonsense_qa),
    "commonsense_reasoning/bigbench_strange_stories.jsonl": _bigbench("strange_stories", bigbench_mc),
    "commonsense_reasoning/bigbench_strategy_qa.jsonl": _bigbench("strategyqa", bigbench_mc),
    "reading_comprehension/boolq.jsonl": Source("google/boolq", None, "validation", boolq),
    "reading_comprehension/squad.jsonl": Source("rajpurkar/squad", None, "validation", squad),
    "reading_comprehension/coqa.jsonl": Source("stanfordnlp/coqa", None, "validation", coqa),
    "reading_comprehension/agi_eval_lsat_rc.jsonl": _agieval("lsat-rc"),
    "reading_comprehension/agi_eval_lsat_lr.jsonl": _agieval("lsat-lr"),
    "reading_comprehension/agi_eval_sat_en.jsonl": _agieval("sat-en"),
    "language_understanding/hellaswag.jsonl": Source("Rowan/hellaswag", None, "validation", hellaswag),
    "language_understanding/winogrande.jsonl": Source("allenai/winogrande", "winogrande_xl", "validation", winogrande),
    "language_understanding/winograd_wsc.jsonl": Source("ErnestSDavis/winograd_wsc", "wsc273", "test", winograd_wsc),
    "language_understanding/lambada_openai.jsonl": Source("EleutherAI/lambada_openai", "default", "test", lambada),
    "symbolic_problem_solving/bigbench_elementary_math_qa.jsonl": _bigbench("elementary_math_qa", bigbench_mc),
    "symbolic_problem_solving/bigbench_dyck_languages.jsonl": _bigbench("dyck_languages", bigbench_lm),
    "symbolic_problem_solving/bigbench_cs_algorithms.jsonl": _bigbench("cs_algorithms", bigbench_lm),
    "symbolic_problem_solving/bigbench_operators.jsonl": _bigbench("operators", bigbench_lm),
    "symbolic_problem_solving/simple_arithmetic_nospaces.jsonl": lambda load: simple_arithmetic(spaces=False),
    "symbolic_problem_solving/simple_arithmetic_withspaces.jsonl": lambda load: simple_arithmetic(spaces=True),
    "symbolic_problem_solving/agi_eval_lsat_ar.jsonl": _agieval("lsat-ar"),
    "symbolic_problem_solving/gsm8k_prepended_8shot.jsonl": gsm8k,
    "symbolic_problem_solving/svamp.jsonl": Source("ChilleD/SVAMP", None, "test", svamp),
}

# task files of tasks_v0.3.yaml with no public source to build them from
NOT_BUILDABLE: dict[str, str] = {
    "world_knowledge/jeopardy_all.jsonl": "llm-foundry's Jeopardy! file is its own selection of categories "
    "(american_history, literature, science, word_origins, world_history) from a scrape with no maintained Hugging "
    "Face dataset; copy it from an llm-foundry local_data folder",
}


def hf_loader(name: str, config: str | None, split: str) -> Iterable[dict]:
    from datasets import load_dataset

    return load_dataset(name, config, split=split)


def write_jsonl(path: Path, records: Iterable[Record]) -> int:
    """Write the records (all or nothing: a failure midway leaves no partial file); returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    n = 0
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                n += 1
        if n == 0:
            raise ValueError("no records")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return n


def build(out: Path, wanted: list[str] | None = None, load: Loader | None = None) -> dict[str, str]:
    """Build the task files of tasks_v0.3.yaml (or those whose stem is in ``wanted``) under ``out``; returns the
    ones that could not be built, with why. ``load``: where rows come from (default: hf_loader, online)."""
    load = load or hf_loader
    failed: dict[str, str] = {}
    for rel in referenced():
        if wanted and Path(rel).stem not in wanted:
            continue
        if rel in NOT_BUILDABLE:
            failed[rel] = NOT_BUILDABLE[rel]
            continue
        builder = BUILDERS.get(rel)
        if builder is None:
            failed[rel] = "no builder for this file"
            continue
        try:
            n = write_jsonl(out / rel, builder(load))
        except Exception as error:  # noqa: BLE001 - offline, a renamed dataset, a changed schema...: report, go on
            text = str(error).strip().splitlines()
            failed[rel] = f"{type(error).__name__}: {text[0] if text else ''}"
            print(f"{rel}: FAILED ({failed[rel]})", flush=True)
            continue
        source = builder.describe() if isinstance(builder, Source) else "generated or several splits"
        print(f"{rel}: {n} records from {source}", flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "local_data"))
    parser.add_argument("--tasks", nargs="*", help="stems of the files to build (default: every file of tasks_v0.3)")
    args = parser.parse_args(argv)
    failed = build(Path(args.out), args.tasks)
    if args.tasks:
        unknown = sorted(set(args.tasks) - {Path(rel).stem for rel in referenced()})
        for stem in unknown:
            failed[stem] = "not a task file of eval/yamls/tasks_v0.3.yaml"
    if failed:
        print(f"\ncould not build {len(failed)} task file(s); their tasks fail until the file is there (copy it from "
              "an llm-foundry local_data folder, or remove the task from a copy of the task list):")
        for rel, why in failed.items():
            print(f"  {rel}: {why}")
        return 1
    return 0


def referenced() -> list[str]:
    """The task files of eval/yamls/tasks_v0.3.yaml, relative to eval/local_data."""
    import yaml

    data = yaml.safe_load((Path(__file__).parent / "yamls" / "tasks_v0.3.yaml").read_text())
    return list(dict.fromkeys(t["dataset_uri"].removeprefix("eval/local_data/") for t in data["icl_tasks"]))


if __name__ == "__main__":
    raise SystemExit(main())
