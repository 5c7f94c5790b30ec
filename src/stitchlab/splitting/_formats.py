"""The activation format at each point: the batch and channel axes followed through the
graph (:class:`~stitchlab.layouts.LayoutProp`), probed where the graph cannot be
followed, and turned into an :class:`~stitchlab.layers.ActivationSpec` (or the reason
there is none)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.fx as fx
from torch import Tensor, nn

from .._modes import modes
from ..layouts import (
    _FIRST_MODULES,
    _UNKNOWN,
    LAYOUTS,
    Axes,
    LayoutProp,
    layout_of,
    why_no_layout,
)
from ._check import _ModelFailed
from ._halves import _graph_module
from ._outputs import SplitError
from ._points import _closest

if TYPE_CHECKING:
    from . import TracedModel
    from ._trace import _Traced


def _followed(ax) -> bool:
    return isinstance(ax, tuple) and len(ax) == 2 and ax[0] is not None and ax[1] is not None


class _Capture(fx.Interpreter):
    """Runs a graph and keeps the values of some nodes."""

    def __init__(self, gm: fx.GraphModule, nodes: Iterable[fx.Node]) -> None:
        super().__init__(gm)
        self.wanted = set(nodes)
        self.values: dict[fx.Node, object] = {}

    def run_node(self, n: fx.Node):  # noqa: D102
        out = super().run_node(n)
        if n in self.wanted:
            self.values[n] = out
        return out


def _probe(
    gm: fx.GraphModule, prop: LayoutProp, example: Tensor, nodes: dict[str, fx.Node], axes
) -> dict[str, Axes]:
    """Axes the graph could not follow, found by probing: the batch axis is the one axis
    along which only index 0 changes when only sample 0 of the input changes; the channel
    axis is the one the first channel map reading the value acts on (a convolution's axis
    1, a Linear's or ``x @ W``'s last). What a probe cannot decide stays unknown."""
    batch = example.shape[0]
    other: dict[fx.Node, object] = {}
    if batch >= 2 and example.is_floating_point():
        x2 = example.clone()
        x2[0] = example[1] if not torch.equal(example[0], example[1]) else 1.0 - example[0]
        run = _Capture(gm, nodes.values())
        try:
            run.run(x2)
            other = run.values
        except Exception:  # noqa: BLE001 - a probe that fails decides nothing
            other = {}
    out: dict[str, Axes] = {}
    for p, node in nodes.items():
        ax = axes.get(p)
        b, c = ax if isinstance(ax, tuple) and len(ax) == 2 and ax[0] != "elements" else _UNKNOWN
        if b is None:
            b = _batch_axis(prop.values.get(node), other.get(node), batch)
        if c is None and b is not None:
            c = prop.consumer_channel(node)
            if c == b:
                c = None
        out[p] = (b, c)
    return out


def _batch_axis(a, b, batch: int) -> int | None:
    """The axis along which ``a`` and ``b`` differ at index 0 only (None: not one)."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor) or a.shape != b.shape:
        return None
    diff = a != b
    if not bool(diff.any()):
        return None
    found = [
        k for k in range(a.dim())
        if a.shape[k] == batch and not bool(diff.movedim(k, 0)[1:].any())
    ]  # fmt: skip
    return found[0] if len(found) == 1 else None


def _graph_copy(t: _Traced) -> tuple[fx.Graph, dict[fx.Node, fx.Node]]:
    """A copy of the full graph and the map from its nodes to the copies."""
    g = fx.Graph()
    val_map: dict[fx.Node, fx.Node] = {}
    out = g.graph_copy(t.graph, val_map)
    g.output(out)
    return g, val_map


@dataclass(frozen=True)
class PointFormat:
    """The activation at a point: its shape (with batch) and format, or why it has none."""

    point: str
    shape: tuple[int, ...] | None
    spec: object | None  # ActivationSpec
    problem: str | None = None

    def require(self) -> object:
        """The :class:`~stitchlab.layers.ActivationSpec`, or a clear error."""
        if self.spec is None:
            raise SplitError(
                f"Cannot stitch at {self.point!r}: {self.problem}. If you know its layout, "
                f"pass layouts={{{self.point!r}: one of {', '.join(LAYOUTS)}}}; otherwise "
                "choose another point (stitchlab layers lists the formats)."
            )
        return self.spec


