"""llm-foundry run-level keys whose meaning here is a mapping, a consistency check or a one-line notice.

* ``icl_tasks_str`` / ``eval_gauntlet_str``, ``eval_loaders``: finished by llmfoundry.eval.sections (shared with
  the eval recipe).
* ``device_train_microbatch_size`` as a float: accepted when it is a whole number.
* ``device_train_batch_size``, ``device_train_grad_accum``, ``n_gpus``: values llm-foundry derives; accepted
  when they match what this run derives, an error naming both otherwise (:func:`check_derived_batch_keys`).
* ``save_filename`` / ``save_latest_filename``: Composer's default patterns are what our folder names and
  ``latest`` already are; any other pattern is an error.
* ``metadata`` with ``flatten_metadata``: how the logged config carries it (:func:`logged_config`).
* ``save_ignore_keys`` / ``load_ignore_keys``: Composer's state key names mapped onto ours (:class:`IgnoreKeys`).
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any, ClassVar

from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.eval.sections import finish_eval_sections  # the evaluation keys, shared with the eval recipe
from llmfoundry.train.encoder_decoder import encoder_decoder_problems

# Composer's defaults: what llm-foundry passes when the recipe leaves them unset.
DEFAULT_SAVE_FILENAMES = ("ep{epoch}-ba{batch}-rank{rank}.pt",)
DEFAULT_LATEST_FILENAMES = ("latest-rank{rank}.pt", "latest-sharded-rank{rank}")


def check_microbatch_size(value: Any) -> None:
    if value == "auto":
        return
    if value <= 0:
        raise ValueError(f"must be positive or 'auto', got {value}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{value} is not a whole number of samples (llm-foundry's fractional microbatches serve "
                         "sequence parallelism, which this trainer does not have; use an int)")


def finish_recipe(cfg: Any, prefix: str) -> list[str]:
    """Map the keys above onto the recipe's own (in place) and return the problems found."""
    problems: list[str] = []
    if isinstance(cfg.device_train_microbatch_size, float):
        cfg.device_train_microbatch_size = int(cfg.device_train_microbatch_size)
    problems += finish_eval_sections(cfg, prefix)  # icl_tasks_str, eval_gauntlet_str, eval_loaders
    problems += encoder_decoder_problems(cfg, prefix)  # hf_t5 with decoder_only_format: false loaders, and back
    if cfg.save_filename is not None and cfg.save_filename not in DEFAULT_SAVE_FILENAMES:
        problems.append(f"{prefix}save_filename: '{cfg.save_filename}' cannot be used: checkpoints here are folders "
                        "named ep{epoch}-ba{batch} (remove the key)")
    if cfg.save_latest_filename is not None and cfg.save_latest_filename not in DEFAULT_LATEST_FILENAMES:
        problems.append(f"{prefix}save_latest_filename: '{cfg.save_latest_filename}' cannot be used: save_folder/"
                        "latest names the newest checkpoint (remove the key)")
    for key in ("save_ignore_keys", "load_ignore_keys"):
        for pattern in getattr(cfg, key) or []:
            if not IgnoreKeys([pattern]).is_known():
                problems.append(f"{prefix}{key}: '{pattern}' matches no state here (use state/model/<param glob>, "
                                f"state/optimizers, state/schedulers, state/timestamp, state/train_dataloader, rng or "
                                f"state/callbacks/<state_name>)")
    if cfg.only_composer_checkpoint and not cfg.save_folder:
        problems.append(f"{prefix}only_composer_checkpoint: needs save_folder (where the checkpoint is written)")
    if cfg.only_hf_checkpoint and "hf_checkpointer" not in cfg.callbacks:
        problems.append(f"{prefix}only_hf_checkpoint: needs the hf_checkpointer callback (it writes the folder)")
    if cfg.only_hf_checkpoint and cfg.only_composer_checkpoint:
        problems.append(f"{prefix}only_hf_checkpoint: set only one of only_hf_checkpoint and only_composer_checkpoint")
    return problems


def device_batch_size(global_batch_size: int, world_size: int, tp_config: Any = None) -> int:
    """Samples per rank and step; the global batch must split evenly across the data-parallel ranks (the ranks of
    a tensor-parallel group share their batches: world size / tensor_parallel_degree of them)."""
    ranks = world_size // tp_config.tensor_parallel_degree if tp_config is not None else world_size
    ranks = max(1, ranks)
    if global_batch_size % ranks:
        what = "data-parallel groups" if ranks != world_size else "ranks"
        raise ConfigError(f"global_train_batch_size: {global_batch_size} does not divide across {ranks} {what} "
                          f"(use a multiple of {ranks})")
    return global_batch_size // ranks


