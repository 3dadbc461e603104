"""Checkpoints written by the real llm-foundry (Composer) continue here: tests/fixtures/composer holds a monolithic
and a sharded checkpoint of mpt_causal_lm and a monolithic one of hf_causal_lm, each saved after batch 2 of a
4-batch run, with that run's per-batch loss and learning rate (tests/fixtures/composer/make_fixtures.py says how
they were made). A run here resumed from batch 2 must load the weights bit for bit and train batches 3 and 4 with
llm-foundry's learning rates and losses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from llmfoundry.core.errors import ConfigError
from llmfoundry.train.composer_checkpoint import find_composer_checkpoint, moments_of, read_composer_checkpoint
from tests.helpers import build_composer_fixture_data, make_trainer, write_tiny_gpt2
from tests.train.test_lf_parity import Recorder

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "composer"
CHECKPOINTS = {"mpt_monolithic": "mpt_monolithic/ep0-ba2-rank0.pt", "mpt_sharded": "mpt_sharded/ep0-ba2",
               "gpt2_monolithic": "gpt2_monolithic/ep0-ba2-rank0.pt",
               # issue 27's Adam twins: one process, FSDP2 on 2 and 4 ranks (gloo summed their gradients), FSDP1
               "adam_monolithic": "adam_monolithic/ep0-ba2-rank0.pt", "adam_fsdp2_2rank": "adam_fsdp2_2rank/ep0-ba2",
               "adam_fsdp2_4rank": "adam_fsdp2_4rank/ep0-ba2", "adam_fsdp1_2rank": "adam_fsdp1_2rank/ep0-ba2"}


@pytest.fixture(scope="module")
def fixture_data(tmp_path_factory):
    work = tmp_path_factory.mktemp("composer_data")
    mds, tokenizer = build_composer_fixture_data(work)
    hf_model = write_tiny_gpt2(work / "hf_model", vocab_size=128, n_embd=16, n_head=2)
    return {"data": mds, "tokenizer": tokenizer, "hf_model": hf_model}


def resumed_recipe(name: str, paths: dict, tmp_path: Path, **changes) -> dict:
    """The fixture's own recipe (llm-foundry's keys) with load_path at its batch-2 checkpoint."""
    reference = json.loads((FIXTURES / f"{name}.json").read_text())
    text = json.dumps(reference["recipe"])
    for key, value in {**paths, "save_folder": tmp_path / "save"}.items():
        text = text.replace("{" + key + "}", str(value))
    recipe = json.loads(text)
    recipe.pop("fsdp_config", None)  # the sharded fixture was written by 2 ranks; it resumes here on one
    recipe.update({"save_folder": None, "load_path": str(FIXTURES / CHECKPOINTS[name]), **changes})
    return recipe


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_resumed_run_continues_as_llm_foundry_did(name, fixture_data, tmp_path):
    reference = json.loads((FIXTURES / f"{name}.json").read_text())
    trainer = make_trainer(resumed_recipe(name, fixture_data, tmp_path))
    trainer._resume()
    saved = read_composer_checkpoint(FIXTURES / CHECKPOINTS[name])
    ours = get_model_state_dict(trainer.model)
    prefix = "hf_model." if name.startswith("gpt2") else ""
    for key, value in saved.model.items():
        assert torch.equal(ours[prefix + key], value), f"weight {key} differs after loading"
    assert trainer.time.batch == 2 and trainer.time.sample == 16 and trainer.time.token == 16 * 64

    recorder = Recorder()
    trainer = make_trainer(resumed_recipe(name, fixture_data, tmp_path))
    trainer.callbacks.append(recorder)
    trainer.fit()
    # llm-foundry's own resume from the same checkpoint where the fixture has it, else its uninterrupted run
    expected = reference.get("resumed_by_llm_foundry") or reference["batches"][2:]
    assert len(recorder.batches) == len(expected), f"batches 3 to {2 + len(expected)} are trained, no more"
    for i, (ours, theirs) in enumerate(zip(recorder.batches, expected), start=3):
        assert ours["lr"] == pytest.approx(theirs["lr"], rel=1e-12, abs=1e-15), f"lr of batch {i}"
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5), f"loss of batch {i}"


@pytest.mark.parametrize("name, factor", [("adam_fsdp2_2rank", 2), ("adam_fsdp2_4rank", 4), ("adam_fsdp1_2rank", 1)])
def test_restored_moments_equal_the_one_process_twins(name, factor, fixture_data, tmp_path):
    """llm-foundry trained the same batches on 1, 2 and 4 ranks: restored here, every Adam moment equals the
    one-process checkpoint's, whatever scale the sharded one carried (FSDP2 on gloo: world_size x, and its square)."""
    twin = read_composer_checkpoint(FIXTURES / CHECKPOINTS["adam_monolithic"])
    saved = read_composer_checkpoint(FIXTURES / CHECKPOINTS[name])
    assert float(saved.optimizer_state["transformer.wte.weight"]["exp_avg"].norm() /
                 twin.optimizer_state["transformer.wte.weight"]["exp_avg"].norm()) == pytest.approx(factor, rel=1e-5)
    trainer = make_trainer(resumed_recipe(name, fixture_data, tmp_path))
    trainer._resume()
    restored = {name: trainer.optimizer.state[param] for name, param in trainer.model.named_parameters()}
    assert set(restored) == set(twin.optimizer_state)
    for key, moments in twin.optimizer_state.items():
        for moment in ("exp_avg", "exp_avg_sq"):  # per tensor: the layouts summed the same gradients in other orders
            difference = float((restored[key][moment] - moments[moment]).norm() / moments[moment].norm())
            assert difference <= 1e-6, f"{key}.{moment}: relative difference {difference:.2e}"
    scale = moments_of(saved)  # what the notice says: derived from the checkpoint's record alone
    assert (scale.factor, scale.assumed) == (factor, False)
    assert scale.reason == (f"written by FSDP2 (optimizer state in parameter order) on CPU by torch 2.7.0+cu126, "
                            f"whose gloo summed the {factor} ranks' gradients" if factor > 1 else
                            "written by FSDP1 (optimizer state in sorted order), which averages the ranks' gradients")


