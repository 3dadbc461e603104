"""Inference entry points: `llmfoundry generate` (generate.py)."""
