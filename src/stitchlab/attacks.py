"""Projected gradient descent (Madry et al. 2018), written once and shared by adversarial
training, robust evaluation and adversarial stitch training.

:func:`pgd` works on any module that maps images to an output (a classifier, a stitched
model) and any loss of that output; it leaves the module's mode and gradients alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ._modes import evaluating
from .vocabulary import PGD_EVAL, PGD_TRAIN

__all__ = ["pgd", "robust_accuracy", "autoattack_accuracy", "PGD_TRAIN", "PGD_EVAL"]



def _check(x: Tensor, y: Tensor | None, eps: float, step: float, steps: int, norm: str) -> None:
    if norm not in ("linf", "l2"):
        raise ValueError(f"norm must be 'linf' or 'l2', got {norm!r}")
    if eps < 0 or step < 0 or steps < 0:
        raise ValueError(f"eps, step and steps must be >= 0, got {eps}, {step}, {steps}")
    if not x.is_floating_point():
        raise ValueError(f"images must be floating point in [0, 1], got {x.dtype}")
    if y is not None and len(y) != len(x):
        raise ValueError(f"got {len(x)} images but {len(y)} labels")


def _l2_normalise(t: Tensor) -> Tensor:
    norms = t.flatten(1).norm(dim=1).clamp_min(1e-12)
    return t / norms.view(-1, *([1] * (t.dim() - 1)))


def _random_start(x: Tensor, eps: float, norm: str, generator: torch.Generator | None) -> Tensor:
    gen_device = generator.device if generator is not None else x.device
    if norm == "linf":
        noise = torch.empty(x.shape, device=gen_device).uniform_(-eps, eps, generator=generator)
    else:
        direction = _l2_normalise(torch.randn(x.shape, device=gen_device, generator=generator))
        radius = torch.rand(len(x), device=gen_device, generator=generator) * eps
        noise = direction * radius.view(-1, *([1] * (x.dim() - 1)))
    return noise.to(device=x.device, dtype=x.dtype)


def pgd(
    model: nn.Module | Callable[[Tensor], Tensor],
    x: Tensor,
    y: Tensor | None = None,
    *,
    eps: float = PGD_TRAIN["eps"],
    step: float = PGD_TRAIN["step"],
    steps: int = PGD_TRAIN["steps"],
    norm: str = "linf",
    random_start: bool = True,
    loss_fn: Callable[[Tensor, Tensor | None], Tensor] | None = None,
    targeted: bool = False,
    bounds: tuple[float, float] = (0.0, 1.0),
    generator: torch.Generator | None = None,
) -> Tensor:
    """Adversarial examples ``x'`` with ``||x' - x|| <= eps`` inside ``bounds``.

    Each of ``steps`` steps moves by ``step`` along the sign of the gradient (L-inf) or the
    normalised gradient (L2) of ``loss_fn(model(x'), y)`` (default: cross-entropy summed
    over the batch), up the loss, or down with ``targeted=True`` (``y`` the target), then
    projects back. ``random_start`` begins at a uniform point of the ball (drawn from
    ``generator`` when given). The model's mode and parameter gradients are not touched:
    put it in eval mode first if BatchNorm statistics must not move. Returns detached
    images.
    """
    _check(x, y, eps, step, steps, norm)
    if loss_fn is None:
        if y is None:
            raise ValueError("pgd needs labels y for the default cross-entropy loss")

        def loss_fn(out: Tensor, target: Tensor | None) -> Tensor:
            return nn.functional.cross_entropy(out.float(), target, reduction="sum")

    lo, hi = bounds
    x = x.detach()
    delta = _random_start(x, eps, norm, generator) if random_start else torch.zeros_like(x)
    delta = ((x + delta).clamp(lo, hi) - x).detach()
    sign = -1.0 if targeted else 1.0
    with torch.enable_grad():
        for _ in range(steps):
            delta.requires_grad_(True)
            loss = loss_fn(model(x + delta), y)
            (grad,) = torch.autograd.grad(loss, delta)
            with torch.no_grad():
                if norm == "linf":
                    delta = delta + sign * step * grad.sign()
                    delta = delta.clamp(-eps, eps)
                else:
                    delta = delta + sign * step * _l2_normalise(grad)
                    norms = delta.flatten(1).norm(dim=1).clamp_min(1e-12)
                    factor = (eps / norms).clamp(max=1.0)
                    delta = delta * factor.view(-1, *([1] * (x.dim() - 1)))
                delta = (x + delta).clamp(lo, hi) - x
            delta = delta.detach()
    return (x + delta).detach()


def _batches(data, batch_size: int, max_samples: int | None):
    from ._data import as_dataset, loader

    dataset, _ = as_dataset(data)
    if max_samples is not None and max_samples < len(dataset):  # type: ignore[arg-type]
        dataset = torch.utils.data.Subset(dataset, range(max_samples))
    for x, y, *_ in loader(dataset, batch_size):
        yield x, torch.as_tensor(y)


def robust_accuracy(
    model: nn.Module,
    data,
    *,
    eps: float = PGD_EVAL["eps"],
    step: float = PGD_EVAL["step"],
    steps: int = PGD_EVAL["steps"],
    norm: str = "linf",
    batch_size: int = 256,
    max_samples: int | None = None,
    seed: int = 0,
) -> float:
    """Top-1 accuracy in percent under :func:`pgd` (random start), model in eval mode."""
    from ._data import _module_device

    device = _module_device(model)
    gen = torch.Generator().manual_seed(seed)
    correct = total = 0
    with evaluating(model):
        for x, y in _batches(data, batch_size, max_samples):
            x, y = x.to(device), y.to(device)
            adv = pgd(model, x, y, eps=eps, step=step, steps=steps, norm=norm, generator=gen)
            with torch.no_grad():
                correct += int((model(adv).argmax(1) == y).sum())
            total += len(y)
    return 100.0 * correct / max(total, 1)


def autoattack_accuracy(
    model: nn.Module,
    data,
    *,
    eps: float = PGD_EVAL["eps"],
    norm: str = "Linf",
    attacks: tuple[str, ...] = ("apgd-ce", "apgd-dlr"),
    batch_size: int = 256,
    max_samples: int | None = 1000,
    seed: int = 0,
) -> float:
    """Accuracy in percent under AutoAttack's APGD-CE + APGD-DLR (as in the paper).

    Needs the optional ``autoattack`` package (Croce & Hein; installed from its
    repository, it is not on PyPI).
    """
    try:
        from autoattack import AutoAttack
    except ImportError as exc:
        raise ImportError(
            "AutoAttack is not installed; install it with "
            "'pip install git+https://github.com/fra31/auto-attack' or evaluate with PGD "
            "(robust_accuracy)."
        ) from exc
    from ._data import _module_device

    device = _module_device(model)
    xs, ys = zip(*_batches(data, batch_size, max_samples))
    x, y = torch.cat(xs).to(device), torch.cat(ys).to(device)
    with evaluating(model):
        adversary = AutoAttack(
            model,
            norm=norm,
            eps=eps,
            version="custom",
            attacks_to_run=list(attacks),
            seed=seed,
            device=device,
            verbose=False,
        )
        adv = adversary.run_standard_evaluation(x, y, bs=batch_size)
        correct = 0
        with torch.no_grad():
            for i in range(0, len(x), batch_size):
                pred = model(adv[i : i + batch_size]).argmax(1)
                correct += int((pred == y[i : i + batch_size]).sum())
    return 100.0 * correct / len(y)