def _sequential_axes(model: nn.Sequential, example: Tensor, points: Sequence[str]):
    """Values and axes at the children of an untraced ``nn.Sequential``: each child's
    layout from its last submodule of a known kind."""
    values, axes = {}, {}
    x = example
    ax: Axes = (0, 1) if example.dim() >= 2 else _UNKNOWN
    with modes(model, training=False):
        for name, child in model.named_children():
            y = child(x)
            kinds = [m for m in child.modules() if isinstance(m, _FIRST_MODULES)
                     or isinstance(m, (nn.Linear, nn.LayerNorm))]  # fmt: skip
            if isinstance(y, Tensor):
                if kinds:
                    last = kinds[-1]
                    ax = (0, 1) if isinstance(last, _FIRST_MODULES) else (0, y.dim() - 1)
                elif not (isinstance(x, Tensor) and x.shape == y.shape):
                    ax = _UNKNOWN
            values[name], axes[name] = y, ax
            x = y
    return {p: values.get(p) for p in points}, {p: axes.get(p) for p in points}


def point_formats(
    tm: TracedModel,
    example: Tensor,
    points: Sequence[str] | None,
    *,
    layouts: Mapping[str, str] | None,
    prefix_tokens: int | None,
) -> dict[str, PointFormat]:
    """:meth:`TracedModel.formats`: the format at each point, from one eval-mode pass of
    the graph on ``example`` (an untraced ``nn.Sequential``: of the model itself)."""
    from ..layers import ActivationSpec

    if tm.verifies and not tm._refs:
        try:
            tm.verify(example)
        except _ModelFailed:
            pass  # the pass below says why the model cannot run on it
    points = list(tm.points() if points is None else points)
    layouts = dict(layouts or {})
    known = tm.layout_names()
    for p, lay in layouts.items():
        if p not in known:
            hint = _closest(str(p), sorted(known))
            raise SplitError(
                f"layouts names {p!r}, which is no point of {type(tm.model).__name__}"
                + (f" (did you mean {hint!r}?)" if hint else "")
                + "; name the points whose layout you give (stitchlab layers lists them)."
            )
        if lay not in LAYOUTS:
            raise SplitError(
                f"layout of {p!r} must be one of {', '.join(LAYOUTS)}; got {lay!r}"
            )
    if prefix_tokens is None:
        n = getattr(tm.model, "num_prefix_tokens", None)
        prefix_tokens = int(n) if isinstance(n, int) else None
    if tm.sequential:
        values, axes = _sequential_axes(tm.model, example, points)  # type: ignore[arg-type]
    else:
        for p in points:
            tm._check_point(p)
        t = tm._eval
        g, val_map = _graph_copy(t)
        with modes(tm.model, training=False):
            gm = _graph_module(t, g, "Full")
            prop = LayoutProp(gm, t.root, example.shape[0])
            try:
                prop.run(example)
            except Exception as exc:
                raise SplitError(
                    f"{type(tm.model).__name__} fails on an input of shape "
                    f"{tuple(example.shape)} ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0]}); give an input of the size it expects "
                    "(stitchlab layers --input-size)"
                ) from exc
        values = {p: prop.values.get(val_map[t.points[p]]) for p in points}
        axes = {p: prop.axes.get(val_map[t.points[p]]) for p in points}
        unknown = {
            p: val_map[t.points[p]] for p in points
            if isinstance(values[p], Tensor) and not _followed(axes[p])
        }  # fmt: skip
        if unknown:  # where the graph cannot be followed: probe
            with modes(tm.model, training=False):
                axes.update(_probe(gm, prop, example, unknown, axes))
    out: dict[str, PointFormat] = {}
    batch = example.shape[0]
    for p in points:
        value, ax = values[p], axes[p]
        if not isinstance(value, Tensor):
            out[p] = PointFormat(p, None, None, f"its module returns {type(value).__name__} "
                                 "at run time, not a tensor")  # fmt: skip
            continue
        shape = tuple(value.shape)
        lay = layouts.get(p) or layout_of(shape, ax, batch)
        why = None
        if lay is None:
            why = why_no_layout(shape, ax, batch)
        elif len(shape) != len(lay):
            raise SplitError(
                f"layout {lay!r} given for {p!r} does not fit its activation of shape "
                f"{shape} ({len(shape)} axes)"
            )
        spec = ActivationSpec.of(value, prefix_tokens, layout=lay) if lay else None
        out[p] = PointFormat(p, shape, spec, why)
    return out
