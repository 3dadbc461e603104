"""Config sections for in-context-learning evaluation, with llm-foundry's key names and defaults.

* ``ICLTaskConfig`` — one entry of ``icl_tasks`` (used by ``llmfoundry eval`` and by the training recipe).
* ``GauntletConfig`` — the ``eval_gauntlet`` section.
* ``EvalConfig`` — the top-level recipe of ``llmfoundry eval`` (llm-foundry's eval YAML shape).

``icl_tasks`` and ``eval_gauntlet`` may be given inline or as the path of a YAML file (as in llm-foundry, where
``icl_tasks: eval/yamls/tasks_v0.3.yaml``); ``load_icl_tasks`` / ``load_gauntlet`` accept both forms.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from llmfoundry import registry
from llmfoundry.config.checks import LogLevel
from llmfoundry.config.fields import option
from llmfoundry.config.validate import Check, Component, Registered, RegisteredMap, validate
from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError, did_you_mean
from llmfoundry.core.timeunits import check_time
from llmfoundry.eval.models import check_models
from llmfoundry.eval.sections import finish_eval_sections

log = logging.getLogger(__name__)

# llm-foundry's old names of task types, resolved (with a warning) once a task is validated
TASK_TYPE_ALIASES = {"question_answering": "generation_task_with_answers"}


def _check_task_type(name: str) -> None:
    """A task type registered in registry.icl_task_types (whose error lists them) or an alias of one."""
    if name == "code_evaluation":
        raise ValueError("'code_evaluation' is not supported yet")
    if name not in TASK_TYPE_ALIASES:
        registry.icl_task_types.get(name)


def _check_gauntlet_metric(name: str) -> None:
    """A name in registry.metrics: the choice rules, whose names include ``accuracy`` and ``acc``, the metrics
    that language-modeling and generation tasks report."""
    registry.metrics.get(name)


@dataclass
class ICLTaskConfig:
    label: str = option(doc="name of the task in metric keys, e.g. arc_easy")
    dataset_uri: str = option(doc="JSONL task file: local path, s3://bucket/key, or hf://org/name (online)")
    icl_task_type: Annotated[str, Check(_check_task_type)] = option(
        doc="how examples are scored: a name in registry.icl_task_types (built in: language_modeling, "
        "multiple_choice, schema, generation_task_with_answers; question_answering: llm-foundry's old name of "
        "generation_task_with_answers; code_evaluation is not supported yet)"
    )
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
        None, "report only these metrics: accuracy, acc (language modeling too), acc_norm or another choice rule in "
        "registry.metrics, expected_calibration_error (language modeling, multiple choice, schema: llm-foundry's "
        "ECE, 10 buckets; only when listed), or llm-foundry's metric class names (e.g. "
        "InContextLearningMultipleChoiceAccuracy = accuracy, InContextLearningMCExpectedCalibrationError = "
        "expected_calibration_error) (none = every metric of the task type except expected_calibration_error)"
    )
    pass_at_k: int = option(1, "code evaluation: k", unsupported="code_evaluation tasks")
    generations_per_sample: int = option(1, "code evaluation: samples per prompt", unsupported="code_evaluation tasks")
    icl_subset_num_batches: int | None = option(
        None, "evaluate only the examples of the first N batches, in file order (as llm-foundry)"
    )
    limit: int | None = option(None, "evaluate only the first N records (few-shot examples still come from all)")
    kv_cache: Literal["auto", "on", "off"] = option(
        "auto", "score a question's shared prefix once for all its choices, and pack questions into rows instead "
        "of padding them: packed rows when the model takes a 4D mask, else a copied key/value cache (under auto "
        "only where that saves >= 15% of token positions); off: every sequence run whole, padded"
    )

    def check_settings(self, path: str) -> list[str]:
        """dataset_uri: hf:// is a Hugging Face dataset and s3:// a task file; any other store URL (gs://, oci://,
        Azure, dbfs:) is an error here, never a local path."""
        uri = self.dataset_uri
        if not isinstance(uri, str) or uri.startswith("hf://") or not objectstore.is_remote(uri):
            return []
        try:
            objectstore.check_url(uri, f"{path}.dataset_uri" if path else "dataset_uri")
        except ConfigError as error:  # hf:// is valid here too: say so
            return [str(error).replace("use a local path or an s3:// URL", "use a local path, an s3:// URL or hf://")]
        return []


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
    metric: Annotated[str, Check(_check_gauntlet_metric)] = option(
        "accuracy", "which per-task metric feeds the gauntlet: accuracy, acc, acc_norm or another name in "
        "registry.metrics"
    )
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
    icl_tasks: list[ICLTaskConfig] | str | None = option(
        None, "ICL tasks: a list or the path of a YAML file (an eval recipe needs icl_tasks or an eval loader)"
    )
    eval_gauntlet: GauntletConfig | str | None = option(None, "gauntlet: a mapping or the path of a YAML file")
    icl_tasks_str: str | None = option(
        None, "llm-foundry's name for icl_tasks given as the path of a YAML file (set one of the two)"
    )
    eval_gauntlet_str: str | None = option(
        None, "llm-foundry's name for eval_gauntlet given as the path of a YAML file (set one of the two)"
    )
    eval_loader: Annotated[Component, Registered(registry.dataloaders)] | list[dict[str, Any]] | None = option(
        None, "language-modelling data (e.g. MDS text) scored with every model: metrics/eval/LanguageCrossEntropy, "
        "LanguagePerplexity, TokenAccuracy; a list of labelled loaders is eval_loaders (as in llm-foundry)"
    )
    eval_loaders: list[dict[str, Any]] | None = option(
        None, "several eval loaders, each a loader section with a 'label'; metrics are logged as "
        "metrics/eval/<label>/LanguageCrossEntropy, ... (not together with eval_loader)"
    )
    eval_subset_num_batches: int = option(
        -1, "score at most this many batches of each eval loader and each ICL task (-1 = all); as in llm-foundry, a "
        "value other than -1 also replaces icl_subset_num_batches"
    )
    max_seq_len: int = option(2048, "default context window of the tasks")
    device_eval_batch_size: int = option(16, "default sequences per forward pass")
    precision: Literal["fp32", "amp_bf16", "amp_fp16", "bf16"] = option(
        "amp_bf16", "fp32; amp_bf16/amp_fp16 = autocast with fp32 weights; bf16 = weights and math in bf16. amp_bf16 "
        "(llm-foundry's default) needs a CUDA GPU with bf16: elsewhere the models run in fp32 and a notice says so",
        differs="without a CUDA GPU with bf16, amp_bf16 evaluates in fp32 with a notice (llm-foundry refuses to run)",
    )
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
    callbacks: Annotated[dict, RegisteredMap(registry.callbacks)] = option(
        {}, "callbacks by name with their settings, as in training; their on_eval_start / on_eval_end hooks run "
        "around each model's evaluation (e.g. eval_output_logging: a table of each ICL task's outputs)"
    )
    console_log_interval: Annotated[str | int, Check(check_time)] = option(
        "1ba", "accepted for llm-foundry recipes; each model's results are printed once, when it is done (llm-foundry's "
        "eval does not pass this key to its trainer either)"
    )
    log_config: bool = option(True, "print the resolved recipe (secrets masked) and log it to every logger")
    icl_subset_num_batches: int | None = option(
        None, "evaluate only the examples of each task's first N batches, in file order (as llm-foundry)"
    )
    code_paths: list[str] = option(
        [], "Python files imported before the recipe is validated (they may register ICL task types, metrics, "
        "models, ... with llmfoundry.registry)"
    )
    fsdp_config: dict[str, Any] | None = option(
        None, "shard each model with FSDP2 across the ranks of a torchrun launch, with the training recipe's "
        "fsdp_config keys (sharding_strategy, mixed_precision, ...): for models too large for one device; the "
        "weights are read on the CPU first, then sharded onto the devices",
        differs="every rank reads the whole model into CPU memory before sharding (llm-foundry can build it on meta)",
    )
    model_gauntlet: Any = option(None, "old name of eval_gauntlet", unsupported="model_gauntlet (use eval_gauntlet)")
    python_log_level: LogLevel | None = option("info", "Python logging level (debug, info, warning, error, critical)")
    variables: dict[str, Any] = option({}, "values for ${variables.x} interpolation")
    metadata: dict[str, Any] = option({}, "free-form metadata")

    def check_settings(self, path: str) -> list[str]:
        """llm-foundry's aliases (icl_tasks_str, eval_gauntlet_str, a list under eval_loader) and eval_loaders'
        labels; something to evaluate; no 8-bit model under FSDP (as llm-foundry)."""
        prefix = f"{path}." if path else ""
        problems = finish_eval_sections(self, prefix)
        if not problems and self.icl_tasks is None and self.eval_loader is None and not self.eval_loaders:
            problems.append(f"{prefix}icl_tasks: give icl_tasks (or icl_tasks_str) or an eval_loader: there is nothing "
                            "to evaluate")
        if not problems and self.eval_gauntlet is not None and self.icl_tasks is None:
            problems.append(f"{prefix}eval_gauntlet: needs icl_tasks (the gauntlet averages ICL task accuracies)")
        if self.fsdp_config is not None:
            for i, spec in enumerate(self.models or []):
                if isinstance(spec.model, dict) and spec.model.get("load_in_8bit"):
                    problems.append(f"{prefix}models[{i}].model.load_in_8bit: cannot be sharded with fsdp_config "
                                    "(as in llm-foundry); remove one of the two")
        return problems


def _read_yaml_file(path: str, key: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{key}: no such file '{path}' (give a list inline or the path of a YAML file)")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{key}: '{path}' is not valid YAML: {str(error).splitlines()[0]}") from None
    return data


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


# The metrics of the tasks that are scored greedily or by generation (ICLTask.scoring); tasks scored by choices
# report every choice rule in registry.metrics.
SCORING_METRICS = {"greedy": ("accuracy", "acc"), "generation": ("accuracy",)}
# llm-foundry's metric class names: each is our `accuracy` of the tasks scored one way
LLM_FOUNDRY_METRICS = {
    "InContextLearningLMAccuracy": "greedy",
    "InContextLearningMultipleChoiceAccuracy": "choices",
    "InContextLearningGenerationExactMatchAccuracy": "generation",
    "InContextLearningGenerationAccuracy": "generation",
    "InContextLearningQAAccuracy": "generation",
}


# llm-foundry's expected calibration error metrics, by the scoring of the tasks they apply to; computed only when
# a task's metric_names asks for one, as in llm-foundry, and reported as `expected_calibration_error`
CALIBRATION = "expected_calibration_error"
CALIBRATION_METRICS = {
    "InContextLearningLMExpectedCalibrationError": "greedy",
    "InContextLearningMCExpectedCalibrationError": "choices",
    "lm_expected_calibration_error": "greedy",
    "mc_expected_calibration_error": "choices",
}


def headline_first(names: Iterable[str]) -> list[str]:
    """Metric names in the order they are shown: llm-foundry's ``accuracy`` (the headline number), then by name."""
    return sorted(names, key=lambda name: (name != "accuracy", name))


