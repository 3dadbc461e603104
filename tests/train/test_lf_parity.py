"""Same recipe, same seed, same run as mosaicml/llm-foundry: per-batch numbers recorded from llm-foundry 0.22.0
(Composer 0.32.1, CPU, fp32) by benchmarks/lf_parity.py --write-reference, compared with a run here.

The references were made on the data the ``mds_root``, ``tokenizer_dir`` and ``corpus`` fixtures build (the harness
builds the same corpus, tokenizer, shards and prompt/response file, and hf_causal_lm recipes load the tiny GPT-2
folder ``tests.helpers.write_tiny_gpt2`` writes), so llm-foundry is not needed to run this test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfoundry.train.callbacks.base import Callback
from tests.helpers import make_trainer, write_prompt_response_jsonl, write_tiny_gpt2

REFERENCES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "lf_parity").glob("*.json"))


class Recorder(Callback):
    def __init__(self):
        self.batches: list[dict] = []
        self.eval: dict[str, float] = {}

    def on_batch_start(self, trainer):
        self.lr = trainer.optimizer.param_groups[0]["lr"]  # the lr this batch's optimizer step runs at

    def on_batch_end(self, trainer, metrics):
        self.batches.append({"loss": metrics["loss/train/total"], "lr": self.lr})

    def on_eval_end(self, trainer, metrics):
        self.eval.update({f"{trainer.time.batch}:{k}": v for k, v in metrics.items() if k.startswith("metrics/")})


@pytest.mark.parametrize("reference_file", REFERENCES, ids=lambda p: p.stem)
def test_per_batch_loss_and_lr_match_llm_foundry(reference_file, mds_root, tokenizer_dir, corpus, tmp_path):
    reference = json.loads(reference_file.read_text())
    finetuning = write_prompt_response_jsonl(tmp_path / "finetuning.jsonl", corpus)
    text = json.dumps(reference["recipe"]).replace("{data}", str(mds_root)).replace("{tokenizer}", str(tokenizer_dir))
    text = text.replace("{finetuning}", str(finetuning))
    if "{hf_model}" in text:  # hf_causal_lm recipes: the harness's tiny GPT-2, rebuilt from the same seed
        text = text.replace("{hf_model}", str(write_tiny_gpt2(tmp_path / "hf_model")))
    recipe = json.loads(text)
    trainer = make_trainer(recipe)
    recorder = Recorder()
    trainer.callbacks.append(recorder)
    trainer.fit()

    assert len(recorder.batches) == len(reference["batches"])
    for i, (ours, theirs) in enumerate(zip(recorder.batches, reference["batches"]), start=1):
        assert ours["lr"] == pytest.approx(theirs["lr"], rel=1e-12, abs=1e-15), f"lr of batch {i}"
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-3), f"loss of batch {i}"
    expected = reference["eval"]  # LanguageCrossEntropy, LanguagePerplexity and TokenAccuracy per eval
    assert recorder.eval.keys() >= expected.keys()
    for key, value in expected.items():
        assert recorder.eval[key] == pytest.approx(value, rel=1e-3), key
