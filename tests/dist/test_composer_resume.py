"""llm-foundry's (Composer's) checkpoints resume on 2 ranks with FSDP2: the sharded one was written by 2 FSDP1
ranks, the monolithic one by a single process; each continues with llm-foundry's own losses and learning rates."""

from __future__ import annotations

import json

import pytest

from tests.dist.helpers import losses, run_job
from tests.train.test_composer_checkpoints import FIXTURES, fixture_data, resumed_recipe  # noqa: F401 (fixture)

pytestmark = pytest.mark.dist


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mpt_sharded", "mpt_monolithic"])
def test_composer_checkpoint_resumes_on_two_fsdp_ranks(name, fixture_data, tmp_path):  # noqa: F811
    reference = json.loads((FIXTURES / f"{name}.json").read_text())
    recipe = resumed_recipe(name, fixture_data, tmp_path, fsdp_config={"sharding_strategy": "FULL_SHARD"},
                            loggers={"jsonl": {"path": str(tmp_path / "metrics.jsonl")}})
    run_job(recipe, tmp_path, name)
    got = losses(tmp_path / "metrics.jsonl")
    assert sorted(got) == [3, 4]
    for step in (3, 4):
        assert got[step] == pytest.approx(reference["batches"][step - 1]["loss"], rel=1e-5), f"batch {step}"
