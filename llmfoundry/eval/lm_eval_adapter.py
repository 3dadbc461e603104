"""lm-evaluation-harness adapter: score our checkpoints (or any causal LM module) with lm-eval, in-process.

    from llmfoundry.eval.lm_eval_adapter import LLMFoundryLM
    import lm_eval
    lm = LLMFoundryLM.from_path("runs/ckpt/latest")          # our checkpoint or a Hugging Face folder
    lm_eval.simple_evaluate(model=lm, tasks=["arc_easy"])

or, after ``register()``, ``lm_eval --model llmfoundry --model_args path=FOLDER``. Needs the optional extra
``pip install llmfoundry[eval]`` (lm-eval); nothing else in llmfoundry imports this module.

Requests are tokenized as lm-eval's Hugging Face backend does (trailing spaces of the context move to the
continuation; the pair is encoded whole and split; an empty context is conditioned on BOS/EOS), and scored with
our batched scorer, which shares the key/value cache of requests with the same context.
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from lm_eval.api.model import LM
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("the lm-eval adapter needs lm-evaluation-harness: pip install 'llmfoundry[eval]'") from error

from llmfoundry.eval.icl.scoring import generate_greedy, run_scoring, supports_kv_cache, supports_packed
from llmfoundry.eval.icl.tasks import Sequence


class LLMFoundryLM(LM):
    """An ``lm_eval`` LM over a causal LM module whose forward returns ``.logits``."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, device: str | torch.device = "cpu",
                 batch_size: int = 16, max_length: int = 2048, add_bos_token: bool = False):
        super().__init__()
        self.model = getattr(model, "hf_model", model).eval()
        self.tokenizer = tokenizer
        self._device = torch.device(device)
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.add_bos_token = add_bos_token
        self.prefix_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id

    @classmethod
    def from_path(cls, path: str, **kwargs: Any) -> "LLMFoundryLM":
        """Our checkpoint (a checkpoint folder or a save_folder) or a Hugging Face folder, local or ``s3://``
        (downloaded first, as ``llmfoundry eval`` does)."""
        from pathlib import Path

        from llmfoundry.eval.models import stage_model_path

        path = stage_model_path(path, "path")
        device = kwargs.get("device", "cpu")
        if (Path(path) / "config.json").is_file():
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
            tokenizer = AutoTokenizer.from_pretrained(path)
        else:
            from llmfoundry.train.checkpoint import load_model_for_inference

            model, tokenizer = load_model_for_inference(path, device=device)
        return cls(model, tokenizer, **kwargs)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "LLMFoundryLM":
        args = dict(kv.split("=", 1) for kv in arg_string.split(",") if kv)
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k in ("device", "batch_size")}
        path = args.pop("path")
        return cls.from_path(path, **{**args, **extra})

    # --- tokenization ---------------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=self.add_bos_token)["input_ids"])

    def _pair(self, context: str, continuation: str) -> Sequence:
        if not context:
            cont = list(self.tokenizer(continuation, add_special_tokens=False)["input_ids"])
            tokens = [self.prefix_token_id] + cont
            return self._fit(tokens, 1)
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self._encode(context + continuation)
        ctx = self._encode(context)
        return self._fit(whole, len(ctx))

    def _fit(self, tokens: list[int], cont_start: int) -> Sequence:
        cut = max(0, len(tokens) - self.max_length - 1)  # lm-eval keeps the last max_length + 1 tokens
        cont_start = max(cont_start - cut, 1)
        return Sequence(tokens[cut:], cont_start)

    # --- lm-eval API ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        seqs = [self._pair(*req.args) for req in requests]
        # requests with the same context tokens share one group (their KV cache is computed once)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(seqs):
            groups.setdefault(tuple(s.tokens[: s.cont_start]), []).append(i)
        members = list(groups.values())
        shared = any(len(m) > 1 for m in members)
        packed = shared and supports_packed(self.model)
        use_kv = shared and not packed and supports_kv_cache(self.model)
        scores = run_scoring(self.model, [[seqs[i] for i in m] for m in members], device=self._device,
                             batch_size=self.batch_size, use_kv_cache=use_kv, packed=packed)
        out: list[tuple[float, bool]] = [(0.0, False)] * len(seqs)
        for m, sc in zip(members, scores):
            for i, s in zip(m, sc or []):
                out[i] = (s.logprob, s.greedy)
        return out

    @torch.no_grad()
    def loglikelihood_rolling(self, requests) -> list[float]:
        results = []
        for req in requests:
            (text,) = req.args
            tokens = [self.prefix_token_id] + list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            windows, pos = [], 1
            while pos < len(tokens):
                end = min(pos + self.max_length, len(tokens))
                start = max(0, end - self.max_length - 1)
                windows.append([Sequence(tokens[start:end], pos - start)])
                pos = end
            scores = run_scoring(self.model, windows, device=self._device, batch_size=self.batch_size)
            results.append(sum(sc[0].logprob for sc in scores if sc))
        return results

    @torch.no_grad()
    def generate_until(self, requests) -> list[str]:
        outputs = []
        for req in requests:
            context, kwargs = req.args
            kwargs = dict(kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.pop("max_gen_toks", 256))
            prompt = self._encode(context)[-(self.max_length - max_new) :]
            text = generate_greedy(self.model, self.tokenizer, [prompt], device=self._device, max_new_tokens=max_new,
                                   stop_strings=until)[0]
            for stop in until:
                text = text.split(stop)[0]
            outputs.append(text)
        return outputs


def register() -> None:
    """Make ``--model llmfoundry`` available to lm-eval's registry."""
    from lm_eval.api.registry import register_model

    register_model("llmfoundry")(LLMFoundryLM)
