"""Finetuning examples -> batches, as llm-foundry's collators make them.

* decoder-only (``decoder_only_format: true``): ``input_ids``, ``attention_mask`` and ``labels`` (-100 on padding)
  of ``max_seq_len`` (or the longest row's length with ``allow_pad_trimming``); padding goes on the side the
  tokenizer pads (``tokenizer.kwargs.padding_side``), as llm-foundry's Seq2SeqFinetuningCollator and
  BinPackCollator do. Packed rows also carry ``sequence_id`` (-1 on padding).
* encoder-decoder (``decoder_only_format: false``, llm-foundry's Seq2SeqFinetuningCollator for T5): the context is
  ``input_ids``/``attention_mask`` (padded on the tokenizer's side, as llm-foundry's ``tokenizer.pad`` does); the
  target is ``labels`` (-100 on padding), ``decoder_input_ids`` (the labels one position on, after the decoder's
  start token, which for T5 is the pad token) and ``decoder_attention_mask`` (the labels that are not padding),
  always padded on the right.
"""

from __future__ import annotations

import torch

from llmfoundry.data.loader_settings import FinetuningDatasetSettings
from llmfoundry.data.text import IGNORE_INDEX

Example = dict[str, list[int]]


class FinetuningCollator:
    """Pads examples into a batch (``__call__``), or turns packed bins of examples into rows (``packed``)."""

    def __init__(self, ds: FinetuningDatasetSettings, pad_token_id: int, rows: int, padding_side: str = "right"):
        self.max_seq_len = ds.max_seq_len
        self.pad = pad_token_id
        self.rows = rows
        self.trim = ds.allow_pad_trimming
        self.decoder_only = ds.decoder_only_format
        self.left = padding_side == "left"  # the tokenizer's side; an encoder-decoder target always on the right
        self.num_dropped = 0  # examples in carried-over bins beyond max_leftover_bins_to_keep (never trained)

    def _tensor(self, rows: list[list[int]], fill: int, length: int, left: bool | None = None) -> torch.Tensor:
        """``rows`` padded with ``fill`` to ``length``, on the left when ``left`` (default: the tokenizer's side)."""
        left = self.left if left is None else left
        out = torch.full((len(rows), length), fill, dtype=torch.long)
        for i, row in enumerate(rows):
            if row:
                place = out[i, length - len(row):] if left else out[i, : len(row)]
                place.copy_(torch.tensor(row, dtype=torch.long))
        return out

    def _length(self, rows: list[list[int]]) -> int:
        return max(1, max(len(r) for r in rows)) if self.trim else self.max_seq_len

    def __call__(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        ids = [e["input_ids"] for e in examples]
        labels = [e["labels"] for e in examples]
        if not self.decoder_only:
            return self._encoder_decoder(ids, labels)
        length = self._length(ids)
        return {
            "input_ids": self._tensor(ids, self.pad, length),
            "attention_mask": self._tensor([[1] * len(r) for r in ids], 0, length),
            "labels": self._tensor(labels, IGNORE_INDEX, length),
        }

    def _encoder_decoder(self, ids: list[list[int]], labels: list[list[int]]) -> dict[str, torch.Tensor]:
        batch = {
            "input_ids": self._tensor(ids, self.pad, self._length(ids)),
            "attention_mask": self._tensor([[1] * len(r) for r in ids], 0, self._length(ids)),
            "labels": self._tensor(labels, IGNORE_INDEX, self._length(labels), left=False),
        }
        targets = batch["labels"]
        decoder_ids = torch.cat([torch.full_like(targets[:, :1], self.pad), targets[:, :-1]], dim=1)
        batch["decoder_input_ids"] = decoder_ids.masked_fill(decoder_ids == IGNORE_INDEX, self.pad)
        batch["decoder_attention_mask"] = (targets != IGNORE_INDEX).long()
        return batch

    def packed(self, bins: list[list[Example]]) -> dict[str, torch.Tensor]:
        """One row per bin, always ``max_seq_len`` long (as llm-foundry's, whatever allow_pad_trimming says);
        ``sequence_id`` numbers a row's examples (-1 on padding) and each example after the first loses its first
        label, so no example's last token learns to predict the next example's first one."""
        ids, labels, seq = [], [], []
        for members in bins:
            ids.append([t for e in members for t in e["input_ids"]])
            labels.append([IGNORE_INDEX if n and k == 0 else t
                           for n, e in enumerate(members) for k, t in enumerate(e["labels"])])
            seq.append([n for n, e in enumerate(members) for _ in e["input_ids"]])
        return {
            "input_ids": self._tensor(ids, self.pad, self.max_seq_len),
            "labels": self._tensor(labels, IGNORE_INDEX, self.max_seq_len),
            "attention_mask": self._tensor([[1] * len(r) for r in ids], 0, self.max_seq_len),
            "sequence_id": self._tensor(seq, -1, self.max_seq_len),
        }
