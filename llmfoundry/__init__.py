"""llmfoundry: config-driven recipes to pretrain, finetune and evaluate LLMs with plain PyTorch."""

__version__ = "0.1.0"
