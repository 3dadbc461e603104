"""loss_perp_v_len (llm-foundry's LossPerpVsContextLengthLogger): training loss and perplexity by position in the
sequence.

On every ``compute_batch_interval``-th batch, each microbatch's per-token losses (next-token cross-entropy; a label
of ``ignore_index`` counts 0) are summed by position, and, for packed batches with a ``sequence_id``, by position
within each packed sequence. Right after such a batch the running means over all the batches seen so far, summed
over ranks, become one row (one value per position, then the batch index) of six tables; every
``log_batch_interval`` batches those rows are logged as ``metrics/train/LossPerpVLenTable/<name>`` for
``mean_loss_v_len``, ``mean_perplexity_v_len``, ``sum_length`` and their ``_seq_id`` versions. As in llm-foundry,
perplexity is averaged per token (exp of each token's loss; ignored positions count exp(0) = 1 in the sum).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmfoundry.core import dist
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import LossPerpVLenSettings
from llmfoundry.train.callbacks.tables import log_table
from llmfoundry.train.state import TrainState

KEY = "callbacks.loss_perp_v_len"
SUMS = ("loss", "perplexity", "length", "loss_seq_id", "perplexity_seq_id", "length_seq_id")


class LossPerpVLen(Callback):
    def __init__(self, settings: LossPerpVLenSettings):
        self.s = settings
        self.sums: dict[str, torch.Tensor] = {}  # by position, over every measured microbatch (never reset)
        self.rows: dict[str, list[list[float]]] = {}  # metric -> rows waiting to be logged (rank 0)
        self.logged: dict[str, list[list[float]]] = {}  # the last tables logged (rank 0)

    def on_after_backward(self, state: TrainState, microbatch, logits):
        if state.time.batch % self.s.compute_batch_interval != 0:
            return
        with torch.no_grad():
            self._update(microbatch["labels"], logits.detach(), microbatch.get("sequence_id"))

    def _update(self, labels: torch.Tensor, logits: torch.Tensor, sequence_id: torch.Tensor | None) -> None:
        targets = torch.full_like(labels, self.s.ignore_index)
        targets[:, :-1] = labels[:, 1:]  # position i predicts token i + 1
        batch, seq = targets.shape
        loss = F.cross_entropy(logits.float().reshape(batch * seq, -1), targets.reshape(-1),
                               ignore_index=self.s.ignore_index, reduction="none").reshape(batch, seq)
        perplexity = loss.exp()
        valid = (targets != self.s.ignore_index).long()
        if not self.sums:
            self.sums = {name: torch.zeros(seq, device=loss.device, dtype=torch.long if "length" in name
                                           else loss.dtype) for name in SUMS}
        self.sums["loss"] += loss.sum(0)
        self.sums["perplexity"] += perplexity.sum(0)
        self.sums["length"] += valid.sum(0)
        if sequence_id is None:
            return
        # each packed sequence's tokens, moved to start at position 0 of its own row
        in_sequence = sequence_id != -1
        ids = torch.where(in_sequence, sequence_id, 0)
        members = torch.where(in_sequence[..., None], F.one_hot(ids), 0).transpose(1, 2)  # batch, sequences, seq
        lengths = members.sum(-1)
        count = lengths.shape[1]
        positions = torch.arange(seq, device=ids.device)[None, None, :].expand(batch, count, -1)
        inside = positions < lengths[:, :, None]
        starts = F.pad(lengths.cumsum(1)[:, :-1], (1, 0))
        source = torch.where(inside, positions + starts[:, :, None], 0)

        def by_sequence(values: torch.Tensor) -> torch.Tensor:
            spread = values[:, None, :].expand(-1, count, -1)
            return torch.where(inside, torch.gather(spread, 2, source), torch.zeros_like(spread)).sum((0, 1))

        self.sums["loss_seq_id"] += by_sequence(loss)
        self.sums["perplexity_seq_id"] += by_sequence(perplexity)
        self.sums["length_seq_id"] += by_sequence(valid)

    def on_batch_end(self, state: TrainState, metrics):
        measured = state.time.batch - 1  # the batch just trained, counted from 0
        if measured % self.s.compute_batch_interval == 0 and self.sums:
            for name, values in self._means().items():
                self.rows.setdefault(name, []).append(values.tolist() + [measured])
        if measured % self.s.log_batch_interval == 0:
            for name, rows in self.rows.items() if state.dist.is_main else ():
                columns = [f"context_length_{i}" for i in range(len(rows[0]) - 1)] + ["batch_index"]
                log_table(state, f"metrics/train/LossPerpVLenTable/{name}", columns, rows, KEY)
            self.logged, self.rows = self.rows, {}

    def _means(self) -> dict[str, torch.Tensor]:
        total = {name: dist.all_reduce_sum(value.clone()) for name, value in self.sums.items()}
        out = {}
        for suffix in ("", "_seq_id"):
            length = total[f"length{suffix}"]
            seen = length != 0
            divisor = torch.where(seen, length, 1)
            out[f"mean_loss{suffix}_v_len"] = torch.where(seen, total[f"loss{suffix}"], -1) / divisor
            out[f"mean_perplexity{suffix}_v_len"] = torch.where(seen, total[f"perplexity{suffix}"], -1) / divisor
            out[f"sum_length{suffix}"] = length
        return out


def build_loss_perp_v_len(settings: LossPerpVLenSettings) -> Callback:
    return LossPerpVLen(settings)
