"""eval_output_logging (llm-foundry's EvalOutputLogging): after each evaluation, one table per ICL task and
shot count, ``<label>/<n>-shot_step_<batch>``, with a row per example: ``input`` (the prompt as text), ``outputs``
(the generated text, for generation tasks), ``result`` (1.0 when scored correct, by the task's first metric),
``correct_choice_idx`` (the gold choice, for multiple-choice tasks), ``category`` and ``run_name``; with
``log_tokens``, ``input_tokens`` too.

llm-foundry also logs the eval_loader's batches (their inputs and argmax outputs); this trainer scores its
eval loaders without per-batch hooks, so only the ICL tasks are logged (a notice says so when there are eval
loaders).
"""

from __future__ import annotations

from typing import Any

from llmfoundry.core.notices import notice_once
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import EvalOutputLoggingSettings
from llmfoundry.train.callbacks.tables import log_table
from llmfoundry.train.state import TrainState

KEY = "callbacks.eval_output_logging"


class EvalOutputLogging(Callback):
    def __init__(self, settings: EvalOutputLoggingSettings):
        self.s = settings
        self.tables: dict[str, tuple[list[str], list[list[Any]]]] = {}  # the last evaluation's tables (rank 0)

    def on_fit_start(self, state: TrainState):
        if state.eval_loaders:
            notice_once(f"{KEY}: logs the ICL tasks' outputs; the eval loaders' batches (which llm-foundry also "
                        "logs) are not")
        if state.icl_evaluator is None:
            notice_once(f"{KEY}: the run has no icl_tasks, so there is nothing to log")

    def on_eval_end(self, state: TrainState, metrics):
        if state.icl_evaluator is None or not state.dist.is_main:
            return
        self.tables = {}
        for run in state.icl_evaluator.runs:
            if not run.results:
                continue
            examples = {ex.index: ex for ex in run.examples}
            columns, rows = self.table(run, examples, state.run_name)
            name = f"{run.name}_step_{state.time.batch}"
            self.tables[name] = (columns, rows)
            log_table(state, name, columns, rows, KEY)

    def table(self, run, examples: dict, run_name: str) -> tuple[list[str], list[list[Any]]]:
        with_outputs = self.s.log_output_text is not False and "output" in run.results[0]
        with_gold = run.task.scoring == "choices"
        columns = ["input"] + (["outputs"] if with_outputs else []) + ["result"]
        columns += (["correct_choice_idx"] if with_gold else []) + ["category", "run_name"]
        columns += ["input_tokens"] if self.s.log_tokens else []
        rows = []
        for result in run.results:
            ex = examples[result["index"]]
            row = [ex.text] + ([result["output"]] if with_outputs else [])
            row.append(next(iter(result["correct"].values()), 0.0))
            row += ([ex.gold] if with_gold else []) + [result["category"], run_name]
            if self.s.log_tokens:
                row.append(ex.prompt if ex.prompt is not None else [s.tokens for s in ex.sequences])
            rows.append(row)
        return columns, rows


def build_eval_output_logging(settings: EvalOutputLoggingSettings) -> Callback:
    return EvalOutputLogging(settings)
