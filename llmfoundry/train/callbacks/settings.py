"""The config sections of the built-in callbacks, checked before anything runs.

Kept apart from the callbacks themselves, which need torch, so that checking a recipe does not load it: each
callback's module imports its settings from here (what a callback does with its keys is described there).
``unavailable`` holds the settings of the callbacks that are refused.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, fields
from typing import Any, Literal

from llmfoundry.config.checks import PositiveInt, TimeString
from llmfoundry.config.fields import option
from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.timeunits import Time

# -- monitoring: throughput, time, memory, norms ------------------------------------------------------------------

TimeUnit = Literal["seconds", "minutes", "hours", "days"]
SECONDS_PER_UNIT = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}


@dataclass
class SpeedMonitorSettings:
    window_size: int = option(100, "number of batches in the rolling average of throughput (logged once the "
                                   "window is full)")
    gpu_flops_available: float | None = option(None, "per-device peak FLOP/s for throughput/device/mfu (default: "
                                                     "from the GPU's name and the run's precision; none on a CPU)")
    time_unit: TimeUnit = option("hours", "unit of time/train, time/val and time/total: seconds, minutes, hours "
                                          "or days")

    def check_settings(self, path: str) -> list[str]:
        problems = []
        if self.window_size < 1:
            problems.append(f"{path}.window_size: must be at least 1, got {self.window_size}")
        if self.gpu_flops_available is not None and self.gpu_flops_available < 0:
            problems.append(f"{path}.gpu_flops_available: must be a FLOP/s count >= 0, got "
                            f"{self.gpu_flops_available}")
        return problems


@dataclass
class RuntimeEstimatorSettings:
    skip_batches: int = option(1, "leave the first batches (compilation, warm-up) out of the estimate")
    time_unit: TimeUnit = option("hours", "unit of time/remaining_estimate: seconds, minutes, hours or days")

    def check_settings(self, path: str) -> list[str]:
        if self.skip_batches < 0:
            return [f"{path}.skip_batches: must be >= 0, got {self.skip_batches}"]
        return []


@dataclass
class LRMonitorSettings:
    pass


@dataclass
class MemoryMonitorSettings:
    memory_keys: dict[str, str] | None = option(None, "torch.cuda.memory_stats() entries to log, each mapped to "
                                                      "the name it is logged under as memory/<name> (default: "
                                                      "Composer's nine: current_/peak_ allocated, active, inactive, "
                                                      "reserved _mem, and alloc_retries)")
    dist_aggregate_batch_interval: int | None = option(None, "every this many batches also log each statistic's "
                                                             "_avg, _min and _max over all ranks (default: never)")
    interval: int = option(1, "log every this many batches (not a Composer key: Composer logs every batch)")

    def check_settings(self, path: str) -> list[str]:
        problems = []
        if self.interval < 1:
            problems.append(f"{path}.interval: must be at least 1, got {self.interval}")
        if self.dist_aggregate_batch_interval is not None and self.dist_aggregate_batch_interval < 1:
            problems.append(f"{path}.dist_aggregate_batch_interval: must be at least 1 (or null to never "
                            f"aggregate), got {self.dist_aggregate_batch_interval}")
        return problems


NOT_UPLOADED = ("Composer uploads the files through an object-store logger (remote_uploader_downloader), which "
                "this project does not have: they stay in folder")


@dataclass
class MemorySnapshotSettings:
    skip_batches: int = option(1, "batches to run before recording starts")
    interval: str | int = option("3ba", "how long to record (batches; an int is batches)")
    max_entries: PositiveInt = option(100000, "allocation events kept")
    folder: str = option("{run_name}/torch_traces", "where the snapshot files go")
    filename: str = option("rank{rank}.{batch}.memory_snapshot", "name of the files, without suffix")
    remote_file_name: str | None = option("{run_name}/torch_memory_traces", "where Composer uploads the files",
                                          differs=NOT_UPLOADED)
    overwrite: bool = option(False, "allow a folder that already holds files")

    def check_settings(self, path: str) -> list[str]:
        try:
            unit = Time.parse(f"{self.interval}ba" if isinstance(self.interval, int) else self.interval).unit
        except ValueError as error:
            return [f"{path}.interval: {error}"]
        return [] if unit == "ba" else [f"{path}.interval: must be in batches (e.g. '3ba'), got '{self.interval}'"]


@dataclass
class OOMObserverSettings:
    max_entries: PositiveInt = option(100000, "allocation events kept")
    folder: str = option("{run_name}/torch_traces", "where the files go when CUDA runs out of memory")
    filename: str = option("rank{rank}_oom", "prefix of the files")
    remote_file_name: str | None = option("{run_name}/oom_traces/rank{rank}_oom", "where Composer uploads the files",
                                          differs=NOT_UPLOADED)
    overwrite: bool = option(False, "allow a folder that already holds files")


@dataclass
class OptimizerMonitorSettings:
    log_optimizer_metrics: bool = option(True, "also log the moment, parameter and update norms (Adam and Lion "
                                               "optimizers)")
    batch_log_interval: PositiveInt = option(10, "log every this many batches")


@dataclass
class TokPerExpertSettings:
    log_interval: PositiveInt = option(10, "batches between logs")
    log_every_layer: bool = option(False, "also log each layer's statistics (mb_moe/layer<i>_<stat>_tpe)")
    all_reduce_stats: bool = option(False, "sum the counts over every rank (else this rank's, logged by rank 0)")
    normalize: bool = option(True, "counts as a fraction of the layer's tokens (else raw token counts)")


@dataclass
class LossPerpVLenSettings:
    log_batch_interval: PositiveInt = option(doc="log the collected rows every this many batches")
    compute_batch_interval: PositiveInt = option(doc="measure every this many batches (at most log_batch_interval)")
    ignore_index: int = option(-100, "the label of positions without a target")

    def check_settings(self, path: str) -> list[str]:
        if self.compute_batch_interval > self.log_batch_interval:
            return [f"{path}.compute_batch_interval: {self.compute_batch_interval} is longer than "
                    f"log_batch_interval {self.log_batch_interval} (measure at least as often as you log)"]
        return []


@dataclass
class FDiffSettings:
    diff_train_metrics: bool = option(False, "log loss/train/total_fdiff and metrics/train/<name>_fdiff")
    diff_eval_metrics: bool = option(True, "log <eval metric>_fdiff after each evaluation")


# -- the machine ----------------------------------------------------------------------------------------------------


@dataclass
class SystemMetricsMonitorSettings:
    log_all_data: bool = option(False, "log each rank's GPU metrics, not only the minimum and maximum")


@dataclass
class EnvLoggingSettings:
    workspace_dir: str = option("/workspace", "folder whose git repositories (its subfolders) are logged")
    log_git: bool = option(True, "commit and branch of each repository under workspace_dir")
    log_nvidia: bool = option(True, "CUDA, cuDNN and NCCL versions")
    log_docker: bool = option(True, "the run's Docker image", differs="the image is looked up on the MosaicML "
                                                                     "platform (mcli) in llm-foundry; not logged here")
    log_packages: bool = option(True, "versions of packages_to_log")
    log_system: bool = option(False, "Python, OS, host name, CPU and memory")
    log_gpu: bool = option(False, "GPU model, count and memory")
    log_distributed: bool = option(False, "world size, local world size, rank and local rank")
    packages_to_log: list[str] | None = option(None, "packages whose versions are logged (default: llm-foundry's "
                                                     "list and llmfoundry)")


@dataclass
class ScheduledGCSettings:
    batch_interval: PositiveInt = option(doc="batches between full collections (gc.collect())")
    gen_1_batch_interval: PositiveInt | None = option(None, "batches between generation-1 collections "
                                                            "(gc.collect(1)); null = none")
    eval_keep_disabled: bool = option(False, "keep automatic collection off during evaluation too")


@dataclass
class RunTimeoutSettings:
    timeout: PositiveInt = option(1800, "seconds the process may live on after training ends before it is "
                                        "interrupted (SIGINT)")


# -- watching the loss, stopping --------------------------------------------------------------------------------------

MIN_WINDOW_SIZE = 100  # llm-foundry's defaults, and the rule that grows the window with the run
MAX_LOSS_CAP = 10.0


@dataclass
class NaNMonitorSettings:
    pass


@dataclass
class KillLossSpikeSettings:
    log_only: bool = option(True, "true: only log a warning; false: stop the run with an error")
    patience: int = option(4, "outliers in a row tolerated before it is a loss spike")
    outlier_multiplier: float = option(2.0, "a loss this many times the window's mean is an outlier")
    window_size: PositiveInt = option(MIN_WINDOW_SIZE, "losses in the window (left at 100: 5% of the run's "
                                                       "batches, at least 100)")
    loss_cap: float = option(MAX_LOSS_CAP, "a loss above this is high (left at 10: the first window's largest "
                                           "loss, at most 10)")


@dataclass
class LossSpikeGuardSettings:
    action: Literal["stop", "skip", "checkpoint"] = option(
        "stop", "stop = end training with an error; skip = drop the batch's update; checkpoint = drop the batch's "
        "update, save a checkpoint and stop with an error (resuming goes on after the batch)")
    check_nan: bool = option(True, "treat a NaN/inf loss as a spike")
    spike_factor: float | None = option(3.0, "a loss above this multiple of the recent mean is a spike (null = off)")
    window: int = option(20, "number of recent losses in the mean")
    min_history: int = option(5, "no spike detection before this many losses")
    max_consecutive_skips: int = option(5, "with action: skip, stop after this many skipped batches in a row")


@dataclass
class EarlyStopperSettings:
    monitor: str = option(doc="the metric's name, e.g. LanguageCrossEntropy or InContextLearningLMAccuracy")
    dataloader_label: str = option(doc="where the metric comes from: eval, eval/<eval_loaders label>, an ICL "
                                       "metric's prefix (icl/...), or train")
    comp: str | None = option(None, "gt/greater (higher is better) or lt/less; default: less when the name "
                                    "contains loss, error or perplexity, else greater")
    min_delta: float = option(0.0, "a new best must beat the old one by more than this")
    patience: Any = option(1, "how long the metric may not improve: an int (epochs) or a time string in ba or ep")

    def check_settings(self, path: str) -> list[str]:
        problems = []
        if self.comp is not None and self.comp.lower() not in ("gt", "greater", "lt", "less"):
            problems.append(f"{path}.comp: '{self.comp}' is not gt, greater, lt or less")
        try:
            patience = parse_patience(self.patience)
        except ValueError as error:
            return problems + [f"{path}.patience: {error}"]
        if self.dataloader_label == "train" and patience.unit != "ba":
            problems.append(f"{path}.patience: with dataloader_label train it must be in batches here (e.g. "
                            "'500ba'): this trainer has no per-epoch train metrics")
        return problems


def parse_patience(value: Any) -> Time:
    """early_stopper's patience as a Time in batches or epochs; ValueError says what is wrong with it."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"expected an int (epochs) or a time string such as '500ba', got {value!r}")
    patience = Time.parse(value)  # an int is epochs
    if patience.unit not in ("ba", "ep"):
        raise ValueError(f"must be in batches or epochs (ba, ep), got '{value}'")
    return patience


