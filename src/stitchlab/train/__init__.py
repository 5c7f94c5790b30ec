"""Training base models: the paper's recipes and CPU-sized ones.

* :func:`train_model`: standard, shortcut (marked data), adversarial (PGD on half of each
  batch) and SimCLR (+ linear classifier) training with a :class:`Recipe`; resumable,
  seeded, mixed precision and channels-last on a GPU; evaluates and saves the result.
* :func:`paper_recipe`, :func:`fast_recipe`: the paper's base-model recipe and a fast one.
* :func:`evaluate_classifier`: clean / marked / rolled-marker / robust accuracy.
* :func:`train_classifier`: the small AdamW recipe of the examples (kept as it was).

The ``stitchlab train`` command is in :mod:`stitchlab.train.command`.
"""

from .classifier import train_classifier
from .evaluation import accuracy_on, evaluate_classifier
from .loop import MODEL_FILE, STATE_FILE, Augmented, TrainResult, train_model
from .recipes import METHODS, Recipe, fast_recipe, paper_recipe
from .simclr import info_nce

__all__ = [
    "train_classifier",
    "train_model",
    "TrainResult",
    "Recipe",
    "paper_recipe",
    "fast_recipe",
    "METHODS",
    "evaluate_classifier",
    "accuracy_on",
    "info_nce",
    "Augmented",
    "MODEL_FILE",
    "STATE_FILE",
]
