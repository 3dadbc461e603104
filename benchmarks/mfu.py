"""Training throughput (tok/s per GPU) and MFU of MPT shapes, measured through `llmfoundry train` itself.

Each row of ROWS is one real run: ``llmfoundry train yamls/quickstart.yaml`` with the shape's overrides and the
row's own list of overrides (microbatch, compile_config, fsdp_config, precision, ...), in its own process, with
speed_monitor (window 1), memory_monitor and a jsonl logger added. So what is timed is the Trainer's step as users
run it: the data loader, the loss, clipping, the scheduler, the callbacks. A row's tok/s and MFU are the medians of
the per-batch figures speed_monitor logs after the first ``--warmup`` batches (compilation happens there).

Next to each shape: llm-foundry's published figure for the same shape and sequence length (PUBLISHED, from its
throughput tables) and, with ``--hf``, the ratio against transformers' MptForCausalLM at the same shape, global
batch, microbatch and autocast (its own plain loop on synthetic tokens; halved microbatch on out-of-memory).

    python benchmarks/mfu.py --tiny                                 # CPU: a tiny MPT at seq 128, fp32
    python benchmarks/mfu.py --shapes 125m 350m 1b --hf             # a GPU: eager and tuned rows per shape
    python benchmarks/mfu.py --shapes 1b --rows eager compile       # only rows with these names

To try a setting, add a row to ROWS: a name and a list of overrides. A row whose overrides do not validate (a key
another change has not landed yet) is reported as "not available" with the recipe's one-line error, and the sweep
goes on; so are rows that run out of memory or time out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "yamls/quickstart.yaml"
BATCH = 16  # global batch of every row (the issue's figures use 16 x 2048 tokens)

# The shapes of llm-foundry's MPT recipes (yamls/mpt/*.yaml: no ALiBi, 50368-token vocabulary); the quickstart's
# tokenizer has 4096 tokens, which fit in the larger embedding.
SHAPES: dict[str, dict] = {
    "tiny": dict(d_model=64, n_heads=4, n_layers=2, vocab_size=4096),
    "125m": dict(d_model=768, n_heads=12, n_layers=12, vocab_size=50368),
    "350m": dict(d_model=1024, n_heads=16, n_layers=24, vocab_size=50368),
    "1b": dict(d_model=2048, n_heads=16, n_layers=24, vocab_size=50368),
}
GPU_SEQ, CPU_SEQ = 2048, 128

_COMPILE = "compile_config={}"
_FSDP_PURE = "+fsdp_config={sharding_strategy: FULL_SHARD, mixed_precision: PURE}"


@dataclass
class Row:
    shape: str
    name: str  # "eager" is the baseline of its shape; every other row is a tuning candidate
    overrides: list[str]
    hf: bool = False  # the row transformers' MptForCausalLM is compared with (ALiBi, as MptForCausalLM has)


# One table for every setting tried: add or edit a line. Keys that are still landing elsewhere (amp_fp8, selective
# activation checkpointing, flex attention) are rows too; until their change lands they report "not available".
_ALIBI = "model.attn_config.alibi=true"
ROWS: list[Row] = [
    Row("tiny", "eager", ["device_train_microbatch_size=16"]),
    Row("tiny", "eager alibi", ["device_train_microbatch_size=16", _ALIBI], hf=True),
    Row("tiny", "microbatch 8", ["device_train_microbatch_size=8"]),
    Row("125m", "eager", ["device_train_microbatch_size=16"]),
    Row("125m", "eager alibi", ["device_train_microbatch_size=16", _ALIBI], hf=True),
    Row("125m", "compile", ["device_train_microbatch_size=16", _COMPILE]),
    Row("125m", "compile + fp8", ["device_train_microbatch_size=16", _COMPILE, "precision=amp_fp8"]),
    Row("350m", "eager", ["device_train_microbatch_size=16"]),
    Row("350m", "eager alibi", ["device_train_microbatch_size=16", _ALIBI], hf=True),
    Row("350m", "compile", ["device_train_microbatch_size=16", _COMPILE]),
    Row("1b", "eager", ["device_train_microbatch_size=8"]),
    Row("1b", "eager alibi mb4", ["device_train_microbatch_size=4", _ALIBI], hf=True),
    Row("1b", "compile mb16", ["device_train_microbatch_size=16", _COMPILE]),
    Row("1b", "fsdp pure + compile mb16", ["device_train_microbatch_size=16", _COMPILE, _FSDP_PURE]),
    Row("1b", "compile mb16 + fp8", ["device_train_microbatch_size=16", _COMPILE, "precision=amp_fp8"]),
    Row("1b", "fsdp pure + selective ac + compile mb16", [
        "device_train_microbatch_size=16", _COMPILE, "+fsdp_config={sharding_strategy: FULL_SHARD, mixed_precision: "
        "PURE, activation_checkpointing: true, activation_checkpointing_mode: selective_op}"]),
]

# llm-foundry's published throughput (scripts/train/benchmarking/README.md of mosaicml/llm-foundry at 061f2c7,
# seq 2048, bf16, FULL_SHARD, no activation checkpointing). Its H100 table has no 125M or 350M row at seq 2048, so
# those are its A100 80GB rows: compare their MFU, not their tok/s, with an H100/H200.
PUBLISHED_SOURCE = "mosaicml/llm-foundry scripts/train/benchmarking/README.md @061f2c7"
PUBLISHED: dict[str, dict] = {
    "125m": dict(gpu="A100 80GB", gpus=8, micro=40, mfu=44.79, tok_s_gpu=142830),
    "350m": dict(gpu="A100 80GB", gpus=8, micro=32, mfu=51.62, tok_s_gpu=58782),
    "1b": dict(gpu="H100 80GB", gpus=16, micro=20, mfu=42.36, tok_s_gpu=46037),
}


@dataclass
class Result:
    row: Row
    status: str = "ok"  # ok, not available (...), OOM, timeout, failed (...)
    tok_s: float | None = None  # per GPU
    mfu: float | None = None  # fraction
    step_s: float | None = None
    peak_gb: float | None = None  # memory/peak_allocated_mem (1e9 bytes)
    losses: dict[int, float] = field(default_factory=dict)


def base_overrides(data: str, seq: int, precision: str, batches: int, jsonl: str) -> list[str]:
    """What every benchmark run adds to the quickstart: the data at ``seq``, no evaluation or checkpoints."""
    return [
        f"variables.data_local={data}", f"variables.max_seq_len={seq}", f"precision={precision}",
        f"global_train_batch_size={BATCH}", f"max_duration={batches}ba", "eval_first=false", "eval_interval=0",
        "~icl_tasks", "~eval_gauntlet", "progress_bar=false", "console_log_interval=1ba", "save_folder=null",
        "model.attn_config.alibi=false",
        "+callbacks.speed_monitor={window_size: 1, time_unit: seconds}", "+callbacks.memory_monitor={}",
        f"+loggers.jsonl.path={jsonl}",
    ]


def shape_overrides(shape: str) -> list[str]:
    return [f"model.{k}={v}" for k, v in SHAPES[shape].items()]


def read_jsonl(path: str | Path) -> list[dict]:
    """The metrics lines a jsonl logger wrote (those with a step), in order; none if the file is missing."""
    path = Path(path)
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if "step" in line]


def batch_seconds(records: list[dict]) -> dict[int, float]:
    """Seconds of each batch (end to end, with whatever ran between: a save shows in the batch after it)."""
    return {int(r["step"]): 1.0 / r["throughput/batches_per_sec"] for r in records
            if r.get("throughput/batches_per_sec")}


def summarise(records: list[dict], warmup: int) -> dict:
    steady = [r for r in records if r["step"] > warmup and "throughput/device/tokens_per_sec" in r]

    def median(key):
        values = [r[key] for r in steady if key in r]
        return statistics.median(values) if values else None

    bps = median("throughput/batches_per_sec")
    peaks = [r["memory/peak_allocated_mem"] for r in records if "memory/peak_allocated_mem" in r]
    return dict(tok_s=median("throughput/device/tokens_per_sec"), mfu=median("throughput/device/mfu"),
                flops=median("throughput/device/flops_per_sec"),
                step_s=1.0 / bps if bps else None, peak_gb=max(peaks) if peaks else None,
                losses={int(r["step"]): r["loss/train/total"] for r in records if "loss/train/total" in r})


def classify_failure(code: int, output: str) -> str:
    """A row's status from a failed run: a recipe error (exit 2) is a setting that is not available here."""
    if "OutOfMemoryError" in output or "CUDA out of memory" in output:
        return "OOM"
    errors = [line.strip() for line in output.splitlines() if line.strip().lower().startswith("error")]
    last = errors[-1] if errors else (output.strip().splitlines() or ["no output"])[-1].strip()
    last = last[:160].replace("|", "/")
    return f"not available ({last})" if code == 2 else f"failed, exit {code} ({last})"