# -- changing a resumed run ------------------------------------------------------------------------------------------


@dataclass
class GlobalLRScalingSettings:
    lr_scale: float = option(doc="multiply the learning rate (and its schedule) by this")
    wd_pct: float = option(0.0, "the new weight decay as a fraction of the (scaled) learning rate")


@dataclass
class LayerFreezingSettings:
    layer_names: list[str] = option(doc="parameters to freeze, by name (llm-foundry's model.... names or this "
                                        "model's own)")


# -- what the model produces: generations, eval outputs ---------------------------------------------------------------

GENERATE_OWN_KEYS = ("prompts", "interval", "batch_size")  # the callback's keys; the others go to generate


@dataclass
class GenerateSettings:
    prompts: list[str] = option(doc="the prompts to complete")
    interval: str | int = option(doc="how often, e.g. 500ba or 1ep (an int is epochs); also at the end of training")
    batch_size: int | None = option(None, "prompts per generate call (default: all at once)")
    max_new_tokens: int | None = option(None, "generate's max_new_tokens")
    min_new_tokens: int | None = option(None, "generate's min_new_tokens")
    do_sample: bool | None = option(None, "generate's do_sample (sampling rather than greedy)")
    temperature: float | None = option(None, "generate's temperature")
    top_k: int | None = option(None, "generate's top_k")
    top_p: float | None = option(None, "generate's top_p")
    num_beams: int | None = option(None, "generate's num_beams")
    repetition_penalty: float | None = option(None, "generate's repetition_penalty")
    no_repeat_ngram_size: int | None = option(None, "generate's no_repeat_ngram_size")
    use_cache: bool | None = option(None, "generate's use_cache")
    eos_token_id: int | None = option(None, "generate's eos_token_id")
    pad_token_id: int | None = option(None, "generate's pad_token_id")

    def check_settings(self, path: str) -> list[str]:
        problems = [] if self.prompts else [f"{path}.prompts: give at least one prompt"]
        if self.batch_size is not None and self.batch_size <= 0:
            problems.append(f"{path}.batch_size: must be positive, got {self.batch_size}")
        return problems

    def generate_kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in GENERATE_OWN_KEYS and getattr(self, f.name) is not None}


