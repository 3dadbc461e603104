"""Data: tokenizers, MDS pretraining and finetuning loaders, and the converters behind data_prep/.

Importing this package registers the ``text`` and ``finetuning`` dataloaders.
"""

from llmfoundry.data import text  # noqa: F401  (registers the `text` dataloader)
from llmfoundry.data.text import check_token_ids  # noqa: F401
from llmfoundry.data.tokenizers import build_tokenizer  # noqa: F401

import importlib.util as _util

if _util.find_spec("llmfoundry.data.finetuning") is not None:  # the finetuning loader lands after the text loader
    from llmfoundry.data import finetuning  # noqa: F401  (registers the `finetuning` dataloader)
