"""`hf_causal_lm`: transformers models (and LoRA) behind the trainer's interface."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from llmfoundry.core.errors import ConfigError
from llmfoundry.models.hf_export import export_hf
from llmfoundry.models.settings import HFModelSettings
from llmfoundry.registry import models
from llmfoundry.train import parallel
from tests.models.helpers import randomize_norms, tiny_model

LLAMA_LIKE = dict(
    learned_pos_emb=False,
    norm_type="rmsnorm",
    attn_config={"rope": True, "attn_type": "grouped_query_attention", "kv_n_heads": 2},
    ffn_config={"ffn_type": "mptglu"},
)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tokenizer):
    out = tmp_path_factory.mktemp("llama")
    model = tiny_model(**LLAMA_LIKE)
    randomize_norms(model)
    export_hf(model, tokenizer, out)
    return out


def build(tokenizer, **values):
    return models.get("hf_causal_lm").builder(HFModelSettings(**values), tokenizer).eval()


def test_hf_causal_lm_wraps_a_local_folder(llama_dir, tokenizer):
    model = build(tokenizer, pretrained_model_name_or_path=str(llama_dir))
    reference = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    x = torch.randint(2, 512, (2, 16))
    torch.testing.assert_close(model(x).logits, reference(x).logits)
    assert len(model.blocks()) == 2 and model.supports_sequence_id
    n = sum(p.numel() for p in reference.parameters())
    assert model.flops_per_token(16) == pytest.approx(6 * n + 12 * 2 * 32 * 16)
    out = model(x, labels=x)
    assert out.loss is not None and torch.isfinite(out.loss)


def test_attn_implementations_agree(llama_dir, tokenizer):
    x = torch.randint(2, 512, (1, 16))
    eager = build(tokenizer, pretrained_model_name_or_path=str(llama_dir), attn_implementation="eager")
    sdpa = build(tokenizer, pretrained_model_name_or_path=str(llama_dir), attn_implementation="sdpa")
    torch.testing.assert_close(eager(x).logits, sdpa(x).logits, atol=1e-5, rtol=1e-4)


def test_config_overrides_apply_and_unknown_keys_are_errors(llama_dir, tokenizer):
    model = build(tokenizer, pretrained_model_name_or_path=str(llama_dir), config_overrides={"num_hidden_layers": 1})
    assert len(model.blocks()) == 1
    with pytest.raises(ConfigError, match="config_overrides.num_hiden_layers.*num_hidden_layers"):
        build(tokenizer, pretrained_model_name_or_path=str(llama_dir), config_overrides={"num_hiden_layers": 1})
    with pytest.raises(ConfigError, match="pretrained_model_name_or_path"):
        build(tokenizer, pretrained_model_name_or_path=str(llama_dir / "nope"))


def test_sequence_id_keeps_documents_apart_with_attn_uses_sequence_id(llama_dir, tokenizer):
    model = build(tokenizer, pretrained_model_name_or_path=str(llama_dir), attn_implementation="sdpa",
                  attn_uses_sequence_id=True)
    torch.manual_seed(0)
    a, b = torch.randint(2, 512, (1, 7)), torch.randint(2, 512, (1, 9))
    packed = torch.cat([a, b], dim=1)
    seq_id = torch.tensor([[0] * 7 + [1] * 9])
    logits = model(packed, sequence_id=seq_id).logits
    torch.testing.assert_close(logits[:, 7:], model(b).logits, atol=1e-5, rtol=1e-4)


def test_packed_documents_attend_to_each_other_by_default_as_in_llm_foundry(llama_dir, tokenizer):
    model = build(tokenizer, pretrained_model_name_or_path=str(llama_dir), attn_implementation="sdpa")
    torch.manual_seed(0)
    packed = torch.randint(2, 512, (1, 16))
    seq_id = torch.tensor([[0] * 7 + [1] * 9])
    logits = model(packed, sequence_id=seq_id).logits
    torch.testing.assert_close(logits, model(packed).logits)  # sequence_id dropped, as Composer drops it
    assert not torch.allclose(logits[:, 7:], model(packed[:, 7:]).logits, atol=1e-3)


def test_attn_uses_sequence_id_on_an_mpt_folder_points_at_its_config(tmp_path, tokenizer):
    tiny_model(attn_config={"alibi": True}).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"model\.attn_uses_sequence_id: an MPT folder .*attn_uses_sequence_id: true"):
        build(tokenizer, pretrained_model_name_or_path=str(tmp_path), attn_uses_sequence_id=True)


def test_our_mpt_folder_works_through_hf_causal_lm(tmp_path, tokenizer):
    ours = tiny_model(attn_config={"alibi": True, "attn_uses_sequence_id": True})
    ours.save_pretrained(tmp_path)
    model = build(tokenizer, pretrained_model_name_or_path=str(tmp_path))
    x = torch.randint(2, 512, (1, 12))
    seq_id = torch.tensor([[0] * 5 + [1] * 7])
    torch.testing.assert_close(model(x, sequence_id=seq_id).logits, ours(x, sequence_id=seq_id).logits)


def test_attn_implementation_reaches_our_mpt_kernel_choice(tmp_path, tokenizer):
    ours = tiny_model(attn_config={"alibi": True})
    ours.save_pretrained(tmp_path)
    eager = build(tokenizer, pretrained_model_name_or_path=str(tmp_path), attn_implementation="eager")
    assert eager.config.attn_config["attn_impl"] == "torch"
    x = torch.randint(2, 512, (1, 12))
    torch.testing.assert_close(eager(x).logits, ours(x).logits, atol=1e-5, rtol=1e-4)
    with pytest.raises(ConfigError, match="model.attn_implementation: 'flex_attention' is not available"):
        build(tokenizer, pretrained_model_name_or_path=str(tmp_path), attn_implementation="flex_attention")


def test_config_overrides_of_our_mpt_are_validated(tmp_path, tokenizer):
    tiny_model().save_pretrained(tmp_path)
    shallower = build(tokenizer, pretrained_model_name_or_path=str(tmp_path), config_overrides={"n_layers": 1})
    assert len(shallower.blocks()) == 1
    with pytest.raises(ConfigError, match=r"model\.d_model: 32 is not divisible by model\.n_heads=5"):
        build(tokenizer, pretrained_model_name_or_path=str(tmp_path), config_overrides={"n_heads": 5})


def test_attention_backends_that_cannot_run_are_one_line_errors(llama_dir, tokenizer):
    with pytest.raises(ConfigError, match="model.attn_implementation: 'bogus' cannot be used with this model"):
        build(tokenizer, pretrained_model_name_or_path=str(llama_dir), attn_implementation="bogus")
    try:
        import flash_attn  # noqa: F401
    except ImportError:  # the CPU machines: flash-attn is a GPU extra
        with pytest.raises(ConfigError, match="model.use_flash_attention_2: 'flash_attention_2' cannot be used"):
            build(tokenizer, pretrained_model_name_or_path=str(llama_dir), use_flash_attention_2=True)


def test_pretrained_false_builds_fresh_weights_of_the_folders_shape(llama_dir, tokenizer):
    pretrained = build(tokenizer, pretrained_model_name_or_path=str(llama_dir))
    fresh = build(tokenizer, pretrained_model_name_or_path=str(llama_dir), pretrained=False)
    shapes = {k: v.shape for k, v in pretrained.state_dict().items()}
    assert {k: v.shape for k, v in fresh.state_dict().items()} == shapes
    key = next(k for k in shapes if k.endswith("q_proj.weight"))
    assert not torch.equal(fresh.state_dict()[key], pretrained.state_dict()[key])


def test_lora_trains_only_adapters_and_merges_on_export(llama_dir, tokenizer, tmp_path):
    peft_config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    model = build(tokenizer, pretrained_model_name_or_path=str(llama_dir), peft_config=peft_config).train()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    x = torch.randint(2, 512, (2, 16))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    model(x, labels=x).loss.backward()
    optimizer.step()
    model.eval()
    expected = model(x).logits
    export_hf(model, tokenizer, tmp_path)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(merged(x).logits, expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(ConfigError, match="peft_type"):
        build(tokenizer, pretrained_model_name_or_path=str(llama_dir), peft_config={"peft_type": "IA3"})


def test_llm_foundry_loading_keys_load_the_same_weights_and_say_what_differs(llama_dir, tokenizer, caplog):
    reference = build(tokenizer, pretrained_model_name_or_path=str(llama_dir))
    x = torch.randint(2, 512, (1, 8))
    with caplog.at_level("WARNING", logger="llmfoundry"):
        mixed = build(tokenizer, pretrained_model_name_or_path=str(llama_dir), init_device="mixed",
                      use_auth_token="hf_secret_value")  # a local folder: the token is never needed
    assert parallel.is_meta(mixed)  # the weights are read after sharding (tests/models/test_pretrained_loading.py)
    parallel.materialize(mixed, "cpu", seed=0)
    torch.testing.assert_close(mixed.eval()(x).logits, reference(x).logits)
    assert "hf_secret_value" not in caplog.text
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"^model.load_in_8bit: needs a CUDA GPU"):
            build(tokenizer, pretrained_model_name_or_path=str(llama_dir), load_in_8bit=True)


@pytest.mark.parametrize("adapters_only", [True, False])
def test_should_save_peft_only_checkpoints_hold_the_adapters_alone(llama_dir, tokenizer, tmp_path, adapters_only):
    from llmfoundry.train.checkpoint import load_checkpoint, save_checkpoint
    from llmfoundry.train.components import weights_of
    from llmfoundry.train.dcp_reading import read_metadata_file

    peft_config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    settings = dict(pretrained_model_name_or_path=str(llama_dir), peft_config=peft_config,
                    should_save_peft_only=adapters_only)
    model = build(tokenizer, **settings).train()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(0.5)  # adapters that change the output
    save_checkpoint(tmp_path, "ep0-ba1", weights_of(model), config={}, tokenizer=None, overwrite=True)
    metadata = read_metadata_file(tmp_path / "ep0-ba1" / ".metadata")
    saved = [k for k in metadata.state_dict_metadata if k.startswith("model.")]
    assert all("lora_" in k for k in saved) == adapters_only and saved
    fresh = build(tokenizer, **settings).eval()
    load_checkpoint(tmp_path / "ep0-ba1", weights_of(fresh), weights_only=True)
    x = torch.randint(2, 512, (2, 16))
    torch.testing.assert_close(fresh(x).logits, model.eval()(x).logits)
