"""The scores of docs/method.md section 4. All percentages are in [0, 100]."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "agreement",
    "accuracy",
    "hard_agreement",
    "error_consistency",
    "chance_normalised",
    "excess_agreement",
    "layer_average",
    "cka",
    "bootstrap_agreement",
    "agreement_interval",
    "per_image_agreement",
]


def _check_finite(t: Tensor, what: str) -> None:
    """Refuse a tensor with a NaN or infinite entry: no score is computed from one."""
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        rows = (~torch.isfinite(t.reshape(len(t), -1))).any(dim=1) if t.dim() else None
        where = f" ({int(rows.sum())} of {len(t)} samples)" if rows is not None else ""
        raise ValueError(
            f"{what} contain NaN or infinite values{where}: the model diverged, has non-finite "
            "weights or was given non-finite inputs; no score is computed from them."
        )


def _check_logits(t: Tensor, what: str = "logits") -> None:
    if t.dim() != 2:
        raise ValueError(f"Expected {what} of shape (N, classes), got {tuple(t.shape)}.")
    _check_finite(t, what)


def _check_pair(a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape or a.dim() != 2:
        raise ValueError(
            f"Expected two logit tensors of equal shape (N, classes), got {tuple(a.shape)} "
            f"and {tuple(b.shape)}."
        )
    _check_finite(a, "the first logits")
    _check_finite(b, "the second logits")


def _check_labels(logits: Tensor, labels: Tensor) -> None:
    """Labels must be integer class indices, one per row of ``logits``: a label tensor of
    shape (N, 1) would broadcast against the N predictions and give a wrong score."""
    if labels.dim() != 1 or len(labels) != len(logits):
        raise ValueError(
            f"Expected labels of shape ({len(logits)},) for {len(logits)} logits, got "
            f"{tuple(labels.shape)}; give one integer class index per sample."
        )
    if labels.is_floating_point() or labels.dtype == torch.bool or labels.is_complex():
        raise ValueError(
            f"labels must be integer class indices, got {labels.dtype}; convert them with "
            "labels.long() if they are whole numbers."
        )


def agreement(logits_a: Tensor, logits_b: Tensor) -> float:
    """Agreement probability in percent: mean of ``<p_a, p_b> / max(|p_a|^2, |p_b|^2)``."""
    return float(per_image_agreement(logits_a, logits_b).mean() * 100)


def accuracy(logits: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy in percent."""
    _check_logits(logits)
    _check_labels(logits, labels)
    return float((logits.argmax(1) == labels).double().mean() * 100)


def hard_agreement(logits_a: Tensor, logits_b: Tensor) -> float:
    """Percentage of samples on which the two top-1 predictions are equal."""
    _check_pair(logits_a, logits_b)
    return float((logits_a.argmax(1) == logits_b.argmax(1)).double().mean() * 100)


def error_consistency(logits_a: Tensor, logits_b: Tensor, labels: Tensor) -> float:
    """Cohen's kappa of the two models' correct/incorrect decisions (Geirhos et al.)."""
    _check_pair(logits_a, logits_b)
    _check_labels(logits_a, labels)
    ca = logits_a.argmax(1) == labels
    cb = logits_b.argmax(1) == labels
    c_obs = float((ca == cb).double().mean())
    a1, a2 = float(ca.double().mean()), float(cb.double().mean())
    c_exp = a1 * a2 + (1 - a1) * (1 - a2)
    if c_exp >= 1.0:
        return 1.0 if c_obs >= 1.0 else 0.0
    return (c_obs - c_exp) / (1 - c_exp)


def chance_normalised(score: float, num_classes: int) -> float:
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
    _check_finite(x, "CKA's first representations")
    _check_finite(y, "CKA's second representations")
    kx = _centered_gram_unbiased(x.reshape(n, -1).double())
    ky = _centered_gram_unbiased(y.reshape(n, -1).double())
    hxy = (kx * ky).sum()
    hxx = (kx * kx).sum()
    hyy = (ky * ky).sum()
    denom = torch.sqrt(hxx * hyy)
    return float(hxy / denom) if float(denom) > 0 else 0.0