def train(overrides: list[str], timeout: float, log: Path | None = None) -> tuple[int | None, str]:
    """Runs `llmfoundry train RECIPE overrides` in its own process; (exit code or None on timeout, output)."""
    cmd = [sys.executable, "-m", "llmfoundry.cli", "train", RECIPE, *overrides]
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false")
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        code = None
        output = "".join(x.decode() if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
    if log is not None:
        log.write_text(" ".join(cmd) + "\n" + output)
    return code, output


def run_row(row: Row, *, data: str, seq: int, precision: str, batches: int, warmup: int, timeout: float,
            work: Path, extra: list[str] = (), bf16_peak: float | None = None) -> Result:
    jsonl = work / f"{row.shape}-{row.name.replace(' ', '_').replace('+', 'p')}.jsonl"
    jsonl.unlink(missing_ok=True)
    overrides = base_overrides(data, seq, precision, batches, str(jsonl)) + shape_overrides(row.shape) + list(extra)
    code, output = train(overrides + row.overrides, timeout, jsonl.with_suffix(".log"))
    if code is None:
        return Result(row, status=f"timeout after {timeout:.0f} s")
    if code != 0:
        return Result(row, status=classify_failure(code, output))
    stats = summarise(read_jsonl(jsonl), warmup)
    if stats["tok_s"] is None:
        return Result(row, status=f"failed (no throughput after batch {warmup}: raise --batches)")
    flops, status = stats.pop("flops"), "ok"
    if flops and bf16_peak and (stats["mfu"] is None or "precision=amp_fp8" in row.overrides):
        # amp_fp8: speed_monitor reports MFU against the float8 peak (Composer's rule) or, on a GPU it has no
        # figure for, none; here against the bf16 peak, as torchtitan reports its float8 runs, so that it
        # compares with the bf16 rows
        stats["mfu"], status = flops / bf16_peak, "ok (MFU against the bf16 peak)"
    return Result(row, status=status, **stats)


# ----- transformers' MptForCausalLM at the same shape (run in a process of its own by --hf-only) -----
def hf_tokens_per_sec(shape: str, seq: int, micro: int, precision: str, steps: int, warmup: int) -> dict:
    import torch

    from llmfoundry.config.validate import validate
    from llmfoundry.models.hf_export import to_transformers
    from llmfoundry.models.mpt.arch import MPTArch
    from llmfoundry.models.mpt.config import MPTConfig
    from llmfoundry.models.mpt.model import MPTForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = dict(SHAPES[shape], expansion_ratio=4, max_seq_len=seq, learned_pos_emb=False, no_bias=True,
                attn_config={"attn_impl": "sdpa", "alibi": True})  # the quickstart's model with the shape's sizes
    torch.manual_seed(0)
    theirs = to_transformers(MPTForCausalLM(MPTConfig.from_arch(validate(spec, MPTArch, "model"))))
    theirs = theirs.to(device).train()
    optimizer = torch.optim.AdamW(theirs.parameters(), lr=1e-5, fused=device.type == "cuda")
    vocab = SHAPES[shape]["vocab_size"]
    data = torch.randint(0, vocab, (BATCH, seq), device=device)
    use_amp = precision.startswith("amp_")
    amp_dtype = torch.float16 if precision == "amp_fp16" else torch.bfloat16
    times = []
    for i in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for s in range(0, BATCH, micro):
            x = data[s:s + micro]
            with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
                logits = theirs(x).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(),
                                                     x[:, 1:].reshape(-1), reduction="sum") / (BATCH * (seq - 1))
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return dict(tok_s=BATCH * seq / statistics.median(times), micro=micro)


