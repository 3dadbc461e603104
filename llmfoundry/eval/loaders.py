"""Language-modelling metrics over an eval loader (``eval_loader`` / ``eval_loaders``), for training runs and eval
recipes alike: ``metrics/eval/LanguageCrossEntropy``, ``.../LanguagePerplexity``, ``.../TokenAccuracy`` (and any
additional metric of llmfoundry.models.metrics), or ``metrics/eval/<label>/...`` per labelled loader.

Under torch.distributed every rank scores its own share of the loader and the sums are reduced, so the values are
those of the whole eval set; with FSDP every rank makes the same number of forward calls because the streaming
loaders give every rank the same number of batches.
"""

from __future__ import annotations

import torch

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.precision import autocast
from llmfoundry.data.text import check_token_ids
from llmfoundry.models.interface import label_offset
from llmfoundry.models.metrics import LanguageMetrics


# what an encoder-decoder model's forward takes besides input_ids (batches of decoder_only_format: false)
DECODER_INPUTS = ("decoder_input_ids", "decoder_attention_mask")


def model_inputs(batch: dict[str, torch.Tensor], supports_sequence_id: bool) -> dict[str, torch.Tensor]:
    """What a CausalLM's forward takes from a loader batch (sequence_id only for models that can use it; the
    decoder's inputs where the batch has them: an encoder-decoder model's)."""
    inputs = {"input_ids": batch["input_ids"]}
    for key in ("attention_mask", *DECODER_INPUTS):
        if key in batch:
            inputs[key] = batch[key]
    if "sequence_id" in batch and supports_sequence_id:
        inputs["sequence_id"] = batch["sequence_id"]
    return inputs


def loader_key(prefix: str) -> str:
    """The recipe key of the loader whose metrics carry ``prefix`` (for errors)."""
    return "eval_loader" if prefix == "metrics/eval" else f"eval_loaders.{prefix.rsplit('/', 1)[-1]}"


@torch.no_grad()
def evaluate_loader(
    model: torch.nn.Module,
    loader,
    *,
    prefix: str,
    names: list[str],
    device: torch.device,
    precision: str,
    subset_num_batches: int = -1,
    vocab_size: int | None = None,
    supports_sequence_id: bool | None = None,
) -> dict[str, float]:
    """``{prefix}/{Name}`` over ``loader`` (its first ``subset_num_batches`` batches when that is >= 0).

    ``model`` is called as it is (an FSDP-sharded module gathers its weights inside the call); ``vocab_size``: a
    token id at or above it is a one-line error instead of an index error inside the embedding."""
    if supports_sequence_id is None:
        supports_sequence_id = bool(getattr(model, "supports_sequence_id", False))
    sums = LanguageMetrics(names, device, label_offset(model))
    for i, batch in enumerate(loader):
        if 0 <= subset_num_batches <= i:
            break
        if vocab_size is not None:
            check_token_ids(batch, vocab_size)
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast(precision, device):
            logits = _logits(model(**model_inputs(batch, supports_sequence_id)))
        sums.update(logits, batch["labels"])
    if sums.target_tokens() == 0:  # a loss of 0 over nothing would be logged as a perfect model
        raise ConfigError(f"{loader_key(prefix)}: the evaluation data gave no token to score (fewer samples than one "
                          "batch of device_eval_batch_size, or every row dropped by drop_last or packing); add data or "
                          "lower device_eval_batch_size")
    return sums.compute(prefix)


def _logits(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output[0]

