"""Scores of PROTOCOL section 4. All percentages are in [0, 100]."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "agreement",
    "accuracy",
    "hard_agreement",
    "error_consistency",
    "chance_normalized",
    "excess_agreement",
    "layer_average",
    "cka",
]


def _check_pair(a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(
            f"Expected two logit tensors of equal shape (N, classes), got {tuple(a.shape)} "
            f"and {tuple(b.shape)}."
        )


def agreement(logits_a: Tensor, logits_b: Tensor) -> float:
    """Agreement probability in percent: mean of ``<p_a, p_b> / max(|p_a|^2, |p_b|^2)``."""
    _check_pair(logits_a, logits_b)
    pa = torch.softmax(logits_a.double(), dim=1)
    pb = torch.softmax(logits_b.double(), dim=1)
    num = (pa * pb).sum(1)
    den = torch.maximum((pa * pa).sum(1), (pb * pb).sum(1))
    return float((num / den).mean() * 100)


def accuracy(logits: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy in percent."""
    return float((logits.argmax(1) == labels).double().mean() * 100)


def hard_agreement(logits_a: Tensor, logits_b: Tensor) -> float:
    """Percentage of samples on which the two top-1 predictions are equal."""
    _check_pair(logits_a, logits_b)
    return float((logits_a.argmax(1) == logits_b.argmax(1)).double().mean() * 100)


def error_consistency(logits_a: Tensor, logits_b: Tensor, labels: Tensor) -> float:
    """Cohen's kappa of the two models' correct/incorrect decisions (Geirhos et al.)."""
    _check_pair(logits_a, logits_b)
    ca = logits_a.argmax(1) == labels
    cb = logits_b.argmax(1) == labels
    c_obs = float((ca == cb).double().mean())
    a1, a2 = float(ca.double().mean()), float(cb.double().mean())
    c_exp = a1 * a2 + (1 - a1) * (1 - a2)
    if c_exp >= 1.0:
        return 1.0 if c_obs >= 1.0 else 0.0
    return (c_obs - c_exp) / (1 - c_exp)


def chance_normalized(score: float, num_classes: int) -> float:
    """``(a - 100/K) / (100 - 100/K) * 100``: 0 at chance, 100 at perfect."""
    if num_classes < 2:
        raise ValueError("chance normalisation needs at least 2 classes")
    chance = 100.0 / num_classes
    return (score - chance) / (100.0 - chance) * 100.0


def excess_agreement(agreement_marked: float, agreement_rolled: float) -> float:
    """Agreement with class-consistent markers minus agreement with rolled markers."""
    return agreement_marked - agreement_rolled


def layer_average(scores: Sequence[float]) -> float:
    """Mean of a curve over its stitch points (End and Front excluded by the caller)."""
    if len(scores) == 0:
        raise ValueError("layer_average of an empty curve")
    return float(sum(scores) / len(scores))


def _centered_gram_unbiased(x: torch.Tensor) -> torch.Tensor:
    """The U-centred Gram matrix of Song et al. (2012), for the unbiased HSIC."""
    n = x.shape[0]
    k = x @ x.T
    k.fill_diagonal_(0.0)
    col = k.sum(0, keepdim=True) / (n - 2)
    row = k.sum(1, keepdim=True) / (n - 2)
    total = k.sum() / ((n - 1) * (n - 2))
    u = k - col - row + total
    u.fill_diagonal_(0.0)
    return u


def cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA with the unbiased HSIC estimator, between two representations of the
    same ``n`` inputs (any shapes ``(n, ...)``; flattened per input). In [about 0, 1]:
    invariant to orthogonal transforms and isotropic scaling of either side."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA needs the same inputs on both sides: {x.shape[0]} vs {y.shape[0]}")
    n = x.shape[0]
    if n < 4:
        raise ValueError(f"unbiased CKA needs at least 4 inputs, got {n}")
    kx = _centered_gram_unbiased(x.reshape(n, -1).double())
    ky = _centered_gram_unbiased(y.reshape(n, -1).double())
    hxy = (kx * ky).sum()
    hxx = (kx * kx).sum()
    hyy = (ky * ky).sum()
    denom = torch.sqrt(hxx * hyy)
    return float(hxy / denom) if float(denom) > 0 else 0.0
