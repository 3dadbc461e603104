"""llm-foundry's (Composer's) checkpoints resume on 2 ranks with FSDP2 (ours): written by 2 FSDP1 ranks (Lion),
by one process, and by 2 and 4 FSDP2 ranks whose moments carry the ranks' summed gradients (Adam, issue 27); each
continues with llm-foundry's own losses (its own resume where the fixture records one) and learning rates."""

from __future__ import annotations

import json

import pytest

from tests.distributed.helpers import losses, run_job
from tests.train.test_composer_checkpoints import FIXTURES, fixture_data, resumed_recipe  # noqa: F401 (fixture)

pytestmark = pytest.mark.dist


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mpt_sharded", "adam_monolithic", "adam_fsdp2_2rank", "adam_fsdp2_4rank"])
def test_composer_checkpoint_resumes_on_two_fsdp_ranks(name, fixture_data, tmp_path):  # noqa: F811
    reference = json.loads((FIXTURES / f"{name}.json").read_text())
    recipe = resumed_recipe(name, fixture_data, tmp_path, fsdp_config={"sharding_strategy": "FULL_SHARD"},
                            loggers={"jsonl": {"path": str(tmp_path / "metrics.jsonl")}},
                            callbacks={"record_lr": {"folder": str(tmp_path)}})
    run_job(recipe, tmp_path, name)
    got = losses(tmp_path / "metrics.jsonl")
    expected = reference.get("resumed_by_llm_foundry") or reference["batches"][2:]
    assert sorted(got) == list(range(3, 3 + len(expected)))
    rates = {row["batch"]: row["lr"] for row in map(json.loads, (tmp_path / "lr-rank0.jsonl").read_text().splitlines())}
    for step, theirs in enumerate(expected, start=3):
        assert got[step] == pytest.approx(theirs["loss"], rel=1e-5), f"batch {step}"
        assert rates[step] == pytest.approx(theirs["lr"], rel=1e-12, abs=1e-15), f"lr of batch {step}"