def check_derived_batch_keys(cfg: Any, world_size: int, device_batch_size: int) -> None:
    """device_train_batch_size, device_train_grad_accum and n_gpus as llm-foundry derives them must match ours."""
    problems = []
    if cfg.n_gpus is not None and cfg.n_gpus != world_size:
        problems.append(f"n_gpus: {cfg.n_gpus} does not match the {world_size} processes of this run (remove n_gpus: "
                        "it is the world size)")
    if cfg.device_train_batch_size is not None and cfg.device_train_batch_size != device_batch_size:
        problems.append(f"device_train_batch_size: {cfg.device_train_batch_size} does not match global_train_batch_size "
                        f"{cfg.global_train_batch_size} / {cfg.global_train_batch_size // device_batch_size} data-parallel "
                        f"ranks = {device_batch_size} (remove it or "
                        "change global_train_batch_size)")
    if cfg.device_train_grad_accum is not None:
        micro = cfg.device_train_microbatch_size
        expected: int | str = "auto" if micro == "auto" else math.ceil(device_batch_size / min(micro, device_batch_size))
        if cfg.device_train_grad_accum != expected:
            problems.append(f"device_train_grad_accum: {cfg.device_train_grad_accum!r} does not match the {expected!r} "
                            f"microbatches per device batch from device_train_microbatch_size {micro!r} (remove it or "
                            "set device_train_microbatch_size)")
    if problems:
        raise ConfigError.many(problems)


def log_notices(cfg: Any) -> None:
    """One line for each llm-foundry setting that is accepted but works differently here."""
    if not cfg.spin_dataloaders:
        notice_once("spin_dataloaders: false changes nothing here: the train loader always resumes from the sample "
                    "position saved in the checkpoint")
    if cfg.fsdp_config is not None and cfg.fsdp_config.state_dict_type == "local":
        notice_once("fsdp_config.state_dict_type: local is saved as sharded here (each rank writes its own shards; "
                    "unlike Composer's local, they load on any number of ranks)")
    if cfg.save_filename is not None or cfg.save_latest_filename is not None:
        notice_once("save_filename/save_latest_filename: Composer's defaults accepted; checkpoints are folders "
                    "save_folder/ep{epoch}-ba{batch} and save_folder/latest names the newest")


def logged_config(plain: dict[str, Any], flatten: bool) -> dict[str, Any]:
    """The config as loggers receive it (``plain`` has its secrets masked already): llm-foundry's flatten_metadata
    puts metadata's keys at the top level."""
    metadata = plain.get("metadata") or {}
    if not flatten or not metadata:
        return plain
    logged = {k: v for k, v in plain.items() if k != "metadata"}
    clashes = sorted(set(logged) & set(metadata))
    if clashes:
        raise ConfigError(f"metadata: keys {', '.join(clashes)} are already config keys (rename them in metadata or "
                          "set flatten_metadata: false)")
    logged.update(metadata)
    return logged


class IgnoreKeys:
    """Composer state key patterns (``state/model/*``, ``state/optimizers/*``, ``rng``, ...) over our state.

    Our checkpoint state maps onto Composer's names: model weights -> ``state/model/<name>`` (also matched as
    ``state/model/model.<name>``, the name under Composer's model wrapper); the optimizer -> ``state/optimizers``;
    scheduler -> ``state/schedulers``; trainer time -> ``state/timestamp``; loader position ->
    ``state/train_dataloader`` (also ``state/dataset_state``); RNG -> ``rng``.
    """

    SECTIONS: ClassVar[dict[str, tuple[str, ...]]] = {
        "model": (),  # never a whole section: its keys are matched one by one (model_key)
        "optimizer": ("state/optimizers", "state/optimizers/x"),
        "scheduler": ("state/schedulers", "state/schedulers/x"),
        "time": ("state/timestamp", "state/timestamp/x"),
        "dataloader": ("state/train_dataloader", "state/train_dataloader/x", "state/dataset_state",
                       "state/dataset_state/x"),
        "rng": ("rng", "rng/x"),
    }
    # Composer state with no counterpart here (callbacks: only those that declare a state_name have one): ignoring
    # it changes nothing, so patterns naming it are accepted.
    COMPOSER_ONLY: ClassVar[tuple[str, ...]] = (
        "state/callbacks", "state/algorithms", "state/train_metrics", "state/eval_metrics", "state/scaler",
        "state/rank_zero_seed", "state/run_name", "state/metadata", "state/integrations",
    )

    def __init__(self, patterns: list[str] | None):
        self.patterns = list(patterns or [])

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def _match(self, names: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns for name in names)

    def section(self, name: str) -> bool:
        """True when a whole section (a component of train.components: optimizer, scheduler, time, dataloader,
        rng) is ignored. Any other component is a callback's state, which Composer keeps under
        ``state/callbacks/<name>``."""
        names = self.SECTIONS.get(name)
        if names is None:
            names = (f"state/callbacks/{name}", "state/callbacks", "state/callbacks/x")
        return self._match(names)

    def model_key(self, key: str) -> bool:
        return self._match((f"state/model/{key}", f"state/model/model.{key}", "state/model"))

    def is_known(self) -> bool:
        """Whether the patterns can match anything of ours at all (a typo is an error, not silently nothing)."""
        names = [n for names in self.SECTIONS.values() for n in names] + ["state/model/x", "state/model/model.x",
                                                                           "state/model"]
        names += list(self.COMPOSER_ONLY) + [f"{n}/x" for n in self.COMPOSER_ONLY]
        per_name = ("state/model/", "state/callbacks/")  # a weight's or a callback's name: any may exist
        return self._match(tuple(names)) or any(p.startswith(per_name) for p in self.patterns)
