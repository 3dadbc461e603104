"""The machine a run uses: system_metrics_monitor (Composer's SystemMetricsMonitor) and env_logging (llm-foundry's
EnvironmentLoggingCallback).

system_metrics_monitor logs, every batch, Composer's metric names: ``cpu_percentage``, ``cpu_memory_<field>``
(psutil's virtual_memory), ``disk_memory_<field>`` (disk usage of /), ``network_<field>`` (I/O counters) and, on
CUDA (through NVML, the ``nvidia-ml-py`` package), ``gpu_percentage``, ``memory_percentage``,
``gpu_temperature_C`` and ``gpu_power_usage_W`` per rank: as ``min_/max_<name>_rank_<r>`` or, with
``log_all_data``, ``<name>_rank_<r>`` for every rank.

env_logging logs, once at the start, ``environment_data`` among the run's hyperparameters: git commit and branch of
each repository under ``workspace_dir``, package versions, CUDA/cuDNN/NCCL versions, and on request the system, GPUs
and process layout.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch
import torch.distributed

from llmfoundry.core import dist
from llmfoundry.core.errors import ConfigError
from llmfoundry.core.notices import notice_once
from llmfoundry.train.callbacks.base import Callback
from llmfoundry.train.callbacks.settings import EnvLoggingSettings, SystemMetricsMonitorSettings
from llmfoundry.train.state import TrainState

GPU_METRICS = ("gpu_percentage", "memory_percentage", "gpu_temperature_C", "gpu_power_usage_W")
PACKAGES_TO_LOG = ["llm-foundry", "llmfoundry", "mosaicml", "megablocks", "grouped-gemm", "torch", "flash_attn",
                   "transformers", "datasets", "peft"]  # llm-foundry's list, and this project's own package


def _psutil(key: str):
    try:
        import psutil  # optional: only these callbacks need it
    except ImportError:
        raise ConfigError(f"{key}: needs psutil (pip install psutil), or remove the callback") from None
    return psutil


class SystemMetricsMonitor(Callback):
    def __init__(self, settings: SystemMetricsMonitorSettings):
        self.log_all_data = settings.log_all_data
        self.nvml = self.nvml_handle = None
        self.psutil = _psutil("callbacks.system_metrics_monitor")

    def on_fit_start(self, state: TrainState):
        if state.device.type == "cuda":
            try:
                import pynvml  # optional: only GPU metrics need it
            except ImportError:
                raise ConfigError("callbacks.system_metrics_monitor: GPU metrics need NVML (pip install "
                                  "nvidia-ml-py), or remove the callback") from None
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.nvml_handle = nvml_handle(pynvml, state.device)

    def on_batch_end(self, state: TrainState, metrics):
        everyone = _gather(self.local_metrics(state))
        for rank, values in enumerate(everyone):
            for key, value in values.items():
                if key not in GPU_METRICS:
                    metrics[key] = value
                elif self.log_all_data:
                    metrics[f"{key}_rank_{rank}"] = value
        if self.nvml is not None and not self.log_all_data:
            for key in GPU_METRICS:
                values = [rank_values[key] for rank_values in everyone]
                low = min(range(len(values)), key=values.__getitem__)
                high = max(range(len(values)), key=values.__getitem__)
                metrics[f"min_{key}_rank_{low}"] = values[low]
                metrics[f"max_{key}_rank_{high}"] = values[high]

    def local_metrics(self, state: TrainState) -> dict[str, float]:
        values: dict[str, float] = {}
        if self.nvml is not None:
            nvml, handle = self.nvml, self.nvml_handle
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            values["gpu_percentage"] = float(rates.gpu)
            values["memory_percentage"] = float(rates.memory)
            values["gpu_temperature_C"] = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            values["gpu_power_usage_W"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # mW
        psutil = self.psutil
        values["cpu_percentage"] = float(psutil.cpu_percent())
        for prefix, fields in (("cpu_memory", psutil.virtual_memory()), ("disk_memory", psutil.disk_usage(os.sep)),
                               ("network", psutil.net_io_counters())):
            for key, value in fields._asdict().items():
                values[f"{prefix}_{key}"] = float(value)
        return values


def nvml_names(torch_uuid) -> list[str]:
    """NVML's possible names of a device from ``torch.cuda.get_device_properties(d).uuid`` (torch gives the bare
    UUID): a whole GPU's ``GPU-`` name, then a MIG instance's ``MIG-`` name."""
    text = str(torch_uuid)
    return [text] if text.startswith(("GPU-", "MIG-")) else [f"GPU-{text}", f"MIG-{text}"]


def nvml_handle(nvml, device: torch.device):
    """NVML's handle of this rank's GPU, found by UUID: NVML numbers every GPU of the machine, torch only those
    CUDA_VISIBLE_DEVICES shows (Slurm's and Kubernetes' GPU binding), so torch's index can name another job's GPU.
    Where no name is found, torch's index, with a notice."""
    for name in nvml_names(torch.cuda.get_device_properties(device).uuid):
        try:
            return nvml.nvmlDeviceGetHandleByUUID(name)
        except nvml.NVMLError:
            continue
    notice_once(f"callbacks.system_metrics_monitor: NVML knows no GPU by the UUID of {device}; its metrics are "
                "read by torch's device index, which names another GPU under CUDA_VISIBLE_DEVICES binding")
    return nvml.nvmlDeviceGetHandleByIndex(device.index or 0)


