"""Running the model: batched continuation log-likelihoods and greedy generation.

Speed comes from four things:

* sequences are sorted by length and batched so that padding stays small;
* all choices of a question go in the same batch;
* the longest token prefix that a question's sequences share (the few-shot preamble and the question) is run
  once. Transformers-native models get one *packed* row per question (prefix, then each choice's tokens, with a
  4D mask so that a choice sees only the prefix and itself, and positions restarting after the prefix); other
  models whose forward takes a KV cache (``cache`` or ``past_key_values``) and ``position_ids`` get the prefix's
  key/value cache copied to every choice; the rest run each sequence whole;
* the output projection runs only on the last positions that hold scored predictions (``logits_to_keep``).

Under torch.distributed every rank must make the same number of forward calls (FSDP gathers weights inside each
call), so ``sync_calls`` pads a rank that has fewer batches with tiny dummy forwards.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import StoppingCriteriaList

from llmfoundry.core.errors import ConfigError
from llmfoundry.eval.icl.metrics import SequenceScore
from llmfoundry.eval.icl.tasks import Sequence


def _forward_params(model: torch.nn.Module) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def cache_argument(model: torch.nn.Module) -> str | None:
    """The name under which ``model.forward`` takes a KV cache: ``cache`` (transformers >= 5.24),
    ``past_key_values`` (before, and our MPT), or None."""
    params = _forward_params(model)
    return next((name for name in ("cache", "past_key_values") if name in params), None)


def supports_kv_cache(model: torch.nn.Module) -> bool:
    return cache_argument(model) is not None and "position_ids" in _forward_params(model)


def supports_packed(model: torch.nn.Module) -> bool:
    """Whether the model takes a custom 4D boolean attention mask (transformers models on sdpa/eager attention)."""
    declared = getattr(model, "supports_4d_attention_mask", None)
    if declared is not None:
        return bool(declared)
    # transformers' own model classes build their masks in transformers.masking_utils, which passes 4D masks on
    if not type(model).__module__.startswith("transformers."):
        return False
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return impl in ("sdpa", "eager") and {"position_ids", "attention_mask"} <= _forward_params(model)


def shared_prefix_len(group: list[Sequence]) -> int:
    """Tokens that every sequence of the group shares at its start, never reaching into a continuation."""
    limit = min(s.cont_start for s in group)
    first = group[0].tokens
    n = 0
    while n < limit and all(s.tokens[n] == first[n] for s in group[1:]):
        n += 1
    return n


def kv_cache_saving(groups: list[list[Sequence]]) -> float:
    """The fraction of token positions that the shared-prefix path saves on these groups (0 when it cannot run)."""
    total = saved = 0
    for group in groups:
        p = shared_prefix_len(group)
        if p < 1:
            return 0.0
        total += sum(len(s.tokens) for s in group)
        saved += p * (len(group) - 1)
    return saved / total if total else 0.0


def packed_width(group: list[Sequence]) -> int:
    """Token positions a group takes in a packed row: the shared prefix once plus every sequence's remaining
    tokens except its last (whose prediction no continuation token needs)."""
    p = shared_prefix_len(group)
    return p + sum(len(s.tokens) - 1 - p for s in group)


def pack_rows(widths: list[int]) -> list[list[int]]:
    """Groups (given by their packed widths) placed into rows no wider than the widest one, first fit in
    decreasing width, so that short questions fill the padding that the longest question would leave."""
    order = sorted(range(len(widths)), key=lambda g: -widths[g])
    limit = widths[order[0]] if order else 0
    rows: list[list[int]] = []
    free: list[int] = []
    for g in order:
        for r, room in enumerate(free):
            if widths[g] <= room:
                rows[r].append(g)
                free[r] -= widths[g]
                break
        else:
            rows.append([g])
            free.append(limit - widths[g])
    return rows


def plan_batches(
    groups: list[list[Sequence]],
    batch_size: int,
    max_batch_tokens: int,
    width: Callable[[list[Sequence]], int] | None = None,
    rows: Callable[[list[Sequence]], int] = len,
) -> list[list[int]]:
    """Groups ordered widest first and packed into batches of at most ``batch_size`` sequences and
    ``max_batch_tokens`` padded tokens (a group larger than that gets a batch of its own). ``width``: the padded
    length a group needs (default: its longest sequence); ``rows``: the forward-pass rows it takes."""
    width = width or (lambda group: max(len(s.tokens) for s in group))
    widths = [width(g) for g in groups]
    order = sorted(range(len(groups)), key=lambda g: -widths[g])
    batches: list[list[int]] = []
    current: list[int] = []
    n_seqs = n_rows = w = 0
    for g in order:
        new_seqs, new_rows, new_w = n_seqs + len(groups[g]), n_rows + rows(groups[g]), max(w, widths[g])
        if current and (new_seqs > batch_size or new_rows * new_w > max_batch_tokens):
            batches.append(current)
            current, new_seqs, new_rows, new_w = [], len(groups[g]), rows(groups[g]), widths[g]
        current.append(g)
        n_seqs, n_rows, w = new_seqs, new_rows, new_w
    if current:
        batches.append(current)
    return batches


def _score_rows(pred_logits: torch.Tensor, targets: torch.Tensor) -> SequenceScore:
    logprobs = F.log_softmax(pred_logits.float(), dim=-1)
    token_lp = logprobs.gather(1, targets[:, None])[:, 0]
    greedy = bool((pred_logits.argmax(-1) == targets).all().item())
    # the three numbers in one transfer from the device
    lp, mean_prob, min_top = torch.stack([token_lp.sum(), token_lp.exp().mean(),
                                          logprobs.max(-1).values.min().exp()]).tolist()
    return SequenceScore(logprob=lp, num_tokens=int(targets.numel()), greedy=greedy, mean_prob=mean_prob,
                         min_top_prob=min_top)


def _pad_right(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids.to(device), mask.to(device)


def _logits(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output[0]


def score_full(model, seqs: list[Sequence], device, pad_id: int = 0, trim_logits: bool = False) -> list[SequenceScore]:
    """Each sequence run whole (right padding: real tokens never see the padding under the causal mask).

    With ``trim_logits`` (models whose forward takes ``logits_to_keep``) only the last positions that hold some
    sequence's continuation predictions get the output projection."""
    ids, mask = _pad_right([s.tokens for s in seqs], pad_id, device)
    width = ids.shape[1]
    kwargs = {}
    offset = 0
    if trim_logits:
        keep = width - min(s.cont_start for s in seqs) + 1
        kwargs["logits_to_keep"] = keep
        offset = width - keep
    # right padding needs no mask: under the causal mask no real token attends to a later pad token
    logits = _logits(model(input_ids=ids, **kwargs))
    scores = []
    for r, s in enumerate(seqs):
        targets = ids[r, s.cont_start : len(s.tokens)]
        scores.append(_score_rows(logits[r, s.cont_start - 1 - offset : len(s.tokens) - 1 - offset], targets))
    return scores


