"""llm-foundry's run-level keys on 2 ranks (gloo): per-sample accumulation and labelled eval loaders."""

from __future__ import annotations

import json

import pytest

from tests.distributed.helpers import losses, run_job
from tests.helpers import make_trainer

pytestmark = pytest.mark.dist


def test_per_sample_accumulation_on_two_ranks_matches_one_rank_and_eval_loaders_log_per_label(dist_recipe, mds_root,
                                                                                             tmp_path):
    heldout = {"label": "heldout", "name": "text", "dataset": {"local": str(mds_root), "split": "val", "max_seq_len": 64}}
    recipe = dist_recipe(max_duration="3ba", accumulate_train_batch_on_tokens=False, scheduler=None,
                         eval_interval="3ba", eval_loaders=[heldout])
    run_job(dict(recipe, loggers={"jsonl": {"path": str(tmp_path / "two.jsonl")}}), tmp_path, "two")
    one = make_trainer(recipe).fit()
    # the samples of each global batch are the same on 1 and 2 ranks; weighting by samples must not depend on how
    # they are spread over ranks
    assert losses(tmp_path / "two.jsonl")[3] == pytest.approx(one["loss/train/total"], rel=1e-5)
    rows = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    logged = {k: v for row in rows for k, v in row.items() if k.startswith("metrics/eval/")}
    assert set(logged) == {f"metrics/eval/heldout/{name}"  # llm-foundry's eval metrics of a causal LM
                           for name in ("LanguageCrossEntropy", "LanguagePerplexity", "TokenAccuracy")}
    assert logged["metrics/eval/heldout/LanguageCrossEntropy"] == pytest.approx(
        one["metrics/eval/heldout/LanguageCrossEntropy"], rel=1e-5)
