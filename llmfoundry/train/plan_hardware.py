"""The GPU kinds `llmfoundry plan` knows: memory, peak dense bf16 FLOP/s, HBM and interconnect bandwidth.

Every figure is the vendor's datasheet value (dense, i.e. the sparse tensor-core figure halved), per GPU:
- H100 SXM5 80GB: NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100): 989.4 TFLOP/s bf16
  dense, 3.35 TB/s HBM3, NVLink 900 GB/s (bidirectional; 450 GB/s each way).
- H200 SXM 141GB: NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): 989.4 TFLOP/s bf16 dense, 4.8 TB/s
  HBM3e, NVLink 900 GB/s.
- A100 SXM4 80GB / 40GB: NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): 312 TFLOP/s bf16 dense,
  2.039 / 1.555 TB/s, NVLink 600 GB/s (300 GB/s each way).
- B200 (HGX B200): NVIDIA Blackwell datasheet (nvidia.com/en-us/data-center/hgx): 2.25 PFLOP/s bf16 dense,
  180 GB HBM3e at 7.7 TB/s (HGX B200 8-GPU: 1,440 GB, 62 TB/s), NVLink 5 1.8 TB/s.
- L40S: NVIDIA L40S datasheet: 362 TFLOP/s bf16 dense, 48 GB GDDR6 at 864 GB/s, PCIe Gen4 x16 64 GB/s.
Between nodes every kind gets one 400 Gb/s NIC per GPU (50 GB/s each way: the DGX/HGX H100 and H200 reference
design, ConnectX-7; A100 DGX systems have 200 Gb/s per GPU, used for the a100 kinds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: float
    bf16_flops: float  # dense peak
    hbm_bytes_per_s: float
    intra_node_bytes_per_s: float  # NVLink (or PCIe), one direction
    inter_node_bytes_per_s: float  # per GPU, one direction
    hourly_usd: float  # a typical on-demand cloud price per GPU-hour (for the cost line only)


GPUS = {
    "h100": GPU("H100 SXM 80GB", 80 * GIB, 989.4e12, 3.35e12, 450 * GB, 50 * GB, 3.0),
    # H200: torch.cuda reports 140.4 GiB (141 GB is the marketing figure)
    "h200": GPU("H200 SXM 141GB", 140 * GIB, 989.4e12, 4.8e12, 450 * GB, 50 * GB, 3.8),
    "a100": GPU("A100 SXM 80GB", 80 * GIB, 312e12, 2.039e12, 300 * GB, 25 * GB, 1.8),
    "a100-40gb": GPU("A100 SXM 40GB", 40 * GIB, 312e12, 1.555e12, 300 * GB, 25 * GB, 1.3),
    "b200": GPU("B200 180GB", 180 * GB, 2.25e15, 7.7e12, 900 * GB, 50 * GB, 6.0),
    "l40s": GPU("L40S 48GB", 48 * GB, 362e12, 0.864e12, 32 * GB, 25 * GB, 1.0),
}

# What a well-tuned run reaches of the peak FLOP/s in its matmuls: the roofline's compute ceiling is scaled by it.
# 0.6 for wide models: llm-foundry's published H100 table reaches about 0.4-0.6 MFU for 1B-70B models
# (docs/plan-table.md). Narrow ones reach less (normalisation, softmax, the loss and kernel launches weigh more
# beside small matmuls): matmul_efficiency's width scale is fitted to this trainer's own compiled runs through
# `llmfoundry train` on an H200 (benchmarks/results/gpu_h200.md, seq 2048, microbatch 16: d768 32.0%, d1024 43.7%,
# d2048 55.8% MFU; the fit gives 32.2%, 38.5%, 52.3%).
MATMUL_EFFICIENCY = 0.6
EFFICIENCY_WIDTH = 1000.0


def matmul_efficiency(d_model: int) -> float:
    """The share of peak FLOP/s a model of this width reaches: MATMUL_EFFICIENCY x (1 - exp(-d / 1000))."""
    return MATMUL_EFFICIENCY * (1.0 - math.exp(-max(1, d_model) / EFFICIENCY_WIDTH))
# Collectives reach about this share of the link bandwidth (NCCL's bus bandwidth on NVLink and InfiniBand).
LINK_EFFICIENCY = 0.8