def test_weights_only_load_starts_time_and_optimizer_afresh(fixture_data, tmp_path):
    trainer = make_trainer(resumed_recipe("mpt_monolithic", fixture_data, tmp_path, load_weights_only=True))
    trainer._resume()
    assert trainer.time.batch == 0
    assert not trainer.optimizer.state  # nothing restored: the optimizer starts afresh


def test_a_different_optimizer_is_a_one_line_error(fixture_data, tmp_path):
    recipe = resumed_recipe("mpt_monolithic", fixture_data, tmp_path)
    recipe["optimizer"] = {"name": "decoupled_lionw", "lr": 1.0e-3}
    with pytest.raises(ConfigError, match="trained with optimizer decoupled_adamw, this run uses decoupled_lionw"):
        make_trainer(recipe)._resume()


def test_a_different_model_is_a_one_line_error_unless_not_strict(fixture_data, tmp_path):
    recipe = resumed_recipe("mpt_monolithic", fixture_data, tmp_path)
    recipe["model"] = {**recipe["model"], "n_layers": 3}
    with pytest.raises(ConfigError, match=r"does not match this run's model \(missing \['transformer.blocks.2"):
        make_trainer(recipe)._resume()
    recipe.update(load_strict_model_weights=False, load_weights_only=True)
    trainer = make_trainer(recipe)
    trainer._resume()  # the two layers that match are loaded
    saved = read_composer_checkpoint(FIXTURES / CHECKPOINTS["mpt_monolithic"])
    block = "transformer.blocks.1.attn.Wqkv.weight"
    assert torch.equal(get_model_state_dict(trainer.model)[block], saved.model[block])


def test_load_ignore_keys_leave_composer_state_out(fixture_data, tmp_path):
    recipe = resumed_recipe("mpt_monolithic", fixture_data, tmp_path,
                            load_ignore_keys=["state/optimizers", "state/timestamp", "state/model/*wte*"])
    trainer = make_trainer(recipe)
    before = get_model_state_dict(trainer.model)["transformer.wte.weight"].clone()
    trainer._resume()
    assert trainer.time.batch == 0 and not trainer.optimizer.state
    assert torch.equal(get_model_state_dict(trainer.model)["transformer.wte.weight"], before)


def test_a_save_folder_with_composer_pointers_resumes_from_the_newest(tmp_path):
    folder = tmp_path / "checkpoints"
    shutil.copytree(FIXTURES / "mpt_sharded", folder)
    (folder / "latest-sharded-rank0").symlink_to("ep0-ba2")
    assert find_composer_checkpoint(folder) == (folder / "ep0-ba2").resolve()
    assert find_composer_checkpoint(FIXTURES / "mpt_sharded" / "ep0-ba2") is not None


def test_a_checkpoint_that_needs_code_to_unpickle_is_refused_unread(tmp_path):
    class Payload:  # what an untrusted file could hold: unpickling it would call this class
        def __reduce__(self):
            return (print, ("this must never run",))

    bad = tmp_path / "ep0-ba2-rank0.pt"
    torch.save({"state": {"model": {"model.w": torch.zeros(1)}, "evil": Payload()}, "rng": []}, bad)
    with pytest.raises(ConfigError, match="refused unread .*print"):
        read_composer_checkpoint(bad)


