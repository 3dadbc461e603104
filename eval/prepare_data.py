"""Build ICL task files (llm-foundry's JSONL formats) under eval/local_data/ from public Hugging Face datasets.

    python eval/prepare_data.py [--out eval/local_data] [--tasks arc_easy piqa ...]

Needs network access and the `datasets` package (pip install datasets). Each converter maps one upstream row to
one record in the format eval/yamls/tasks_v0.3.yaml expects (see eval/README.md). The layout of the prompts
follows the files llm-foundry distributes (e.g. ARC queries are "Question: ...", BoolQ queries are
"Passage: ...\\nQuestion: ...?"), but upstream datasets change and llm-foundry's own files were made by its
authors' scripts, so numbers can differ slightly from runs on llm-foundry's files; to reproduce llm-foundry
exactly, copy its scripts/eval/local_data folder to eval/local_data instead. Each benchmark keeps its own license.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

Record = dict[str, Any]


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


# file -> (dataset name, config, split, converter)
SOURCES: dict[str, tuple[str, str | None, str, Callable[[dict], Record]]] = {
    "world_knowledge/arc_easy.jsonl": ("allenai/ai2_arc", "ARC-Easy", "test", arc),
    "world_knowledge/arc_challenge.jsonl": ("allenai/ai2_arc", "ARC-Challenge", "test", arc),
    "world_knowledge/mmlu.jsonl": ("cais/mmlu", "all", "test", mmlu),
    "commonsense_reasoning/piqa.jsonl": ("ybisk/piqa", None, "validation", piqa),
    "commonsense_reasoning/copa.jsonl": ("aps/super_glue", "copa", "validation", copa),
    "commonsense_reasoning/openbook_qa.jsonl": ("allenai/openbookqa", "main", "test", openbook_qa),
    "reading_comprehension/boolq.jsonl": ("google/boolq", None, "validation", boolq),
    "language_understanding/hellaswag.jsonl": ("Rowan/hellaswag", None, "validation", hellaswag),
    "language_understanding/winogrande.jsonl": ("allenai/winogrande", "winogrande_xl", "validation", winogrande),
    "language_understanding/lambada_openai.jsonl": ("EleutherAI/lambada_openai", "default", "test", lambada),
}


def write_jsonl(path: Path, records: Iterable[Record]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "local_data"))
    parser.add_argument("--tasks", nargs="*", help="stems of the files to build (default: all known)")
    args = parser.parse_args(argv)
    from datasets import load_dataset

    for rel, (name, config, split, convert) in SOURCES.items():
        stem = Path(rel).stem
        if args.tasks and stem not in args.tasks:
            continue
        dataset = load_dataset(name, config, split=split)
        n = write_jsonl(Path(args.out) / rel, (convert(dict(row)) for row in dataset))
        print(f"{rel}: {n} records from {name} ({config or 'default'}, {split})")
    missing = sorted(set(_referenced()) - set(SOURCES))
    if missing and not args.tasks:
        print("not built here (copy them from an llm-foundry local_data folder):\n  " + "\n  ".join(missing))
    return 0


def _referenced() -> list[str]:
    import yaml

    data = yaml.safe_load((Path(__file__).parent / "yamls" / "tasks_v0.3.yaml").read_text())
    return [t["dataset_uri"].removeprefix("eval/local_data/") for t in data["icl_tasks"]]


if __name__ == "__main__":
    raise SystemExit(main())
