"""Tensor parallelism (tp_config): what the plans refuse, and how the ranks of a TP group share their data.

Training under TP (loss curves against one rank, the split each rank holds, resharded resumes) runs through
``llmfoundry train`` in test_tp_training.py.
"""

from __future__ import annotations

import re

import pytest

SEQ, VOCAB = 8, 64


def model_config(strategy: str) -> dict:
    # block: separate q/k/v projections, grouped-query attention with 2 kv heads (each rank keeps 2 q + 1 kv head)
    attn = {"fused_qkv": strategy != "block", "attn_type": "grouped_query_attention", "kv_n_heads": 2,
            "attn_impl": "torch"}
    return dict(d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=SEQ, vocab_size=VOCAB,
                attn_config=attn, ffn_config={"ffn_type": "mptglu"}, norm_type="low_precision_layernorm")


def mpt(strategy: str = "block", **changes):
    from llmfoundry.models.mpt.model import MPTConfig, MPTForCausalLM

    return MPTForCausalLM(MPTConfig(**{**model_config(strategy), **changes}))


@pytest.mark.parametrize("degree, world, model, message", [
    (3, 4, lambda: mpt(), "tensor_parallel_degree: 3 does not divide the world size 4"),
    (4, 4, lambda: mpt(attn_config={"fused_qkv": False, "attn_type": "grouped_query_attention", "kv_n_heads": 2}),
     "does not divide the model's kv heads (2)"),
    (2, 2, lambda: mpt("ffn"), "fused_qkv: false"),
    (2, 2, lambda: mpt(attn_config={"fused_qkv": False, "alibi": True}), "ALiBi"),
    (2, 4, lambda: mpt(), "2 data-parallel groups need fsdp_config"),
])
def test_what_tp_cannot_split_is_a_one_line_config_error(degree, world, model, message):
    from llmfoundry.core.errors import ConfigError
    from llmfoundry.train.settings import TPConfig
    from llmfoundry.train.layouts import check_tensor_parallel

    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        check_tensor_parallel(model(), TPConfig(strategy="block", tensor_parallel_degree=degree), None, world)
    assert "\n" not in str(error.value)


def test_tp_config_of_a_model_other_than_mpt_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    from llmfoundry.core.errors import ConfigError
    from llmfoundry.train.settings import TPConfig
    from llmfoundry.train.layouts import check_tensor_parallel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16))
    with pytest.raises(ConfigError, match="GPT2LMHeadModel declares no tensor-parallel plan"):
        check_tensor_parallel(gpt2, TPConfig(tensor_parallel_degree=2), None, 2)


def test_a_layer_plan_is_refused_and_the_ranks_of_a_tp_group_share_their_data(monkeypatch):
    from llmfoundry.core import dist
    from llmfoundry.train.settings import TPConfig

    assert TPConfig(layer_plan={"ffn": "colwise"}).check_settings("tp_config") == [
        "tp_config.layer_plan: explicit plans are not supported; use tp_config.strategy: ffn | block"]
    positions = []
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "4")
        positions.append(dist.data_share(replication=2))
    assert dist.data_share() == dist.DataShare(rank=3, size=4, replication=1)  # nothing kept between calls
    assert [(p.rank, p.size, p.replication) for p in positions] == [(0, 2, 2), (0, 2, 2), (1, 2, 2), (1, 2, 2)]


@pytest.mark.parametrize("learned_pos_emb", [False, True], ids=["rope", "learned_positions"])
def test_block_tp_pads_any_length_to_the_degree_without_changing_outputs(learned_pos_emb):
    """strategy block splits each block's positions evenly over the TP ranks: the model's input is padded to a
    multiple of the degree and its output cut back. Here on one process (degree 4, no split): lengths 7 and 1 give
    the unpadded logits, with a padding mask, packed documents, and a KV cache that holds only real positions."""
    import torch

    from llmfoundry.models.interface import hooks_of

    rope = {"rope": True, "alibi": False} if not learned_pos_emb else {}
    longest = 16
    changes = dict(learned_pos_emb=learned_pos_emb, max_seq_len=longest,
                   attn_config={**model_config("block")["attn_config"], **rope, "attn_uses_sequence_id": True})
    torch.manual_seed(0)
    plain = mpt(**changes).eval()
    padded = mpt(**changes).eval()
    padded.load_state_dict(plain.state_dict())
    hooks_of(padded).tensor_parallel.prepare_model(padded, degree=4, strategy="block")
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    sequence_id = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]])
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}, {"sequence_id": sequence_id}):
            want, got = plain(ids, **kwargs).logits, padded(ids, **kwargs).logits
            assert got.shape == want.shape == (2, 7, VOCAB)
            real = mask.bool() if "attention_mask" in kwargs else torch.ones(2, 7, dtype=torch.bool)
            assert torch.allclose(got[real], want[real], atol=1e-5), kwargs  # (a masked query's output is moot)
        # generation: 7 prompt tokens then one at a time, up to max_seq_len (a learned table's last row)
        want_gen = plain.generate(ids, attention_mask=mask, max_new_tokens=longest - 7, do_sample=False)
        got_gen = padded.generate(ids, attention_mask=mask, max_new_tokens=longest - 7, do_sample=False)
        assert got_gen.shape == (2, longest) and torch.equal(got_gen, want_gen)
        out = padded(ids, attention_mask=mask, use_cache=True)
        assert out.past_key_values.get_seq_length() == 7  # the cache holds the real positions only
