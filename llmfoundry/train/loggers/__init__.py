"""Metrics loggers (``base.Logger``). ``catalog`` names the built-in ones and ``settings`` holds their config
sections; each logger's module (and its library: wandb, mlflow, tensorboard) is imported only when a run builds it."""