def run_hf(shape: str, seq: int, micro: int, precision: str, timeout: float, tries: int = 3) -> dict:
    """transformers' tok/s at ``micro``, halving the microbatch on out-of-memory (``tries`` sizes at most)."""
    for _ in range(tries):
        cmd = [sys.executable, __file__, "--hf-only", shape, "--seq", str(seq), "--micro", str(micro),
               "--precision", precision]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return dict(status=f"timeout after {timeout:.0f} s")
        if proc.returncode == 0:
            return dict(json.loads(proc.stdout.strip().splitlines()[-1]), status="ok")
        if "OutOfMemoryError" not in proc.stderr or micro == 1:
            return dict(status=classify_failure(proc.returncode, proc.stderr))
        micro //= 2
    return dict(status=f"OOM down to microbatch {micro * 2}")


# ----- the report -----
def fmt(value, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def best_of(results: list[Result]) -> dict[str, Result]:
    """The fastest row that ran, per shape (eager included: a tuned row must beat it to count as best)."""
    best: dict[str, Result] = {}
    for r in results:
        if r.tok_s is not None and (r.row.shape not in best or r.tok_s > best[r.row.shape].tok_s):
            best[r.row.shape] = r
    return best


def markdown(results: list[Result], hf: dict[str, dict], title: str) -> str:
    best = best_of(results)
    lines = [title, "", "| shape | how | overrides | tok/s per GPU | MFU | s/step | peak GB | status |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        mark = " **best**" if best.get(r.row.shape) is r else ""
        lines.append(f"| {r.row.shape} | {r.row.name}{mark} | `{' '.join(r.row.overrides)}` | {fmt(r.tok_s, ',.0f')} "
                     f"| {fmt(r.mfu and 100 * r.mfu, '.1f')}{'%' if r.mfu else ''} | {fmt(r.step_s, '.3f')} "
                     f"| {fmt(r.peak_gb, '.1f')} | {r.status} |")
    lines += ["", f"Against llm-foundry's published figures ({PUBLISHED_SOURCE}) and transformers' MptForCausalLM "
                  f"(same shape, batch {BATCH}, autocast; its own loop):", "",
              "| shape | our best tok/s per GPU | our best MFU | llm-foundry (GPU, GPUs, microbatch): MFU, tok/s per GPU "
              "| MptForCausalLM tok/s (microbatch) | ours, same settings (ALiBi) / MptForCausalLM "
              "| our best / MptForCausalLM |",
              "|---|---|---|---|---|---|---|"]
    for shape in dict.fromkeys(r.row.shape for r in results):
        b = best.get(shape)
        same = next((r for r in results if r.row.shape == shape and r.row.hf and r.tok_s), None)
        pub = PUBLISHED.get(shape)
        pub_text = (f"{pub['gpu']}, {pub['gpus']}, {pub['micro']}: {pub['mfu']}%, {pub['tok_s_gpu']:,}" if pub
                    else "no published row")
        h = hf.get(shape, {})
        h_tok = h.get("tok_s")
        h_text = f"{h_tok:,.0f} ({h['micro']})" if h_tok else h.get("status", "not run")
        lines.append(f"| {shape} | {fmt(b and b.tok_s, ',.0f')} | {fmt(b and b.mfu and 100 * b.mfu, '.1f')} "
                     f"| {pub_text} | {h_text} | {fmt(same and h_tok and same.tok_s / h_tok, '.2f')}x "
                     f"| {fmt(b and h_tok and b.tok_s / h_tok, '.2f')}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=None, choices=sorted(SHAPES))
    p.add_argument("--tiny", action="store_true", help="the tiny shape on this machine (CPU: fp32, seq 128)")
    p.add_argument("--rows", nargs="+", default=None, help="only rows with these names (default: all)")
    p.add_argument("--seq", type=int, default=None, help=f"default {GPU_SEQ} on a GPU, {CPU_SEQ} on a CPU")
    p.add_argument("--precision", default=None, help="default amp_bf16 on a GPU, fp32 on a CPU")
    p.add_argument("--data", default=None, help="the quickstart's data folder at this seq (prepared if missing)")
    p.add_argument("--batches", type=int, default=12, help="batches per run")
    p.add_argument("--warmup", type=int, default=4, help="batches left out of the medians (compilation)")
    p.add_argument("--timeout", type=float, default=240, help="seconds per run")
    p.add_argument("--deadline", type=float, default=None,
                   help="a time.time() after which no run starts (the rest are reported as skipped)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides for every run")
    p.add_argument("--hf", action="store_true", help="also time transformers' MptForCausalLM per shape")
    p.add_argument("--markdown", default=None, help="append the tables to this file")
    p.add_argument("--json", default=None, help="write the rows' results to this file")
    p.add_argument("--work", default=None, help="folder for the runs' logs (default: a temporary one)")
    p.add_argument("--hf-only", default=None, help=argparse.SUPPRESS)
    p.add_argument("--micro", type=int, default=16, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    gpu = _cuda_available()
    seq = args.seq or (GPU_SEQ if gpu else CPU_SEQ)
    precision = args.precision or ("amp_bf16" if gpu else "fp32")
    if args.hf_only:
        print(json.dumps(hf_tokens_per_sec(args.hf_only, seq, args.micro, precision, steps=3, warmup=1)))
        return 0
    shapes = args.shapes or (["tiny"] if args.tiny or not gpu else ["125m", "350m", "1b"])
    rows = [r for shape in shapes for r in ROWS if r.shape == shape and (args.rows is None or r.name in args.rows)]
    work = Path(args.work or tempfile.mkdtemp(prefix="mfu-"))
    work.mkdir(parents=True, exist_ok=True)
    data = args.data or str(ROOT / "data" / f"quickstart-{seq}")
    print(f"# {_device_name()}, {precision}, seq {seq}, global batch {BATCH}, {args.batches} batches per run, "
          f"medians after batch {args.warmup}; logs in {work}", flush=True)
    print(f"{'shape':>5} {'how':<28} {'tok/s/GPU':>10} {'MFU':>6} {'s/step':>7} {'peak GB':>8}  status", flush=True)
    results = []
    for row in rows:
        budget = _budget(args.timeout, args.deadline)
        if budget is None:
            r = Result(row, status="skipped (out of the time budget)")
        else:
            r = run_row(row, data=data, seq=seq, precision=precision, batches=args.batches, warmup=args.warmup,
                        timeout=budget, work=work, extra=args.set, bf16_peak=_bf16_peak())
        results.append(r)
        if args.json:  # after every row: what ran is kept if a later row hangs past an outer timeout
            _write_json(args.json, results)
        mfu = f"{100 * r.mfu:.1f}%" if r.mfu else "-"
        print(f"{row.shape:>5} {row.name:<28} {fmt(r.tok_s, ',.0f'):>10} {mfu:>6} {fmt(r.step_s, '.3f'):>7} "
              f"{fmt(r.peak_gb, '.1f'):>8}  {r.status}", flush=True)
    hf = {}
    if args.hf:  # after our rows: a shape's transformers run is only compared with a row that ran here
        for shape in dict.fromkeys(r.row.shape for r in results):
            same = next((r for r in rows if r.shape == shape and r.hf), None)
            if same is None:
                continue
            micro = _microbatch(same.overrides)
            budget = _budget(args.timeout, args.deadline)
            hf[shape] = (run_hf(shape, seq, micro, precision, budget) if budget is not None
                         else dict(status="skipped (out of the time budget)"))
            print(f"{shape:>5} transformers MptForCausalLM: {hf[shape]}", flush=True)
    text = markdown(results, hf, f"### `llmfoundry train` throughput: {_device_name()}, {precision}, seq {seq}")
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(text + "\n")
    return 0


def _budget(timeout: float, deadline: float | None, least: float = 20.0) -> float | None:
    """Seconds a run may take: its timeout, cut to the deadline; None when less than ``least`` is left."""
    if deadline is None:
        return timeout
    left = deadline - time.time()
    return min(timeout, left) if left >= least else None


def _write_json(path: str, results: list[Result]) -> None:
    Path(path).write_text(json.dumps([dict(shape=r.row.shape, name=r.row.name, overrides=r.row.overrides,
                                           status=r.status, tok_s=r.tok_s, mfu=r.mfu, step_s=r.step_s,
                                           peak_gb=r.peak_gb) for r in results], indent=1))


def _microbatch(overrides: list[str]) -> int:
    values = [int(o.split("=", 1)[1]) for o in overrides if o.startswith("device_train_microbatch_size=")]
    return values[-1] if values else BATCH


def _bf16_peak() -> float | None:
    import torch

    from llmfoundry.train.callbacks.speed_monitor import device_peak_flops

    return device_peak_flops(torch.device("cuda"), "amp_bf16") if torch.cuda.is_available() else None


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"CPU ({os.cpu_count()} cores), torch {torch.__version__}"


if __name__ == "__main__":
    raise SystemExit(main())
