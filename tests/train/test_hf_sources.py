"""hf:// where the Hub is a source, on a fake Hub (tests/hf_hub_server.py): a loader's remote, load_path (with the
checkpoint's own verification), convert's input and generate's model; every key that would write there is a
one-line refusal that says hf:// is read-only and how to put files on the Hub."""

from __future__ import annotations

import pytest
import torch

from llmfoundry.cli import main as cli
from llmfoundry.core.errors import ConfigError
from llmfoundry.train.checkpoint_files import CHECKSUMS
from llmfoundry.train.recipe import TrainConfig, validate
from tests.helpers import make_trainer, weights
from tests.hf_hub_server import hub_fixture  # noqa: F401 (the hf_hub fixture)
from tests.models.test_convert_outputs import _logits, source  # noqa: F401 (source: a fixture)

READ_ONLY = "hf:// is read-only here (it is read by load_path, a loader's remote and model paths"


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_training_streams_its_data_from_a_hub_dataset(recipe, mds_root, hf_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMFOUNDRY_CACHE", str(tmp_path / "cache"))
    hf_hub.upload(mds_root / "train", "org/tiny-c4", "datasets", "train")  # as `hf upload` would commit it
    base = recipe()
    dataset = {k: v for k, v in base["train_loader"]["dataset"].items() if k != "local"}
    loader = dict(base["train_loader"], dataset=dict(dataset, remote="hf://datasets/org/tiny-c4@main"))
    streamed = make_trainer(recipe(train_loader=loader, eval_loader=None, max_duration="2ba"))
    streamed.fit()
    local = make_trainer(recipe(eval_loader=None, max_duration="2ba"))
    local.fit()
    assert streamed.time.batch == 2 and _equal(weights(streamed), weights(local))  # the same samples, in order
    assert {method for method, _ in hf_hub.requests} <= {"GET", "HEAD"}


def test_a_checkpoint_in_a_hub_repo_loads_its_weights_after_the_usual_checks(recipe, hf_hub, tmp_path):
    run = tmp_path / "run"
    saved = make_trainer(recipe(eval_loader=None, max_duration="2ba", save_folder=str(run), save_interval="2ba"))
    saved.fit()
    hf_hub.upload(run, "org/ckpts")  # a local save_folder, as `hf upload org/ckpts run` commits it
    for load_path in ("hf://org/ckpts/ep0-ba2", "hf://org/ckpts"):  # one checkpoint, or the save_folder's latest
        loaded = make_trainer(recipe(eval_loader=None, max_duration="2ba", load_path=load_path))
        assert loaded.time.batch == 2 and _equal(weights(loaded), weights(saved))

    # the checksums recorded at save time are checked on the downloaded copy, as for every store
    damaged = hf_hub.repo("org/ckpts") / "ep0-ba2" / "rank0.pt"
    assert (damaged.parent / CHECKSUMS).is_dir()
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"^load_path: checkpoint file .*rank0\.pt"):
        make_trainer(recipe(eval_loader=None, max_duration="2ba", load_path="hf://org/ckpts/ep0-ba2"))
    (hf_hub.repo("org/half") / "ep0-ba2").mkdir()
    (hf_hub.repo("org/half") / "ep0-ba2" / "rank0.pt").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"^load_path: 'hf://org/half/ep0-ba2' is not a complete checkpoint \(no "
                                          r"\.metadata marker\)$"):
        make_trainer(recipe(eval_loader=None, max_duration="2ba", load_path="hf://org/half/ep0-ba2"))


def test_convert_and_generate_read_a_model_from_the_hub(source, hf_hub, tmp_path, capsys):  # noqa: F811
    export = tmp_path / "export"
    assert cli(["convert", str(source), str(export)]) == 0
    hf_hub.upload(export, "org/tiny")  # a model at a repo's root, the usual layout
    assert cli(["convert", "hf://org/tiny@main", str(tmp_path / "again")]) == 0
    torch.testing.assert_close(_logits(tmp_path / "again"), _logits(export), rtol=0, atol=0)

    capsys.readouterr()
    said = []
    for model in (str(export), "hf://org/tiny"):
        assert cli(["generate", model, "--prompt", "hello world", "--max_new_tokens", "3", "--temperature", "0"]) == 0
        said.append(capsys.readouterr().out)
    assert said[0] == said[1] and said[0].strip()


def test_every_key_that_writes_refuses_hf_in_one_line(recipe, hf_hub, tmp_path, capsys, tokenizer_dir):
    url = "hf://org/runs/a"
    for overrides, key in [({"save_folder": url}, "save_folder"),
                           ({"save_folder": url, "autoresume": True}, "save_folder"),
                           ({"callbacks": {"hf_checkpointer": {"save_folder": url, "save_interval": "1ba"}}},
                            "callbacks.hf_checkpointer.save_folder"),
                           ({"callbacks": {"mono_checkpoint_saver": {"save_folder": url, "batch_interval": 1}}},
                            "callbacks.mono_checkpoint_saver.save_folder")]:
        with pytest.raises(ConfigError) as refused:
            validate(recipe(**overrides), TrainConfig)
        assert refused.value.problems == [f"{key}: '{url}': {READ_ONLY} (convert's input, eval, generate)); write "
                                          "to a local folder or another store, then upload it with `hf upload "
                                          "ORG/NAME FOLDER`"]

    capsys.readouterr()
    assert cli(["convert", str(tmp_path / "missing"), url]) == 2  # before the checkpoint is even looked at
    assert capsys.readouterr().err.startswith(f"error: OUT_DIR: '{url}': {READ_ONLY}")
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"text": "a b c"}\n')
    assert cli(["data", "json", "--path", str(jsonl), "--out_root", "hf://datasets/org/mds", "--split", "train",
                      "--concat_tokens", "8", "--tokenizer", str(tokenizer_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out_root: 'hf://datasets/org/mds': hf:// is read-only here") and err.count("\n") == 1
    assert {method for method, _ in hf_hub.requests} <= {"GET", "HEAD"}
