"""lm-evaluation-harness adapter: score our checkpoints (or any causal LM module) with lm-eval, in-process.

    from llmfoundry.inference.lm_eval_adapter import LLMFoundryLM
    import lm_eval
    lm = LLMFoundryLM.from_path("runs/ckpt")                  # our checkpoint or a Hugging Face folder (or s3://)
    lm_eval.simple_evaluate(model=lm, tasks=["arc_easy"])

or from the command line, with lm-eval's own arguments (this module registers ``--model llmfoundry`` and then
runs lm-eval's command line; the plain ``lm_eval``/``lm-eval`` command cannot, as nothing registers the model
there)::

    python -m llmfoundry.inference.lm_eval_adapter run --model llmfoundry --model_args path=FOLDER --tasks arc_easy

``--model_args`` takes ``path`` (required) and ``device``, ``batch_size``, ``max_length``, ``add_bos_token``.
In-process, ``register()`` makes ``simple_evaluate(model="llmfoundry", model_args={"path": ...})`` work. Needs
the optional extra ``pip install llmfoundry[eval]`` (lm-eval); nothing else in llmfoundry imports this module.

Requests are tokenized as lm-eval's Hugging Face backend does (trailing spaces of the context move to the
continuation; the pair is encoded whole and split; an empty context is conditioned on BOS/EOS), and scored with
our batched scorer, which shares the key/value cache of requests with the same context.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch

try:
    from lm_eval.api.model import LM
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("the lm-eval adapter needs lm-evaluation-harness: pip install 'llmfoundry[eval]'") from error

from llmfoundry.eval.icl.scoring import generate_greedy, run_scoring, supports_kv_cache, supports_packed
from llmfoundry.eval.icl.tasks import Sequence
from llmfoundry.loading import load_model
from llmfoundry.models.interface import context_length


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
        model, tokenizer = load_model(path, kwargs.get("device", "cpu"), dtype=torch.float32, key="path")
        return cls(model, tokenizer, **kwargs)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "LLMFoundryLM":
        args = dict(kv.split("=", 1) for kv in arg_string.split(",") if kv)
        return cls.create_from_arg_obj(args, additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "LLMFoundryLM":
        """lm-eval's ``--model_args`` (``path`` and our constructor's keys) and its ``--device``/``--batch_size``."""
        args = dict(arg_dict)
        path = args.pop("path", None) or args.pop("pretrained", None)
        if not path:
            raise ValueError("--model_args: give path=FOLDER (our checkpoint or a Hugging Face folder, or s3://)")
        unknown = sorted(set(args) - set(MODEL_ARGS))
        if unknown:
            raise ValueError(f"--model_args: unknown {', '.join(unknown)} (known: path, {', '.join(MODEL_ARGS)})")
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k in ("device", "batch_size")}
        kwargs = {**args, **extra}
        device = str(kwargs.get("device", "cpu"))
        if device.startswith("cuda") and not torch.cuda.is_available():  # lm-eval's --device defaults to cuda
            warnings.warn(f"device '{device}' is not available; running on the CPU", stacklevel=2)
            kwargs["device"] = "cpu"
        if "batch_size" in kwargs:  # lm-eval passes strings, and "auto"; ours is a fixed size
            size = str(kwargs["batch_size"])
            kwargs["batch_size"] = int(size) if size.isdigit() else 16
        if isinstance(kwargs.get("add_bos_token"), str):
            kwargs["add_bos_token"] = kwargs["add_bos_token"].lower() in ("1", "true", "yes")
        return cls.from_path(str(path), **kwargs)

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
                             batch_size=self.batch_size, use_kv_cache=use_kv, packed=packed,
                             max_width=context_length(self.model))
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


MODEL_ARGS = ("device", "batch_size", "max_length", "add_bos_token")


def register() -> None:
    """Make ``model="llmfoundry"`` available to lm-eval's registry (in this process)."""
    from lm_eval.api.registry import MODEL_REGISTRY, register_model

    if MODEL_REGISTRY.get("llmfoundry", None) is not LLMFoundryLM:
        register_model("llmfoundry")(LLMFoundryLM)


def main(argv: list[str] | None = None) -> int:
    """``python -m llmfoundry.inference.lm_eval_adapter [lm-eval arguments]``: lm-eval's command line, with
    ``--model llmfoundry`` registered first."""
    register()
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
