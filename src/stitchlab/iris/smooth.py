"""Gradients through a front's nonlinearities (``relu_grad="smooth"``).

The forward pass is always exact; only the descent direction changes. In a smooth step an
inner ReLU backpropagates ``max(floor, sigmoid(z / w))`` for its pre-activation ``z``, with
``w`` = ``relu_width`` x the standard deviation of the *source's* pre-activation over the
map (per sample and channel): a unit just below zero passes about half the gradient, one
far below ``relu_floor`` of it. A saturating nonlinearity (a clamp to ``[lo, hi]``: ReLU6,
Hardtanh; Hardsigmoid and Hardswish, kinked at -3 and 3) takes its slope with each kink
made a linear ramp of width ``2 pi w`` (the same variance), at least ``relu_floor``, and a
max-pooling of non-overlapping windows spreads each window's gradient over its inputs by a
softmax of ``(x - max) / w``. The smooth gradient is not the error's, so the last steps of
a batch (and all steps once the nonlinearities' on/off states agree with the sources') take
the exact one (:class:`_SmoothReLUs`, driven by :mod:`stitchlab.iris.descent`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _front_graphs(front: nn.Module) -> list:
    import torch.fx as fx

    if isinstance(front, fx.GraphModule):
        return [front]
    return [
        m for m in (getattr(front, "train_graph", None), getattr(front, "eval_graph", None))
        if isinstance(m, fx.GraphModule)
    ]  # fmt: skip



def _relu_forward(ctx, x: Tensor, inplace: bool) -> Tensor:
    """The exact ReLU of an autograd function's forward: in place (``x`` marked dirty) where
    the model's own ReLU was, so that the front's memory use stays the model's."""
    if inplace:
        ctx.mark_dirty(x)
        return x.clamp_min_(0)
    return x.clamp_min(0)



class _SmoothReLUFn(torch.autograd.Function):
    """ReLU forward; backward ``max(floor, sigmoid(x * inv_width))``, computed as
    ``sigmoid(max(x * inv_width, logit(floor)))`` (the same number: the sigmoid is
    monotone) by one fused kernel, ``softplus_backward``, on what the forward keeps: the
    scaled pre-activation, clamped, in the activation's own dtype (bfloat16 under autocast
    on a GPU). The forward keeps it because the model's in-place ReLUs overwrite the
    pre-activation; two passes over the activation (scale, clamp) and no float32 copy,
    since on a GPU these elementwise passes, not the convolutions, are the smooth
    gradient's cost."""

    @staticmethod
    def forward(ctx, x: Tensor, inv_width: Tensor, floor: float, inplace: bool) -> Tensor:  # noqa: D102
        scaled = x.detach() * inv_width.to(x.dtype)
        if floor > 0:
            scaled.clamp_min_(math.log(floor / (1.0 - floor)))
        ctx.save_for_backward(scaled)
        return _relu_forward(ctx, x, inplace)

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        (scaled,) = ctx.saved_tensors
        d = torch.ops.aten.softplus_backward(grad, scaled.to(grad.dtype), 1.0, 20.0)
        return d, None, None, None


#: The version of the saturating nonlinearities' smooth slope, in the key of a stored IRI
#: set whose front has one (:func:`smooths_saturating`): sets made with another slope (the
#: softplus-smoothed one before) are made again, those of other fronts are kept.
SATURATING_RULE = "ramps-2pi"

#: The ramps' width over ``w``: a uniform window of width ``2 pi w`` has the variance of the
#: logistic window of scale ``w`` that smooths the inner ReLUs (``pi^2 w^2 / 3``).
RAMP_WIDTH = 2 * math.pi


def _relu_state(t: Tensor) -> Tensor:
    return t > 0


def _saturating_slope(
    xd: Tensor, inv_width: Tensor, kind: str, lo: float, hi: float, floor: float
) -> Tensor:
    """:class:`_SmoothSaturatingFn`'s backward slope at the input ``xd`` (a new tensor in
    its dtype and memory layout)."""
    q = inv_width.to(xd.dtype) * (1 / RAMP_WIDTH)  # 1 / r, per sample and channel
    # the ramps as one expression: 1/2 + min(x - lo, hi - x) / r
    d = torch.sub(xd, (lo + hi) / 2).abs_().mul_(-q).add_(0.5 + (hi - lo) / 2 * q)
    if kind == "hardswish":  # h(x) + x s(x) / 6, s the ramped slope in [0, 1]
        d = d.clamp_(0.0, 1.0).mul_(xd).div_(hi - lo).add_(F.hardsigmoid(xd))
        return d.add_(xd.le(lo), alpha=floor)
    d.clamp_(floor, 1.0)
    return d.div_(hi - lo) if kind == "hardsigmoid" else d


