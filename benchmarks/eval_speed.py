"""Time our ICL harness against lm-evaluation-harness on the same Hugging Face model and the same JSONL task.

    python benchmarks/eval_speed.py --model HF_FOLDER --data LOCAL_DATA_DIR [--tasks arc_easy copa] [--limit 300]
        [--repeat 3]

Both harnesses read the same file: the first --limit records of the task, stripped as llm-foundry strips them,
written to a temporary JSONL. Both run 0-shot, in this process, alternately --repeat times, with the same batch
size and thread count. The script prints each harness's acc / acc_norm (and llm-foundry's accuracy), the absolute
difference in points, the median seconds and the median of the per-run speed ratios (lm-eval seconds / our
seconds).

It also counts the work each harness hands the model (forward hooks on the same model object): the token
positions run through the transformer (padding included) and the positions run through the output projection.
The *floor* is every distinct token position computed once (each question's shared prefix once, each choice's
remaining tokens but its last) with the projection only where a continuation token is predicted; *bound* is
the speed-up that the floor allows at equal arithmetic speed: lm-eval's multiply-adds over the floor's (body
and projection weighed by their parameter counts). lm-eval is optional (`pip install lm-eval`); without it only
our numbers are printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path
from statistics import median

import torch

# label -> (file under local_data, task type, continuation delimiter as in eval/yamls/tasks_v0.3.yaml)
TASKS = {
    "arc_easy": ("world_knowledge/arc_easy.jsonl", "multiple_choice", "\nAnswer: "),
    "arc_challenge": ("world_knowledge/arc_challenge.jsonl", "multiple_choice", "\nAnswer: "),
    "copa": ("commonsense_reasoning/copa.jsonl", "multiple_choice", " "),
    "piqa": ("commonsense_reasoning/piqa.jsonl", "multiple_choice", "\nAnswer: "),
    "openbook_qa": ("commonsense_reasoning/openbook_qa.jsonl", "multiple_choice", " "),
    "winogrande": ("language_understanding/winogrande.jsonl", "schema", " "),
    "winograd_wsc": ("language_understanding/winograd_wsc.jsonl", "schema", " "),
    "lambada_openai": ("language_understanding/lambada_openai.jsonl", "language_modeling", " "),
    "boolq": ("reading_comprehension/boolq.jsonl", "multiple_choice", "\nAnswer: "),
}
ISSUE_TASKS = ["arc_easy", "arc_challenge", "piqa", "copa", "openbook_qa", "winogrande", "lambada_openai", "boolq"]


class WorkCounter:
    """Token positions a model's forward passes compute: through the transformer and through the output
    projection (counted with hooks, so it sees whatever any harness passes)."""

    def __init__(self, model):
        self.positions = self.projected = 0
        model.register_forward_pre_hook(self._inputs, with_kwargs=True)
        model.get_output_embeddings().register_forward_hook(self._head)

    def _inputs(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.positions += ids.numel()

    def _head(self, module, args, output):
        self.projected += output.shape[:-1].numel()

    def take(self) -> tuple[int, int]:
        counts = self.positions, self.projected
        self.positions = self.projected = 0
        return counts


def floor_positions(tokenizer, label, path, task_type, delimiter) -> tuple[int, int]:
    """(distinct token positions, positions predicting a continuation token) of a task, as our tasks build it."""
    from llmfoundry.eval.icl.scoring import packed_width
    from llmfoundry.eval.runner import ICLEvaluator

    task = {"label": label, "dataset_uri": str(path), "icl_task_type": task_type, "num_fewshot": [0],
            "continuation_delimiter": delimiter}
    groups = [ex.sequences for ex in ICLEvaluator([task], tokenizer).runs[0].examples]
    return (sum(packed_width(g) for g in groups),
            sum(len(s.tokens) - s.cont_start for g in groups for s in g))


def param_split(model) -> tuple[int, int]:
    """Parameters used per position by the transformer body and by the output projection."""
    head = model.get_output_embeddings().weight.numel()
    embed = model.get_input_embeddings().weight.numel()
    return sum(p.numel() for p in model.parameters()) - embed - (0 if model.config.tie_word_embeddings else head), head


def write_subset(src: Path, dst: Path, limit: int | None) -> int:
    from llmfoundry.eval.icl.data import read_records

    records = read_records(str(src), strip=True)[:limit]
    dst.write_text("".join(json.dumps(r) + "\n" for r in records))
    return len(records)


def lm_eval_task_yaml(name: str, path: Path, task_type: str, delimiter: str) -> str:
    """An lm-eval task over our JSONL that forms the same (context, continuation) pairs as our harness."""
    ctx_suffix = json.dumps(delimiter.rstrip())[1:-1]  # trailing whitespace moves to the continuation
    target_delim = delimiter[len(delimiter.rstrip()) :] or ""
    head = (
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {path}\n"
        f"test_split: test\ntarget_delimiter: {json.dumps(target_delim)}\n"
    )
    if task_type == "multiple_choice":
        return head + (
            f'output_type: multiple_choice\ndoc_to_text: "{{{{query}}}}{ctx_suffix}"\ndoc_to_choice: choices\n'
            "doc_to_target: gold\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n"
        )
    if task_type == "schema":
        return head + (
            "output_type: multiple_choice\ndoc_to_text: gold\ndoc_to_choice: context_options\n"
            "doc_to_target: continuation\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n"
        )
    return head + (
        f'output_type: loglikelihood\ndoc_to_text: "{{{{context}}}}{ctx_suffix}"\n'
        f"doc_to_target: \"{{{{'{json.dumps(target_delim)[1:-1]}' + continuation}}}}\"\n"
        "metric_list:\n  - metric: acc\n"
    )


def run_ours(model, tokenizer, label, path, task_type, delimiter, batch_size, kv_cache):
    from llmfoundry.eval.runner import ICLEvaluator

    start = time.perf_counter()
    task = {"label": label, "dataset_uri": str(path), "icl_task_type": task_type, "num_fewshot": [0],
            "continuation_delimiter": delimiter, "kv_cache": kv_cache}
    evaluator = ICLEvaluator([task], tokenizer, batch_size=batch_size, max_seq_len=2048)
    metrics = evaluator.evaluate(model, "cpu")
    seconds = time.perf_counter() - start
    return {k.split("/")[-1]: v for k, v in metrics.items()}, seconds


def run_lm_eval(model, tokenizer, label, path, task_type, delimiter, batch_size, workdir: Path):
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    name = f"lf_{label}"
    task_dir = workdir / name
    task_dir.mkdir(exist_ok=True)
    import logging

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    (task_dir / f"{name}.yaml").write_text(lm_eval_task_yaml(name, path, task_type, delimiter))
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    start = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=[name], task_manager=TaskManager(include_path=str(task_dir)),
                                  num_fewshot=0, log_samples=False, verbosity="WARNING")
    seconds = time.perf_counter() - start
    res = out["results"][name]
    return {k.split(",")[0]: v for k, v in res.items() if k.split(",")[0] in ("acc", "acc_norm")}, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--data", required=True, help="local_data folder (llm-foundry layout)")
    parser.add_argument("--tasks", nargs="+", default=ISSUE_TASKS, choices=sorted(TASKS))
    parser.add_argument("--limit", type=int, default=300, help="first N records of each task")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--kv-cache", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--skip-lm-eval", action="store_true")
    parser.add_argument("--repeat", type=int, default=3,
                        help="run the two harnesses alternately this many times; report medians")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    installed = importlib.util.find_spec("lm_eval") is not None
    have_lm_eval = installed and not args.skip_lm_eval
    if not installed:
        print("lm-evaluation-harness is not installed: printing our numbers only")
    print(f"model {args.model}, threads {torch.get_num_threads()}, batch size {args.batch_size}, 0-shot, "
          f"first {args.limit} documents, median of {args.repeat} runs")
    counter = WorkCounter(model)
    body, head = param_split(model)
    rows = []
    print("| task | type | n | harness | positions | projected | accuracy | acc | acc_norm | seconds |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for label in args.tasks:
            rel, task_type, delimiter = TASKS[label]
            path = workdir / f"{label}.jsonl"
            n = write_subset(Path(args.data) / rel, path, args.limit)
            t_ours, t_theirs = [], []
            for _ in range(args.repeat):
                ours, t = run_ours(model, tokenizer, label, path, task_type, delimiter, args.batch_size, args.kv_cache)
                t_ours.append(t)
                work_ours = counter.take()
                if have_lm_eval:
                    theirs, t = run_lm_eval(model, tokenizer, label, path, task_type, delimiter, args.batch_size,
                                            workdir)
                    t_theirs.append(t)
                    work_theirs = counter.take()
            floor = floor_positions(tokenizer, label, path, task_type, delimiter)
            acc_norm = ours.get("acc_norm", float("nan"))
            print(f"| {label} | {task_type} | {n} | llmfoundry | {work_ours[0]} | {work_ours[1]} | "
                  f"{ours['accuracy']:.4f} | {ours['acc']:.4f} | {acc_norm:.4f} | {median(t_ours):.1f} |", flush=True)
            print(f"| {label} | | | floor | {floor[0]} | {floor[1]} | | | | |", flush=True)
            if not have_lm_eval:
                continue
            print(f"| {label} | | | lm-eval | {work_theirs[0]} | {work_theirs[1]} | | {theirs['acc']:.4f} | "
                  f"{theirs.get('acc_norm', float('nan')):.4f} | {median(t_theirs):.1f} |", flush=True)
            diffs = [abs(ours[m] - theirs[m]) * 100 for m in ("acc", "acc_norm") if m in theirs]
            speedup = median([a / b for a, b in zip(t_theirs, t_ours)])
            bound = (work_theirs[0] * body + work_theirs[1] * head) / (floor[0] * body + floor[1] * head)
            rows.append((label, diffs, speedup, min(t_theirs[i] / t_ours[i] for i in range(args.repeat)),
                         max(t_theirs[i] / t_ours[i] for i in range(args.repeat)),
                         work_theirs[0] / work_ours[0], bound))
    if rows:
        print("\n| task | acc diff (points) | acc_norm diff (points) | speed-up (median) | min-max | "
              "positions lm-eval/ours | bound at the floor |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, diffs, speedup, lo, hi, ratio, bound in rows:
            norm = f"{diffs[1]:.2f}" if len(diffs) > 1 else "-"
            print(f"| {label} | {diffs[0]:.2f} | {norm} | {speedup:.2f}x | {lo:.2f}-{hi:.2f} | {ratio:.2f} | "
                  f"{bound:.2f}x |")


if __name__ == "__main__":
    main()
