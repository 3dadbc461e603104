"""The settings of the `model:` sections of the transformers builders (`hf_causal_lm`: models/hf.py, `hf_t5`:
models/hf_t5.py) and the metric keys every model section has: light, so that the recipe schema checks them without
importing torch or transformers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from llmfoundry.config.fields import option
from llmfoundry.config.validate import Check

# llm-foundry's registered name -> the class name its value is logged under
LANGUAGE_METRICS = {
    "language_cross_entropy": "LanguageCrossEntropy",
    "language_perplexity": "LanguagePerplexity",
    "token_accuracy": "TokenAccuracy",
    "masked_accuracy": "MaskedAccuracy",
}
DEFAULT_METRICS = ("language_cross_entropy", "language_perplexity", "token_accuracy")
# llm-foundry's ICL metrics: accepted in additional_*_metrics; ICL tasks choose theirs with metric_names
ICL_METRICS = ("lm_accuracy", "mc_accuracy", "qa_accuracy", "lm_expected_calibration_error",
               "mc_expected_calibration_error")


def _check_metric_names(names: list[str]) -> None:
    unknown = [n for n in names if n not in LANGUAGE_METRICS and n not in ICL_METRICS]
    if unknown:
        raise ValueError(f"unknown metric {', '.join(map(repr, unknown))}; choose from "
                         f"{', '.join([*LANGUAGE_METRICS, *ICL_METRICS])}")


MetricNames = Annotated[list[str], Check(_check_metric_names)]


@dataclass(kw_only=True)  # keyword-only: mixes into settings whose first fields have no default
class MetricSettings:
    """The metric keys of a ``model:`` section (llm-foundry's ComposerMPTCausalLM / ComposerHFCausalLM)."""

    use_train_metrics: bool = option(
        True, "log metrics/train/LanguageCrossEntropy, LanguagePerplexity and TokenAccuracy on every training "
        "batch (from the training forward pass, over the whole global batch)"
    )
    additional_train_metrics: MetricNames = option(
        [], "more metrics for training batches and eval loaders, by llm-foundry's registered name (masked_accuracy; "
        "ICL metric names are accepted and apply to ICL tasks through their metric_names)"
    )
    additional_eval_metrics: MetricNames = option(
        [], "more metrics for eval loaders, by llm-foundry's registered name (masked_accuracy; ICL metric names are "
        "accepted and apply to ICL tasks through their metric_names)"
    )


@dataclass
class HFModelSettings(MetricSettings):  # MetricSettings: use_train_metrics, ...
    pretrained_model_name_or_path: str = option(doc="a local folder (or a hub id when online)")
    pretrained: bool = option(True, "load the pretrained weights (false: random weights from the config)")
    config_overrides: dict[str, Any] = option({}, "values that replace keys of the model's config.json")
    trust_remote_code: bool = option(False, "allow running modelling code shipped inside the folder")
    use_flash_attention_2: bool = option(False, "shorthand for attn_implementation: flash_attention_2")
    attn_implementation: str | None = option(None, "transformers attention backend: eager, sdpa, flash_attention_2")
    peft_config: dict[str, Any] | None = option(
        None, "LoRA adapters via peft: {peft_type: LORA, r: 8, lora_alpha: 16, target_modules: [...], ...}"
    )
    init_device: Literal["cpu", "mixed", "meta"] = option(
        "cpu", "cpu: every rank reads the whole model. mixed / meta: the model is built without storage and each "
        "rank reads only its own FSDP shards from the folder's safetensors (about one copy per node)",
        differs="mixed: rank 0 does not read the full model; every rank reads its shards. meta with pretrained: "
        "the weights are read into the shards (llm-foundry refuses the combination)",
    )
    use_auth_token: str | bool | None = option(
        None, "Hugging Face hub token (or true: the saved login) for gated or private hub models", secret=True
    )
    load_in_8bit: bool = option(False, "8-bit weights through bitsandbytes (needs a CUDA GPU and bitsandbytes)")
    pretrained_lora_id_or_path: str | None = option(
        None, "a trained LoRA adapter (peft folder) to continue training: loaded trainable on the base model"
    )
    allow_embedding_resizing: bool = option(
        False, "grow the embedding to the tokenizer's size when the tokenizer has more tokens (otherwise an error)"
    )
    attn_uses_sequence_id: bool = option(
        False, "with packed data: keep packed examples apart (positions restart per example, no attention across "
        "them); false: they attend to each other with positions running on, as llm-foundry trains such models",
        differs="not an llm-foundry key: llm-foundry always trains as with false (Composer drops sequence_id for "
        "models whose forward does not name it)",
    )
    should_save_peft_only: bool = option(
        True, "with LoRA: checkpoints hold only the adapter weights (the base comes from the pretrained folder)",
    )


@dataclass
class HFT5Settings(MetricSettings):  # MetricSettings: use_train_metrics, additional_train_metrics, ...
    # read by the recipe checks (train/encoder_decoder.py): this model takes encoder-decoder batches only
    is_encoder_decoder: ClassVar[bool] = True

    pretrained_model_name_or_path: str = option(doc="a local T5 folder (or a hub id such as t5-small when online)")
    pretrained: bool = option(True, "load the pretrained weights (false: random weights from the config)")
    config_overrides: dict[str, Any] = option({}, "values that replace keys of the model's config.json")
    trust_remote_code: bool = option(
        False, "allow running code shipped inside the folder while its config is read",
        differs="false by default (llm-foundry: true); the model class is transformers' T5ForConditionalGeneration "
        "either way, so it only matters for a folder whose config needs its own code",
    )
    use_auth_token: str | bool | None = option(
        None, "Hugging Face hub token (or true: the saved login) for gated or private hub models", secret=True
    )
    init_device: Literal["cpu", "mixed", "meta"] = option(
        "cpu", "cpu: every rank builds the whole model. meta: built without storage and initialised after "
        "sharding (needs pretrained: false, as in llm-foundry). mixed: meta without pretrained weights; with them, "
        "every rank reads the folder",
        differs="mixed with pretrained: every rank reads the pretrained folder (llm-foundry reads it on rank 0 and "
        "broadcasts it)",
    )

    def check_settings(self, path: str) -> list[str]:
        if self.init_device == "meta" and self.pretrained:
            return [f"{path}.init_device: 'meta' cannot load pretrained weights for hf_t5 (as in llm-foundry); set "
                    "pretrained: false, or init_device: cpu or mixed"]
        return []
