"""Data: tokenizers, MDS pretraining and finetuning loaders, and the converters behind data_prep/.

Importing this package registers the ``text`` and ``finetuning`` dataloaders.
"""

from llmfoundry.data import finetuning_loader, text  # noqa: F401  (register the `finetuning` and `text` dataloaders)