@dataclass
class EvalOutputLoggingSettings:
    log_tokens: bool = option(False, "also log the input token ids")
    log_output_text: bool | None = option(None, "log the generated text of generation tasks (default: yes)")


# -- checkpoints beside the run's own --------------------------------------------------------------------------------

# the fields a file or folder name may use: Composer's format_name_with_dist_and_time names this trainer tracks
NAME_FIELDS = ("run_name", "rank", "world_size", "epoch", "batch", "batch_in_epoch", "sample", "token")
LOAD_EVENTS = ("init", "before_load", "after_load", "fit_start")  # Composer's events that happen before training here


def _save_folder_problems(save_folder: str, key: str, stores: tuple[str, ...] = (objectstore.S3,)) -> list[str]:
    """A save_folder URL that is not a valid bucket URL of one of ``stores``, as one message (a local folder is
    always fine)."""
    if objectstore.is_remote(save_folder):
        try:
            objectstore.check_url(save_folder, key, stores)
        except ConfigError as error:
            return [str(error)]
    return []


@dataclass
class MonoCheckpointSaverSettings:
    save_folder: str = option(doc="where the files go, a local folder or s3://bucket/prefix")
    batch_interval: int = option(doc="write one every this many batches (and at the end of training)")
    filename: str = option("ep{epoch}-ba{batch}.pt", "the file's name; may use " +
                           ", ".join("{" + name + "}" for name in NAME_FIELDS))
    overwrite: bool = option(False, "in an object store, replace an existing file of the same name (false: an "
                                    "error); a local file is replaced either way, as in llm-foundry")
    keep_optimizers: bool = option(False, "also save the optimizer state",
                                   unsupported="optimizer state in the monolithic file (it is in the run's own "
                                               "checkpoints: save_folder)")

    def check_settings(self, path: str) -> list[str]:
        problems = [] if self.batch_interval > 0 else [f"{path}.batch_interval: must be positive"]
        return problems + _save_folder_problems(self.save_folder, f"{path}.save_folder")


