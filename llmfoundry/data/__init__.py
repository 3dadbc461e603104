"""Data: tokenizers, MDS pretraining and finetuning loaders, and the converters behind data_prep/."""
