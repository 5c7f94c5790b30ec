"""Train/eval flags set for a block and restored after it, module by module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

__all__ = ["modes", "evaluating"]


@contextlib.contextmanager
def modes(*models: nn.Module, training: bool | None = None) -> Iterator[None]:
    """Restore every submodule's train/eval flag after the block (a mixed model keeps its
    mix); with ``training`` given, set all of them to it first."""
    flags = [(m, m.training) for model in models for m in model.modules()]
    try:
        if training is not None:
            for model in models:
                model.train(training)
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def evaluating(*models: nn.Module) -> contextlib.AbstractContextManager[None]:
    """The block runs ``models`` in eval mode; their flags are restored after it."""
    return modes(*models, training=False)
