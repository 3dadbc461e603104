"""Callbacks: hooks the trainer calls during a run (``base.Callback``). ``catalog`` names the built-in ones and
``settings`` holds their config sections; each callback's own module (which needs torch) is imported only when a
run builds it."""

import importlib

__all__ = ["Callback"]


def __getattr__(attribute: str):
    """``from llmfoundry.train.callbacks import Callback`` (what plugins write) still works; the base module (torch) is
    imported only then, so importing the package, as the catalog does, stays light."""
    if attribute == "Callback":
        return importlib.import_module("llmfoundry.train.callbacks.base").Callback
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
