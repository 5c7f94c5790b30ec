"""Stitch layers and their least-squares initialisation.

The layer is chosen from the activation shapes at the two points:

=============  =============  ==================================================
front          back           stitch layer
=============  =============  ==================================================
conv (C,H,W)   conv (C',H',W')  1x1 convolution with bias (bilinear resize first
                              when the spatial sizes differ)
tokens (L,D)   tokens (L,D')  one Linear applied to every token (the grid part is
                              resized bilinearly when the grids differ)
conv           tokens         Linear per grid position; the prefix (class) tokens
                              from a Linear of the spatially pooled map
tokens         conv           prefix tokens dropped, grid tokens as a map, 1x1 conv
conv/seq       seq (C',L')    Linear per time step; a map's height is averaged
                              (a mel x time map to a time sequence), then the
                              length resized linearly
conv/tokens    vector         Linear of the pooled map / of the class token
vector         vector         Linear
=============  =============  ==================================================

A map is NCHW or NHWC (channels last: Swin, MaxViT) and a sequence NCL (Conv1d, as a
map of height 1): whatever the layout, every layer maps the channel axis (the layout is
part of :class:`ActivationSpec`, detected by :meth:`stitchlab.splitting.TracedModel.formats`).

Every layer is affine in its parameters, so its least-squares fit is solved exactly
from streamed normal equations in float64 (:class:`LeastSquares`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "ActivationSpec",
    "StitchLayer",
    "LeastSquares",
    "StitchShapeError",
    "fit_least_squares",
]

Kind = Literal["conv", "seq", "tokens", "vector"]

# layout -> (kind, channel axis of one sample's activation)
_LAYOUT_KIND = {
    "NCHW": ("conv", 0), "NHWC": ("conv", 2), "NCL": ("seq", 0), "NLC": ("tokens", 1),
    "NC": ("vector", 0),
}  # fmt: skip
_DEFAULT_LAYOUT = {"conv": "NCHW", "seq": "NCL", "tokens": "NLC", "vector": "NC"}


class StitchShapeError(ValueError):
    """No stitch layer can bridge the two activation shapes."""


@dataclass(frozen=True)
class ActivationSpec:
    """The format of one sample's activation at a stitch point.

    ``layout`` says which axis holds the channels (batch first): ``NCHW`` or ``NHWC``
    maps (kind ``conv``), ``NCL`` sequences (``seq``, e.g. Conv1d), ``NLC`` tokens,
    ``NC`` vectors. Every stitch layer maps channels to channels whatever the layout.
    """

    kind: Kind
    shape: tuple[int, ...]  # without the batch dimension, in the activation's own layout
    prefix_tokens: int = 0  # tokens only: class/register tokens before the grid
    layout: str | None = None  # default: the kind's channels-first (tokens: NLC) layout

    def __post_init__(self) -> None:
        layout = self.layout or _DEFAULT_LAYOUT.get(self.kind)
        if layout not in _LAYOUT_KIND or _LAYOUT_KIND[layout][0] != self.kind:
            raise StitchShapeError(f"layout {self.layout!r} does not fit kind {self.kind!r}")
        if len(self.shape) != len(layout) - 1:
            raise StitchShapeError(
                f"an activation of layout {layout} has {len(layout) - 1} axes per sample, "
                f"got shape {self.shape}"
            )
        object.__setattr__(self, "layout", layout)

    @property
    def channels(self) -> int:
        """Feature dimension: C of a map or sequence, D of tokens and vectors."""
        return self.shape[_LAYOUT_KIND[self.layout][1]]  # type: ignore[index]

    @property
    def grid(self) -> tuple[int, int] | None:
        """Spatial size (H, W) of the map or token grid ((1, L) for a sequence), or None
        for vectors and tokens that do not form a square grid."""
        if self.layout == "NCHW":
            return (self.shape[1], self.shape[2])
        if self.layout == "NHWC":
            return (self.shape[0], self.shape[1])
        if self.layout == "NCL":
            return (1, self.shape[1])
        if self.kind == "tokens":
            n = self.shape[0] - self.prefix_tokens
            side = math.isqrt(n)
            return (side, side) if side * side == n and n > 0 else None
        return None

    @classmethod
    def of(
        cls, activation: Tensor, prefix_tokens: int | None = None, layout: str | None = None
    ) -> ActivationSpec:
        """The spec of a batched activation ``(N, ...)`` in ``layout``.

        Without a layout the rank decides (4 axes: NCHW, 3: tokens, 2: vector); stitch()
        passes the layout detected from the model's graph instead.
        """
        shape = tuple(activation.shape[1:])
        if layout is None:
            layout = {3: "NCHW", 2: "NLC", 1: "NC"}.get(len(shape))
            if layout is None:
                raise StitchShapeError(
                    f"Activation of shape {tuple(activation.shape)} is neither a conv map "
                    "(N,C,H,W), tokens (N,L,D) nor a vector (N,D)."
                )
        if layout not in _LAYOUT_KIND:
            raise StitchShapeError(f"unknown layout {layout!r}; one of {', '.join(_LAYOUT_KIND)}")
        kind = _LAYOUT_KIND[layout][0]
        if kind == "tokens":
            if len(shape) != 2:
                raise StitchShapeError(f"tokens (N,L,D) expected, got {tuple(activation.shape)}")
            if prefix_tokens is None:  # infer: the grid is the largest square that fits
                prefix_tokens = shape[0] - math.isqrt(shape[0]) ** 2
            return cls("tokens", shape, prefix_tokens, layout)
        return cls(kind, shape, 0, layout)  # type: ignore[arg-type]

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        extra = f", {self.prefix_tokens} prefix" if self.kind == "tokens" else ""
        return f"{self.layout} {dims} ({self.channels} channels{extra})"


def _pooled(a: Tensor, spec: ActivationSpec) -> Tensor:
    """A vector per sample: spatial mean, class token (or token mean), or itself."""
    if spec.layout == "NCHW":
        return a.mean(dim=(2, 3))
    if spec.layout == "NHWC":
        return a.mean(dim=(1, 2))
    if spec.layout == "NCL":
        return a.mean(dim=2)
    if spec.kind == "tokens":
        return a[:, 0] if spec.prefix_tokens > 0 else a.mean(dim=1)
    return a


def _grid_map(a: Tensor, spec: ActivationSpec) -> Tensor:
    """The activation as an ``(N, C, H, W)`` map (grid tokens only for tokens)."""
    if spec.layout == "NCHW":
        return a
    if spec.layout == "NHWC":
        return a.permute(0, 3, 1, 2)
    if spec.layout == "NCL":
        return a.unsqueeze(2)
    h, w = spec.grid  # type: ignore[misc]
    grid = a[:, spec.prefix_tokens :]
    return grid.transpose(1, 2).reshape(a.shape[0], spec.channels, h, w)


def _from_map(m: Tensor, spec: ActivationSpec) -> Tensor:
    """An ``(N, C, H, W)`` map in ``spec``'s layout (inverse of :func:`_grid_map`)."""
    if spec.layout == "NHWC":
        return m.permute(0, 2, 3, 1)
    if spec.layout == "NCL":
        return m.squeeze(2)
    return m


