"""Config sections for in-context-learning evaluation, with llm-foundry's key names and defaults.

* ``ICLTaskConfig`` — one entry of ``icl_tasks`` (used by ``llmfoundry eval`` and by the training recipe).
* ``GauntletConfig`` — the ``eval_gauntlet`` section.
* ``EvalConfig`` — the top-level recipe of ``llmfoundry eval`` (llm-foundry's eval YAML shape).

``icl_tasks`` and ``eval_gauntlet`` may be given inline or as the path of a YAML file (as in llm-foundry, where
``icl_tasks: eval/yamls/tasks_v0.3.yaml``); ``load_icl_tasks`` / ``load_gauntlet`` accept both forms.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from llmfoundry.core.errors import ConfigError, did_you_mean
from llmfoundry import registry
from llmfoundry.config.checks import LogLevel
from llmfoundry.config.fields import option
from llmfoundry.config.validate import RegisteredMap

TASK_TYPES = ("language_modeling", "multiple_choice", "schema", "generation_task_with_answers", "code_evaluation")
log = logging.getLogger(__name__)


@dataclass
class ICLTaskConfig:
    label: str = option(doc="name of the task in metric keys, e.g. arc_easy")
    dataset_uri: str = option(doc="JSONL task file: local path, s3://bucket/key, or hf://org/name (online)")
    icl_task_type: Literal[
        "language_modeling", "multiple_choice", "schema", "generation_task_with_answers", "question_answering",
        "code_evaluation",
    ] = option(doc="how examples are scored (question_answering: llm-foundry's old name of "
                   "generation_task_with_answers; code_evaluation is not supported yet)")
    num_fewshot: list[int] | int = option(doc="numbers of in-context examples; the task runs once per entry "
                                              "(required, as in llm-foundry)")
    batch_size: int | None = option(
        None, "sequences per forward pass; a multiple-choice/schema batch holds batch_size // choices questions, "
        "as in llm-foundry (none = device_eval_batch_size)"
    )
    max_seq_len: int | None = option(None, "context window; longer prompts lose tokens on the left (none = global)")
    prompt_string: str = option("", "text put once before the few-shot examples")
    example_delimiter: str = option("\n", "text between examples")
    continuation_delimiter: str = option(" ", "text between an example's context and its answer")
    question_prelimiter: str = option("", "text put before every context (e.g. 'Question: ')")
    prelimiter: str | None = option(None, "llm-foundry's newer name of question_prelimiter (set one of the two)")
    fewshot_random_seed: int = option(1234, "seed of the RNG that picks few-shot examples")
    has_categories: bool = option(False, "records carry a 'category'; report accuracy per category too")
    generation_kwargs: dict[str, Any] = option({}, "generation settings (max_new_tokens, ...) for generation tasks")
    cot_delimiter: str = option("", "text between the chain of thought and the final answer")
    early_stopping_criteria: list[str] | None = option(None, "generation stops at (and is cut before) these strings")
    do_normalization: bool = option(True, "compare answers after lowercasing and removing punctuation/articles")
    strip_dataset: bool = option(True, "strip leading/trailing whitespace of every string field of a record")
    hf_loading_vars: dict[str, Any] = option({}, "keyword arguments of datasets.load_dataset for hf:// URIs")
    hf_parsing_map: dict[str, Any] = option({}, "{icl_key: [hf_column, ...]} joined with spaces, for hf:// URIs")
    metric_names: list[str] | None = option(
        None, "report only these metrics: accuracy, acc, acc_norm, or llm-foundry's metric class names (e.g. "
        "InContextLearningMultipleChoiceAccuracy = accuracy) (none = every metric of the task type)"
    )
    pass_at_k: int = option(1, "code evaluation: k", unsupported="code_evaluation tasks")
    generations_per_sample: int = option(1, "code evaluation: samples per prompt", unsupported="code_evaluation tasks")
    icl_subset_num_batches: int | None = option(
        None, "evaluate only the examples of the first N batches, in file order (as llm-foundry)"
    )
    limit: int | None = option(None, "evaluate only the first N records (few-shot examples still come from all)")
    kv_cache: Literal["auto", "on", "off"] = option(
        "auto", "score the choices of a question from one pass over their shared prefix (auto: when supported)"
    )


@dataclass
class GauntletBenchmark:
    name: str = option(doc="an icl_tasks label")
    num_fewshot: int = option(doc="which of the task's num_fewshot runs counts")
    random_baseline: float = option(0.0, "accuracy of random guessing on the benchmark (0 <= x < 1)")

    def check_settings(self, path: str) -> list[str]:
        if not 0.0 <= self.random_baseline < 1.0:
            return [f"{path}.random_baseline: must be at least 0 and below 1 (a benchmark's score is divided by "
                    f"1 - random_baseline), got {self.random_baseline} for {self.name}"]
        return []


@dataclass
class GauntletCategory:
    name: str = option(doc="category name, e.g. world_knowledge")
    benchmarks: list[GauntletBenchmark] = option([], "benchmarks averaged into the category score")


@dataclass
class GauntletConfig:
    weighting: Literal["EQUAL", "SAMPLE_SZ", "LOG_SAMPLE_SZ"] = option(
        "EQUAL", "benchmark weights within a category: equal, number of samples, or log2(number of samples)"
    )
    subtract_random_baseline: bool = option(True, "subtract each benchmark's random_baseline from its accuracy")
    rescale_accuracy: bool = option(True, "divide by (1 - random_baseline) after subtracting it")
    categories: list[GauntletCategory] = option([], "categories of benchmarks")
    averages: dict[str, list[str]] | None = option(
        None, "named averages over categories, e.g. core_average: [...] (none = default_average over all categories)"
    )
    metric: str = option("accuracy", "which per-task metric feeds the gauntlet: accuracy, acc or acc_norm")
    destination_dir: str | None = option(
        None, "llm-foundry's download folder", unsupported="destination_dir (task files are read in place)"
    )

    def check_settings(self, path: str) -> list[str]:
        """llm-foundry's rules: rescaling needs the baseline subtracted; average and category names do not overlap.
        Also: category names are unique and an average names only categories that exist (a typo is an error)."""
        problems = []
        where = f"{path}." if path else ""
        if self.rescale_accuracy and not self.subtract_random_baseline:
            problems.append(f"{where}rescale_accuracy: needs subtract_random_baseline: true (set rescale_accuracy: "
                            "false to keep raw accuracies)")
        names = [c.name for c in self.categories]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            problems.append(f"{where}categories: category names must be unique; repeated: {', '.join(repeated)}")
        for avg_name, members in (self.averages or {}).items():
            if avg_name in names:
                problems.append(f"{where}averages.{avg_name}: '{avg_name}' is also a category name; average names "
                                "and category names must not overlap")
            for member in members:
                if member not in names:
                    problems.append(f"{where}averages.{avg_name}: '{member}' is not a category of the gauntlet"
                                    f"{did_you_mean(member, names)}")
        return problems


@dataclass
class EvalTokenizerConfig:
    name: str | None = option(None, "Hugging Face tokenizer folder or hub id, a SentencePiece .model file, or "
                                    "'tiktoken' (none = the model's own)")
    kwargs: dict[str, Any] = option({}, "passed to the tokenizer (model_max_length defaults to max_seq_len)")


@dataclass
class EvalModelConfig:
    model_name: str = option(doc="name of the model in tables and the results file (unique)")
    model: dict[str, Any] = option(
        {}, "the model section of a training recipe: name (default hf_causal_lm) and that model's settings, "
        "validated and built as in training (e.g. pretrained_model_name_or_path, config_overrides, pretrained)"
    )
    tokenizer: EvalTokenizerConfig | None = option(
        None, "tokenizer: {name: FOLDER_OR_ID, kwargs: {...}} (default: the model folder's or the checkpoint's own)"
    )
    load_path: str | None = option(
        None, "our training checkpoint or save_folder, or a Hugging Face folder; local or s3:// (downloaded first)"
    )


@dataclass
class EvalConfig:
    models: list[EvalModelConfig] = option(doc="models to evaluate")
    icl_tasks: list[ICLTaskConfig] | str = option(doc="ICL tasks: a list or the path of a YAML file")
    eval_gauntlet: GauntletConfig | str | None = option(None, "gauntlet: a mapping or the path of a YAML file")
    max_seq_len: int = option(2048, "default context window of the tasks")
    device_eval_batch_size: int = option(16, "default sequences per forward pass")
    precision: Literal["fp32", "amp_bf16", "amp_fp16", "bf16"] = option("fp32", "numeric precision of the model")
    seed: int = option(17, "random seed")
    dist_timeout: float = option(600.0, "seconds to wait for other ranks")
    run_name: str | None = option(None, "name of the run")
    results_path: str | None = option("eval_results.json", "write all metrics here as JSON (none = do not)")
    table_path: str | None = option(None, "also write the markdown tables to this file")
    plot_path: str | None = option(None, "save a bar chart of the gauntlet scores here (needs matplotlib)")
    loggers: Annotated[dict, RegisteredMap(registry.loggers)] = option(
        {}, "loggers by name with their settings, as in training (jsonl, wandb, ...): each model's task metrics and "
        "gauntlet scores are logged as {model_name}/icl/..., model i at step i"
    )
    icl_subset_num_batches: int | None = option(
        None, "evaluate only the examples of each task's first N batches, in file order (as llm-foundry)"
    )
    fsdp_config: dict[str, Any] | None = option(None, "FSDP settings", unsupported="fsdp_config in eval")
    model_gauntlet: Any = option(None, "old name of eval_gauntlet", unsupported="model_gauntlet (use eval_gauntlet)")
    python_log_level: LogLevel | None = option("info", "Python logging level (debug, info, warning, error, critical)")
    variables: dict[str, Any] = option({}, "values for ${variables.x} interpolation")
    metadata: dict[str, Any] = option({}, "free-form metadata")


def _read_yaml_file(path: str, key: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{key}: no such file '{path}' (give a list inline or the path of a YAML file)")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{key}: '{path}' is not valid YAML: {str(error).splitlines()[0]}") from None
    return data


def _validate(data: Any, cls: type, path: str) -> Any:
    from llmfoundry.config.validate import validate

    return validate(data, cls, path)


def _normalise_task(raw: Any) -> Any:
    if isinstance(raw, dict) and isinstance(raw.get("num_fewshot"), int):
        raw = {**raw, "num_fewshot": [raw["num_fewshot"]]}
    return raw


def _raw_task_problems(raw: Any, path: str) -> list[str]:
    """Keys that the schema would only call unknown, with what to write instead."""
    if isinstance(raw, dict) and "kwargs" in raw:
        return [f"{path}.kwargs: llm-foundry hands a task's own keys to its dataset; write them at the task's top "
                "level (e.g. prompt_string: ..., prelimiter: ...) instead of under kwargs"]
    return []


# llm-foundry's metric class names -> the metric they compute here
LLM_FOUNDRY_METRICS = {
    "InContextLearningLMAccuracy": ("accuracy", ("language_modeling",)),
    "InContextLearningMultipleChoiceAccuracy": ("accuracy", ("multiple_choice", "schema")),
    "InContextLearningGenerationExactMatchAccuracy": ("accuracy", ("generation_task_with_answers",)),
    "InContextLearningGenerationAccuracy": ("accuracy", ("generation_task_with_answers",)),
    "InContextLearningQAAccuracy": ("accuracy", ("generation_task_with_answers",)),
}
# the metrics each task type reports
TYPE_METRICS = {
    "language_modeling": ("accuracy", "acc"),
    "multiple_choice": ("accuracy", "acc", "acc_norm"),
    "schema": ("accuracy", "acc", "acc_norm"),
    "generation_task_with_answers": ("accuracy",),
}


def selected_metrics(task: ICLTaskConfig) -> set[str] | None:
    """The metrics ``metric_names`` keeps (None = all): our names, or llm-foundry's class names mapped to ours."""
    if task.metric_names is None:
        return None
    return {LLM_FOUNDRY_METRICS[n][0] if n in LLM_FOUNDRY_METRICS else n for n in task.metric_names}


