"""In-context-learning task types, prompt building, batching and scoring.

Importing this module registers the task types (``registry.icl_task_types``: language_modeling, multiple_choice,
schema, generation_task_with_answers) and the choice rules (``registry.metrics``: accuracy, acc, acc_norm). What a
plugin's task type or choice rule must provide: ``ICLTask`` (tasks.py) and metrics.py's docstring.
"""

from llmfoundry.eval.icl.metrics import (
    SequenceScore,
    generation_correct,
    normalize_answer,
)
from llmfoundry.eval.icl.tasks import (
    Example,
    GenerationTask,
    ICLTask,
    LanguageModelingTask,
    MultipleChoiceTask,
    SchemaTask,
    Sequence,
    build_task,
    fewshot_indices,
    needs_prefix_space,
)

__all__ = [
    "Example",
    "GenerationTask",
    "ICLTask",
    "LanguageModelingTask",
    "MultipleChoiceTask",
    "SchemaTask",
    "Sequence",
    "SequenceScore",
    "build_task",
    "fewshot_indices",
    "generation_correct",
    "needs_prefix_space",
    "normalize_answer",
]
