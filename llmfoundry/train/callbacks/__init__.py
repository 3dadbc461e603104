"""Callbacks: hooks the trainer calls during a run (``base.Callback``). ``catalog`` names the built-in ones and
``settings`` holds their config sections; each callback's own module (which needs torch) is imported only when a
run builds it."""

from llmfoundry.registry import lazy_attributes

__all__ = ["Callback"]
# plugins write `from llmfoundry.train.callbacks import Callback`:
# the base module (torch) is imported only then; importing the package, as the catalog does, stays light
__getattr__ = lazy_attributes(__name__, {"Callback": "llmfoundry.train.callbacks.base:Callback"})