def _check_metric_names(task: ICLTaskConfig, path: str) -> None:
    if task.metric_names is None:
        return
    available = TYPE_METRICS.get(task.icl_task_type, ())
    problems = []
    for name in task.metric_names:
        if name in LLM_FOUNDRY_METRICS:
            if task.icl_task_type not in LLM_FOUNDRY_METRICS[name][1]:
                problems.append(f"{path}.metric_names: {name} does not apply to {task.icl_task_type} tasks "
                                f"({task.label})")
        elif name not in available:
            known = [*available, *(n for n, (_, types) in LLM_FOUNDRY_METRICS.items() if task.icl_task_type in types)]
            problems.append(f"{path}.metric_names: '{name}' is not supported for {task.icl_task_type} tasks "
                            f"({task.label}); choose from {', '.join(known)}")
    if not task.metric_names:
        problems.append(f"{path}.metric_names: give at least one metric, or leave the key out ({task.label})")
    if problems:
        raise ConfigError.many(problems)


def _finish_task(task: ICLTaskConfig, path: str) -> ICLTaskConfig:
    """llm-foundry's aliases resolved (question_answering, prelimiter) and num_fewshot made a list."""
    if isinstance(task.num_fewshot, int):
        task.num_fewshot = [task.num_fewshot]
    if task.icl_task_type == "question_answering":
        log.warning("%s.icl_task_type: 'question_answering' is llm-foundry's deprecated name of "
                    "'generation_task_with_answers' (%s)", path, task.label)
        task.icl_task_type = "generation_task_with_answers"
    if task.prelimiter is not None:
        if task.question_prelimiter not in ("", task.prelimiter):
            raise ConfigError(f"{path}.prelimiter: set either prelimiter or question_prelimiter, not both "
                              f"({task.label}; they are the same setting)")
        task.question_prelimiter, task.prelimiter = task.prelimiter, None
    _check_metric_names(task, path)
    return task