def _map_for(a: Tensor, src: ActivationSpec, dst: ActivationSpec) -> Tensor:
    """The front activation as an ``(N, C, H, W)`` map of the back's grid: a back that is a
    sequence (no height) gets the map averaged over its height first."""
    m = _grid_map(a, src)
    if dst.layout == "NCL" and m.shape[2] != 1:
        m = m.mean(dim=2, keepdim=True)
    return _resize(m, dst.grid)  # type: ignore[arg-type]


def _resize(m: Tensor, size: tuple[int, int]) -> Tensor:
    if tuple(m.shape[-2:]) == tuple(size):
        return m
    return F.interpolate(m, size=size, mode="bilinear", align_corners=False)


class StitchLayer(nn.Module):
    """The trainable affine map between a front activation and a back activation.

    ``main`` is the per-position (or per-vector) affine map; ``prefix`` exists only when
    the back expects class tokens that the front does not provide one-to-one.
    """

    def __init__(self, src: ActivationSpec, dst: ActivationSpec) -> None:
        super().__init__()
        self.src, self.dst = src, dst
        self.shared_tokens = (
            src.kind == "tokens" and dst.kind == "tokens" and src.prefix_tokens == dst.prefix_tokens
        )
        # same token layout: one Linear on every token, no grid needed
        self.same_tokens = self.shared_tokens and src.shape[0] == dst.shape[0]
        if dst.kind == "tokens" and not self.same_tokens and dst.grid is None:
            raise StitchShapeError(
                f"Cannot stitch {src} to {dst}: the back's tokens do not form a square grid "
                "after its prefix tokens, so they cannot be produced from another layout."
            )
        if dst.kind != "vector" and not self.same_tokens and src.grid is None:
            raise StitchShapeError(
                f"Cannot stitch a front activation {src} to a back activation {dst}: "
                "the back expects a spatial map or token grid and the front has none. "
                "Stitch to a vector point of the back (e.g. 'pre_logits') instead."
            )
        self.main = nn.Linear(src.channels, dst.channels)
        needs_prefix = dst.kind == "tokens" and dst.prefix_tokens > 0 and not self.shared_tokens
        self.prefix = (
            nn.Linear(src.channels, dst.prefix_tokens * dst.channels) if needs_prefix else None
        )

    def extra_repr(self) -> str:
        return f"{self.src} -> {self.dst}"

    # -- forward --------------------------------------------------------------------
    def forward(self, a: Tensor) -> Tensor:  # noqa: D102
        src, dst = self.src, self.dst
        if dst.kind == "vector":
            return self.main(_pooled(a, src))
        if dst.kind in ("conv", "seq"):
            if src.layout == dst.layout == "NHWC" and src.grid == dst.grid:
                return self.main(a)  # channels last: the 1x1 convolution is a Linear
            # NCHW whatever the input's memory format (channels-last activations of a
            # convolutional front, or a batch stacked from them): the same numbers either way
            m = _map_for(a, src, dst).contiguous()
            out = F.conv2d(m, self.main.weight[:, :, None, None], self.main.bias)
            return _from_map(out, dst)
        # tokens
        if self.same_tokens:
            return self.main(a)
        grid = _resize(_grid_map(a, src), dst.grid).flatten(2).transpose(1, 2)  # type: ignore[arg-type]
        if self.shared_tokens:
            return self.main(torch.cat([a[:, : src.prefix_tokens], grid], dim=1))
        out = self.main(grid)
        if self.prefix is not None:
            pre = self.prefix(_pooled(a, src)).view(a.shape[0], dst.prefix_tokens, dst.channels)
            out = torch.cat([pre, out], dim=1)
        return out

    # -- least squares ----------------------------------------------------------------
    def affine_maps(self) -> list[nn.Linear]:
        """The affine maps in the order of :meth:`design_rows`."""
        return [self.main] + ([self.prefix] if self.prefix is not None else [])

    def design_rows(self, a: Tensor, target: Tensor) -> list[tuple[Tensor, Tensor]]:
        """(inputs, targets) rows per affine map: the layer is exact on them iff it fits."""
        src, dst = self.src, self.dst
        n = a.shape[0]
        if dst.kind == "vector":
            return [(_pooled(a, src), target.reshape(n, -1))]
        if dst.kind in ("conv", "seq"):
            m = _map_for(a, src, dst)
            return [(_channels_last_rows(m), _channels_last_rows(_grid_map(target, dst)))]
        if self.same_tokens:
            return [(a.reshape(-1, src.channels), target.reshape(-1, dst.channels))]
        if self.shared_tokens:
            grid = _resize(_grid_map(a, src), dst.grid).flatten(2).transpose(1, 2)  # type: ignore[arg-type]
            a = torch.cat([a[:, : src.prefix_tokens], grid], dim=1)
            return [(a.reshape(-1, src.channels), target.reshape(-1, dst.channels))]
        grid = _resize(_grid_map(a, src), dst.grid)  # type: ignore[arg-type]
        rows = [
            (_channels_last_rows(grid), target[:, dst.prefix_tokens :].reshape(-1, dst.channels))
        ]
        if self.prefix is not None:
            rows.append((_pooled(a, src), target[:, : dst.prefix_tokens].reshape(n, -1)))
        return rows

    @torch.no_grad()
    def init_identity(self) -> None:
        """Set the layer to the identity map (front and back formats must be equal)."""
        if self.src != self.dst or self.prefix is not None:
            raise StitchShapeError(
                f"Identity initialisation needs equal formats, got {self.src} -> {self.dst}."
            )
        self.main.weight.copy_(torch.eye(self.src.channels))
        self.main.bias.zero_()


