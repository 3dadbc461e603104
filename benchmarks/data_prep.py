"""Data pipeline throughput, measured side by side in one run (tokens/s).

1. Raw batch encoding: the tokenizer's own ``tokenizer(list_of_docs)`` on the whole corpus, all cores
   (TOKENIZERS_PARALLELISM=true) — the baseline. Its Rust backend's ``encode_batch_fast`` (no offsets, no Python
   wrapper: the fastest call the tokenizer has) is timed too, as a second, stricter reference.
2. End-to-end converters, each reported as a ratio to (1) measured in the same run (target >= 0.9x in the median
   of the runs): ``convert_text_to_mds`` (text files in -> zstd MDS shards out, --processes = all cores),
   ``convert_dataset_json`` (one JSONL file in, --num_workers = all cores) and ``convert_dataset_hf`` (the same
   records as a Hugging Face dataset saved with ``save_to_disk``, so Arrow's one-off JSON parse is not timed).
   ``--repeat N`` runs (1) and the chosen converters N times and prints, per converter, the median and the spread
   (min-max) of each rate and the median of the per-run ratios. ``--profile`` prints the time by phase of each
   converter's last run (reading, worker start-up, tokenizing, writing samples, flushing shards, merging).
3. The ``text`` loader reading the converter's shards (shuffled), against what a training step consumes: a few
   steps (forward + loss + backward + AdamW) of an MPT on the loader's own batches, timed in the same run on this
   machine's device; the loader's headroom is their ratio (above 1: the loader is not the bottleneck).
   ``--model quickstart`` (default) is the quickstart's shape; ``--model 125m`` is MPT-125M (slow on a CPU).
   ``--skip_loader`` leaves this part out.

    python benchmarks/data_prep.py [--docs 20000] [--repeat 5] [--converter text|json|hf|all] [--profile]
        [--tokenizer DIR] [--concat_tokens 2048] [--model quickstart] [--skip_loader]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET = 0.9
CONVERTERS = ("text", "json", "hf")
MODEL_SHAPES = {
    "quickstart": dict(d_model=128, n_heads=4, n_layers=2),
    "125m": dict(d_model=768, n_heads=12, n_layers=12),
}


def training_tokens_per_s(batches, vocab_size: int, seq_len: int, shape: str, steps: int) -> tuple[float, str]:
    """Tokens/s of forward + loss + backward + AdamW on ``batches`` (one warm-up step is not timed)."""
    import torch

    from llmfoundry.models.mpt.config import MPTConfig
    from llmfoundry.models.mpt.model import MPTForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = MPTConfig(**MODEL_SHAPES[shape], expansion_ratio=4, max_seq_len=seq_len, vocab_size=vocab_size,
                       no_bias=True, learned_pos_emb=False, attn_config={"attn_impl": "sdpa", "alibi": True})
    model = MPTForCausalLM(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    seen, elapsed = 0, 0.0
    for i, batch in enumerate(batches[: steps + 1]):
        input_ids = batch["input_ids"].to(device)
        start = time.perf_counter()
        loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if i > 0:
            elapsed += time.perf_counter() - start
            seen += input_ids.numel()
    return seen / elapsed, device


def synthetic_corpus(work: Path, n_docs: int, tokenizer_dir: str | None) -> tuple[list[str], str]:
    """``n_docs`` documents of the tests' synthetic text (~4 paragraphs each) and a tokenizer folder: the one given,
    else a 4096-token BPE trained on the first 2000 documents in ``work``."""
    from llmfoundry.data.tokenizer_training import train_bpe_tokenizer
    from tests.helpers import make_corpus

    docs = [" ".join(make_corpus(4, seed=i)) for i in range(n_docs)]
    if tokenizer_dir is None:
        tokenizer_dir = str(work / "tok")
        train_bpe_tokenizer(docs[:2000], vocab_size=4096, out_dir=tokenizer_dir)
    return docs, tokenizer_dir


def prepare_inputs(work: Path, docs: list[str], converters: list[str]) -> dict[str, Path]:
    """The corpus as the converters read it: .txt files, a JSONL file, a saved Hugging Face dataset."""
    inputs = {"text": work / "texts", "json": work / "docs.jsonl", "hf": work / "hf_dataset"}
    inputs["text"].mkdir()
    for i, doc in enumerate(docs):
        (inputs["text"] / f"{i:06d}.txt").write_text(doc)
    with open(inputs["json"], "w") as f:
        f.writelines(json.dumps({"text": doc}) + "\n" for doc in docs)
    if "hf" in converters:
        import datasets

        datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(inputs["hf"]))
    return inputs


def run_converter(name: str, inputs: dict[str, Path], out: Path, tokenizer_dir: str, concat_tokens: int,
                  processes: int) -> Path:
    """One end-to-end conversion; returns the folder holding the MDS index."""
    from llmfoundry.data.prep.json_data import main_hf, main_json
    from llmfoundry.data.prep.text import main as text_main

    common = ["--concat_tokens", str(concat_tokens), "--tokenizer", tokenizer_dir, "--quiet"]
    if name == "text":
        text_main(["--input_folder", str(inputs["text"]), "--output_folder", str(out), "--processes", str(processes),
                   "--use_tokenizer_eos", *common])
        return out
    if name == "json":
        main_json(["--path", str(inputs["json"]), "--out_root", str(out), "--num_workers", str(processes), *common])
    else:
        main_hf(["--dataset", str(inputs["hf"]), "--splits", "train", "--out_root", str(out), "--num_workers",
                 str(processes), *common])
    return out / "train"


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all its threads) and of its finished child processes."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def spread(values: list[float], fmt: str) -> str:
    return f"median {format(statistics.median(values), fmt)} (min {format(min(values), fmt)}, max {format(max(values), fmt)})"


def print_profile(name: str, phases: dict[str, float]) -> None:
    wall = phases.get("wall time (this process)", 0.0) or 1.0
    print(f"\ntime by phase, {name} converter, last run (seconds; phases in workers are summed over the workers):")
    for phase, seconds in phases.items():
        print(f"  {phase:<44} {seconds:8.3f}  {seconds / wall:6.1%} of wall")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5, help="runs; the median and the spread are reported")
    parser.add_argument("--converter", choices=[*CONVERTERS, "all"], default="text", help="converter(s) to time")
    parser.add_argument("--profile", action="store_true", help="print each converter's time by phase (last run)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: a 4096-token BPE trained here)")
    parser.add_argument("--concat_tokens", type=int, default=2048)
    parser.add_argument("--model", choices=sorted(MODEL_SHAPES), default="quickstart", help="MPT shape to train")
    parser.add_argument("--train_steps", type=int, default=4, help="timed training steps (after one warm-up)")
    parser.add_argument("--skip_loader", action="store_true", help="time the converters only")
    args = parser.parse_args()
    from llmfoundry.data.prep import timing
    from llmfoundry.data.tokenizers import build_tokenizer

    converters = list(CONVERTERS) if args.converter == "all" else [args.converter]
    work = Path(tempfile.mkdtemp(prefix="llmfoundry-bench-"))
    try:
        docs, tokenizer_dir = synthetic_corpus(work, args.docs, args.tokenizer)
        inputs = prepare_inputs(work, docs, converters)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        tokenizer = build_tokenizer(tokenizer_dir, {})
        tokenizer(docs[:100])  # warm up
        raw_rates: list[float] = []
        fast_rates: list[float] = []
        backend = getattr(tokenizer, "backend_tokenizer", None)
        backend = backend if hasattr(backend, "encode_batch_fast") else None
        # CPU seconds per run (all threads and worker processes): less sensitive to other jobs than wall time
        raw_cpu: list[float] = []
        cpu: dict[str, list[float]] = {name: [] for name in converters}
        rates: dict[str, list[float]] = {name: [] for name in converters}
        ratios: dict[str, list[float]] = {name: [] for name in converters}
        profiles: dict[str, dict[str, float]] = {}
        tokens = 0
        out = work / "mds"
        for run in range(args.repeat):
            start, start_cpu = time.perf_counter(), cpu_seconds()
            encoded = tokenizer(docs, add_special_tokens=False)["input_ids"]
            raw_s = time.perf_counter() - start
            raw_cpu.append(cpu_seconds() - start_cpu)
            tokens = sum(len(x) for x in encoded) + len(docs)  # + one EOS per document, as the converters add
            del encoded  # not held (nor inherited by forked workers) while the converters run
            raw_rates.append(tokens / raw_s)
            line = [f"run {run + 1}: raw {raw_rates[-1]:,.0f} tok/s"]
            if backend is not None:  # the Rust tokenizer's own fastest batch call: no offsets, no Python wrapper
                start = time.perf_counter()
                backend.encode_batch_fast(docs, add_special_tokens=False)
                fast_rates.append(tokens / (time.perf_counter() - start))
                line.append(f"raw fast {fast_rates[-1]:,.0f} tok/s")
            for name in converters:
                shutil.rmtree(out, ignore_errors=True)
                start, start_cpu = time.perf_counter(), cpu_seconds()
                mds = run_converter(name, inputs, out, tokenizer_dir, args.concat_tokens, cores)
                rate = tokens / (time.perf_counter() - start)
                cpu[name].append(cpu_seconds() - start_cpu)
                rates[name].append(rate)
                ratios[name].append(rate / raw_rates[-1])
                profiles[name] = timing.last()
                line.append(f"{name} {rate:,.0f} tok/s ({ratios[name][-1]:.2f}x)")
                if os.environ.get("TOKENIZERS_PARALLELISM") != "true":
                    raise RuntimeError(f"the {name} converter changed TOKENIZERS_PARALLELISM in this process")
            print("; ".join(line), flush=True)

        print(f"\ncores: {cores}; documents: {len(docs)}; tokens: {tokens}; runs: {args.repeat}")
        print(f"raw batch encoding ({tokenizer.__class__.__name__}, all cores): {spread(raw_rates, ',.0f')} tokens/s; "
              f"CPU seconds {spread(raw_cpu, '.2f')}")
        if fast_rates:
            print(f"raw fast batch encoding (the Rust tokenizer's encode_batch_fast, all cores): "
                  f"{spread(fast_rates, ',.0f')} tokens/s")
        for name in converters:
            ratio = statistics.median(ratios[name])
            if fast_rates:
                to_fast = statistics.median([r / f for r, f in zip(rates[name], fast_rates)])
                print(f"{name} converter / raw fast encoding: {to_fast:.2f}x (median of the per-run ratios)")
            print(f"{name} converter end to end ({cores} processes): {spread(rates[name], ',.0f')} tokens/s; "
                  f"ratio to raw per run {spread(ratios[name], '.2f')}x -> {ratio:.2f}x "
                  f"({'meets' if ratio >= TARGET else 'below'} the target >= {TARGET}x); CPU seconds "
                  f"{spread(cpu[name], '.2f')}, {statistics.median(raw_cpu) / statistics.median(cpu[name]):.2f}x "
                  "raw's CPU efficiency")
        if args.profile:
            for name in converters:
                print_profile(name, profiles[name])
        if not args.skip_loader:
            loader_and_training(args, tokenizer, mds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def loader_and_training(args, tokenizer, mds: Path) -> None:
    from llmfoundry.data.loader_settings import TextDatasetSettings, TextLoaderSettings
    from llmfoundry.data.text import build_text_dataloader

    settings = TextLoaderSettings(dataset=TextDatasetSettings(local=str(mds), shuffle=True,
                                                              max_seq_len=args.concat_tokens,
                                                              eos_token_id=tokenizer.eos_token_id))
    loader = build_text_dataloader(settings, tokenizer, 8)
    start = time.perf_counter()
    batches = list(loader)
    load_rate = sum(b["input_ids"].numel() for b in batches) / (time.perf_counter() - start)
    train_rate, device = training_tokens_per_s(batches, len(tokenizer), args.concat_tokens, args.model,
                                               args.train_steps)
    print(f"\ntext loader (shuffled, batch 8 x {args.concat_tokens}, num_workers 0): {load_rate:,.0f} tokens/s")
    print(f"training step ({args.model} MPT, batch 8 x {args.concat_tokens}, fp32, {device}) consumes "
          f"{train_rate:,.0f} tokens/s -> loader headroom {load_rate / train_rate:.0f}x")


if __name__ == "__main__":
    main()
