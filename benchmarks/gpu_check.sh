#!/usr/bin/env bash
# The GPU check of issue #30 in one call: on one lent CUDA machine (torch preinstalled, Python 3.12, no package
# index) it runs, in at most 8 minutes, the quickstart as shipped; the 125M/350M/1B MPT shapes at seq 2048 through
# `llmfoundry train`, eager and tuned (benchmarks/mfu.py's ROWS); the save stall, synchronous against save_async;
# resume from an async checkpoint against the uninterrupted run; the CUDA tests (pytest -m gpu); and `llmfoundry
# plan` against the measured memory and step time. It writes benchmarks/results/gpu_<device>.md (gpu_h100.md,
# gpu_h200.md, ...) section by section; each section has its own timeout (benchmarks/gpu_check.py).
#
# How the dependencies travel (the GPU machine has torch and transformers but no package index):
#   1. here, with an index:     bash benchmarks/gpu_check.sh --pack
#      downloads the cp312 manylinux wheels of what such a machine lacks (PACKAGES below) and unpacks them into
#      .gpu/site, and prepares the quickstart's data at seq 128 and 2048 into .gpu/data (about 45 MB together;
#      .gpu/ is git-ignored, so it travels only when carried: the device tool's carry: [".gpu"], 64 MiB at most).
#   2. there, from the project root:   bash benchmarks/gpu_check.sh
#      puts .gpu/site and the tree on PYTHONPATH; results and logs are copied to $OUT when it is set.
#      GPU_CHECK_BUDGET=SECONDS (default 460) and GPU_CHECK_ONLY="stall resume tests shapes quickstart hf plan"
#      cut a run to a shorter lease or to some sections.
# CI and tests:                        bash benchmarks/gpu_check.sh --cpu-dry-run
#      the same pipeline at tiny shapes in fp32 on the CPU, results in .gpu/gpu_cpu_dry_run.md (or $GPU_CHECK_RESULTS).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
GPU_DIR=${GPU_CHECK_DIR:-$ROOT/.gpu}
# what a bare torch machine lacks: the config loader, streaming and its codecs, the object-store clients, the
# checkpoint checksums, the float8 backend (precision: amp_fp8), pytest's timeout plugin (pyproject's timeout key)
PACKAGES=(omegaconf antlr4-python3-runtime streaming-community boto3 botocore s3transfer jmespath zstd python-snappy
          cramjam Brotli catalogue sniffio xxhash torchao pytest-timeout)

pack() {
  local site=$GPU_DIR/site wheels
  wheels=$(mktemp -d)
  rm -rf "$site" && mkdir -p "$site" "$GPU_DIR/data"
  local plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
    -d "$wheels" "${PACKAGES[@]}" || return 1
  python3 -m pip install -q --no-deps --no-compile --target "$site" --python-version 3.12 --implementation cp \
    --only-binary=:all: "${plat[@]}" "$wheels"/*.whl || return 1
  rm -rf "$wheels"
  # botocore's service descriptions are most of its size; the project talks to S3 (and STS) only
  for d in "$site"/botocore/data/*/; do case $(basename "$d") in s3|sts) ;; *) rm -rf "$d" ;; esac; done
  # torchao's compiled kernels (cutlass, mxfp8) are built for one torch version and not what float8 training uses
  # (torch._scaled_mm); torchao imports without them, with a warning
  find "$site/torchao" -name '*.so' -delete
  rm -rf "$site/test" "$site/simulation"  # torchao's and streaming's own test folders (test/ would shadow the stdlib's)
  for seq in 128 2048; do  # one batch of a tiny model: prepare_data builds the tokenizer and the MDS shards
    [ -d "$GPU_DIR/data/qs$seq/train" ] && continue
    python3 -m llmfoundry.cli train yamls/quickstart.yaml "variables.data_local=$GPU_DIR/data/qs$seq" \
      "variables.max_seq_len=$seq" eval_first=false eval_interval=0 '~icl_tasks' '~eval_gauntlet' \
      progress_bar=false max_duration=1ba save_folder=null model.n_layers=1 global_train_batch_size=1 \
      device_train_microbatch_size=1 >/dev/null || return 1
    rm -rf "$GPU_DIR/data/qs$seq/text"  # the raw text the shards were made from
  done
  du -sh "$GPU_DIR/site" "$GPU_DIR/data"
}

case "${1:-}" in
  --pack) pack; exit $? ;;
  --cpu-dry-run) MODE=(--cpu-dry-run); RESULTS=${GPU_CHECK_RESULTS:-$GPU_DIR/gpu_cpu_dry_run.md}; BUDGET=${GPU_CHECK_BUDGET:-300} ;;
  "") MODE=(); RESULTS=; BUDGET=${GPU_CHECK_BUDGET:-460} ;;
  *) echo "usage: bash benchmarks/gpu_check.sh [--pack | --cpu-dry-run]" >&2; exit 2 ;;
esac

export PYTHONPATH=$GPU_DIR/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
if [ ${#MODE[@]} -eq 0 ]; then
  # the device's short name from torch (NVIDIA H100 80GB HBM3 -> h100, NVIDIA H200 -> h200)
  DEVICE=$(python3 -c "import re, torch; n = torch.cuda.get_device_name(); m = re.search(r'\b([A-Z]+\d+[A-Z]*)\b', n.replace('NVIDIA', '')); print(m.group(1).lower() if m else 'cuda')") || {
    echo "no CUDA device: use --cpu-dry-run" >&2; exit 1; }
  RESULTS=${GPU_CHECK_RESULTS:-$ROOT/benchmarks/results/gpu_$DEVICE.md}
  case $DEVICE in h100|h200|a100|b200|l40s) KIND=$DEVICE ;; *) KIND=h100 ;; esac
else
  KIND=h100
fi
mkdir -p "$(dirname "$RESULTS")" "$GPU_DIR/work"
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
{
  echo "# GPU check (benchmarks/gpu_check.sh${MODE:+ ${MODE[*]}}), $(date -u +%Y-%m-%d)"
  echo
  echo '```'
  nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], '| torch', torch.__version__, '| transformers', transformers.__version__)"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo '```'
  echo
} > "$RESULTS"
# the outer timeout is a last guard: gpu_check.py keeps every section inside BUDGET by itself
timeout -k 10 $((BUDGET + 60)) python3 benchmarks/gpu_check.py "${MODE[@]}" --results "$RESULTS" --budget "$BUDGET" \
  --work "$GPU_DIR/work" --data "$GPU_DIR/data" --gpu-kind "$KIND" ${GPU_CHECK_ONLY:+--only $GPU_CHECK_ONLY}
rc=$?
echo "_total: $(( $(date +%s) - T0 )) s, exit ${rc}_" >> "$RESULTS"
if [ -n "${OUT:-}" ]; then
  cp "$RESULTS" "$OUT/"
  # one archive: the device tool brings back only a few files
  (cd "$GPU_DIR/work" && find . -maxdepth 2 \( -name '*.log' -o -name '*.jsonl' -o -name '*.json' \) -size -2M -print0 \
    | xargs -0 tar -czf "$OUT/gpu_check_logs.tar.gz")
fi
echo "results: $RESULTS"
exit $rc