def test_sharded_metadata_with_foreign_types_is_refused_unread(tmp_path):
    folder = tmp_path / "ep0-ba2"
    shutil.copytree(FIXTURES / "mpt_sharded" / "ep0-ba2", folder)
    (folder / ".metadata").write_bytes(b"cos\nsystem\n(S'echo this must never run'\ntR.")  # os.system(...)
    with pytest.raises(ConfigError, match="refused unread"):
        read_composer_checkpoint(folder)


# ----- llmfoundry convert from a Composer checkpoint (llm-foundry's convert_composer_to_hf.py) -----
@pytest.mark.parametrize("name,cls", [("mpt_monolithic", "MptForCausalLM"), ("gpt2_monolithic", "GPT2LMHeadModel")])
def test_convert_writes_a_transformers_folder_with_the_checkpoint_weights_and_tokenizer(name, cls, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmfoundry.cli import main

    out = tmp_path / "hf"
    assert main(["convert", str(FIXTURES / CHECKPOINTS[name]), str(out), "--dtype", "bf16"]) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model).__name__ == cls and model.dtype == torch.bfloat16
    saved = read_composer_checkpoint(FIXTURES / CHECKPOINTS[name])
    embedding = model.get_input_embeddings().weight
    assert torch.equal(embedding, saved.model["transformer.wte.weight"].to(torch.bfloat16))
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.decode(tokenizer("The cat runs.").input_ids) == "The cat runs ."  # the word-level tokenizer


