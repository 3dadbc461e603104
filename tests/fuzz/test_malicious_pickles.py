"""A pickle that runs code (``os.system("touch MARKER")`` on unpickling) planted in each kind of file we read from
a checkpoint or a model folder is refused with a one-line ConfigError, and the marker file is never created.

Files covered: our checkpoints' DCP ``.metadata``, a tensor and a plain value inside a ``.distcp`` shard, the
per-rank ``rank0.pt``, ``config.yaml`` (a YAML tag that would call code); Composer's monolithic ``.pt``, its
sharded ``.metadata`` and ``.distcp`` (tensor and plain value); a Hugging Face folder's ``pytorch_model.bin`` (read
by transformers) and an llm-foundry MPT folder's ``pytorch_model.bin`` (read by us). Nothing else is read from
these folders as a pickle: ``model_full.pt`` is written for other tools and never read here, tokenizers are JSON
or SentencePiece protobufs, and the optimizer/trainer files of a Hugging Face Trainer folder are not read.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from llmfoundry.core.errors import ConfigError
from llmfoundry.loading import load_model
from llmfoundry.train.checkpoint import load_checkpoint
from llmfoundry.train.composer_checkpoint import read_composer_checkpoint
from llmfoundry.train.dcp_reading import read_metadata_file
from tests.helpers import make_trainer, tiny_recipe, write_tiny_gpt2

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "composer"


class RunsCode:
    """Unpickling this calls os.system: what a file from an untrusted bucket could carry."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def torch_payload(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save({"weight": RunsCode(marker)}, buffer)
    return buffer.getvalue()


def plant_in_distcp(folder: Path, payload: bytes, tensor: bool) -> str:
    """Point one stored item of a DCP folder (a tensor or a plain value) at ``payload``; the rewritten .metadata
    holds only DCP's own records, so it is the item itself that must be refused. Returns the item's name."""
    metadata = read_metadata_file(folder / ".metadata")
    for index, info in metadata.storage_data.items():
        if isinstance(metadata.state_dict_metadata[index.fqn], BytesStorageMetadata) != tensor:
            break
    (folder / "__planted.distcp").write_bytes(payload)
    metadata.storage_data[index] = dataclasses.replace(info, relative_path="__planted.distcp", offset=0,
                                                       length=len(payload))
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    return index.fqn


@pytest.fixture(scope="module")
def our_checkpoint(tmp_path_factory, mds_root, tokenizer_dir):
    """A checkpoint of ours after 2 batches, and the trainer (model and optimizer) to load it into."""
    folder = tmp_path_factory.mktemp("ours")
    trainer = make_trainer(tiny_recipe(mds_root, tokenizer_dir, max_duration="2ba", save_interval="2ba",
                                       save_folder=str(folder / "ckpt"), eval_interval="2ba"))
    trainer.fit()
    return folder / "ckpt" / "ep0-ba2", trainer


def _our_metadata(folder, marker):
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(RunsCode(marker), f)


def _our_rank_file(folder, marker):
    state = torch.load(folder / "rank0.pt", weights_only=True)
    state["trainer"]["payload"] = RunsCode(marker)
    torch.save(state, folder / "rank0.pt")


def _our_config(folder, marker):
    (folder / "config.yaml").write_text(f"model: !!python/object/apply:os.system ['touch {marker}']\n")


OURS = {
    ".metadata": (_our_metadata, r"\.metadata: .*refused unread .*posix\.system"),
    ".distcp tensor": (lambda f, m: plant_in_distcp(f, torch_payload(m), tensor=True), r"refused unread"),
    ".distcp value": (lambda f, m: plant_in_distcp(f, torch_payload(m), tensor=False), r"refused unread"),
    "rank0.pt": (_our_rank_file, r"rank0\.pt' holds more than tensors and plain values, refused unread"),
}


