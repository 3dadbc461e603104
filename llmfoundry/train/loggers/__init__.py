"""Metrics loggers (``base.Logger``). ``catalog`` names the built-in ones and ``settings`` holds their config
sections; each logger's module (and its library: wandb, mlflow, tensorboard) is imported only when a run builds it."""

import importlib

__all__ = ["Logger"]


def __getattr__(attribute: str):
    """``from llmfoundry.train.loggers import Logger`` (what plugins write) still works; the base module (torch) is
    imported only then, so importing the package, as the catalog does, stays light."""
    if attribute == "Logger":
        return importlib.import_module("llmfoundry.train.loggers.base").Logger
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
