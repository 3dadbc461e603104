"""``console_log_interval`` in tok: printed when the real tokens trained (padding left out, as eval_interval and
save_interval count them) cross a multiple of it, not every interval / padded batch size batches."""

from __future__ import annotations

import math
import re

from llmfoundry.data.batches import count_batch_tokens
from tests.helpers import make_trainer, tiny_recipe, write_prompt_response_jsonl


def test_console_log_interval_in_tokens_follows_the_real_tokens_trained(tmp_path, corpus, tokenizer_dir, mds_root,
                                                                        capsys):
    data = write_prompt_response_jsonl(tmp_path / "pr.jsonl", corpus[:40])
    loader = {"name": "finetuning", "dataset": {"hf_name": "json", "hf_kwargs": {"data_files": str(data)},
                                                "split": "train", "max_seq_len": 64, "shuffle": True}}
    recipe = tiny_recipe(mds_root, tokenizer_dir, train_loader=loader, eval_loader=None, max_duration="6ba",
                         global_train_batch_size=4, device_train_microbatch_size=4, log_to_console=True,
                         scheduler=None)
    tokens = []
    probe = make_trainer(recipe)
    for batch in probe.train_loader:
        tokens.append(int(count_batch_tokens(batch)))
        if len(tokens) == 6:
            break
    # an interval of about 2 batches' real tokens: a padded batch (4 x 64 tokens) holds far more
    interval = sum(tokens[:2]) + 1
    assert interval < 4 * 64 * 2
    trained = [sum(tokens[: k + 1]) for k in range(6)]
    expected = [k + 1 for k in range(6) if math.floor(trained[k] / interval) != math.floor(
        (trained[k - 1] if k else 0) / interval)] + [6]  # fmt: skip
    capsys.readouterr()
    make_trainer({**recipe, "console_log_interval": f"{interval}tok"}).fit()
    printed = [int(n) for n in re.findall(r"^\[batch (\d+)/6\]", capsys.readouterr().out, flags=re.M)]
    assert printed == sorted(set(expected)) and len(printed) < 6
