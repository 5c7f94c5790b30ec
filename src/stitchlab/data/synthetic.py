"""Procedurally generated images: no files, no download, deterministic for a seed.

* :func:`shapes`: grey (or randomly coloured) shapes; the class is the shape.
* :func:`cues`: the class can be carried by the shape, the colour and/or the texture of
  the object, each of the others random or absent, so that networks relying on different
  cues can be trained in a minute on a CPU. Add a marker with
  :class:`stitchlab.data.Marked` (grey images make the marker the easiest cue).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["shapes", "cues", "render_cues", "SHAPE_NAMES", "TEXTURE_NAMES", "CUES"]

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


TEXTURE_NAMES = (
    "stripes-0",
    "stripes-45",
    "stripes-90",
    "stripes-135",
    "fine-0",
    "fine-45",
    "fine-90",
    "fine-135",
    "checker",
    "dots",
)
CUES = ("shape", "colour", "texture")


def _textures(kind: Tensor, size: int) -> Tensor:
    """Patterns (N, S, S) in [0, 1] of texture ``kind`` (image coordinates)."""
    pix = torch.arange(size, dtype=torch.float32) + 0.5
    yy, xx = torch.meshgrid(pix, pix, indexing="ij")
    period = max(size / 5.0, 3.0)
    out = torch.ones(len(kind), size, size)
    for k in range(len(TEXTURE_NAMES)):
        sel = kind == k
        if not bool(sel.any()):
            continue
        if k < 8:
            theta = math.pi / 4 * (k % 4)
            p = period if k < 4 else period / 2
            t = xx * math.cos(theta) + yy * math.sin(theta)
            pattern = (torch.remainder(t / p, 1.0) < 0.5).float()
        elif k == 8:
            pattern = (
                (torch.remainder(xx / period, 1.0) < 0.5)
                ^ (torch.remainder(yy / period, 1.0) < 0.5)
            ).float()
        else:
            u = torch.remainder(xx / period, 1.0) - 0.5
            v = torch.remainder(yy / period, 1.0) - 0.5
            pattern = (u * u + v * v > 0.09).float()
        out[sel] = pattern
    return out


def cues(
    n: int,
    *,
    seed: int = 0,
    label_cues: tuple[str, ...] | list[str] = ("shape",),
    nuisance: tuple[str, ...] | list[str] | None = None,
    size: int = 32,
    num_classes: int = 10,
    noise: float = 0.05,
    return_factors: bool = False,
):
    """``n`` images ``(n, 3, size, size)`` in [0, 1] of one object, and the labels.

    Every image has a shape, a colour and a texture (see ``SHAPE_NAMES``,
    :func:`stitchlab.data.markers.distinct_colours` and ``TEXTURE_NAMES``). A cue in
    ``label_cues`` takes the label's value; a cue in ``nuisance`` is random (no label
    information; default: every cue that does not carry the label); any other cue is
    fixed (a square, grey, no texture). With
    ``return_factors=True`` a third item maps each cue to its per-image value.
    """

    label_cues = tuple(label_cues)
    if nuisance is None:
        nuisance = tuple(c for c in CUES if c not in label_cues)
    nuisance = tuple(nuisance)
    unknown = [c for c in label_cues + nuisance if c not in CUES]
    if unknown:
        raise ValueError(f"unknown cue(s) {unknown}; choose from {', '.join(CUES)}")
    if not label_cues:
        raise ValueError("label_cues must name at least one cue that carries the label")
    both = set(label_cues) & set(nuisance)
    if both:
        raise ValueError(f"cue(s) {sorted(both)} cannot carry the label and be random at once")
    if not 2 <= num_classes <= len(SHAPE_NAMES):
        raise ValueError(f"num_classes must be in [2, {len(SHAPE_NAMES)}], got {num_classes}")
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    fixed = {"shape": 2, "colour": -1, "texture": -1}
    factors = {}
    for cue in CUES:
        draw = torch.randint(0, 10, (n,), generator=g)  # always drawn: stable streams
        if cue in label_cues:
            factors[cue] = labels.clone()
        elif cue in nuisance:
            factors[cue] = draw
        else:
            factors[cue] = torch.full((n,), fixed[cue])
    img = _render(factors, g, size, noise)
    return (img, labels, factors) if return_factors else (img, labels)


def render_cues(
    factors: dict[str, Tensor], *, seed: int = 0, size: int = 32, noise: float = 0.05
) -> Tensor:
    """Images ``(n, 3, size, size)`` in [0, 1] of one object whose shape, colour and texture
    are the given per-image classes (``factors``: ``{"shape", "colour", "texture"}`` to
    tensors of class indices in 0..9; ``-1`` for colour or texture: grey, no texture).
    Position, size, rotation, brightness and noise are drawn from ``seed``."""
    missing = [c for c in CUES if c not in factors]
    if missing:
        raise ValueError(f"render_cues needs a class for every cue; missing {missing}")
    n = len(factors["shape"])
    if any(len(factors[c]) != n for c in CUES):
        raise ValueError("every cue needs one class per image")
    return _render({c: factors[c].long() for c in CUES}, torch.Generator().manual_seed(seed),
                   size, noise)  # fmt: skip


def _render(factors: dict[str, Tensor], g: torch.Generator, size: int, noise: float) -> Tensor:
    from .markers import distinct_colours

    n = len(factors["shape"])
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    r = 0.45 + 0.3 * torch.rand(n, generator=g)
    cx = (torch.rand(n, generator=g) * 2 - 1) * (0.95 - r)
    cy = (torch.rand(n, generator=g) * 2 - 1) * (0.95 - r)
    angle = (torch.rand(n, generator=g) - 0.5) * (math.pi / 6)
    u0, v0 = xx[None] - cx[:, None, None], yy[None] - cy[:, None, None]
    c, s = torch.cos(angle)[:, None, None], torch.sin(angle)[:, None, None]
    u, v = c * u0 + s * v0, -s * u0 + c * v0
    mask = _masks(factors["shape"], u, v, r[:, None, None])
    background = 0.1 + 0.2 * torch.rand(n, 1, 1, 1, generator=g)
    bright = 0.75 + 0.25 * torch.rand(n, 1, 1, 1, generator=g)
    palette = torch.cat([distinct_colours(10), torch.full((1, 3), 0.8)])  # index -1: grey
    fg = bright * palette[factors["colour"]][:, :, None, None]
    texture = _textures(factors["texture"], size)[:, None]
    fg = fg * (0.35 + 0.65 * texture)
    img = background + (fg - background) * mask[:, None]
    img = img + noise * torch.randn(n, 3, size, size, generator=g)
    img = img.clamp(0, 1)
    return img
