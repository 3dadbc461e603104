"""Which of llm-foundry's (Composer's) sharded checkpoints carry Adam moments at another scale than the gradients
our trainer computes: the experiment behind the rule in llmfoundry/train/composer_moments.py.

For each layout, the real llm-foundry (the venv of benchmarks/lf_env.sh) trains the issue-27 recipe
(tests/fixtures/composer/make_fixtures.py's ``adam_*`` recipe) for 2 batches and saves; the ratio of each
parameter's ``exp_avg`` (and ``exp_avg_sq``) to the one-process run's is printed, with what the checkpoint records
(world size, device, torch version) and the factor composer_moments derives from that record alone.

    bash benchmarks/lf_env.sh /tmp/lf_venv
    python benchmarks/composer_moment_scale.py --lf-python /tmp/lf_venv/bin/python [--results FILE]
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from llmfoundry.train.composer_checkpoint import moments_of, read_composer_checkpoint  # noqa: E402
from tests.fixtures.composer import make_fixtures as fixtures  # noqa: E402

_SHARDED = {"sharding_strategy": "FULL_SHARD", "state_dict_type": "sharded", "mixed_precision": "FULL"}
# name -> (changes to the adam recipe, processes, environment)
LAYOUTS: dict[str, tuple[dict, int, dict]] = {
    "one process (reference)": ({}, 1, {}),
    "FSDP1 FULL_SHARD, 2 ranks": ({"fsdp_config": _SHARDED}, 2, {}),
    "FSDP1 FULL_SHARD, 4 ranks": ({"fsdp_config": _SHARDED}, 4, {}),
    "FSDP1 HYBRID_SHARD, 2 ranks": ({"fsdp_config": {**_SHARDED, "sharding_strategy": "HYBRID_SHARD"}}, 2, {}),
    "FSDP2, 2 ranks": ({"fsdp_config": _SHARDED}, 2, fixtures.FSDP2),
    "FSDP2, 4 ranks": ({"fsdp_config": _SHARDED}, 4, fixtures.FSDP2),
    "FSDP2 HYBRID_SHARD, 2 ranks": ({"fsdp_config": {**_SHARDED, "sharding_strategy": "HYBRID_SHARD"}}, 2,
                                    fixtures.FSDP2),
    "FSDP2, 2 ranks, microbatch 1 (accumulation x4)": ({"fsdp_config": _SHARDED, "device_train_microbatch_size": 1},
                                                       2, fixtures.FSDP2),
    "FSDP2, 2 ranks, accumulate_train_batch_on_tokens false": (
        {"fsdp_config": _SHARDED, "accumulate_train_batch_on_tokens": False}, 2, fixtures.FSDP2),
}


def ratios(checkpoint, reference) -> tuple[float, float]:
    """Median over parameters of exp_avg / reference's, and of exp_avg_sq / reference's."""
    first, second = [], []
    for name, state in reference.optimizer_state.items():
        theirs = checkpoint.optimizer_state[name]
        nonzero = state["exp_avg_sq"] > 0
        first.append(float((theirs["exp_avg"][nonzero] / state["exp_avg"][nonzero]).median()))
        second.append(float((theirs["exp_avg_sq"][nonzero] / state["exp_avg_sq"][nonzero]).median()))
    return statistics.median(first), statistics.median(second)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lf-python", default="/tmp/lf_venv/bin/python")
    parser.add_argument("--results", help="also write the table (Markdown) to this file")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="moment_scale_"))
    data, tokenizer, hf_model = fixtures.build_data(work)
    base = {**copy.deepcopy(fixtures.FIXTURES["adam_monolithic"][0]), "max_duration": "2ba"}
    rows, reference = [], None
    for index, (name, (changes, processes, env)) in enumerate(LAYOUTS.items()):
        save_folder = work / f"layout{index}"
        recipe = fixtures.fill({**base, **copy.deepcopy(changes)}, data, tokenizer, save_folder, hf_model)
        record = fixtures.run_llm_foundry(args.lf_python, f"layout{index}", recipe, processes, work, env)
        path = save_folder / "ep0-ba2-rank0.pt"
        checkpoint = read_composer_checkpoint(path if path.is_file() else save_folder / "ep0-ba2")
        reference = reference or checkpoint
        first, second = ratios(checkpoint, reference)
        scale = moments_of(checkpoint)
        rows.append(f"| {name} | {processes} | {first:.4f} | {second:.4f} | {scale.factor:g} | {scale.reason} |")
        print(rows[-1], f"(losses {[round(b['loss'], 5) for b in record['batches']]})", flush=True)
    table = "\n".join(["| layout | ranks | exp_avg / one process | exp_avg_sq / one process | factor derived from "
                       "the checkpoint | why |", "|---|---|---|---|---|---|", *rows])
    print(table)
    if args.results:
        Path(args.results).write_text(
            "# Adam moments of llm-foundry's checkpoints, by layout\n\n"
            f"`python benchmarks/composer_moment_scale.py` (llm-foundry {record['versions'].get('llm-foundry')}, "
            f"Composer {record['versions'].get('mosaicml')}, torch {record['versions'].get('torch')}, CPU, gloo).\n\n"
            f"{table}\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
