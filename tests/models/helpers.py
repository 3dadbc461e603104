"""Tiny model configs shared by the model tests."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from llmfoundry.models.mpt.config import MPTConfig
from llmfoundry.models.mpt.model import MPTForCausalLM

TINY = dict(d_model=32, n_heads=4, n_layers=2, max_seq_len=64, vocab_size=512, no_bias=True)


def tiny_config(**overrides) -> MPTConfig:
    values = copy.deepcopy(TINY)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key].update(value)
        else:
            values[key] = value
    return MPTConfig(**values)


def tiny_model(seed: int = 0, **overrides) -> MPTForCausalLM:
    torch.manual_seed(seed)
    model = MPTForCausalLM(tiny_config(**overrides)).eval()
    return model


def masked_batch(second_document_ids: list[int] | None, padding: bool):
    """(input_ids, model kwargs) of 2 x 24 tokens for the attention tests: ``second_document_ids`` gives packed
    documents (row 0: three of them; row 1: these ids), ``padding`` an attention mask padding row 0 on the left and
    row 1 on the right."""
    torch.manual_seed(3)
    x = torch.randint(2, 512, (2, 24))
    kwargs = {}
    if second_document_ids is not None:
        kwargs["sequence_id"] = torch.tensor([[0] * 10 + [1] * 8 + [2] * 6, second_document_ids])
    if padding:
        mask = torch.ones_like(x)
        mask[0, :7] = 0  # left padding
        mask[1, -5:] = 0  # right padding
        kwargs["attention_mask"] = mask
    return x, kwargs


def randomize_norms(model: torch.nn.Module, seed: int = 1) -> None:
    """Norm weights start at 1 / 0; perturb them so that parity tests would notice a swapped or missing norm."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "_ln" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def write_pretrained_folders(root: Path) -> Path:
    """In ``root``: a Llama (untied), a GPT-2 (tied embeddings) and our MPT, each saved with save_pretrained
    (safetensors), and a LoRA adapter on the Llama whose lora_B is drawn (not zero), so that it changes outputs."""
    import peft
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    llama.save_pretrained(root / "llama")
    GPT2LMHeadModel(GPT2Config(vocab_size=512, n_embd=32, n_layer=2, n_head=4, n_positions=64)).save_pretrained(
        root / "gpt2")
    mpt = tiny_model()
    randomize_norms(mpt)
    mpt.save_pretrained(root / "mpt")
    lora = peft.get_peft_model(llama, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                      task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_()
    lora.save_pretrained(root / "lora")
    return root


def padded_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 24 random token ids (2..511) and their attention mask; the second row is left-padded by 5."""
    torch.manual_seed(5)
    x = torch.randint(2, 512, (2, 24))
    mask = torch.ones_like(x)
    x[1, :5], mask[1, :5] = 1, 0
    return x, mask