class _SmoothSaturatingFn(torch.autograd.Function):
    """A saturating piecewise-linear nonlinearity (clamp to ``[lo, hi]``: ReLU6,
    Hardtanh; Hardsigmoid, Hardswish) with its exact forward and, backward, a slope whose
    kinks are linear ramps of width ``r`` = :data:`RAMP_WIDTH` x ``w`` (the kink smoothed by
    a uniform window of ``r``): for a clamp ``s(x) = 1/2 + min(x - lo, hi - x) / r``
    limited to ``[floor, 1]``; Hardsigmoid ``s(x) / 6`` over ``[-3, 3]``; Hardswish ``h(x)
    + x s(x) / 6`` with ``h`` the exact Hardsigmoid and ``s`` limited to ``[0, 1]``, plus
    ``floor`` at and below -3. ``w`` as for the ReLUs.

    The slope depends on the input only, so the forward computes it (products and
    clamps, no transcendental function: on depthwise fronts these elementwise passes,
    not the convolutions, are the smooth step's cost) in the activation's dtype and
    memory layout and keeps it instead of the input; the backward is one product."""

    @staticmethod
    def forward(ctx, x, inv_width, kind, lo, hi, floor, exact):  # noqa: D102
        xd = x.detach()
        ctx.save_for_backward(_saturating_slope(xd, inv_width, kind, lo, hi, floor))
        # an in-place module would overwrite its input: it gets a copy
        return exact(xd.clone() if getattr(exact, "inplace", False) else xd)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        (d,) = ctx.saved_tensors
        return grad * d.to(grad.dtype), None, None, None, None, None, None


class _SoftMaxPoolFn(torch.autograd.Function):
    """Max-pooling over non-overlapping windows ``k`` (kernel = stride, no padding) with
    its exact forward and, backward, each window's gradient spread over its inputs by a
    softmax of ``(x - max) / w`` (``w`` as for the ReLUs): an input just below its
    window's maximum gets about as much as the maximum, one far below none (the exact
    gradient as ``w`` -> 0)."""

    @staticmethod
    def forward(ctx, x, inv_width, k, exact):  # noqa: D102
        y = exact(x)
        ctx.save_for_backward(x.detach(), y.detach(), inv_width)
        ctx.k = k
        return y

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        x, y, inv = ctx.saved_tensors
        k = ctx.k
        pool = F.avg_pool1d if len(k) == 1 else F.avg_pool2d
        size = tuple(o * kk for o, kk in zip(y.shape[2:], k, strict=True))
        cut = tuple(x.shape[2:]) != size  # floor mode left a border out of every window
        xc = x[(slice(None), slice(None), *(slice(0, n) for n in size))] if cut else x
        e = torch.exp((xc - F.interpolate(y, size=size, mode="nearest")) * inv.to(x.dtype))
        total = pool(e, k) * math.prod(k)  # each window's sum (its maximum contributes 1)
        gx = e.mul_(F.interpolate(grad / total, size=size, mode="nearest"))
        if not cut:
            return gx, None, None, None
        full = torch.zeros_like(x, dtype=grad.dtype)
        full[(slice(None), slice(None), *(slice(0, n) for n in size))] = gx
        return full, None, None, None


def _saturating_kind(module: nn.Module) -> tuple[str, float, float] | None:
    """(kind, lo, hi) of a saturating nonlinearity module the smooth gradient treats:
    ``nn.Hardtanh`` and ``nn.ReLU6`` (a clamp to ``[lo, hi]``), ``nn.Hardsigmoid`` and
    ``nn.Hardswish`` (kinks at -3 and 3); None for another module."""
    if isinstance(module, nn.Hardtanh):  # ReLU6 is one
        return "clamp", float(module.min_val), float(module.max_val)
    if isinstance(module, nn.Hardsigmoid):
        return "hardsigmoid", -3.0, 3.0
    if isinstance(module, nn.Hardswish):
        return "hardswish", -3.0, 3.0
    return None


def _pool_windows(module: nn.Module) -> tuple[int, ...] | None:
    """The windows of a max-pooling module whose windows do not overlap (kernel =
    stride, no padding or dilation, floor mode, no indices), else None."""
    if not isinstance(module, (nn.MaxPool1d, nn.MaxPool2d)) or module.return_indices:
        return None
    nd = 1 if isinstance(module, nn.MaxPool1d) else 2

    def tup(v) -> tuple[int, ...]:
        return tuple(v) if isinstance(v, (tuple, list)) else (int(v),) * nd

    k, st = tup(module.kernel_size), tup(module.stride or module.kernel_size)
    if k != st or any(tup(module.padding)) or set(tup(module.dilation)) != {1} \
            or module.ceil_mode:
        return None
    return k


