"""Procedurally generated images: no files, no download, deterministic for a seed."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["shapes", "SHAPE_NAMES"]

SHAPE_NAMES = (
    "disc",
    "ring",
    "square",
    "frame",
    "triangle",
    "plus",
    "cross",
    "hbars",
    "vbars",
    "diagonal",
)


def _masks(kind: Tensor, u: Tensor, v: Tensor, r: Tensor) -> Tensor:
    """Binary masks (N, S, S) of shape ``kind`` in centred coordinates u, v, radius r."""
    au, av = u.abs(), v.abs()
    d = torch.sqrt(u * u + v * v)
    thick = 0.35 * r
    out = torch.zeros_like(u)
    tables = [
        d < r,  # disc
        (d < r) & (d > r - thick),  # ring
        (au < r * 0.85) & (av < r * 0.85),  # square
        (au < r * 0.85) & (av < r * 0.85) & ((au > r * 0.85 - thick) | (av > r * 0.85 - thick)),
        (v < r * 0.7) & (v > -r) & (au < (v + r) * 0.6),  # triangle
        ((au < thick / 2) & (av < r)) | ((av < thick / 2) & (au < r)),  # plus
        ((u - v).abs() < thick / 1.4) & (d < r) | ((u + v).abs() < thick / 1.4) & (d < r),
        (torch.remainder(v / (r / 2.5), 2.0) < 1.0) & (au < r) & (av < r),  # hbars
        (torch.remainder(u / (r / 2.5), 2.0) < 1.0) & (au < r) & (av < r),  # vbars
        (torch.remainder((u + v) / (r / 2.0), 2.0) < 1.0) & (au < r) & (av < r),  # diagonal
    ]
    for k, mask in enumerate(tables):
        sel = (kind == k)[:, None, None]
        out = torch.where(sel & mask, torch.ones_like(out), out)
    return out


def shapes(
    n: int,
    *,
    seed: int = 0,
    size: int = 32,
    num_classes: int = 10,
    colour: bool = False,
    noise: float = 0.08,
) -> tuple[Tensor, Tensor]:
    """``n`` images ``(n, 3, size, size)`` in [0, 1] of one of 10 shapes, and the labels.

    The class is the shape; position, scale, brightness (and, with ``colour=True``, hue)
    are random. Grey shapes by default, so that a coloured marker is the easier cue.
    """
    if not 2 <= num_classes <= len(SHAPE_NAMES):
        raise ValueError(f"num_classes must be in [2, {len(SHAPE_NAMES)}], got {num_classes}")
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    r = 0.35 + 0.3 * torch.rand(n, generator=g)
    cx = (torch.rand(n, generator=g) * 2 - 1) * (0.9 - r)
    cy = (torch.rand(n, generator=g) * 2 - 1) * (0.9 - r)
    angle = (torch.rand(n, generator=g) - 0.5) * (math.pi / 6)
    u0, v0 = xx[None] - cx[:, None, None], yy[None] - cy[:, None, None]
    c, s = torch.cos(angle)[:, None, None], torch.sin(angle)[:, None, None]
    u, v = c * u0 + s * v0, -s * u0 + c * v0
    mask = _masks(labels, u, v, r[:, None, None])
    background = 0.2 + 0.2 * torch.rand(n, 1, 1, 1, generator=g)
    fg = 0.6 + 0.4 * torch.rand(n, 1, 1, 1, generator=g)
    if colour:
        fg = fg * (0.3 + 0.7 * torch.rand(n, 3, 1, 1, generator=g))
    else:
        fg = fg.expand(n, 3, 1, 1)
    img = background + (fg - background) * mask[:, None]
    img = img + noise * torch.randn(n, 3, size, size, generator=g)
    return img.clamp(0, 1), labels