def per_image_agreement(logits_a: Tensor, logits_b: Tensor) -> Tensor:
    """The agreement probability of each sample (in [0, 1]); :func:`agreement` is its
    mean in percent."""
    _check_pair(logits_a, logits_b)
    pa = torch.softmax(logits_a.double(), dim=1)
    pb = torch.softmax(logits_b.double(), dim=1)
    return (pa * pb).sum(1) / torch.maximum((pa * pa).sum(1), (pb * pb).sum(1))


def _resampled_means(values: np.ndarray, img: np.ndarray, chunk: int = 100) -> np.ndarray:
    """``values[img].mean(-1)`` for one image resample per row of ``img``, in chunks of
    rows so that memory stays O(chunk x images)."""
    return np.concatenate([values[img[i : i + chunk]].mean(axis=1)
                           for i in range(0, len(img), chunk)])  # fmt: skip


def _agreement_values(values: np.ndarray, what: str) -> np.ndarray:
    """``values`` as float64 (seeds, images), each a per-image agreement in [0, 1], over at
    least 2 images (an interval over images needs two)."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] == 0:
        raise ValueError(f"{what} must be (seeds, images), got shape {values.shape}")
    if not np.isfinite(values).all():
        raise ValueError(f"{what} contain NaN or infinite agreements: no interval is computed.")
    if values.min() < -1e-9 or values.max() > 1 + 1e-9:
        raise ValueError(
            f"{what} must be per-image agreements in [0, 1] (per_image_agreement), got "
            f"values in [{values.min():g}, {values.max():g}]."
        )
    if values.shape[1] < 2:
        raise ValueError(
            f"an interval over test images needs at least 2 of them, got {values.shape[1]}; "
            "score on more test images."
        )
    return values


def bootstrap_agreement(
    values: np.ndarray,
    null_values: np.ndarray | None = None,
    *,
    reps: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Mean agreement (%) of ``values`` (seeds x test images: each image's agreement in
    [0, 1], :func:`per_image_agreement`) with a two-level percentile bootstrap interval:
    seeds drawn with replacement, and one image resample shared by every seed. With
    ``null_values`` (null seeds x the same images) also the null's mean and interval and
    the excess over the null, whose interval resamples the images jointly (paired) and
    the seeds of each side independently."""
    values = _agreement_values(values, "values")
    rng = np.random.default_rng(seed)
    n = values.shape[1]
    img = rng.integers(0, n, size=(reps, n), dtype=np.int32)
    alpha = (1 - confidence) / 2

    def replicates(h: np.ndarray) -> np.ndarray:
        per_seed = np.stack([_resampled_means(row, img) for row in h])  # (seeds, reps)
        pick = rng.integers(0, len(h), size=(reps, len(h)))
        return 100 * per_seed[pick, np.arange(reps)[:, None]].mean(axis=1)

    rep = replicates(values)
    out = {"agreement": 100 * float(values.mean()),
           "agreement_ci_low": float(np.quantile(rep, alpha)),
           "agreement_ci_high": float(np.quantile(rep, 1 - alpha)),
           "agreement_seed_std": float(100 * values.mean(axis=1).std(ddof=1))
           if len(values) > 1 else float("nan")}  # fmt: skip
    if null_values is not None and len(null_values):
        null_values = _agreement_values(null_values, "null_values")
        if null_values.shape[1] != n:
            raise ValueError("null_values must be (null seeds, the same test images)")
        nrep = replicates(null_values)
        diff = rep - nrep
        null = 100 * float(null_values.mean())
        out |= {"null_agreement": null,
                "null_ci_low": float(np.quantile(nrep, alpha)),
                "null_ci_high": float(np.quantile(nrep, 1 - alpha)),
                "excess_over_null": out["agreement"] - null,
                "excess_ci_low": float(np.quantile(diff, alpha)),
                "excess_ci_high": float(np.quantile(diff, 1 - alpha))}  # fmt: skip
    return out


def agreement_interval(
    logits_a: Tensor, logits_b: Tensor, *, reps: int = 1000, confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval (%) of :func:`agreement` over the test images
    (``reps`` resamples of the images with replacement; seeded, so reproducible); NaN
    bounds for a single image, over which no interval exists."""
    values = per_image_agreement(logits_a, logits_b).numpy()
    if len(values) < 2:
        return float("nan"), float("nan")
    stats = bootstrap_agreement(values[None], reps=reps, confidence=confidence, seed=seed)
    return stats["agreement_ci_low"], stats["agreement_ci_high"]