@dataclass
class LoadCheckpointSettings:
    load_path: str = option(doc="the checkpoint: ours or Composer's, a local path or s3://")
    load_weights_only: bool = option(False, "load only the model weights (not optimizer, schedule, time, data "
                                            "position)")
    strict_model_weights: bool = option(True, "the checkpoint's weights must match the model's exactly")
    ignore_keys: list[str] | None = option(None, "Composer's state keys not to load (as load_ignore_keys)")
    event: str = option("BEFORE_LOAD", "when to load: before_load (only when the run loads no checkpoint of its "
                                       "own), after_load or fit_start (over the run's own)")

    def check_settings(self, path: str) -> list[str]:
        if self.event.lower() not in LOAD_EVENTS:
            return [f"{path}.event: '{self.event}' is not supported here (use {', '.join(LOAD_EVENTS)}: loading "
                    "during training, at another event, is not done by this trainer)"]
        return []


@dataclass
class HFCheckpointerSettings:
    save_folder: str = option(doc="where the exports go, a local folder or an object store (s3://, gs://, "
                                  "Azure, oci://); each one is "
                                  "save_folder/huggingface/{huggingface_folder_name}")
    save_interval: TimeString = option("1dur", "how often to export, e.g. 1000ba (and always at the end of training)")
    huggingface_folder_name: str = option(
        "ba{batch}", "name of each export under save_folder/huggingface/; may use " +
        ", ".join("{" + name + "}" for name in NAME_FIELDS)
    )
    precision: Literal["fp32", "bf16", "fp16", "float32", "bfloat16", "float16"] = option(
        "float32", "dtype of the exported weights"
    )
    overwrite: bool = option(True, "replace an export of the same name (false: an existing one is an error)")
    mlflow_registered_model_name: str | None = option(
        None, "register the final model in MLflow's model registry under this name",
        unsupported="registering models in MLflow (mlflow_registered_model_name)"
    )
    mlflow_logging_config: dict[str, Any] | None = option(
        None, "arguments of MLflow's save_model when registering",
        unsupported="registering models in MLflow (mlflow_logging_config)"
    )
    final_register_only: bool = option(
        False, "only register the final model in MLflow, without exporting it; without "
        "mlflow_registered_model_name it falls back to exporting, with a warning (as in llm-foundry)"
    )
    register_wait_seconds: int = option(7200, "how long to wait for MLflow registration at the end (used only "
                                              "when registering)")
    flatten_imports: list[str] = option(
        ["llmfoundry"], "import prefixes flattened in the custom MPT code files llm-foundry writes",
        differs="no effect: exports use transformers' own classes and contain no custom code to flatten"
    )

    def check_settings(self, path: str) -> list[str]:
        problems = _save_folder_problems(self.save_folder, f"{path}.save_folder", objectstore.CHECKPOINT_STORES)
        try:
            names = [field for _, field, _, _ in string.Formatter().parse(self.huggingface_folder_name) if field]
        except ValueError as error:
            names = [f"unbalanced braces: {error}"]
        for name in names:
            if name not in NAME_FIELDS:
                problems.append(f"{path}.huggingface_folder_name: '{{{name}}}' in '{self.huggingface_folder_name}' "
                                f"is not known (use {', '.join('{' + n + '}' for n in NAME_FIELDS)})")
        return problems
