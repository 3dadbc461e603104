"""The recipe's ``profiler`` section (llm-foundry's shape): torch.profiler traces of chosen training batches.

``schedule`` counts training batches as Composer's ``cyclic_schedule`` does: skip ``skip_first`` batches, then
``repeat`` cycles (0 = until training ends) of ``wait`` idle, ``warmup`` profiled-but-discarded and ``active``
recorded batches. Each cycle's trace is written (Chrome trace JSON, viewable in Perfetto or chrome://tracing) to
``torch_prof_folder/torch_prof_filename``, both formatted with {run_name}, {rank}, {epoch} and {batch}.
The trainer runs it through train.callbacks.torch_profiler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmfoundry.config.fields import option


@dataclass(kw_only=True)
class ProfilerSchedule:
    """``profiler.schedule``: Composer's cyclic_schedule, in training batches."""

    skip_first: int = option(0, "batches to leave out before the first cycle")
    wait: int = option(0, "idle batches at the start of each cycle")
    warmup: int = option(1, "batches profiled but discarded (profiler warm-up) in each cycle")
    active: int = option(4, "batches recorded in each cycle")
    repeat: int = option(1, "number of cycles (0 = until training ends)")

    def check_settings(self, path: str) -> list[str]:
        problems = [f"{path}.{key}: must be >= 0, got {getattr(self, key)}"
                    for key in ("skip_first", "wait", "warmup", "repeat") if getattr(self, key) < 0]
        if self.active < 1:
            problems.append(f"{path}.active: must be at least 1 batch, got {self.active}")
        return problems


@dataclass(kw_only=True)
class ProfilerConfig:
    """``profiler``: torch.profiler over training batches (llm-foundry builds Composer's Profiler from it)."""

    schedule: ProfilerSchedule = option(doc="which batches are profiled (required, as in llm-foundry)")
    torch_prof_folder: str = option("{run_name}/torch_traces", "local folder of the traces")
    torch_prof_filename: str = option("rank{rank}.{batch}.pt.trace.json", "trace file name of each cycle")
    torch_prof_overwrite: bool = option(False, "replace a trace file that exists (otherwise an error)")
    torch_prof_record_shapes: bool = option(False, "record operator input shapes")
    torch_prof_profile_memory: bool = option(True, "record tensor memory allocation and release")
    torch_prof_with_stack: bool = option(False, "record Python stacks of operators")
    torch_prof_with_flops: bool = option(True, "estimate FLOPs of matrix multiplications and convolutions")
    torch_prof_num_traces_to_keep: int = option(-1, "keep the newest N trace files of this rank (-1 = all)")
    torch_prof_use_gzip: bool = option(False, "gzip the trace files (.gz appended)")
    json_trace_handler: dict[str, Any] | None = option(
        None, "Composer's own event trace; not produced here (a notice says so): torch traces cover the batches"
    )
    sys_prof_cpu: bool = option(True, "Composer's system statistics sampler; not produced here (accepted)")
    sys_prof_memory: bool = option(False, "Composer system statistics",
                                   unsupported="Composer's system memory statistics")
    sys_prof_disk: bool = option(False, "Composer system statistics",
                                 unsupported="Composer's system disk statistics")
    sys_prof_net: bool = option(False, "Composer system statistics",
                                unsupported="Composer's system network statistics")
    sys_prof_stats_thread_interval_seconds: float = option(0.5, "Composer system statistics sampling (accepted)")
    torch_prof_remote_file_name: str | None = option(
        None, "Composer's upload of traces", unsupported="uploading traces"
    )
    torch_prof_memory_filename: str | None = option(
        None, "Composer's memory timeline", unsupported="memory timelines"
    )
