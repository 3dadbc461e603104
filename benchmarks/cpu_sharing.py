"""Whether background work on this machine's other cores slows a one-thread training step (a fact of the machine
that benchmarks/checkpoint_stall.py's numbers depend on).

    python benchmarks/cpu_sharing.py

Times the python-bound shape's step (MPT, 24 blocks of width 64, one thread) alone, next to a busy loop at nice 19
and next to a SHA-256 loop at nice 5, each in a process of its own, and prints each against the step alone. On a
machine whose cores are really separate, both ratios are ~1.0; on vCPUs that share a core they are not, and any
background process (save_async's writer, an upload, an emulator) slows the loop wherever it runs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

BACKGROUND = {
    "a busy loop at nice 19": "import os; os.nice(19)\nwhile True: pass",
    "a SHA-256 loop at nice 5": "import hashlib, os; os.nice(5); b = os.urandom(10_000_000)\n"
                                "while True: hashlib.sha256(b).digest()",
}


def main() -> None:
    from llmfoundry.models.mpt.config import MPTConfig
    from llmfoundry.models.mpt.model import MPTForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MPTForCausalLM(MPTConfig(d_model=64, n_heads=4, n_layers=24, expansion_ratio=2, max_seq_len=64,
                                     vocab_size=512, attn_config={"attn_impl": "torch", "alibi": True},
                                     learned_pos_emb=False))
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 512, (1, 64))

    def step_ms(steps: int = 30) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            model(ids).logits.sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        return (time.perf_counter() - start) / steps * 1000

    step_ms(5)  # warm up
    alone = step_ms()
    print(f"step alone: {alone:.1f} ms")
    for name, code in BACKGROUND.items():
        background = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(0.5)
            took = step_ms()
        finally:
            background.kill()
            background.wait()
        print(f"next to {name}: {took:.1f} ms ({took / alone:.2f}x)")


if __name__ == "__main__":
    main()
