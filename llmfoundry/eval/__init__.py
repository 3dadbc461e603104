"""In-context-learning evaluation (llm-foundry task formats) and the eval gauntlet.

Entry points: ``llmfoundry.eval.runner.ICLEvaluator`` (evaluate a model on tasks; used by the trainer and by
``llmfoundry eval``), ``llmfoundry.eval.gauntlet.compute_gauntlet`` and ``llmfoundry.commands.eval.main``.
"""
