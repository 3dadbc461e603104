"""llm-foundry's packing rule for the finetuning loader, on example lengths and ids only (no tensors).

Each batch's examples are packed largest first into ``rows`` bins of ``max_seq_len`` tokens (first fit, where a bin
that receives an example moves to the end of the bin list), together with the bins left over from earlier batches;
the ``rows`` fullest bins form the batch (fullest first) and the rest are kept for the next batch (at most
``max_leftover_bins_to_keep``, fullest first; none kept: all kept). This is llm-foundry 0.22's BinPackCollator.

A bin here is a list of example ids (dataset indices), so the leftover bins are small, plain state that a
checkpoint can hold: a resumed run rebuilds the same bins from the dataset.

``auto_packing_ratio`` profiles the rule as llm-foundry's ``packing_ratio: auto`` does: candidate ratios from 1 to
``max_seq_len / 100`` (20 of them, rounded to 0.1), each fed the first examples of the epoch; the largest ratio
that packs every example (no waste) wins; ``max_seq_len <= 100`` always chooses 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Bin = tuple[int, list[int]]  # (tokens in the bin, example ids in packing order)


@dataclass
class BinPacker:
    """The packing rule with its carried-over bins (one packer per rank and, with worker processes, per worker)."""

    rows: int
    max_seq_len: int
    max_leftover_bins_to_keep: int | None = None
    leftovers: list[Bin] = field(default_factory=list)
    packed_tokens: int = 0  # tokens in the rows handed out (for auto_packing_ratio's waste)
    offered_tokens: int = 0  # tokens of every example offered

    def pack(self, sizes: list[int], ids: list[int]) -> list[list[int]]:
        """Pack one batch's examples (``sizes[i]`` tokens, id ``ids[i]``); returns up to ``rows`` bins of ids."""
        bins: list[Bin] = list(self.leftovers)
        ranked = sorted(zip(sizes, ids), key=lambda pair: pair[0], reverse=True)  # stable: ties keep batch order
        for position, (size, example) in enumerate(ranked):
            # once only as many examples remain as empty rows, each opens its own bin (no row stays empty)
            if len(ranked) - position <= self.rows - len(bins):
                bins.append((size, [example]))
                continue
            for b, (used, members) in enumerate(bins):
                if used + size <= self.max_seq_len:
                    del bins[b]
                    bins.append((used + size, members + [example]))
                    break
            else:
                bins.append((size, [example]))
        bins.sort(key=lambda bin_: bin_[0], reverse=True)
        batch, rest = bins[: self.rows], bins[self.rows :]
        self.packed_tokens += sum(used for used, _ in batch)
        self.offered_tokens += sum(sizes)
        self.leftovers = rest[: self.max_leftover_bins_to_keep]
        return [members for _, members in batch]

    @property
    def waste(self) -> float:
        """The share of offered tokens that were not in a row handed out (left over or dropped)."""
        return 1 - self.packed_tokens / self.offered_tokens if self.offered_tokens else 0.0


def examples_per_batch(rows: int, packing_ratio: float) -> int:
    """Examples a packed batch of ``rows`` rows draws from the data (llm-foundry rounds down)."""
    return int(rows * packing_ratio)


def candidate_ratios(max_seq_len: int, rows: int) -> list[float]:
    """llm-foundry's profiled ratios: 20 from 1 to max_seq_len / 100, rounded to 0.1, one per examples-per-batch."""
    ratios: list[float] = []
    seen: set[int] = set()
    for ratio in np.linspace(1, max_seq_len / 100, 20, endpoint=True):
        ratio = float(np.round(10 * ratio) / 10)
        if examples_per_batch(rows, ratio) not in seen:
            seen.add(examples_per_batch(rows, ratio))
            ratios.append(ratio)
    return ratios


def profiled_example_count(max_seq_len: int, rows: int) -> int:
    """How many examples of the epoch's start auto_packing_ratio profiles (100 batches of the largest ratio)."""
    return max(examples_per_batch(rows, r) for r in candidate_ratios(max_seq_len, rows)) * 100


def auto_packing_ratio(sizes: list[int], max_seq_len: int, rows: int) -> float:
    """The largest candidate ratio whose packing of ``sizes`` (the epoch's first examples, in order) wastes nothing.

    As in llm-foundry, each candidate is fed consecutive chunks of ``rows * ratio`` examples (a chunk smaller than
    ``rows`` is skipped), all leftover bins kept; the search stops at the first ratio with waste.
    """
    if max_seq_len <= 100:
        return 1.0
    chosen = 1.0
    for ratio in candidate_ratios(max_seq_len, rows):
        per_batch = examples_per_batch(rows, ratio)
        packer = BinPacker(rows, max_seq_len)
        for start in range(0, len(sizes), per_batch):
            chunk = sizes[start : start + per_batch]
            if len(chunk) >= rows:
                packer.pack(chunk, list(range(start, start + len(chunk))))
        if packer.offered_tokens == 0 or packer.waste > 0:
            break
        chosen = ratio
    return chosen
