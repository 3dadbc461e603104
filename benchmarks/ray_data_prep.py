"""Ray Data converter vs the single-machine converter, side by side in one run (tokens/s).

The same JSONL file is converted by ``convert_dataset_json`` on one machine (``--num_workers P`` processes) and
with ``--ray --ray-workers W`` on a local Ray cluster of W CPUs, alternately, ``--repeat`` times each; the median
of each is printed, with their ratio. The cluster is started once, before the timed runs (on a real cluster it is
already running), and one untimed round of both converters warms it up (its workers start and import llmfoundry
once; on a long-lived cluster they are already running): the start-up and that first Ray run are printed
separately. Every Ray run is checked to hold the single-machine
run's samples (per-sample hashes, in order).

    python benchmarks/ray_data_prep.py [--docs 20000] [--concat_tokens 2048] [--workers 2] [--processes 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def sample_digest(folder: Path) -> str:
    """One sha256 over every sample's bytes, in index order (read back by streaming)."""
    from llmfoundry.data.streaming_guard import import_streaming

    dataset = import_streaming().StreamingDataset(local=str(folder))
    digest = hashlib.sha256()
    for i in range(len(dataset)):
        digest.update(dataset[i]["tokens"].tobytes())
    return digest.hexdigest()


def timed_conversion(argv: list[str]) -> tuple[float, int]:
    """(seconds, input tokens) of one ``convert_dataset_json`` run."""
    from llmfoundry.data.prep.json_data import main_json

    out = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out):
        assert main_json(argv) == 0
    seconds = time.perf_counter() - start
    tokens = int(re.search(r"\((\d+) tokens\)", out.getvalue()).group(1))
    return seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: a 4096-token BPE trained here)")
    parser.add_argument("--concat_tokens", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2, help="Ray Data workers (the local cluster's CPUs)")
    parser.add_argument("--processes", type=int, default=2, help="processes of the single-machine converter")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each converter (the median is printed)")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import ray

    from benchmarks.data_prep import synthetic_corpus

    work = Path(tempfile.mkdtemp(prefix="llmfoundry-ray-bench-"))
    try:
        docs, tokenizer_dir = synthetic_corpus(work, args.docs, args.tokenizer)
        (work / "docs.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs))
        common = ["--path", str(work / "docs.jsonl"), "--concat_tokens", str(args.concat_tokens),
                  "--tokenizer", tokenizer_dir, "--quiet"]

        start = time.perf_counter()
        ray.init(address="local", num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
        startup = time.perf_counter() - start
        single, by_ray, tokens, reference = [], [], 0, None
        for run in range(-1, args.repeat):  # run -1: the warm-up round, not in the medians
            for name, extra, times in (("one", ["--num_workers", str(args.processes)], single),
                                       ("ray", ["--ray", "--ray-workers", str(args.workers)], by_ray)):
                out = work / f"{name}{run}"
                seconds, tokens = timed_conversion([*common, "--out_root", str(out), *extra])
                if run >= 0:
                    times.append(seconds)
                elif name == "ray":
                    cold = seconds
                digest = sample_digest(out / "train")
                reference = reference or digest
                assert digest == reference, f"run {run} ({name}) wrote other samples than the first run"
                shutil.rmtree(out)
        ray.shutdown()

        one_rate, ray_rate = tokens / statistics.median(single), tokens / statistics.median(by_ray)
        print(f"documents: {len(docs)}; tokens: {tokens}; concat_tokens: {args.concat_tokens}; "
              f"median of {args.repeat} runs each; every run wrote the same samples (hash-compared)")
        print(f"Ray local cluster start ({args.workers} CPUs, not timed below): {startup:.1f} s; first (cold) Ray "
              f"conversion: {cold:.1f} s")
        print(f"convert_dataset_json, one machine (--num_workers {args.processes}): {one_rate:,.0f} tokens/s "
              f"({statistics.median(single):.2f} s)")
        print(f"convert_dataset_json --ray --ray-workers {args.workers}: {ray_rate:,.0f} tokens/s "
              f"({statistics.median(by_ray):.2f} s) = {ray_rate / one_rate:.2f}x the single-machine converter")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