def test_convert_of_a_model_transformers_cannot_express_is_a_one_line_error(tmp_path, capsys):
    from llmfoundry.cli import main

    # the sharded fixture uses qk_ln, which no transformers-native class computes
    assert main(["convert", str(FIXTURES / CHECKPOINTS["mpt_sharded"]), str(tmp_path / "hf")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "qk_ln" in err[0]
    assert not (tmp_path / "hf").exists()


def test_a_sharded_checkpoint_written_out_as_a_folder_loads_with_its_tokenizer(tmp_path):
    """A sharded checkpoint keeps only leaves (empty containers vanish); tokenizer.json still loads, and the
    folder is llm-foundry's MPT export, read here without its code."""
    from llmfoundry.loading import load_model

    model, tokenizer = load_model(FIXTURES / CHECKPOINTS["mpt_sharded"])
    saved = read_composer_checkpoint(FIXTURES / CHECKPOINTS["mpt_sharded"])
    for key, value in saved.model.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert tokenizer("The cat").input_ids == [64, 20]


@pytest.mark.s3
def test_a_composer_checkpoint_in_s3_resumes(s3_server, fixture_data, tmp_path):
    import boto3

    from tests.helpers import S3_TEST_BUCKET

    s3 = boto3.client("s3", endpoint_url=s3_server)
    for path in (FIXTURES / "mpt_sharded" / "ep0-ba2").iterdir():
        s3.upload_file(str(path), S3_TEST_BUCKET, f"run/checkpoints/ep0-ba2/{path.name}")
    # Composer's upload of its latest-sharded-rank0 symlink: a text object naming the target's key
    s3.put_object(Bucket=S3_TEST_BUCKET, Key="run/checkpoints/latest-sharded-rank0.symlink",
                  Body=b"run/checkpoints/ep0-ba2")
    s3.upload_file(str(FIXTURES / CHECKPOINTS["mpt_monolithic"]), S3_TEST_BUCKET, "mono/ep0-ba2-rank0.pt")
    for name, url in {"mpt_sharded": f"s3://{S3_TEST_BUCKET}/run/checkpoints",
                      "mpt_monolithic": f"s3://{S3_TEST_BUCKET}/mono/ep0-ba2-rank0.pt"}.items():
        trainer = make_trainer(resumed_recipe(name, fixture_data, tmp_path, load_path=url))
        trainer._resume()
        saved = read_composer_checkpoint(FIXTURES / CHECKPOINTS[name])
        assert trainer.time.batch == 2
        assert torch.equal(get_model_state_dict(trainer.model)["transformer.wte.weight"],
                           saved.model["transformer.wte.weight"])


@pytest.mark.parametrize("name", ["mpt_monolithic", "mpt_sharded"])
def test_convert_to_a_checkpoint_of_ours_keeps_the_whole_training_state(name, fixture_data, tmp_path):
    """--recipe: the Composer checkpoint becomes a DCP checkpoint of this project; a run resumed from that one
    trains batches 3 and 4 as llm-foundry did."""
    import yaml

    from llmfoundry.cli import main

    recipe = resumed_recipe(name, fixture_data, tmp_path)
    recipe.pop("load_path")
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "ours"
    assert main(["convert", str(FIXTURES / CHECKPOINTS[name]), str(out), "--recipe", str(recipe_file)]) == 0
    assert (out / "latest").read_text().strip() == "ep0-ba2"

    reference = json.loads((FIXTURES / f"{name}.json").read_text())
    recorder = Recorder()
    trainer = make_trainer({**recipe, "load_path": str(out)})
    trainer.callbacks.append(recorder)
    trainer.fit()
    assert [b["lr"] for b in recorder.batches] == pytest.approx([b["lr"] for b in reference["batches"][2:]])
    for ours, theirs in zip(recorder.batches, reference["batches"][2:]):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)


def test_autoresume_continues_a_save_folder_llm_foundry_wrote(fixture_data, tmp_path):
    """autoresume with save_folder = llm-foundry's own folder resumes from Composer's latest pointer (as
    llm-foundry would), then from this project's newer checkpoints written there."""
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy2(FIXTURES / CHECKPOINTS["mpt_monolithic"], folder / "ep0-ba2-rank0.pt")
    (folder / "latest-rank0.pt").symlink_to("ep0-ba2-rank0.pt")
    recipe = resumed_recipe("mpt_monolithic", fixture_data, tmp_path, load_path=None, autoresume=True,
                            save_folder=str(folder), save_interval="1ba", max_duration="3ba")
    trainer = make_trainer(recipe)
    trainer.fit()
    assert trainer.time.batch == 3 and (folder / "latest").read_text().strip() == "ep0-ba3"
    trainer = make_trainer({**recipe, "max_duration": "4ba"})
    trainer._resume()
    assert trainer.time.batch == 3  # our own newer checkpoint now comes first


def test_a_recipe_tokenizer_can_name_an_llm_foundry_mpt_folder(tmp_path):
    """tokenizer.name pointing at llm-foundry's MPT export (whose config.json transformers' MptConfig refuses)."""
    from llmfoundry.data.tokenizers import build_tokenizer
    from llmfoundry.train.composer_checkpoint import write_hf_folder

    folder = write_hf_folder(read_composer_checkpoint(FIXTURES / CHECKPOINTS["mpt_sharded"]), tmp_path / "hf")
    assert build_tokenizer(str(folder), {})("The cat").input_ids == [64, 20]


@pytest.mark.parametrize("metadata, version, factor, assumed", [
    ({"world_size": 1, "device": "cpu", "torch_version": "2.7.0"}, None, 1, False),  # one process
    ({"world_size": 8, "device": "gpu", "torch_version": "2.7.0"}, 2, 1, False),  # NCCL averages
    ({"world_size": 4, "device": "cpu", "torch_version": "2.7.0"}, 2, 4, False),  # gloo summed
    ({"world_size": 4, "device": "cpu", "torch_version": "2.7.0"}, 1, 1, False),  # FSDP1 divides
    ({"world_size": 2, "device": "cpu", "torch_version": "2.13.0"}, 2, 1, False),  # this gloo averages
    ({"world_size": 2, "device": "cpu", "torch_version": "2.10.0"}, 2, 2, True),  # not measured: said
    ({"world_size": 2, "device": "cpu", "torch_version": "2.7.0"}, None, 1, True),  # FSDP version unknown: said
])
def test_the_moment_scale_rule(metadata, version, factor, assumed):
    from llmfoundry.train.composer_moments import moment_scale

    scale = moment_scale(metadata, version)
    assert (scale.factor, scale.assumed) == (factor, assumed), scale.reason


def test_the_fsdp_version_shows_in_the_optimizer_state_order():
    from llmfoundry.train.composer_moments import fsdp_version_from_order

    model = ["wte.weight", "blocks.0.w", "blocks.1.w", "norm_f.weight"]
    assert fsdp_version_from_order(model, list(model)) == 2
    assert fsdp_version_from_order(model, sorted(model)) == 1
    assert fsdp_version_from_order(sorted(model), sorted(model)) is None  # both orders agree: no evidence
    assert fsdp_version_from_order(model, ["norm_f.weight", "wte.weight", "blocks.1.w", "blocks.0.w"]) is None


def test_gradient_clipping_makes_the_factor_an_assumption_that_is_said():
    from llmfoundry.train.composer_moments import moment_scale

    scale = moment_scale({"world_size": 2, "device": "cpu", "torch_version": "2.7.0"}, 2, clipped=True)
    assert (scale.factor, scale.assumed) == (2, True) and "gradient clipping was on" in scale.reason
    assert moment_scale({"world_size": 2, "device": "gpu"}, 2, clipped=True).assumed is False  # factor 1 anyway