class _SmoothModule(nn.Module):
    """A saturating nonlinearity or max-pooling module of a front, run by the front's
    :class:`_SmoothReLUs` (exact outside a smooth step)."""

    def __init__(self, inner: nn.Module, smooth: _SmoothReLUs) -> None:
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "smooth", smooth)  # not a submodule

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        windows = _pool_windows(self.inner)
        if windows is not None:
            return self.smooth.max_pool(x, windows, self.inner)
        kind, lo, hi = _saturating_kind(self.inner)
        return self.smooth.saturating(x, kind, lo, hi, self.inner)


def _smooth_saturating(front: nn.Module, smooth: _SmoothReLUs) -> None:
    """Run every saturating nonlinearity module (:func:`_saturating_kind`) and every
    max-pooling of non-overlapping windows in ``front`` (inside leaf modules too) through
    ``smooth``."""
    roots = [front, *_front_graphs(front)]
    for root in roots:
        for parent in list(root.modules()):
            if isinstance(parent, _SmoothModule):
                continue
            for name, child in list(parent.named_children()):
                if isinstance(child, _SmoothModule):
                    continue
                if _saturating_kind(child) is not None or _pool_windows(child) is not None:
                    setattr(parent, name, _SmoothModule(child, smooth))


class _SmoothReLUs:
    """The inner ReLUs of a front under ``relu_grad="smooth"``: exact forward; backward
    ``max(floor, sigmoid(x / w))`` with ``w = width`` x the standard deviation of the
    *source's* pre-activation over every axis after the second (the map of ``(N, C, H, W)``
    and ``(N, C, T)`` activations: per sample and channel), or over all of a sample's
    units where that leaves fewer than two values (``(N, C)``, a 1x1 map), so that a unit
    just below zero passes about half the gradient and one far below ``floor`` of it. A
    constant pre-activation gives a width of 1e-12 x ``width`` (about the exact gradient).
    The widths are recorded once per batch, at the targets' forward (:meth:`recording`); a
    step's forward then runs on the rows :meth:`step` names. Outside both the ReLUs are
    plain (measurement, BatchNorm folding)."""

    def __init__(self, width: float, floor: float = 0.0) -> None:
        self.width, self.floor = width, floor
        self.mode = "off"
        self.inv_widths: list[Tensor] = []
        # each inner ReLU's on/off states for the sources, when recorded (keep_states)
        self.source_on: list[Tensor] = []
        self._keep_states = False
        self._measure: float | None = None  # the threshold of a measured step
        self._mismatches: list[float] = []
        self._k = 0
        self._rows: Tensor | None = None

    def _next(self, x: Tensor, state: Callable[[Tensor], Tensor] | None) -> Tensor | None:
        """The inverse widths of the next smooth op in a step (None outside a step); in
        a recording forward, records them (and, with ``keep_states``, the op's ``state``
        of the sources, None for an op whose states are not compared)."""
        if self.mode == "step":
            if self._k >= len(self.inv_widths):
                raise RuntimeError(
                    f"the front ran more nonlinearities in an IRI step ({self._k + 1}) than "
                    f"when the smooth gradient's widths were recorded "
                    f"({len(self.inv_widths)}): its forward depends on its input; use "
                    "relu_grad='exact' for this model"
                )
            inv = self._of_rows(self.inv_widths[self._k])
            # before the op, which may overwrite x; none after an op above the threshold
            on = self.source_on[self._k] if self._k < len(self.source_on) else None
            if (
                self._measure is not None and on is not None and state is not None
                and max(self._mismatches, default=0) <= self._measure
            ):  # fmt: skip
                differ = torch.count_nonzero(state(x.detach()).ne_(self._of_rows(on)))
                self._mismatches.append(float(differ) / max(x.numel(), 1))
            self._k += 1
            return inv
        if self.mode == "record":
            if self._keep_states:
                self.source_on.append(state(x.detach()) if state is not None else None)
            dims = tuple(range(2, x.dim()))
            if math.prod(x.shape[2:]) < 2:  # no map to measure: the sample's units
                dims = tuple(range(1, x.dim()))
            if math.prod(x.shape[1:]) < 2:  # one unit: no spread at all
                sd = x.new_zeros((x.shape[0],) + (1,) * (x.dim() - 1), dtype=torch.float32)
            else:
                sd = x.detach().float().std(dim=dims, keepdim=True)
            self.inv_widths.append((sd * self.width).clamp_min(1e-12).reciprocal())
        return None

    def relu(self, x: Tensor, inplace: bool = False) -> Tensor:
        """Replaces each inner ReLU of the front (``inplace`` as the model's own): the
        smooth one in a step, a plain one otherwise (an exact step, measurement)."""
        inv = self._next(x, _relu_state)
        if inv is not None:
            return _SmoothReLUFn.apply(x, inv, self.floor, inplace)
        # torch's ReLU: its backward (in an exact step) reads the result, keeps no copy
        return torch.relu_(x) if inplace else torch.relu(x)

    def saturating(self, x: Tensor, kind: str, lo: float, hi: float, exact: Callable) -> Tensor:
        """A saturating nonlinearity of the front (:func:`_saturating_kind`): ``exact(x)``
        forward; in a smooth step the backward of :class:`_SmoothSaturatingFn`."""
        inv = self._next(x, lambda t: (t > lo) & (t < hi))
        if inv is None:
            return exact(x)
        return _SmoothSaturatingFn.apply(x, inv, kind, lo, hi, self.floor, exact)

    def max_pool(self, x: Tensor, k: tuple[int, ...], exact: Callable) -> Tensor:
        """A max-pooling of non-overlapping windows ``k``: exact forward; in a smooth
        step the backward of :class:`_SoftMaxPoolFn` (each window's gradient spread by a
        softmax of its inputs)."""
        inv = self._next(x, None)
        if inv is None:
            return exact(x)
        return _SoftMaxPoolFn.apply(x, inv, k, exact)

    def __deepcopy__(self, memo: dict) -> _SmoothReLUs:
        # one state per front: a copy of the front (BatchNorm folding) runs the same ops
        return self

    def _of_rows(self, t: Tensor) -> Tensor:
        """``t``'s rows of this step's samples (all of them before any stopped)."""
        return t if self._rows is None else t[self._rows]

    @contextlib.contextmanager
    def recording(self, keep_states: bool = False) -> Iterator[None]:
        """Context in which the front's forward records the widths of a new batch (and,
        if ``keep_states``, each inner ReLU's on/off states, for :meth:`mismatch`)."""
        self.mode, self.inv_widths, self.source_on = "record", [], []
        self._keep_states = keep_states
        try:
            yield
        finally:
            self.mode = "off"

    def step(
        self, rows: Tensor | None, exact: bool = False, measure: float | None = None
    ) -> None:
        """The next forward is an optimisation step on the batch rows ``rows`` (None:
        all); ``exact``: with the exact ReLU gradient (the recipe's last
        ``exact_relu_steps``); ``measure`` (a threshold, in a smooth step of a batch
        recorded with ``keep_states``): measure :meth:`mismatch` in it, up to the first
        inner ReLU above that threshold."""
        self.mode, self._k, self._rows = ("exact" if exact else "step"), 0, rows
        self._measure, self._mismatches = (None if exact else measure), []

    def mismatch(self) -> float:
        """Of the last measured step: the largest, over the inner ReLUs measured, fraction
        of units (over the step's rows) that are on where the source's are off or off
        where they are on (the ReLUs after the first above the threshold are not measured:
        the largest is above it either way); ``inf`` where nothing was measured."""
        return max(self._mismatches, default=math.inf)

    def off(self) -> None:
        """Plain ReLUs from now on (the sources' states, kept for a batch, released)."""
        self.mode, self._rows, self.source_on = "off", None, []