def load_icl_tasks(value: Any, key: str = "icl_tasks") -> list[ICLTaskConfig]:
    """ICL task configs from a list (of dicts or ICLTaskConfig) or the path of a YAML file holding ``icl_tasks``."""
    if value is None:
        return []
    if isinstance(value, (str, Path)):
        data = _read_yaml_file(str(value), key)
        if isinstance(data, dict):
            if "icl_tasks" not in data:
                raise ConfigError(f"{key}: '{value}' has no 'icl_tasks' key")
            data = data["icl_tasks"]
        value = data
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}: expected a list of tasks or a YAML path, got {type(value).__name__}")
    tasks = []
    problems = []
    for i, raw in enumerate(value):
        path = f"{key}[{i}]"
        try:
            if isinstance(raw, ICLTaskConfig):
                tasks.append(_finish_task(raw, path))
                continue
            if extra := _raw_task_problems(raw, path):
                problems.extend(extra)
                continue
            tasks.append(_finish_task(_validate(_normalise_task(raw), ICLTaskConfig, path), path))
        except ConfigError as error:
            problems.extend(error.problems)
    if problems:
        raise ConfigError.many(problems)
    labels = [t.label for t in tasks]
    duplicates = sorted({lab for lab in labels if labels.count(lab) > 1})
    if duplicates:
        raise ConfigError(f"{key}: task labels must be unique; repeated: {', '.join(duplicates)}")
    for i, task in enumerate(tasks):
        if task.icl_task_type == "code_evaluation":
            raise ConfigError(f"{key}[{i}].icl_task_type: 'code_evaluation' is not supported yet ({task.label})")
        if not task.num_fewshot:
            raise ConfigError(f"{key}[{i}].num_fewshot: give at least one number of shots")
    return tasks