@pytest.mark.parametrize("kind", list(OURS))
def test_a_pickle_that_runs_code_in_our_checkpoint_is_refused_unrun(our_checkpoint, tmp_path, kind):
    source, trainer = our_checkpoint
    folder = tmp_path / "ep0-ba2"
    shutil.copytree(source, folder)
    marker = tmp_path / "code-ran"
    plant, message = OURS[kind]
    shutil.rmtree(folder / "checksums", ignore_errors=True)  # an attacker rewrites or drops them: not a defence
    plant(folder, marker)
    with pytest.raises(ConfigError, match=message) as refused:
        load_checkpoint(folder, trainer.checkpoint_components())
    assert "\n" not in str(refused.value)
    assert not marker.exists()


def test_a_python_tag_in_a_checkpoints_config_yaml_is_refused_unrun(our_checkpoint, tmp_path):
    source, _ = our_checkpoint
    folder = tmp_path / "ep0-ba2"
    shutil.copytree(source, folder)
    marker = tmp_path / "code-ran"
    shutil.rmtree(folder / "checksums", ignore_errors=True)
    _our_config(folder, marker)
    with pytest.raises(ConfigError, match=r"config\.yaml"):
        load_model(folder)
    assert not marker.exists()


def _composer_monolithic(tmp_path, marker):
    path = tmp_path / "ep0-ba2-rank0.pt"
    state = torch.load(FIXTURES / "mpt_monolithic" / "ep0-ba2-rank0.pt", weights_only=False)  # our own fixture
    state["state"]["timestamp"]["payload"] = RunsCode(marker)
    torch.save(state, path)
    return path


def _composer_sharded(kind):
    def plant(tmp_path, marker):
        folder = tmp_path / "ep0-ba2"
        shutil.copytree(FIXTURES / "mpt_sharded" / "ep0-ba2", folder)
        if kind == "metadata":
            with open(folder / ".metadata", "wb") as f:
                pickle.dump(RunsCode(marker), f)
        else:
            plant_in_distcp(folder, torch_payload(marker), tensor=kind == "tensor")
        return folder
    return plant


COMPOSER = {"monolithic .pt": _composer_monolithic, "sharded .metadata": _composer_sharded("metadata"),
            "sharded .distcp tensor": _composer_sharded("tensor"),
            "sharded .distcp value": _composer_sharded("value")}


@pytest.mark.parametrize("kind", list(COMPOSER))
def test_a_pickle_that_runs_code_in_a_composer_checkpoint_is_refused_unrun(tmp_path, kind):
    marker = tmp_path / "code-ran"
    path = COMPOSER[kind](tmp_path, marker)
    with pytest.raises(ConfigError, match="refused unread") as refused:
        read_composer_checkpoint(path)
    assert "\n" not in str(refused.value)
    assert not marker.exists()


def _llm_foundry_mpt_folder(folder: Path) -> None:
    """What llm-foundry's MPT export looks like to our reader: its config.json (model_type mpt, its own keys)."""
    config = {"model_type": "mpt", "architectures": ["MPTForCausalLM"], "d_model": 32, "n_heads": 2, "n_layers": 2,
              "expansion_ratio": 2, "max_seq_len": 64, "vocab_size": 512, "ffn_config": {"ffn_type": "mptmlp"},
              "attn_config": {"attn_impl": "torch", "alibi": True}, "learned_pos_emb": False,
              "auto_map": {"AutoModelForCausalLM": "modeling_mpt.MPTForCausalLM"}}
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("kind", ["transformers folder", "llm-foundry MPT folder"])
def test_a_pickle_that_runs_code_in_a_model_folders_weights_is_refused_unrun(tmp_path, tokenizer_dir, kind):
    folder = tmp_path / "model"
    if kind == "transformers folder":
        write_tiny_gpt2(folder)
        for weights in folder.glob("*.safetensors"):
            weights.unlink()
    else:
        _llm_foundry_mpt_folder(folder)
    for name in os.listdir(tokenizer_dir):
        shutil.copy(tokenizer_dir / name, folder / name)
    marker = tmp_path / "code-ran"
    (folder / "pytorch_model.bin").write_bytes(torch_payload(marker))
    with pytest.raises(ConfigError, match="pytorch_model.bin") as refused:
        load_model(folder)
    assert "\n" not in str(refused.value)
    assert not marker.exists()