def _gather(values: dict[str, float]) -> list[dict[str, float]]:
    if dist.world_size() == 1:
        return [values]
    everyone: list[Any] = [None] * dist.world_size()
    torch.distributed.all_gather_object(everyone, values)
    return everyone


class EnvLogging(Callback):
    def __init__(self, settings: EnvLoggingSettings):
        self.s = settings
        self.env_data: dict[str, Any] = {}

    def on_fit_start(self, state: TrainState):
        s, data = self.s, self.env_data
        if s.log_git:
            data["git_info"] = self._git_info()
        if s.log_packages:
            data["package_versions"] = {name: _version(name) for name in (s.packages_to_log or PACKAGES_TO_LOG)}
        if s.log_nvidia:
            data["nvidia"] = _nvidia_info()
        if s.log_system:
            psutil = _psutil("callbacks.env_logging.log_system")
            memory = psutil.virtual_memory()
            data["system_info"] = {
                "python_version": platform.python_version(), "os": f"{platform.system()} {platform.release()}",
                "hostname": socket.gethostname(),
                "cpu_info": {"model": platform.processor(), "cores": psutil.cpu_count(logical=False),
                             "threads": psutil.cpu_count(logical=True)},
                "memory": {"total": memory.total, "available": memory.available}}
        if s.log_gpu:
            data["gpu_info"] = ({"model": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
                                 "memory": {"total": torch.cuda.get_device_properties(0).total_memory,
                                            "allocated": torch.cuda.memory_allocated(0)}}
                                if torch.cuda.is_available() else {"available": False})
        if s.log_distributed:
            data["distributed_info"] = {"world_size": dist.world_size(),
                                        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                                        "rank": dist.rank(), "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}
        for logger in state.loggers:
            logger.log_hyperparameters({"environment_data": data})

    def _git_info(self) -> dict[str, dict[str, str]]:
        workspace = Path(self.s.workspace_dir)
        if not workspace.is_dir():
            notice_once(f"callbacks.env_logging.workspace_dir: '{workspace}' does not exist; no git information "
                        "is logged (set workspace_dir or log_git: false)")
            return {}
        found = {}
        for folder in sorted(workspace.iterdir()):
            if (folder / ".git").exists():
                commit, branch = _git(folder, "HEAD"), _git(folder, "--abbrev-ref", "HEAD")
                if commit:
                    found[folder.name] = {"commit_hash": commit, "branch": branch}
        return found


def _git(folder: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(folder), "rev-parse", *args], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvidia_info() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"available": False}
    nccl = torch.cuda.nccl.version()
    return {"cuda_version": torch.version.cuda, "cudnn_version": str(torch.backends.cudnn.version()),
            "nccl_version": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)}


def build_system_metrics_monitor(settings: SystemMetricsMonitorSettings) -> Callback:
    return SystemMetricsMonitor(settings)


def build_env_logging(settings: EnvLoggingSettings) -> Callback:
    return EnvLogging(settings)