def _select_cache(cache, index: torch.Tensor):
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(index)
        return cache
    return tuple(tuple(t.index_select(0, index) for t in layer) for layer in cache)


def score_shared_prefix(
    model, groups: list[list[Sequence]], device, pad_id: int = 0, keep_last_only: bool = True
) -> list[list[SequenceScore]]:
    """Each group's shared prefix run once (left padded), its cache copied to the group's sequences, then the
    sequences' remaining tokens run (right padded) on top of it."""
    prefix_lens = [shared_prefix_len(g) for g in groups]
    width = max(prefix_lens)
    ids = torch.full((len(groups), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(groups), width), dtype=torch.long)
    for i, (g, p) in enumerate(zip(groups, prefix_lens)):
        ids[i, width - p :] = torch.tensor(g[0].tokens[:p], dtype=torch.long)
        mask[i, width - p :] = 1
    positions = (torch.arange(width)[None, :] - (width - torch.tensor(prefix_lens))[:, None]).clamp(min=0)
    kwargs = {"logits_to_keep": 1} if keep_last_only else {}
    out = model(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        use_cache=True,
        **kwargs,
    )
    last = _logits(out)[:, -1]  # (G, V): predicts each group's first token after its prefix
    cache = out["cache"] if "cache" in out else out.past_key_values

    owner = [g for g, group in enumerate(groups) for _ in group]
    flat = [s for group in groups for s in group]
    index = torch.tensor(owner, dtype=torch.long, device=device)
    cache = _select_cache(cache, index)
    suffixes = [s.tokens[prefix_lens[g] :] for g, s in zip(owner, flat)]
    suf_ids, suf_mask = _pad_right(suffixes, pad_id, device)
    suf_pos = torch.tensor([prefix_lens[g] for g in owner])[:, None] + torch.arange(suf_ids.shape[1])[None, :]
    out = model(
        input_ids=suf_ids,
        attention_mask=torch.cat([mask.to(device).index_select(0, index), suf_mask], dim=1),
        position_ids=suf_pos.to(device),
        use_cache=True,
        **{cache_argument(model): cache},
    )
    logits = _logits(out)
    results: list[list[SequenceScore]] = [[] for _ in groups]
    for r, (g, s) in enumerate(zip(owner, flat)):
        p = prefix_lens[g]
        n = len(s.tokens) - p  # suffix length
        preds = torch.cat([last[g][None], logits[r, : n - 1]], dim=0)  # predictions for tokens p .. len-1
        targets = suf_ids[r, s.cont_start - p : n]
        results[g].append(_score_rows(preds[s.cont_start - p : n], targets))
    return results