def reported_metrics(scoring: str) -> list[str]:
    """The metrics of tasks scored this way (ICLTask.scoring)."""
    if scoring == "choices":
        return headline_first(registry.metrics.names())
    return list(SCORING_METRICS[scoring])


def selected_metrics(task: ICLTaskConfig) -> set[str] | None:
    """The metrics ``metric_names`` keeps (None = all): our names, or llm-foundry's class names mapped to ours."""
    if task.metric_names is None:
        return None
    return {"accuracy" if n in LLM_FOUNDRY_METRICS else CALIBRATION if n in CALIBRATION_METRICS else n
            for n in task.metric_names}


def wants_calibration(task: ICLTaskConfig) -> bool:
    """Whether the task's metric_names asks for the expected calibration error."""
    return CALIBRATION in (selected_metrics(task) or ())


def _check_metric_names(task: ICLTaskConfig, path: str) -> None:
    if task.metric_names is None:
        return
    scoring = registry.icl_task_types.get(task.icl_task_type, key=f"{path}.icl_task_type").builder.scoring
    available = reported_metrics(scoring)
    problems = []
    if scoring in ("greedy", "choices"):
        available = [*available, CALIBRATION]
    llm_foundry_names = {**LLM_FOUNDRY_METRICS, **CALIBRATION_METRICS}
    for name in task.metric_names:
        if name in llm_foundry_names:
            if llm_foundry_names[name] != scoring:
                problems.append(f"{path}.metric_names: {name} does not apply to {task.icl_task_type} tasks "
                                f"({task.label})")
        elif name not in available:
            known = [*available, *(n for n, kind in llm_foundry_names.items() if kind == scoring)]
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
    if task.icl_task_type in TASK_TYPE_ALIASES:
        new_name = TASK_TYPE_ALIASES[task.icl_task_type]
        log.warning("%s.icl_task_type: '%s' is llm-foundry's deprecated name of '%s' (%s)", path,
                    task.icl_task_type, new_name, task.label)
        task.icl_task_type = new_name
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
            tasks.append(_finish_task(validate(_normalise_task(raw), ICLTaskConfig, path), path))
        except ConfigError as error:
            problems.extend(error.problems)
    if problems:
        raise ConfigError.many(problems)
    labels = [t.label for t in tasks]
    duplicates = sorted({lab for lab in labels if labels.count(lab) > 1})
    if duplicates:
        raise ConfigError(f"{key}: task labels must be unique; repeated: {', '.join(duplicates)}")
    for i, task in enumerate(tasks):
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
    return validate(value, GauntletConfig, key)


def load_eval_config(data: dict[str, Any]) -> EvalConfig:
    """The validated ``llmfoundry eval`` recipe, with ``icl_tasks``/``eval_gauntlet`` paths read and the
    ``code_paths`` imported first (what they register must be known to the validator)."""
    registry.import_code_paths(data.get("code_paths"))
    data = dict(data)
    if isinstance(data.get("icl_tasks"), list):
        problems = [p for i, t in enumerate(data["icl_tasks"]) for p in _raw_task_problems(t, f"icl_tasks[{i}]")]
        if problems:
            raise ConfigError.many(problems)
        data["icl_tasks"] = [_normalise_task(t) for t in data["icl_tasks"]]
    cfg = validate(data, EvalConfig, "")
    cfg.icl_tasks = load_icl_tasks(cfg.icl_tasks)
    cfg.eval_gauntlet = load_gauntlet(cfg.eval_gauntlet)
    if not cfg.models:
        raise ConfigError("models: give at least one model to evaluate")
    check_models(cfg.models)
    return cfg
