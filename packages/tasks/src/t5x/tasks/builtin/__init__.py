"""Built-in demo, synthetic and study tasks (nothing downloaded), registered on request.

``register_builtin_tasks()`` registers them (calling it again does nothing):

- ``synthetic_copy``, ``synthetic_reverse``, ``synthetic_sort_digits``,
  ``synthetic_add`` and the mixture ``synthetic_text_to_text``;
- ``synthetic_corpus_span_corruption``, ``synthetic_corpus_prefix_lm``,
  ``synthetic_corpus_lm`` on a generated corpus;
- the prompted multiple-choice ``builtin_mc_*`` tasks and mixtures.

``objective_task`` registers the pretraining task of one objective on a corpus
(the architecture / objective study's tasks). The core ``t5x.tasks`` API does
not depend on this package; its old names (``t5x.tasks.register_builtin_tasks``
and the others listed here) still resolve, loading this package on first use.
"""

from t5x.tasks.builtin._prompted_mc import (
    BUILTIN_MC_MIXTURES,
    BUILTIN_MC_TASKS,
    MC_DATASETS,
    MC_PROMPTS,
    NUM_CHOICES,
    make_mc_examples,
    register_prompted_mc_tasks,
)
from t5x.tasks.builtin._study import STUDY_OBJECTIVES, objective_task
from t5x.tasks.builtin._synthetic import PROBLEMS, WORDS, generate_corpus, make_examples
from t5x.tasks.builtin._tasks import (
    BUILTIN_MIXTURES,
    BUILTIN_TASKS,
    builtin_corpus_source,
    builtin_vocabulary,
    exact_match,
    register_builtin_tasks,
    token_accuracy,
)

__all__ = [
    "BUILTIN_MC_MIXTURES",
    "BUILTIN_MC_TASKS",
    "BUILTIN_MIXTURES",
    "BUILTIN_TASKS",
    "MC_DATASETS",
    "MC_PROMPTS",
    "NUM_CHOICES",
    "PROBLEMS",
    "STUDY_OBJECTIVES",
    "WORDS",
    "builtin_corpus_source",
    "builtin_vocabulary",
    "exact_match",
    "generate_corpus",
    "make_examples",
    "make_mc_examples",
    "objective_task",
    "register_builtin_tasks",
    "register_prompted_mc_tasks",
    "token_accuracy",
]
