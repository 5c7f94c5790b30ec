"""Evaluating base models: clean, marked and rolled-marker accuracy, robust accuracy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .._data import DataLike, as_dataset, predict
from .._modes import evaluating
from ..attacks import PGD_EVAL, autoattack_accuracy, robust_accuracy

__all__ = ["evaluate_classifier", "accuracy_on"]


def accuracy_on(model: nn.Module, data: DataLike, *, batch_size: int = 256) -> float:
    """Top-1 accuracy in percent of ``model`` (put in eval mode, then restored) on ``data``."""
    with evaluating(model):
        logits, labels = predict(model, data, batch_size=batch_size)
    return float((logits.argmax(1) == labels).double().mean() * 100)


def evaluate_classifier(
    model: nn.Module,
    data: DataLike | Mapping[str, DataLike],
    *,
    robust: str | None = None,
    robust_on: str | None = None,
    robust_samples: int | None = 1000,
    eps: float = PGD_EVAL["eps"],
    batch_size: int = 256,
    seed: int = 0,
) -> dict[str, Any]:
    """Accuracies (percent) of ``model`` on one data set or on named ones.

    ``data`` may map names to data sets (e.g. ``{"clean": test, "marked": Marked(test),
    "rolled": Marked(test, rolled=True)}``): the result has ``"<name>_accuracy"`` for
    each (``"accuracy"`` for a single data set). ``robust="pgd"`` adds
    ``"robust_accuracy"`` under PGD-20 (L-inf, ``eps``, step 2/255, random start) on the
    first ``robust_samples`` images of ``robust_on`` (default: the first data set);
    ``robust="autoattack"`` uses APGD-CE + APGD-DLR (optional ``autoattack`` package).
    """
    named = dict(data) if isinstance(data, Mapping) else {"": data}
    if not named:
        raise ValueError("evaluate_classifier needs at least one data set")
    sets = {name: as_dataset(ds, name or "data")[0] for name, ds in named.items()}
    out: dict[str, Any] = {}
    for name, ds in sets.items():
        out[f"{name}_accuracy" if name else "accuracy"] = accuracy_on(
            model, ds, batch_size=batch_size
        )
    if robust is not None:
        key = robust_on if robust_on is not None else next(iter(sets))
        if key not in sets:
            raise ValueError(f"robust_on={key!r} is not one of the data sets {list(sets)}")
        if robust == "pgd":
            out["robust_accuracy"] = robust_accuracy(
                model,
                sets[key],
                eps=eps,
                step=PGD_EVAL["step"],
                steps=PGD_EVAL["steps"],
                batch_size=batch_size,
                max_samples=robust_samples,
                seed=seed,
            )
            out["robust_attack"] = (
                f"PGD-{PGD_EVAL['steps']} Linf eps={eps * 255:g}/255 step=2/255 random start"
            )
        elif robust == "autoattack":
            out["robust_accuracy"] = autoattack_accuracy(
                model, sets[key], eps=eps, batch_size=batch_size, max_samples=robust_samples
            )
            out["robust_attack"] = f"AutoAttack APGD-CE+APGD-DLR Linf eps={eps * 255:g}/255"
        else:
            raise ValueError(f"robust must be None, 'pgd' or 'autoattack', got {robust!r}")
        out["robust_samples"] = min(
            robust_samples or len(sets[key]),  # type: ignore[arg-type]
            len(sets[key]),  # type: ignore[arg-type]
        )
    return out