def load_gauntlet(value: Any, key: str = "eval_gauntlet") -> GauntletConfig | None:
    """A GauntletConfig from a mapping, a GauntletConfig, or the path of a YAML file holding ``eval_gauntlet``."""
    if value is None:
        return None
    if isinstance(value, GauntletConfig):
        return value
    if isinstance(value, (str, Path)):
        data = _read_yaml_file(str(value), key)
        if isinstance(data, dict) and "eval_gauntlet" in data:
            data = data["eval_gauntlet"]
        value = data
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping or a YAML path, got {type(value).__name__}")
    return _validate(value, GauntletConfig, key)


def load_eval_config(data: dict[str, Any]) -> EvalConfig:
    """The validated ``llmfoundry eval`` recipe, with ``icl_tasks``/``eval_gauntlet`` paths read."""
    data = dict(data)
    if isinstance(data.get("icl_tasks"), list):
        problems = [p for i, t in enumerate(data["icl_tasks"]) for p in _raw_task_problems(t, f"icl_tasks[{i}]")]
        if problems:
            raise ConfigError.many(problems)
        data["icl_tasks"] = [_normalise_task(t) for t in data["icl_tasks"]]
    cfg = _validate(data, EvalConfig, "")
    cfg.icl_tasks = load_icl_tasks(cfg.icl_tasks)
    cfg.eval_gauntlet = load_gauntlet(cfg.eval_gauntlet)
    if not cfg.models:
        raise ConfigError("models: give at least one model to evaluate")
    from llmfoundry.eval.models import check_models

    check_models(cfg.models)
    return cfg
