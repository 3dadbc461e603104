"""precision: amp_fp8 (#30): torchao's float8 training of the blocks' Linears, and its one-line errors where it
cannot run. torchao's float8 casts and matmuls also run on CPU, so the conversion and a training run are checked
here with the hardware check patched; the speed is a GPU matter (benchmarks/gpu_check.sh)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from llmfoundry import cli
from llmfoundry.core import precision
from llmfoundry.core.errors import ConfigError
from llmfoundry.train import float8, parallel
from tests.helpers import make_trainer
from tests.models.helpers import tiny_model

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _torchao(monkeypatch):
    """torchao importable for this test (tests.helpers.FLOAT8_LIBRARIES), and for this test only."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        from tests.helpers import FLOAT8_LIBRARIES, make_torchao_importable

        monkeypatch.syspath_prepend(str(FLOAT8_LIBRARIES))
        make_torchao_importable()  # says how to install it when it is missing


class Toy(nn.Module):
    """Two blocks of Linears (one with a width float8 cannot take) and an output head outside them."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 24), nn.Linear(24, 32))
                                    for _ in range(2))
        self.head = nn.Linear(32, 512, bias=False)

    def blocks(self):
        return list(self.layers)


def test_only_block_linears_with_dimensions_divisible_by_16_are_converted():
    from torchao.float8.float8_linear import Float8Linear

    model = Toy()
    names = float8.convert(model, model.blocks(), fsdp_all_gather=False)
    assert names == ["layers.0.0", "layers.1.0"]
    assert [type(m) is Float8Linear for m in model.modules() if isinstance(m, nn.Linear)] == \
        [True, False, False, True, False, False, False]  # 64->24 and 24->32 in each block, and the head, stay


def test_mpt_conversion_keeps_parameter_names_and_leaves_embeddings_and_head():
    from torchao.float8.float8_linear import Float8Linear

    model = tiny_model(n_layers=2, tie_word_embeddings=False)
    before = list(model.state_dict())
    names = float8.convert(model, model.blocks(), fsdp_all_gather=False)
    assert names and all(n.startswith("transformer.blocks.") for n in names)
    assert type(model.lm_head) is nn.Linear  # the output head stays as it was
    assert list(model.state_dict()) == before  # amp_fp8 and amp_bf16 checkpoints load into each other
    assert sum(type(m) is Float8Linear for m in model.modules()) == len(names)


def test_fsdp_float8_all_gather_wraps_the_weights_of_a_meta_model_that_materialises():
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    with torch.device("meta"):
        model = tiny_model(n_layers=2)
    float8.convert(model, model.blocks(), fsdp_all_gather=True)
    parallel.materialize(model, CPU, seed=0)
    weight = model.blocks()[0].attn.out_proj.weight
    assert isinstance(weight, WeightWithDynamicFloat8CastTensor) and not weight.is_meta
    assert weight.std() > 0


@pytest.mark.parametrize("fused_qkv", [True, False])
def test_a_meta_model_converted_to_float8_starts_from_the_values_of_an_fp32_one(fused_qkv):
    """MPT's initialiser reads attributes of its Linears (_is_residual: out_proj and down_proj scaled down;
    _fused_splits); the float8 modules must carry them, or a meta-built amp_fp8 run starts elsewhere."""
    params = []
    for name in ("fp32", "amp_fp8"):
        with torch.device("meta"):
            model = tiny_model(n_layers=2, d_model=64, n_heads=4, attn_config={"fused_qkv": fused_qkv},
                               init_config={"name": "xavier_uniform_", "init_gain": 1.0})
        parallel.parallelize(model.train(), fsdp=None, compile_cfg=None, precision=name, device=CPU, world_size=1,
                             seed=0)
        params.append(dict(model.named_parameters()))
    assert any(type(m).__name__ == "Float8Linear" for m in model.modules())
    for key, value in params[0].items():
        assert torch.equal(value, params[1][key]), key


def test_float8_training_on_cpu_follows_the_fp32_run(recipe, monkeypatch):
    """The whole trainer path of amp_fp8 (float8 hardware pretended): the blocks compute in float8, the loss
    follows the fp32 run's within float8's error (amp_bf16 would run as fp32 here, without a bf16 GPU)."""
    monkeypatch.setattr(precision, "float8_supported", lambda device: True)
    losses = {}
    for name in ("fp32", "amp_fp8"):
        trainer = make_trainer(recipe(eval_loader=None, max_duration="3ba", precision=name))
        if name == "amp_fp8":
            kinds = {type(m).__name__ for m in trainer.model.blocks()[0].modules()}
            assert "Float8Linear" in kinds
        losses[name] = trainer.fit()["loss/train/total"]
    assert math.isfinite(losses["amp_fp8"])
    # float8 changes the numbers (so it ran), by far less than 1% here (0.05% when written)
    assert 0 < abs(losses["amp_fp8"] - losses["fp32"]) < 0.01 * losses["fp32"], losses


def test_amp_fp8_needs_float8_hardware_one_line_before_anything_is_built(tmp_path, recipe):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe(max_duration="1ba")))
    result = subprocess.run(["llmfoundry", "train", str(path), "precision=amp_fp8"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert lines == ["error: precision: amp_fp8 needs a CUDA GPU with float8 matmuls (compute capability 8.9 or "
                     "newer: H100, H200, L4, L40S, ...); this run is on cpu (no CUDA GPU) (use precision: amp_bf16)"]
    assert "Traceback" not in result.stderr


def test_a_gpu_older_than_ada_is_named_with_its_capability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ConfigError, match=r"this run is on NVIDIA A100-SXM4-80GB \(compute capability 8\.0\)"):
        precision.supported_precision("amp_fp8", torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert precision.supported_precision("amp_fp8", torch.device("cuda", 0)) == ("amp_fp8", None)


def test_without_torchao_amp_fp8_is_one_line_naming_the_extra(tmp_path, recipe, monkeypatch, capsys):
    import llmfoundry.train.trainer as trainer_module

    monkeypatch.setattr(precision, "float8_supported", lambda device: True)
    monkeypatch.setitem(sys.modules, "torchao", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    monkeypatch.setattr(trainer_module, "build_model", lambda *a, **k: pytest.fail("built a model"))
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe(max_duration="1ba")))
    assert cli.main(["train", str(path), "precision=amp_fp8"]) == 2
    assert capsys.readouterr().err.strip() == ("error: precision: amp_fp8 trains through torchao, which is not "
                                               "installed (pip install 'llmfoundry[float8]')")
    with pytest.raises(ConfigError, match=r"pip install 'llmfoundry\[float8\]'"):
        float8.convert(Toy(), Toy().blocks(), fsdp_all_gather=False)


def test_amp_fp8_with_tensor_parallelism_is_refused():
    with pytest.raises(ConfigError, match="precision: amp_fp8 does not combine with tp_config"):
        float8.convert(Toy(), Toy().blocks(), fsdp_all_gather=False, tp=True)
