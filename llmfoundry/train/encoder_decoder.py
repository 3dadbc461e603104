"""Recipe checks that pair an encoder-decoder model (``hf_t5``) with encoder-decoder data, reported at validation.

An encoder-decoder model reads finetuning batches made with ``decoder_only_format: false`` (context, target and the
decoder's inputs, data/finetuning_collator.py); a decoder-only model cannot read those, and an encoder-decoder model reads nothing else. ICL
tasks score decoder-only models here (llm-foundry's ICL evaluators call a T5 with a causal LM's inputs too).
"""

from __future__ import annotations

from typing import Any

from llmfoundry.eval.sections import eval_sections


def encoder_decoder_problems(cfg: Any, prefix: str) -> list[str]:
    """The loaders (and ICL tasks) of a validated train recipe that do not fit its model's kind."""
    if getattr(cfg, "model", None) is None:  # a model section with problems of its own, already reported
        return []
    model = f"model.name '{cfg.model.name}'"
    encdec = bool(getattr(cfg.model.settings, "is_encoder_decoder", False))  # a ClassVar of the model's settings
    loaders = [("train_loader", cfg.train_loader)] if getattr(cfg, "train_loader", None) is not None else []
    problems: list[str] = []
    try:
        loaders += [(key, section) for _, key, section in eval_sections(cfg)]
    except (AttributeError, TypeError):  # eval_loaders with problems of their own, already reported
        pass
    for key, section in loaders:
        dataset = getattr(getattr(section, "settings", None), "dataset", None)
        decoder_only = getattr(dataset, "decoder_only_format", True)
        if encdec and decoder_only:
            problems.append(f"{prefix}{key}.dataset.decoder_only_format: {model} is an encoder-decoder model and "
                            "trains on encoder-decoder batches (use name: finetuning with decoder_only_format: false)")
        elif not encdec and not decoder_only:
            problems.append(f"{prefix}{key}.dataset.decoder_only_format: false makes encoder-decoder batches, which "
                            f"{model} cannot read (set it to true, or use model.name: hf_t5)")
    if encdec and cfg.icl_tasks:
        problems.append(f"{prefix}icl_tasks: ICL evaluation scores decoder-only models here and {model} is an "
                        "encoder-decoder model (remove icl_tasks; evaluate it with eval loaders)")
    return problems
