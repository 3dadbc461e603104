"""The built-in callbacks by name: each name with its settings (``settings``, or ``unavailable`` for the refused
ones) and the ``module:function`` that builds it, imported only when a run builds that callback."""

from __future__ import annotations

from llmfoundry.registry import callbacks
from llmfoundry.train.callbacks.settings import (
    EarlyStopperSettings,
    EnvLoggingSettings,
    EvalOutputLoggingSettings,
    FDiffSettings,
    GenerateSettings,
    GlobalLRScalingSettings,
    HFCheckpointerSettings,
    KillLossSpikeSettings,
    LayerFreezingSettings,
    LoadCheckpointSettings,
    LossPerpVLenSettings,
    LossSpikeGuardSettings,
    LRMonitorSettings,
    MemoryMonitorSettings,
    MemorySnapshotSettings,
    MonoCheckpointSaverSettings,
    NaNMonitorSettings,
    OOMObserverSettings,
    OptimizerMonitorSettings,
    RuntimeEstimatorSettings,
    RunTimeoutSettings,
    ScheduledGCSettings,
    SpeedMonitorSettings,
    SystemMetricsMonitorSettings,
    TokPerExpertSettings,
)
from llmfoundry.train.callbacks.unavailable import AsyncEvalSettings, CurriculumLearningSettings, DatasetSwapSettings

# monitoring
callbacks.declare("speed_monitor", "llmfoundry.train.callbacks.speed_monitor:build_speed_monitor",
                  config=SpeedMonitorSettings,
                  differs="time/train, time/val and time/total start from 0 when a run resumes (Composer "
                          "continues them from the checkpoint)")
callbacks.declare("runtime_estimator", "llmfoundry.train.callbacks.runtime_estimator:build_runtime_estimator",
                  config=RuntimeEstimatorSettings)
callbacks.declare("lr_monitor", "llmfoundry.train.callbacks.lr_monitor:build_lr_monitor", config=LRMonitorSettings)
callbacks.declare("memory_monitor", "llmfoundry.train.callbacks.memory_monitor:build_memory_monitor",
                  config=MemoryMonitorSettings,
                  differs="on a CPU it logs the process's memory (memory/rss_mem, memory/peak_rss_mem); Composer "
                          "logs nothing there")
callbacks.declare("memory_snapshot", "llmfoundry.train.callbacks.cuda_memory:build_memory_snapshot",
                  config=MemorySnapshotSettings)
callbacks.declare("oom_observer", "llmfoundry.train.callbacks.cuda_memory:build_oom_observer",
                  config=OOMObserverSettings)
callbacks.declare("optimizer_monitor", "llmfoundry.train.callbacks.optimizer_monitor:build_optimizer_monitor",
                  config=OptimizerMonitorSettings, differs=(
                      "l2_norm/update is the norm of the step applied (Composer's DecoupledAdamW adds the weight "
                      "decay term with the opposite sign); moment/param/update are reported for adamw too "
                      "(Composer: its own optimizers only)"))
callbacks.declare("mbmoe_tok_per_expert", "llmfoundry.train.callbacks.moe_tokens:build_tok_per_expert",
                  config=TokPerExpertSettings)
callbacks.declare("loss_perp_v_len", "llmfoundry.train.callbacks.loss_perp_v_len:build_loss_perp_v_len",
                  config=LossPerpVLenSettings, differs=(
                      "any model and any logger that records tables (else the console); llm-foundry requires an "
                      "MPT model and an MLflow logger"))
callbacks.declare("fdiff_metrics", "llmfoundry.train.callbacks.fdiff:build_fdiff_metrics", config=FDiffSettings)

# the machine
callbacks.declare("system_metrics_monitor", "llmfoundry.train.callbacks.environment:build_system_metrics_monitor",
                  config=SystemMetricsMonitorSettings)
callbacks.declare("env_logging", "llmfoundry.train.callbacks.environment:build_env_logging",
                  config=EnvLoggingSettings)
callbacks.declare("scheduled_gc", "llmfoundry.train.callbacks.scheduled_gc:build_scheduled_gc",
                  config=ScheduledGCSettings)
callbacks.declare("run_timeout", "llmfoundry.train.callbacks.run_timeout:build_run_timeout",
                  config=RunTimeoutSettings)

# watching the loss, stopping
callbacks.declare("nan_monitor", "llmfoundry.train.callbacks.loss_watch:build_nan_monitor", config=NaNMonitorSettings)
callbacks.declare("kill_loss_spike", "llmfoundry.train.callbacks.loss_watch:build_kill_loss_spike",
                  config=KillLossSpikeSettings, differs=(
                      "with log_only a warning goes to the log and console (llm-foundry: run metadata on the "
                      "MosaicML platform); a window_size that is set stays that size and every batch is checked "
                      "(llm-foundry's then only checks once)"))
callbacks.declare("loss_spike_guard", "llmfoundry.train.callbacks.loss_spike_guard:build_loss_spike_guard",
                  config=LossSpikeGuardSettings)
callbacks.declare("early_stopper", "llmfoundry.train.callbacks.early_stopper:build_early_stopper",
                  config=EarlyStopperSettings)

# changing a resumed run
callbacks.declare("global_lr_scaling", "llmfoundry.train.callbacks.resumption:build_global_lr_scaling",
                  config=GlobalLRScalingSettings)
callbacks.declare("layer_freezing", "llmfoundry.train.callbacks.resumption:build_layer_freezing",
                  config=LayerFreezingSettings)

# what the model produces
callbacks.declare("generate_callback", "llmfoundry.train.callbacks.generate:build_generate", config=GenerateSettings,
                  differs=("the table goes to loggers that record tables (log_table); with none, to the console, "
                           "with a notice"))
callbacks.declare("eval_output_logging", "llmfoundry.train.callbacks.eval_output_logging:build_eval_output_logging",
                  config=EvalOutputLoggingSettings, differs=(
                      "only the ICL tasks are logged (not the eval loaders' batches), with the columns input, "
                      "outputs, result, correct_choice_idx, category, run_name (llm-foundry's depend on the "
                      "metric); tables go to loggers that record them, else to the console"))

# checkpoints beside the run's own
callbacks.declare("mono_checkpoint_saver",
                  "llmfoundry.train.callbacks.checkpoint_callbacks:build_mono_checkpoint_saver",
                  config=MonoCheckpointSaverSettings, differs=(
                      "the file holds the full model weights, time and run name in Composer's layout and names, "
                      "without optimizer state, HF config or Composer objects: load_path reads it, Composer cannot "
                      "resume from it"))
callbacks.declare("load_checkpoint", "llmfoundry.train.callbacks.checkpoint_callbacks:build_load_checkpoint",
                  config=LoadCheckpointSettings, differs=(
                      "loaded when training starts; with event before_load (the default) only if the run loads no "
                      "checkpoint of its own (in llm-foundry that one then replaces it); events during training "
                      "are refused"))
callbacks.declare("hf_checkpointer", "llmfoundry.train.callbacks.hf_checkpointer:build_hf_checkpointer",
                  config=HFCheckpointerSettings)

# llm-foundry's that are refused here: their settings' check_settings says why, so they are never built
callbacks.declare("async_eval", "llmfoundry.train.callbacks.unavailable:refuse", config=AsyncEvalSettings)
callbacks.declare("curriculum_learning", "llmfoundry.train.callbacks.unavailable:refuse",
                  config=CurriculumLearningSettings)
callbacks.declare("dataset_swap", "llmfoundry.train.callbacks.unavailable:refuse", config=DatasetSwapSettings)
