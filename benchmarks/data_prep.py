"""Data pipeline throughput, measured side by side in one run (tokens/s).

1. Raw batch encoding: the tokenizer's own ``tokenizer(list_of_docs)`` on the whole corpus, all cores
   (TOKENIZERS_PARALLELISM=true) — the baseline.
2. End-to-end converter: ``convert_text_to_mds`` (text files in -> zstd MDS shards out, --processes = all cores).
   Reported as a ratio to (1); the target is >= 0.8.
3. The ``text`` loader reading those shards (shuffled), against what a training step consumes: a few steps
   (forward + loss + backward + AdamW) of an MPT on the loader's own batches, timed in the same run on this
   machine's device; the loader's headroom is their ratio (above 1: the loader is not the bottleneck).
   ``--model quickstart`` (default) is the quickstart's shape; ``--model 125m`` is MPT-125M (slow on a CPU).

    python benchmarks/data_prep.py [--docs 20000] [--tokenizer DIR] [--concat_tokens 2048] [--model quickstart]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: a 4096-token BPE trained here)")
    parser.add_argument("--concat_tokens", type=int, default=2048)
    parser.add_argument("--model", choices=sorted(MODEL_SHAPES), default="quickstart", help="MPT shape to train")
    parser.add_argument("--train_steps", type=int, default=4, help="timed training steps (after one warm-up)")
    args = parser.parse_args()
    from conftest import make_corpus

    from llmfoundry.data.prep.text import main as convert_main
    from llmfoundry.data.tokenizer_training import train_bpe_tokenizer
    from llmfoundry.data.tokenizers import build_tokenizer

    work = Path(tempfile.mkdtemp(prefix="llmfoundry-bench-"))
    try:
        docs = [" ".join(make_corpus(4, seed=i)) for i in range(args.docs)]  # ~4 paragraphs per document
        tokenizer_dir = args.tokenizer
        if tokenizer_dir is None:
            tokenizer_dir = str(work / "tok")
            train_bpe_tokenizer(docs[:2000], vocab_size=4096, out_dir=tokenizer_dir)
        texts = work / "texts"
        texts.mkdir()
        for i, doc in enumerate(docs):
            (texts / f"{i:06d}.txt").write_text(doc)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        tokenizer = build_tokenizer(tokenizer_dir, {})
        tokenizer(docs[:100])  # warm up
        start = time.perf_counter()
        encoded = tokenizer(docs, add_special_tokens=False)["input_ids"]
        raw_s = time.perf_counter() - start
        tokens = sum(len(x) for x in encoded) + len(docs)  # + one EOS per document, as the converter adds
        raw_rate = tokens / raw_s

        start = time.perf_counter()
        convert_main(["--input_folder", str(texts), "--output_folder", str(work / "mds"), "--concat_tokens",
                      str(args.concat_tokens), "--tokenizer", tokenizer_dir, "--processes", str(cores), "--quiet"])
        conv_s = time.perf_counter() - start
        conv_rate = tokens / conv_s

        from llmfoundry.data.text import TextDatasetSettings, TextLoaderSettings, build_text_dataloader

        settings = TextLoaderSettings(dataset=TextDatasetSettings(local=str(work / "mds"), shuffle=True,
                                                                  max_seq_len=args.concat_tokens,
                                                                  eos_token_id=tokenizer.eos_token_id))
        loader = build_text_dataloader(settings, tokenizer, 8)
        start = time.perf_counter()
        batches = list(loader)
        load_rate = sum(b["input_ids"].numel() for b in batches) / (time.perf_counter() - start)
        train_rate, device = training_tokens_per_s(batches, len(tokenizer), args.concat_tokens, args.model,
                                                   args.train_steps)

        print(f"cores: {cores}; documents: {len(docs)}; tokens: {tokens}")
        print(f"raw batch encoding ({tokenizer.__class__.__name__}, all cores): {raw_rate:,.0f} tokens/s")
        print(f"convert_text_to_mds end to end (--processes {cores}): {conv_rate:,.0f} tokens/s "
              f"= {conv_rate / raw_rate:.2f}x raw (target >= 0.8x)")
        print(f"text loader (shuffled, batch 8 x {args.concat_tokens}, num_workers 0): {load_rate:,.0f} tokens/s")
        print(f"training step ({args.model} MPT, batch 8 x {args.concat_tokens}, fp32, {device}) consumes "
              f"{train_rate:,.0f} tokens/s -> loader headroom {load_rate / train_rate:.0f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
