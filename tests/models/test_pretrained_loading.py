"""Pretrained folders: init_device meta/mixed (weights read after the model is built), LoRA continuation,
embedding resizing and 8-bit loading. The 2-rank FSDP loads are in tests/distributed/test_pretrained_fsdp_loading.py."""

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
)

from llmfoundry.core.errors import ConfigError
from llmfoundry.models.mpt.arch import MPTModelSettings
from llmfoundry.models.settings import HFModelSettings
from llmfoundry.registry import models
from llmfoundry.train import parallel
from tests.models.helpers import write_pretrained_folders

peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A Llama (untied), a GPT-2 (tied embeddings) and our MPT, each saved with save_pretrained (safetensors),
    and a LoRA adapter trained a step on the Llama."""
    return write_pretrained_folders(tmp_path_factory.mktemp("pretrained"))


def hf(**values):
    return models.get("hf_causal_lm").builder(HFModelSettings(**values), None)


def materialized(model):
    assert parallel.is_meta(model)  # nothing was read while building
    parallel.materialize(model, "cpu", seed=0)
    return model.eval()


X = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("init_device", ["meta", "mixed"])
def test_meta_and_mixed_build_without_weights_then_read_the_same_model(folders, arch, init_device):
    reference = AutoModelForCausalLM.from_pretrained(folders / arch).eval()
    model = materialized(hf(pretrained_model_name_or_path=str(folders / arch), init_device=init_device))
    torch.testing.assert_close(model(X).logits, reference(X).logits)
    if arch == "gpt2":  # tied embeddings stay one tensor
        assert model.hf_model.lm_head.weight is model.get_input_embeddings().weight
    for name, buffer in reference.named_buffers():  # rotary tables are computed, not read
        torch.testing.assert_close(model.hf_model.get_buffer(name), buffer)


def test_a_folder_saved_in_several_files_is_read_through_its_index(folders, tmp_path):
    reference = AutoModelForCausalLM.from_pretrained(folders / "llama").eval()
    reference.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("*.safetensors"))) > 2
    model = materialized(hf(pretrained_model_name_or_path=str(tmp_path), init_device="meta"))
    torch.testing.assert_close(model(X).logits, reference(X).logits)


def test_mpt_causal_lm_meta_reads_our_mpt_folder_after_building_and_converts_others_whole(folders):
    settings = MPTModelSettings(pretrained_model_name_or_path=str(folders / "mpt"), init_device="meta")
    model = materialized(models.get("mpt_causal_lm").builder(settings, None))
    reference = AutoModelForCausalLM.from_pretrained(folders / "mpt").eval()
    torch.testing.assert_close(model(X).logits, reference(X).logits)
    # a Llama folder's tensors are converted (q, k, v fused) as they are read: read whole, as with init_device cpu
    settings = MPTModelSettings(pretrained_model_name_or_path=str(folders / "llama"), init_device="meta")
    model = models.get("mpt_causal_lm").builder(settings, None).eval()
    assert not parallel.is_meta(model)
    reference = AutoModelForCausalLM.from_pretrained(folders / "llama").eval()
    torch.testing.assert_close(model(X).logits, reference(X).logits, atol=1e-5, rtol=1e-4)


def test_continuing_a_lora_adapter_loads_it_trainable(folders):
    reference = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folders / "llama"),
                                               folders / "lora").eval()
    for init_device in ("cpu", "mixed"):
        model = hf(pretrained_model_name_or_path=str(folders / "llama"), init_device=init_device,
                   pretrained_lora_id_or_path=str(folders / "lora"))
        model = materialized(model) if init_device == "mixed" else model.eval()
        torch.testing.assert_close(model(X).logits, reference(X).logits)
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable), init_device
    with pytest.raises(ConfigError, match=r"^model.pretrained_lora_id_or_path: the adapter folder brings its own"):
        hf(pretrained_model_name_or_path=str(folders / "llama"), pretrained_lora_id_or_path=str(folders / "lora"),
           peft_config={"r": 2, "target_modules": ["q_proj"]})
    with pytest.raises(ConfigError, match=r"^model.pretrained_lora_id_or_path: cannot load a LoRA adapter"):
        hf(pretrained_model_name_or_path=str(folders / "llama"), pretrained_lora_id_or_path=str(folders / "nope"))


def test_a_new_lora_on_a_meta_model_starts_as_the_base_model(folders):
    reference = AutoModelForCausalLM.from_pretrained(folders / "llama").eval()
    model = materialized(hf(pretrained_model_name_or_path=str(folders / "llama"), init_device="meta",
                            peft_config={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}))
    torch.testing.assert_close(model(X).logits, reference(X).logits)  # lora_B starts at zero, as in peft
    lora_a = [p for n, p in model.named_parameters() if "lora_A" in n]
    assert lora_a and all(p.abs().sum() > 0 for p in lora_a)


class Tokenizer:
    """Only its length matters to the model builders."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n


@pytest.mark.parametrize("init_device", ["cpu", "mixed"])
def test_a_larger_tokenizer_needs_allow_embedding_resizing(folders, init_device):
    settings = dict(pretrained_model_name_or_path=str(folders / "llama"), init_device=init_device)
    build = models.get("hf_causal_lm").builder
    with pytest.raises(ConfigError, match=r"^model.allow_embedding_resizing: the tokenizer has 600 tokens but the "
                                          r"model's embedding only 512 rows"):
        build(HFModelSettings(**settings), Tokenizer(600))
    model = build(HFModelSettings(**settings, allow_embedding_resizing=True), Tokenizer(600))
    if init_device == "mixed":
        materialized(model)
    reference = AutoModelForCausalLM.from_pretrained(folders / "llama")
    embedding = model.get_input_embeddings().weight
    assert embedding.shape == (600, 32)
    torch.testing.assert_close(embedding[:512], reference.get_input_embeddings().weight)  # the first rows are read
    if init_device == "mixed":  # the new rows: the model's initialisation (std 0.02); cpu: transformers' mean
        assert 0.01 < embedding[512:].std() < 0.05
    assert torch.isfinite(embedding).all()
    assert build(HFModelSettings(**settings), Tokenizer(500)).get_input_embeddings().num_embeddings == 512


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of machines without CUDA")
@pytest.mark.parametrize("init_device", ["cpu", "mixed"])
def test_load_in_8bit_is_a_one_line_error_without_cuda(folders, init_device):
    with pytest.raises(ConfigError, match=r"^model.load_in_8bit: needs a CUDA GPU"):
        hf(pretrained_model_name_or_path=str(folders / "llama"), init_device=init_device, load_in_8bit=True)


def test_meta_loading_needs_safetensors(folders, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(folders / "llama")
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # an older folder: no safetensors
    with pytest.raises(ConfigError, match=r"^model.pretrained_model_name_or_path: .* holds no .safetensors weights"):
        hf(pretrained_model_name_or_path=str(tmp_path), init_device="meta")
