"""The lm-eval adapter (lm-evaluation-harness is part of the dev extra, so this always runs)."""

from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F

from llmfoundry.inference.lm_eval_adapter import LLMFoundryLM, main


class Req:
    def __init__(self, *args):
        self.args = args


def _direct(model, tokens, start):
    with torch.no_grad():
        logp = F.log_softmax(model(input_ids=torch.tensor([tokens])).logits[0].float(), -1)
    return sum(logp[t - 1, tokens[t]].item() for t in range(start, len(tokens)))


def test_loglikelihood_matches_a_direct_computation_with_lm_eval_tokenization(llama, tokenizer):
    lm = LLMFoundryLM(llama, tokenizer, batch_size=3)
    reqs = [Req("The cat runs ", "quickly"), Req("The cat runs", " slowly over"), Req("The cat runs", " under"),
            Req("", "A dog")]
    out = lm.loglikelihood(reqs)
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    ctx = enc("The cat runs")
    expected = [
        _direct(llama, enc("The cat runs quickly"), len(ctx)),
        _direct(llama, enc("The cat runs slowly over"), len(ctx)),
        _direct(llama, enc("The cat runs under"), len(ctx)),
        _direct(llama, [lm.prefix_token_id] + enc("A dog"), 1),
    ]
    for (lp, greedy), want in zip(out, expected):
        assert math.isclose(lp, want, rel_tol=1e-4, abs_tol=1e-4) and isinstance(greedy, bool)


def test_rolling_loglikelihood_predicts_every_token_once(llama, tokenizer):
    lm = LLMFoundryLM(llama, tokenizer, max_length=8)
    text = "the model learns to predict next token from data which flows through layers"
    (total,) = lm.loglikelihood_rolling([Req(text)])
    tokens = [lm.prefix_token_id] + tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(tokens) > 9 and total < 0
    full = LLMFoundryLM(llama, tokenizer, max_length=512).loglikelihood_rolling([Req(text)])[0]
    assert math.isclose(full, _direct(llama, tokens, 1), rel_tol=1e-4)


def test_generate_until_cuts_the_output_before_the_first_stop_string(llama, tokenizer):
    lm = LLMFoundryLM(llama, tokenizer)
    (free,) = lm.generate_until([Req("The cat", {"until": [], "max_gen_toks": 8})])
    assert len(free) >= 6, free  # the tiny model's greedy text is long enough to cut inside
    stop = free[len(free) // 2 : len(free) // 2 + 2]  # text that greedy decoding is sure to emit
    (cut,) = lm.generate_until([Req("The cat", {"until": [stop], "max_gen_toks": 8})])
    assert cut == free[: free.index(stop)] and len(cut) < len(free)


def test_the_module_runs_lm_evals_command_line_with_our_model(tmp_path, tokenizer, llama):
    """`python -m llmfoundry.inference.lm_eval_adapter run --model llmfoundry ...` (in-process: main(argv))."""
    folder = tmp_path / "tiny"
    llama.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    rows = [{"query": f"{a} plus {b} is", "choices": [str(a + b), str(a + b + 1)], "gold": 0}
            for a, b in [(1, 2), (2, 3), (3, 4), (4, 5)]]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tiny_sums.yaml").write_text(
        "task: llmfoundry_tiny_sums\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{query}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: gold\nmetric_list:\n  - metric: acc\n"
    )
    out = tmp_path / "out"
    assert main(["run", "--model", "llmfoundry", "--model_args", f"path={folder},batch_size=2",
                 "--tasks", "llmfoundry_tiny_sums", "--include_path", str(tasks), "--output_path", str(out)]) == 0
    (results_file,) = out.rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]["llmfoundry_tiny_sums"]
    assert 0.0 <= results["acc,none"] <= 1.0
