"""Callbacks by name. Importing this package registers the built-in ones."""

from llmfoundry.train.callbacks import (  # noqa: F401
    checkpoint_callbacks,
    cuda_memory,
    early_stopper,
    environment,
    eval_output_logging,
    fdiff,
    generate,
    hf_checkpointer,
    loss_perp_v_len,
    loss_spike_guard,
    loss_watch,
    lr_monitor,
    memory_monitor,
    moe_tokens,
    optimizer_monitor,
    resumption,
    run_timeout,
    runtime_estimator,
    scheduled_gc,
    speed_monitor,
    unavailable,
)
from llmfoundry.train.callbacks.base import Callback

__all__ = ["Callback"]