def smooths_saturating(front: nn.Module) -> bool:
    """Whether ``front`` (a recipe's front, :func:`stitchlab.iris.front._recipe_front`)
    runs a saturating nonlinearity through the smooth gradient."""
    return any(
        isinstance(m, _SmoothModule) and _saturating_kind(m.inner) is not None
        for m in front.modules()
    )


def _smooth_relus_of(front: nn.Module) -> _SmoothReLUs | None:
    """The :class:`_SmoothReLUs` whose ReLUs ``front`` runs, if any."""
    for gm in _front_graphs(front):
        for node in gm.graph.nodes:
            owner = getattr(node.target, "__self__", None) if node.op == "call_function" else None
            if isinstance(owner, _SmoothReLUs):
                return owner
    for m in front.modules():
        if isinstance(m, _SmoothModule):
            return m.smooth
    return None


class _NoSmooth:
    """Stands in for :class:`_SmoothReLUs` on fronts without it (every call a no-op)."""

    def recording(self, keep_states: bool = False) -> contextlib.AbstractContextManager[None]:  # noqa: D102
        return contextlib.nullcontext()

    def step(  # noqa: D102
        self, rows: Tensor | None, exact: bool = False, measure: float | None = None
    ) -> None:
        pass

    def mismatch(self) -> float:  # noqa: D102
        return math.inf

    def off(self) -> None:  # noqa: D102
        pass