def _channels_last_rows(m: Tensor) -> Tensor:
    return m.permute(0, 2, 3, 1).reshape(-1, m.shape[1])


class LeastSquares:
    """Streamed normal equations for an affine map ``Y ~ X W^T + b``, in float64.

    Memory is O(d_in^2 + d_in d_out) whatever the number of rows.
    """

    def __init__(self, d_in: int, d_out: int) -> None:
        self.xtx = torch.zeros(d_in + 1, d_in + 1, dtype=torch.float64)
        self.xty = torch.zeros(d_in + 1, d_out, dtype=torch.float64)
        self.yty = 0.0
        self.rows = 0

    def add(self, x: Tensor, y: Tensor) -> None:
        """Add rows ``x`` (n, d_in) with targets ``y`` (n, d_out)."""
        x = x.detach().to("cpu", torch.float64)
        y = y.detach().to("cpu", torch.float64)
        for t, side in ((x, "front"), (y, "back")):
            if not bool(torch.isfinite(t).all()):
                raise ValueError(
                    f"the {side} model's activations at the stitch point contain NaN or "
                    "infinite values, so no stitch layer can be fitted to them: check that "
                    "model's weights (and its inputs) for non-finite values."
                )
        x1 = torch.cat([x, torch.ones(x.shape[0], 1, dtype=torch.float64)], dim=1)
        self.xtx += x1.T @ x1
        self.xty += x1.T @ y
        self.yty += float((y * y).sum())
        self.rows += x.shape[0]

    def solve(self, ridge: float = 0.0) -> tuple[Tensor, Tensor, float]:
        """``(W, b, relative residual)``; ``ridge`` is relative to the mean feature energy.

        Without ridge the minimum-norm least-squares solution is used (rank-deficient
        activations, such as dead ReLU channels, are fine). The residual comes from the
        normal equations, so it is exact only to about 1e-8 (sqrt of float64 eps): an
        exact fit reports about 1e-8, not 0.
        """
        if self.rows == 0:
            raise ValueError("No rows were added to the least-squares problem.")
        a = self.xtx.clone()
        d = a.shape[0] - 1
        if ridge > 0:
            scale = float(torch.diagonal(a)[:d].mean()) or 1.0
            a[:d, :d] += ridge * scale * torch.eye(d, dtype=torch.float64)
        # equilibrate: every column at unit RMS, so that features of any magnitude (1e-7
        # in a deep randomly initialised net, 1e3 elsewhere) meet the bias column on
        # equal terms and the rank cut-off is relative to each feature's own scale
        col = torch.sqrt(torch.diagonal(a) / self.rows)
        col = torch.where(col > 0, col, torch.ones_like(col))
        a_s = a / (col[:, None] * col[None, :])
        b_s = self.xty / col[:, None]
        if ridge > 0:
            sol = torch.linalg.solve(a_s, b_s) / col[:, None]
        else:
            sol = torch.linalg.lstsq(a_s, b_s, driver="gelsd", rcond=1e-12).solution
            sol = sol / col[:, None]
        sse = self.yty - 2 * float((sol * self.xty).sum()) + float((sol * (self.xtx @ sol)).sum())
        residual = math.sqrt(max(sse, 0.0) / self.yty) if self.yty > 0 else 0.0
        return sol[:d].T.contiguous(), sol[d].contiguous(), residual


def fit_least_squares(
    layer: StitchLayer,
    pairs,
    *,
    ridge: float = 0.0,
) -> float:
    """Fit ``layer`` to ``(front activation, back activation)`` batches; set its weights.

    Returns the normalised residual ``||T(a) - z||_F / ||z||_F`` over all fitted rows
    (summed over the layer's affine maps).
    """
    maps = layer.affine_maps()
    problems = [LeastSquares(m.in_features, m.out_features) for m in maps]
    with torch.no_grad():
        for a, z in pairs:
            for problem, (x, y) in zip(problems, layer.design_rows(a, z)):
                problem.add(x, y)
    sse = total = 0.0
    for m, problem in zip(maps, problems):
        w, b, res = problem.solve(ridge)
        with torch.no_grad():
            m.weight.copy_(w.to(m.weight))
            m.bias.copy_(b.to(m.bias))
        sse += res**2 * problem.yty
        total += problem.yty
    return math.sqrt(sse / total) if total > 0 else 0.0