def takes_logits_index(model: torch.nn.Module) -> bool:
    """Whether ``forward``'s ``logits_to_keep`` also takes a 1-D tensor of positions (transformers, our MPT)."""
    try:
        annotation = inspect.signature(model.forward).parameters["logits_to_keep"].annotation
    except (KeyError, TypeError, ValueError):
        return False
    return "Tensor" in str(annotation)


def score_packed(model, groups: list[list[Sequence]], device, pad_id: int = 0, trim_logits: bool = False
                 ) -> list[list[SequenceScore]]:
    """Questions packed into rows, each question one block: its shared prefix once, then every sequence's
    remaining tokens (all but the last, which predicts nothing scored). A 4D mask lets a sequence's tokens see
    its question's prefix and themselves only; positions restart after the prefix for every sequence. One
    forward pass, no cache, no token computed twice, and short questions fill the rows of long ones instead of
    padding. With ``trim_logits`` the output projection runs only where a continuation token is predicted."""
    widths = [packed_width(g) for g in groups]
    rows = pack_rows(widths)
    width = max(sum(widths[g] for g in row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    block = torch.full((len(rows), width), -1, dtype=torch.long)  # the block a position belongs to (-1: padding)
    home = torch.full((len(rows), width), -1, dtype=torch.long)  # the block of its question's prefix
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    predicted_at: dict[tuple[int, int], tuple[int, list[int]]] = {}  # (group, sequence) -> (row, positions)
    for r, row in enumerate(rows):
        at = n_blocks = 0
        for g in row:
            group = groups[g]
            p = shared_prefix_len(group)
            prefix_at, prefix_block = at, n_blocks
            parts = [(group[0].tokens[:p], 0)] + [(s.tokens[p : len(s.tokens) - 1], p) for s in group]
            for i, (tokens, first_pos) in enumerate(parts):
                n = len(tokens)
                ids[r, at : at + n] = torch.tensor(tokens, dtype=torch.long)
                block[r, at : at + n] = n_blocks
                home[r, at : at + n] = prefix_block
                pos[r, at : at + n] = torch.arange(first_pos, first_pos + n)
                if i > 0:  # sequence position j sits at prefix_at + j in the prefix, at + j - p after it
                    s = group[i - 1]
                    predicted_at[g, i - 1] = (r, [prefix_at + j if j < p else at + j - p
                                                  for j in range(s.cont_start - 1, len(s.tokens) - 1)])
                at += n
                n_blocks += 1
    idx = torch.arange(width)
    causal = idx[None, :, None] >= idx[None, None, :]  # (1, q, k)
    visible = (block[:, :, None] == block[:, None, :]) | (home[:, :, None] == block[:, None, :])
    mask = causal & visible & (block >= 0)[:, :, None]
    mask |= torch.eye(width, dtype=torch.bool)[None]  # padding attends to itself (no empty softmax)

    kwargs: dict = {}
    needed = sorted({j for _, where in predicted_at.values() for j in where})
    column = {j: j for j in range(width)}
    if trim_logits and takes_logits_index(model):
        kwargs["logits_to_keep"] = torch.tensor(needed, device=device)
        column = {j: c for c, j in enumerate(needed)}
    elif trim_logits:
        kwargs["logits_to_keep"] = width - needed[0]
        column = {j: j - needed[0] for j in needed}
    out = model(input_ids=ids.to(device), attention_mask=mask[:, None].to(device), position_ids=pos.to(device),
                **kwargs)
    logits = _logits(out)
    results: list[list[SequenceScore]] = []
    for g, group in enumerate(groups):
        scores = []
        for i, s in enumerate(group):
            r, where = predicted_at[g, i]
            at = torch.tensor([column[j] for j in where], device=logits.device)
            targets = torch.tensor(s.tokens[s.cont_start :], device=logits.device)
            scores.append(_score_rows(logits[r].index_select(0, at), targets))
        results.append(scores)
    return results


def run_scoring(
    model,
    groups: list[list[Sequence]],
    *,
    device,
    batch_size: int,
    max_batch_tokens: int = 16384,
    use_kv_cache: bool = False,
    packed: bool = False,
    max_width: int | None = None,
    sync_calls: Callable[[int], int] | None = None,
    dummy_forward: Callable[[], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[list[SequenceScore] | None]:
    """Scores for every group; the groups are sorted by length and packed into batches (to score a subset, pass
    only the groups of that subset). With ``packed``, a group whose packed width exceeds ``max_width`` (the
    sequence length the model was built for; some models' masks are sized by it) is scored unpacked instead."""
    rest = "kv" if use_kv_cache and not packed else "full"
    fits = [packed and (max_width is None or packed_width(g) <= max_width) for g in groups]
    batches: list[tuple[str, list[int]]] = []
    for mode, wanted in (("packed", True), (rest, False)):
        idx = [g for g in range(len(groups)) if fits[g] == wanted]
        if not idx:
            continue
        sub = [groups[g] for g in idx]
        planned = (plan_batches(sub, batch_size, max_batch_tokens, width=packed_width, rows=lambda g: 1)
                   if mode == "packed" else plan_batches(sub, batch_size, max_batch_tokens))
        batches += [(mode, [idx[i] for i in batch]) for batch in planned]
    total = sync_calls(len(batches)) if sync_calls else len(batches)
    keep_last = "logits_to_keep" in _forward_params(model)
    results: list[list[SequenceScore] | None] = [None] * len(groups)
    for b in range(total):
        if b >= len(batches):
            for _ in range(2 if rest == "kv" else 1):
                dummy_forward()
            continue
        mode, members = batches[b]
        batch = [groups[g] for g in members]
        if mode == "packed":
            scored = score_packed(model, batch, device, trim_logits=keep_last)
        elif mode == "kv":
            scored = score_shared_prefix(model, batch, device, keep_last_only=keep_last)
        else:
            flat = score_full(model, [s for group in batch for s in group], device, trim_logits=keep_last)
            scored, i = [], 0
            for group in batch:
                scored.append(flat[i : i + len(group)])
                i += len(group)
        for g, sc in zip(members, scored):
            results[g] = sc
        if progress:
            progress(len(batch))
    return results


class _StopOnStrings:
    """Stops a row once its generated text contains a stop string (checked on the decoded new tokens)."""

    def __init__(self, tokenizer, stops: list[str], prompt_len: int):
        self.tokenizer, self.stops, self.prompt_len = tokenizer, stops, prompt_len

    def __call__(self, input_ids: torch.Tensor, scores=None, **kwargs) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_len :], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stops) for t in texts], device=input_ids.device)


