"""Scoring a stitched model against a reference (usually the back model)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import metrics
from ._checks import check_class_labels
from ._data import DataLike, _module_device, as_dataset, batches
from ._modes import evaluating
from .fit import check_attack

__all__ = ["evaluate", "iri_agreement", "robust_scores", "pgd_examples"]


def evaluate(
    stitched: nn.Module,
    test_data: DataLike,
    reference: nn.Module | Tensor,
    *,
    batch_size: int = 256,
    attack: dict | None = None,
) -> dict[str, float]:
    """All scores of a stitched model against a reference (usually the back model).

    ``reference`` is a model (run in eval mode) or its logits on ``test_data``. Returns
    agreement with its 95% bootstrap interval over the test images (``agreement_ci_low``,
    ``agreement_ci_high``; :func:`stitchlab.metrics.agreement_interval`), accuracy, hard
    agreement, error consistency, chance-normalised agreement and the reference's own
    accuracy. With ``attack`` (``reference`` must then be a model) also the scores of
    :func:`robust_scores`.
    """
    from ._data import predict

    with evaluating(stitched):
        logits, labels = predict(stitched, test_data, batch_size=batch_size)
    if isinstance(reference, nn.Module):
        with evaluating(reference):
            ref_logits, _ = predict(reference, test_data, batch_size=batch_size)
    else:
        ref_logits = reference.detach().float().cpu()
    if ref_logits.shape != logits.shape:
        raise ValueError(
            f"reference logits have shape {tuple(ref_logits.shape)}, the stitched model's "
            f"{tuple(logits.shape)}: they must be logits on the same test data."
        )
    metrics._check_finite(logits, "the stitched model's logits")
    metrics._check_finite(ref_logits, "the reference logits")
    k = logits.shape[1]
    check_class_labels(labels, k, "test_data")
    agree = metrics.agreement(logits, ref_logits)
    robust = {}
    if attack is not None:
        robust = robust_scores(stitched, test_data, reference, attack, batch_size=batch_size)
    low, high = metrics.agreement_interval(logits, ref_logits)
    return robust | {
        "agreement": agree,
        "agreement_ci_low": low,
        "agreement_ci_high": high,
        "agreement_normalized": metrics.chance_normalised(agree, k),
        "accuracy": metrics.accuracy(logits, labels),
        "hard_agreement": metrics.hard_agreement(logits, ref_logits),
        "error_consistency": metrics.error_consistency(logits, ref_logits, labels),
        "reference_accuracy": metrics.accuracy(ref_logits, labels),
    }


def iri_agreement(
    model: nn.Module, iris: DataLike, sources: DataLike, *, batch_size: int = 256
) -> dict[str, float]:
    """How a whole model treats IRIs: its agreement (%) between its outputs on each IRI and
    on the IRI's source image, with the 95% bootstrap interval over the images.

    ``iris`` (an :class:`~stitchlab.iris.IRISet`, or data) must be aligned with ``sources``
    item by item. For the front model that made the IRIs this measures whether the IRIs are
    close enough to matter nowhere downstream (about 100 when they are); for another model
    it is a stitch-free measure of shared invariance: the back model of a pair reaches about
    100 only if it is invariant to what the front's IRIs changed. Returns ``agreement``,
    ``agreement_ci_low``, ``agreement_ci_high`` (the metric of :func:`evaluate`),
    ``hard_agreement`` (same top-1 decision) and ``null_agreement``: the same model's
    agreement between its outputs on two different source images (a seeded pairing, no
    image with itself), the level its agreement on the IRIs would have if they were
    unrelated images.
    """
    from ._data import predict

    n_iris, n_sources = len(as_dataset(iris, "iris")[0]), len(as_dataset(sources, "sources")[0])
    if n_iris != n_sources:
        raise ValueError(
            f"{n_iris} IRIs for {n_sources} source images: pass the sources the IRIs were "
            "made from, in the same order."
        )
    with evaluating(model):
        on_iris, _ = predict(model, iris, batch_size=batch_size)
        on_sources, _ = predict(model, sources, batch_size=batch_size)
    low, high = metrics.agreement_interval(on_iris, on_sources)
    n = len(on_sources)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    other = torch.empty_like(order)
    other[order] = order.roll(1)  # each image paired with another one (n > 1)
    null = metrics.agreement(on_sources[other], on_sources) if n > 1 else float("nan")
    return {
        "agreement": metrics.agreement(on_iris, on_sources),
        "agreement_ci_low": low,
        "agreement_ci_high": high,
        "hard_agreement": metrics.hard_agreement(on_iris, on_sources),
        "null_agreement": null,
    }


def iri_transfer_columns(
    front: nn.Module, back: nn.Module, iris: DataLike, sources: DataLike, *,
    batch_size: int = 256,
) -> dict[str, float]:
    """The result-table columns of :func:`iri_agreement` for a pair: the front on its IRIs,
    the back on them (agreement, equal top-1) and the back's null. The model is run once
    when front and back are the same object."""
    on_back = iri_agreement(back, iris, sources, batch_size=batch_size)
    on_front = on_back if front is back else iri_agreement(front, iris, sources,
                                                           batch_size=batch_size)  # fmt: skip
    return {
        "iri_front_agreement": on_front["agreement"],
        "iri_back_agreement": on_back["agreement"],
        "iri_back_hard_agreement": on_back["hard_agreement"],
        "iri_back_null_agreement": on_back["null_agreement"],
    }


def robust_scores(
    stitched: nn.Module,
    test_data: DataLike,
    reference: nn.Module,
    attack: dict,
    *,
    batch_size: int = 256,
) -> dict[str, float]:
    """Agreement and accuracy under attack: PGD examples against the stitched model
    (``attack``: ``{eps, step, steps}``, L-inf, and optionally ``samples``, to attack only
    the first that many test images), scored on both the stitched and the reference model.
    Returns ``robust_agreement``, ``robust_accuracy`` and ``robust_samples``.
    """
    if not isinstance(reference, nn.Module):
        raise ValueError("robust scores need the reference model, not its logits.")
    check_attack(attack, "attack", samples=True)
    settings = {k: v for k, v in attack.items() if k != "samples"}
    dataset, _ = as_dataset(test_data, "test_data")
    if "samples" in attack and attack["samples"] < len(dataset):
        dataset = torch.utils.data.Subset(dataset, range(int(attack["samples"])))
    device = _module_device(stitched)
    outs, refs, labels = [], [], []
    with evaluating(stitched, reference):
        for x, y in batches(dataset, batch_size, device):
            x_adv = pgd_examples(stitched, x, y, settings)
            with torch.no_grad():
                outs.append(stitched(x_adv).float().cpu())
                refs.append(reference(x_adv).float().cpu())
            labels.append(y.cpu())
    logits, ref_logits, y_all = torch.cat(outs), torch.cat(refs), torch.cat(labels)
    return {
        "robust_agreement": metrics.agreement(logits, ref_logits),
        "robust_accuracy": metrics.accuracy(logits, y_all),
        "robust_samples": len(y_all),
    }


def pgd_examples(model: nn.Module, x: Tensor, y: Tensor, settings: dict) -> Tensor:
    """PGD (L-inf) examples against ``model``'s cross-entropy, with the model in eval mode."""
    from .attacks import PGD_TRAIN, pgd

    with evaluating(model):
        return pgd(model, x, y, **{**PGD_TRAIN, **settings})
