"""Metrics loggers (``base.Logger``). ``catalog`` names the built-in ones and ``settings`` holds their config
sections; each logger's module (and its library: wandb, mlflow, tensorboard) is imported only when a run builds it."""

from llmfoundry.registry import lazy_attributes

__all__ = ["Logger"]
# plugins write `from llmfoundry.train.loggers import Logger`:
# the base module (torch) is imported only then; importing the package, as the catalog does, stays light
__getattr__ = lazy_attributes(__name__, {"Logger": "llmfoundry.train.loggers.base:Logger"})
