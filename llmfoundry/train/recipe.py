"""The typed schema of a training recipe, with llm-foundry's key names.

Sections chosen by name (model, train_loader, optimizer, ...) are validated against the dataclass that the named
builder registered (see llmfoundry.registry). Run-level keys are declared here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from llmfoundry import registry
from llmfoundry.config.checks import LogLevel, PositiveFloat, PositiveInt
from llmfoundry.config.load import load_config
from llmfoundry.config.fields import option
from llmfoundry.config.validate import Check, Component, Registered, RegisteredMap, to_plain, validate
from llmfoundry.core import objectstore
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.timeunits import Time, check_time
from llmfoundry.data.prep.quickstart_settings import PrepareDataConfig
from llmfoundry.eval.config import GauntletConfig, ICLTaskConfig
from llmfoundry.train import compat
from llmfoundry.train.preemption_protocol import parse_wallclock, signal_number
from llmfoundry.train.profiling import ProfilerConfig
from llmfoundry.train.settings import CheckpointUploadConfig, CompileConfig, FSDPConfig, TPConfig

__all__ = ["TrainConfig", "TokenizerConfig", "PrepareDataConfig", "validate", "to_plain", "Component",
           "load_train_config", "validate_train_config", "cuda_environment"]

# A time string, or a bare int meaning epochs (as llm-foundry recipes write them).
Interval = Annotated[str | int, Check(check_time)]


def _check_duration(text: str | int) -> None:
    """A time string, and not in dur: max_duration is what "dur" is a fraction of."""
    if Time.parse(text).unit == "dur":
        raise ValueError("cannot be given in dur (use ba, ep, tok or sp)")


Duration = Annotated[str | int, Check(_check_duration)]
# llm-foundry allows a float (for sequence parallelism); here a microbatch is a whole number of samples.
MicrobatchSize = Annotated[int | float | Literal["auto"], Check(compat.check_microbatch_size)]


@dataclass(kw_only=True)
class TokenizerConfig:
    name: str = option(doc="Hugging Face tokenizer folder or hub id, a SentencePiece .model file, or 'tiktoken'")
    kwargs: dict[str, Any] = option(default_factory=dict, doc="passed to the tokenizer (e.g. model_max_length)")


@dataclass(kw_only=True)
class TrainConfig:
    # --- what to train ---
    model: Annotated[Component, Registered(registry.models)] = option(doc="the model: name + its settings")
    tokenizer: TokenizerConfig = option(doc="the tokenizer")
    max_seq_len: PositiveInt = option(doc="sequence length of training samples")
    train_loader: Annotated[Component, Registered(registry.dataloaders)] = option(doc="training data loader")
    eval_loader: Annotated[Component, Registered(registry.dataloaders)] | list[dict[str, Any]] | None = option(
        None, "evaluation data loader (loss and perplexity every eval_interval); a list of labelled loaders is "
        "eval_loaders (as in llm-foundry)"
    )
    eval_loaders: list[dict[str, Any]] | None = option(
        None, "several evaluation loaders, each a loader section with a 'label'; metrics are logged as "
        "metrics/eval/<label>/LanguageCrossEntropy, ... (not together with eval_loader)"
    )
    prepare_data: PrepareDataConfig | None = option(None, "data to build before training when missing")
    optimizer: Annotated[Component, Registered(registry.optimizers)] = option(doc="optimizer: name + settings")
    scheduler: Annotated[Component, Registered(registry.schedulers)] | None = option(
        None, "learning-rate schedule: name + settings (none = constant)"
    )
    algorithms: Annotated[dict, RegisteredMap(registry.algorithms)] = option(
        default_factory=dict, doc="training algorithms by name, e.g. gradient_clipping"
    )
    # --- how long, how big ---
    max_duration: Duration = option(doc="training length: e.g. 4800ba, 1ep, 2000000tok")
    global_train_batch_size: PositiveInt = option(doc="samples per optimizer step, summed over all ranks")
    device_train_microbatch_size: MicrobatchSize = option(
        "auto", "samples per forward/backward on one device; gradients accumulate up to the batch ('auto' = "
        "the whole per-device batch, halved on CUDA out-of-memory; a float must be a whole number, e.g. 4.0)"
    )
    accumulate_train_batch_on_tokens: bool = option(
        True, "true = the loss of a batch split into microbatches is the mean over all its target tokens; false "
        "= each microbatch's mean loss weighted by its samples (Composer's older rule)"
    )
    train_subset_num_batches: int = option(-1, "end each epoch after at most this many batches (-1 = all)")
    spin_dataloaders: bool = option(
        True, "Composer fast-forwards the train loader on resume; here it always resumes from its saved sample "
        "position (false is accepted, with a notice that it changes nothing)",
        differs="the train loader resumes from its saved sample position whatever the value",
    )
    device_eval_batch_size: PositiveInt = option(8, "samples per evaluation forward on one device")
    precision: Literal["fp32", "amp_bf16", "amp_fp16", "bf16", "amp_fp8"] = option(
        "amp_bf16", "fp32; amp_bf16/amp_fp16 = autocast with fp32 weights; bf16 = weights and math in bf16; "
        "amp_fp8 = float8 matmuls in the blocks' Linear layers through torchao (the float8 extra; a CUDA GPU of "
        "compute capability 8.9+, e.g. H100), the rest as amp_bf16. amp_bf16 (llm-foundry's default) needs a CUDA "
        "GPU with bf16: elsewhere the run uses fp32 and says so once",
        differs="without a CUDA GPU with bf16, amp_bf16 trains in fp32 with a notice (llm-foundry refuses to run); "
        "amp_fp8 runs through torchao's Float8Linear, not TransformerEngine",
    )
    seed: int = option(17, "random seed for weights, data order and dropout")
    # --- evaluation ---
    eval_interval: Interval = option("1ep", "how often to evaluate, e.g. 500ba (0 = never, not even at the end)")
    eval_first: bool = option(False, "evaluate before the first training batch")
    eval_subset_num_batches: int = option(-1, "evaluate on at most this many batches (-1 = all)")
    icl_tasks: list[ICLTaskConfig] | str | None = option(
        None, "in-context-learning tasks run at every evaluation: a list, or the path of a YAML file with icl_tasks"
    )
    icl_subset_num_batches: int | None = option(
        None, "score only the first N batches of each ICL task, in file order (none = all)"
    )
    icl_seq_len: int | None = option(None, "context window of ICL tasks that set none (default: max_seq_len)")
    eval_gauntlet: GauntletConfig | str | None = option(
        None, "eval gauntlet over the ICL tasks: a mapping, or the path of a YAML file with eval_gauntlet"
    )
    icl_tasks_str: str | None = option(
        None, "llm-foundry's name for icl_tasks given as the path of a YAML file (set one of the two)"
    )
    eval_gauntlet_str: str | None = option(
        None, "llm-foundry's name for eval_gauntlet given as the path of a YAML file (set one of the two)"
    )
    # --- parallelism ---
    fsdp_config: FSDPConfig | None = option(
        None, "shard the model with FSDP2 (fully_shard per block, then the root); none = DDP on several ranks"
    )
    tp_config: TPConfig | None = option(
        None, "tensor parallelism of the MPT blocks on a (dp, tp) mesh with fsdp_config across the TP groups"
    )
    compile_config: CompileConfig | None = option(
        None, "torch.compile each block, or the whole model with scope: model ({} = defaults; none = eager)")
    dist_timeout: PositiveFloat = option(600.0, "seconds to wait for other ranks before failing")
    # --- logging ---
    run_name: str | None = option(
        None, "name of the run (default: $RUN_NAME, else $COMPOSER_RUN_NAME, else a timestamp); replaces "
        "{run_name} in save_folder, load_path, callbacks.hf_checkpointer.save_folder and loggers.jsonl.path"
    )
    callbacks: Annotated[dict, RegisteredMap(registry.callbacks)] = option(
        default_factory=dict, doc="callbacks by name with their settings"
    )
    loggers: Annotated[dict, RegisteredMap(registry.loggers)] = option(
        default_factory=dict, doc="loggers by name with their settings (wandb, jsonl, ...)"
    )
    progress_bar: bool = option(True, "show a progress bar")
    log_to_console: bool = option(True, "print metrics to the console")
    console_log_interval: Interval = option(
        "1ba", "how often to print metrics (tok / sp: when the tokens or samples trained cross a multiple of it, as "
        "for eval_interval; Composer's console logger accepts only ba and ep)"
    )
    python_log_level: LogLevel | None = option(None, "level of Python logging for llmfoundry (debug, info, ...)")
    # --- checkpoints ---
    save_folder: str | None = option(
        None, "where checkpoints go (local folder, s3://bucket/path, gs://bucket/path or azure://container/path; "
        "{run_name} becomes the run's name)"
    )
    save_interval: Interval = option("1000ba", "how often to save a checkpoint")
    save_num_checkpoints_to_keep: int = option(-1, "keep the newest N checkpoints (-1 = all)")
    save_overwrite: bool = option(False, "allow overwriting checkpoints already in save_folder")
    save_weights_only: bool = option(False, "save model weights only (no optimizer state; resuming restarts the optimizer)")
    save_async: bool = option(
        False, "write checkpoints in the background: training waits only while the state is copied to host memory "
        "(one more host copy of model and optimizer state), then the checkpoint is written (and uploaded) by a "
        "thread and appears in save_folder/latest once complete; an llmfoundry extension (llm-foundry has no such "
        "key)"
    )
    checkpoint_upload: CheckpointUploadConfig = option(
        default_factory=CheckpointUploadConfig, doc="staging and retries for an s3:// save_folder"
    )
    load_path: str | None = option(None, "checkpoint to start from (a checkpoint folder or a save_folder; local, "
                                         "s3://, gs://, azure://, oci:// or hf://, read-only)")
    load_weights_only: bool = option(False, "load only model weights from load_path (fresh optimizer and time)")
    load_strict_model_weights: bool = option(True, "fail when load_path lacks or adds model weights")
    autoresume: bool = option(False, "resume from the newest complete checkpoint in save_folder")
    # --- preemption (train/preemption.py; the Slurm and Kubernetes set-ups in docs/clusters.md) ---
    preemption_signal: Annotated[str, Check(signal_number)] | None = option(
        "SIGUSR2", "signal that stops training at the next agreed batch with a checkpoint and exit code 75 (requeue "
        "me); SIGTERM always does the same with exit code 143 (cancelled); none = only SIGTERM"
    )
    preemption_check_interval: PositiveInt = option(
        5, "batches between the ranks' agreement on a stop request (one all-reduce of two numbers)"
    )
    exit_before_walltime: Annotated[str | int | float, Check(parse_wallclock)] | None = option(
        None, "stop with a checkpoint and exit code 75 this long (e.g. 10m, 300s) before the job's end time "
        "($SLURM_JOB_END_TIME, or $LLMFOUNDRY_JOB_END_TIME in seconds since the epoch)"
    )
    log_config: bool = option(True, "log the resolved config (secrets masked) to every logger at the start")
    # --- code and process settings ---
    code_paths: list[str] = option(
        default_factory=list, doc="Python files imported before the recipe is validated (they may register "
        "models, loaders, callbacks, ... with llmfoundry.registry)"
    )
    max_split_size_mb: PositiveInt | None = option(
        None, "CUDA caching allocator: do not split blocks larger than this (PYTORCH_CUDA_ALLOC_CONF)"
    )
    expandable_segments: bool = option(
        True, "CUDA caching allocator: expandable segments, less fragmentation (PYTORCH_CUDA_ALLOC_CONF)"
    )
    cuda_load_lazy: bool = option(False, "load CUDA kernels on first use (CUDA_MODULE_LOADING=LAZY)")
    # --- free-form ---
    variables: dict[str, Any] = option(default_factory=dict, doc="values for ${variables.x} interpolation")
    metadata: dict[str, Any] = option(default_factory=dict, doc="free-form metadata logged with the run's config")
    flatten_metadata: bool = option(
        True, "log metadata's keys at the top level of the logged config (an error if one is already a key "
        "there); false = log them under 'metadata'"
    )
    profiler: ProfilerConfig | None = option(
        None, "torch.profiler traces of chosen training batches",
        differs="torch.profiler Chrome traces only: no Composer event trace or system statistics",
    )
    only_hf_checkpoint: bool = option(
        False, "build the model (and load load_path), write a Hugging Face folder through the hf_checkpointer "
        "callback, and stop without training"
    )
    only_composer_checkpoint: bool = option(
        False, "build the model (and load load_path), save one checkpoint to save_folder, and stop without training",
        differs="the checkpoint is this trainer's DCP folder (save_folder/ep{epoch}-ba{batch}), not a Composer .pt",
    )
    # --- llm-foundry keys mapped onto this trainer (see train/compat.py) ---
    save_filename: str | None = option(
        None, "Composer's checkpoint file pattern: only its default ep{epoch}-ba{batch}-rank{rank}.pt is accepted "
        "(checkpoints here are folders named ep{epoch}-ba{batch})",
        differs="checkpoints are folders save_folder/ep{epoch}-ba{batch}; other patterns are refused",
    )
    save_latest_filename: str | None = option(
        None, "Composer's 'latest' file pattern: only its defaults latest-rank{rank}.pt / latest-sharded-rank{rank} "
        "are accepted (save_folder/latest names the newest checkpoint)",
        differs="save_folder/latest names the newest checkpoint; other patterns are refused",
    )
    save_ignore_keys: list[str] | None = option(
        None, "glob patterns of state left out of saved checkpoints, in Composer's key names: state/model/<param>, "
        "state/optimizers, state/schedulers, state/timestamp, state/train_dataloader, rng, "
        "state/callbacks/<state_name> (a callback's own state)",
        differs="Composer's state names are mapped onto this checkpoint's sections (see the doc)",
    )
    load_ignore_keys: list[str] | None = option(
        None, "glob patterns (as save_ignore_keys) of state not restored from load_path: that state keeps its "
        "fresh value",
        differs="Composer's state names are mapped onto this checkpoint's sections (see save_ignore_keys)",
    )
    device_train_batch_size: int | float | None = option(
        None, "derived by llm-foundry (global_train_batch_size / world size); accepted when it matches"
    )
    device_train_grad_accum: int | str | None = option(
        None, "derived by llm-foundry (microbatches per device batch, or 'auto'); accepted when it matches"
    )
    n_gpus: int | None = option(None, "derived by llm-foundry (the world size); accepted when it matches")

    def check_settings(self, path: str) -> list[str]:
        """Keys that need one another, and store URLs we cannot use, reported before anything is built."""
        prefix = f"{path}." if path else ""
        problems = compat.finish_recipe(self, prefix)
        for key, url, stores in (("save_folder", self.save_folder, objectstore.CHECKPOINT_STORES),
                                 ("load_path", self.load_path, objectstore.SOURCES)):  # hf:// is read, never written
            if objectstore.is_remote(url):
                try:
                    objectstore.check_url(url, prefix + key, stores)
                except ConfigError as error:
                    problems.append(str(error))
        if self.autoresume and not self.save_folder:
            problems.append(f"{prefix}autoresume: needs save_folder (the folder to resume from)")
        if self.eval_gauntlet is not None and not self.icl_tasks and not problems:
            problems.append(f"{prefix}eval_gauntlet: needs icl_tasks (the gauntlet averages ICL task accuracies)")
        return problems


def validate_train_config(plain: dict) -> TrainConfig:
    """``plain`` (a resolved recipe) validated, its code_paths imported first: what they register must be known to
    the validator. Launchers that ship a resolved recipe to other processes (Ray workers) start here."""
    registry.import_code_paths(plain.get("code_paths"))
    return validate(plain, TrainConfig)


def load_train_config(recipe: str, overrides: list[str]) -> tuple[TrainConfig, dict]:
    """The validated TrainConfig and the resolved plain config it came from."""
    plain = load_config(recipe, overrides, TrainConfig)
    return validate_train_config(plain), plain


def cuda_environment(cfg: TrainConfig, environ: dict[str, str]) -> dict[str, str]:
    """Environment variables for max_split_size_mb, expandable_segments and cuda_load_lazy; they take effect
    because CUDA reads them at its first allocation/kernel load. A setting already in the environment wins."""
    current = environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    entries = [e for e in current.split(",") if e]
    given = {e.split(":", 1)[0].strip() for e in entries}
    if cfg.max_split_size_mb is not None and "max_split_size_mb" not in given:
        entries.append(f"max_split_size_mb:{cfg.max_split_size_mb}")
    if cfg.expandable_segments and "expandable_segments" not in given:
        entries.append("expandable_segments:True")
    updates = {"PYTORCH_CUDA_ALLOC_CONF": ",".join(entries)} if entries else {}
    if cfg.cuda_load_lazy and "CUDA_MODULE_LOADING" not in environ:
        updates["CUDA_MODULE_LOADING"] = "LAZY"
    return updates
