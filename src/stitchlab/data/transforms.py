"""Augmentations of images in [0, 1]: base training (torchvision v2, per image) and SimCLR
(per-image parameters, applied to whole batches)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = ["train_augmentation", "simclr_views"]


def train_augmentation(size: int = 32, padding: int | None = None) -> Callable[[Tensor], Tensor]:
    """The base-model augmentation: random crop (``size``, zero padding ``size // 8``: 4 at
    32x32) and horizontal flip for small images; random resized crop and flip at 224."""
    from torchvision.transforms import v2

    if size >= 128:
        return v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])
    pad = size // 8 if padding is None else padding
    return v2.Compose([v2.RandomCrop(size, padding=pad), v2.RandomHorizontalFlip()])


def _grey(x: Tensor) -> Tensor:
    r, g, b = x.unbind(1)
    return (0.299 * r + 0.587 * g + 0.114 * b).unsqueeze(1)


def _hue_matrices(angle: Tensor) -> Tensor:
    """Rotations (N, 3, 3) of RGB about the grey axis by ``angle`` (radians)."""
    c, s = torch.cos(angle), torch.sin(angle)
    k = torch.full_like(angle, 1 / 3)
    a = c + (1 - c) / 3
    b = k * (1 - c) - s / 3**0.5
    d = k * (1 - c) + s / 3**0.5
    return torch.stack(
        [torch.stack([a, b, d], -1), torch.stack([d, a, b], -1), torch.stack([b, d, a], -1)], 1
    )


def simclr_views(
    x: Tensor,
    generator: torch.Generator | None = None,
    *,
    scale: tuple[float, float] = (0.2, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1),
    p_jitter: float = 0.8,
    p_grey: float = 0.2,
) -> Tensor:
    """One SimCLR view of each image of a batch ``(N, 3, H, W)``, on the batch's device.

    SimCLR's CIFAR augmentation (Chen et al. 2020) with its own parameters per image:
    random resized crop (area ``scale``, aspect ``ratio``, bilinear), horizontal flip,
    colour jitter with probability ``p_jitter`` (brightness, contrast, saturation, then
    hue as a rotation about the grey axis), greyscale with probability ``p_grey``. All
    random draws come from ``generator``. Written for whole batches because per-image
    transforms cost milliseconds per image on a CPU.
    """
    n, dev = len(x), x.device

    def u(lo: float, hi: float, *shape: int) -> Tensor:
        return (torch.rand(n, *shape, generator=generator) * (hi - lo) + lo).to(dev)

    area = u(*scale)
    log_ratio = u(math.log(ratio[0]), math.log(ratio[1]))
    aspect = torch.exp(log_ratio)
    w = torch.sqrt(area * aspect).clamp(max=1.0)
    h = torch.sqrt(area / aspect).clamp(max=1.0)
    cx = (u(0, 1) * 2 - 1) * (1 - w)
    cy = (u(0, 1) * 2 - 1) * (1 - h)
    flip = torch.where(u(0, 1) < 0.5, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3, device=dev)
    theta[:, 0, 0], theta[:, 0, 2] = w * flip, cx
    theta[:, 1, 1], theta[:, 1, 2] = h, cy
    grid = nn.functional.affine_grid(theta, list(x.shape), align_corners=False)
    out = nn.functional.grid_sample(x.float(), grid, mode="bilinear", align_corners=False)

    jit = (u(0, 1) < p_jitter).float().view(n, 1, 1, 1)
    bj, cj, sj, hj = jitter
    b = 1 + jit * (u(-bj, bj).view(n, 1, 1, 1))
    c = 1 + jit * (u(-cj, cj).view(n, 1, 1, 1))
    s = 1 + jit * (u(-sj, sj).view(n, 1, 1, 1))
    hue = jit.view(n) * u(-hj, hj) * 2 * math.pi
    out = (out * b).clamp(0, 1)
    mean = _grey(out).mean(dim=(2, 3), keepdim=True)
    out = ((out - mean) * c + mean).clamp(0, 1)
    g = _grey(out)
    out = ((out - g) * s + g).clamp(0, 1)
    out = torch.einsum("nij,njhw->nihw", _hue_matrices(hue), out).clamp(0, 1)
    grey = (u(0, 1) < p_grey).view(n, 1, 1, 1)
    out = torch.where(grey, _grey(out).expand_as(out), out)
    return out.to(x.dtype)