def generate_greedy(
    model,
    tokenizer,
    prompts: list[list[int]],
    *,
    device,
    max_new_tokens: int,
    stop_strings: list[str] | None = None,
    generation_kwargs: dict | None = None,
    synced: bool = False,
    key: str = "generation_kwargs",
) -> list[str]:
    """Greedy continuations of left-padded prompts, decoded without special tokens.

    ``generation_kwargs`` go to ``model.generate`` and override the defaults (``do_sample=False``, the tokenizer's
    ``pad_token_id`` and ``eos_token_id``), as llm-foundry's task ``generation_kwargs`` do; ``max_new_tokens`` is
    the task's (it already reflects a ``max_new_tokens`` in ``generation_kwargs``)."""
    user = {k: v for k, v in (generation_kwargs or {}).items() if k != "max_new_tokens"}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    pad_id = user.get("pad_token_id", pad_id)
    eos_id = user.get("eos_token_id", tokenizer.eos_token_id)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id if pad_id is not None else 0, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    if hasattr(model, "generate"):
        kwargs = {"do_sample": False, "pad_token_id": pad_id, "eos_token_id": eos_id, "synced_gpus": synced, **user}
        criteria = [_StopOnStrings(tokenizer, stop_strings, width)] if stop_strings else []
        criteria += list(kwargs.pop("stopping_criteria", None) or [])
        try:
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                stopping_criteria=StoppingCriteriaList(criteria) if criteria else None,
                **kwargs,
            )
        except (TypeError, ValueError) as error:
            if not user:
                raise
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ConfigError(f"{key}: model.generate rejected {sorted(user)}: {first}") from None
        new = out[:, width:]
    else:  # a plain module: greedy decoding without a cache
        new = torch.empty((len(prompts), 0), dtype=torch.long, device=device)
        done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
        for _ in range(max_new_tokens):
            full = torch.cat([ids, new], 1)
            full_mask = torch.cat([mask, torch.ones_like(new)], 1)
            positions = (full_mask.cumsum(1) - 1).clamp(min=0)
            params = _forward_params(model)
            extra = {"position_ids": positions} if "position_ids" in params else {}
            nxt = _logits(model(input_ids=full, attention_mask=full_mask, **extra))[:, -1].argmax(-1)
            if eos_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, pad_id or 0), nxt)
                done |= torch.isin(nxt, torch.tensor(eos_id, device=nxt.device).reshape(-1))
            new = torch.cat([new, nxt[:, None]], 1)
            if done.all():
                break
    return tokenizer.batch_decode(new, skip_special_tokens=True)
