"""Data: tokenizers, MDS pretraining and finetuning loaders, and the converters behind data_prep/.

The dataloaders are declared by name in data/catalog.py; importing this package imports none of them.
"""
