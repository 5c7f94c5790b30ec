"""Activation layouts: following the batch and channel axes through a traced graph.

:class:`LayoutProp` runs an ``fx`` graph on example inputs and records, for every tensor
value, which axis holds the batch and which the channels. From these a stitch point gets
its layout (:data:`LAYOUTS`): ``NCHW`` maps (convolutions), ``NHWC`` maps (Swin, MaxViT,
ConvNeXt internals), ``NCL`` sequences (Conv1d), ``NLC`` tokens, ``NC`` vectors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.fx as fx
from torch import Tensor, nn

__all__ = ["LAYOUTS", "LayoutProp", "Axes", "layout_of", "why_no_layout", "target_name"]

#: Activation layouts (batch first): maps channels-first / channels-last, 1-D sequences
#: channels-first (Conv1d), tokens (channels last), vectors.
LAYOUTS = ("NCHW", "NHWC", "NCL", "NLC", "NC")


def target_name(n: fx.Node) -> str:
    if n.op == "call_method":
        return str(n.target)
    return getattr(n.target, "__name__", str(n.target))


# ---------------------------------------------------------------------------
# Following the batch and channel axes through a graph

_FIRST_MODULES = (
    nn.modules.conv._ConvNd, nn.modules.batchnorm._BatchNorm, nn.GroupNorm,
    nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm,
    nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd,
    nn.modules.pooling._AdaptiveAvgPoolNd, nn.modules.pooling._AdaptiveMaxPoolNd,
    nn.modules.pooling._LPPoolNd, nn.Upsample, nn.PixelShuffle, nn.PixelUnshuffle,
)  # fmt: skip
_FIRST_FUNCTIONS = {
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "batch_norm", "instance_norm", "group_norm", "local_response_norm", "max_pool1d",
    "max_pool2d", "max_pool3d", "_max_pool1d", "_max_pool2d", "_max_pool3d", "avg_pool1d",
    "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "_adaptive_max_pool1d", "_adaptive_max_pool2d", "interpolate", "upsample",
    "pixel_shuffle", "pixel_unshuffle", "lp_pool2d",
}  # fmt: skip
_LAST_FUNCTIONS = {"linear", "layer_norm", "rms_norm", "embedding"}
_REDUCE = {"mean", "sum", "amax", "amin", "std", "var", "norm", "logsumexp", "prod", "nanmean"}
_RESHAPE = {"view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as",
            "reshape_as"}  # fmt: skip

_MOVES = _RESHAPE | {"permute", "transpose", "swapaxes", "swapdims", "movedim", "t",
                     "getitem", "expand", "expand_as", "repeat", "roll", "flip"}  # fmt: skip

Axes = tuple[int | None, int | None]  # (batch axis, channel axis); None: not followed
_UNKNOWN: Axes = (None, None)


def _norm_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def _map_reshape(axes: Axes, before: tuple[int, ...], after: tuple[int, ...]) -> Axes:
    """Where each axis goes through a reshape: kept when the shape up to it (or from it
    on) is unchanged, lost otherwise."""

    def one(a: int | None) -> int | None:
        if a is None:
            return None
        if before[: a + 1] == after[: a + 1]:
            return a
        tail = before[a:]
        if len(after) >= len(tail) and after[len(after) - len(tail) :] == tail:
            return len(after) - len(tail)
        return None

    return (one(axes[0]), one(axes[1]))


def _map_contract_last(axes: Axes, ndim: int, axis: int | None = None) -> Axes:
    """A linear map over one axis (the last by default) whose result takes its place: the
    batch stays unless it is that axis; the channels are that axis unless they are
    elsewhere (a map over the width of an NCHW map keeps its channels)."""
    axis = ndim - 1 if axis is None else axis
    b, c = axes
    return (None if b == axis else b, axis if c is None or c == axis else c)


def _map_permute(axes: Axes, dims: Sequence[int]) -> Axes:
    dims = [_norm_dim(int(d), len(dims)) for d in dims]
    return tuple(dims.index(a) if a is not None and a in dims else None for a in axes)  # type: ignore[return-value]


def _map_swap(axes: Axes, i: int, j: int, ndim: int) -> Axes:
    i, j = _norm_dim(i, ndim), _norm_dim(j, ndim)
    sw = {i: j, j: i}
    return tuple(None if a is None else sw.get(a, a) for a in axes)  # type: ignore[return-value]


def _map_index(axes: Axes, index, ndim: int) -> Axes:
    """Axes after basic indexing ``x[index]`` (ints, slices, None, Ellipsis)."""
    idx = index if isinstance(index, tuple) else (index,)
    if any(not (isinstance(i, (int, slice)) or i is None or i is Ellipsis) for i in idx):
        return _UNKNOWN
    consumed = sum(1 for i in idx if i is not None and i is not Ellipsis)
    expanded: list = []
    for i in idx:
        if i is Ellipsis:
            expanded += [slice(None)] * (ndim - consumed)
        else:
            expanded.append(i)
    mapping: dict[int, int | None] = {}
    src = dst = 0
    for i in expanded:
        if i is None:
            dst += 1
            continue
        if isinstance(i, int):
            mapping[src] = None
        else:
            mapping[src] = dst
            dst += 1
        src += 1
    for s in range(src, ndim):
        mapping[s] = dst
        dst += 1
    return tuple(None if a is None else mapping.get(a) for a in axes)  # type: ignore[return-value]


def _map_reduce(axes: Axes, dims, keepdim: bool, ndim: int) -> Axes:
    if dims is None:
        return _UNKNOWN
    dims = [dims] if isinstance(dims, int) else list(dims)
    dims = [_norm_dim(int(d), ndim) for d in dims]

    def one(a):
        if a is None or a in dims:
            return None
        return a if keepdim else a - sum(1 for d in dims if d < a)

    return (one(axes[0]), one(axes[1]))


class LayoutProp(fx.Interpreter):
    """Runs a graph and follows the batch and channel axes of every tensor value.

    Convolutions, BatchNorm and pooling put the channels on axis 1; Linear, LayerNorm
    over one axis and embeddings on the last axis; permutes, transposes, reshapes,
    indexing and reductions move or drop the axes; element-wise operations keep the axes
    their inputs agree on. A reshape whose result starts with the batch size gets the
    batch back on axis 0 (windows folded into the batch and unfolded again).
    """

    def __init__(self, gm: fx.GraphModule, root: nn.Module, batch: int) -> None:
        super().__init__(gm)
        self.root = root
        self.batch = batch
        self.axes: dict[fx.Node, object] = {}
        self.values: dict[fx.Node, object] = {}
        self.from_input: dict[fx.Node, bool] = {}  # whether a value depends on the input

    def run_node(self, n: fx.Node):  # noqa: D102
        out = super().run_node(n)
        self.from_input[n] = n.op == "placeholder" or any(
            self.from_input.get(a, False) for a in n.all_input_nodes
        )
        if n.op != "output":
            self.values[n] = out
            try:
                self.axes[n] = self._rule(n, out)
            except Exception:  # an op this analysis does not model: axes unknown
                self.axes[n] = _UNKNOWN
        return out

    def _in(self, a) -> Axes:
        ax = self.axes.get(a) if isinstance(a, fx.Node) else None
        return ax if isinstance(ax, tuple) and len(ax) == 2 and ax[0] != "elements" else _UNKNOWN

    def _rule(self, n: fx.Node, out):
        if n.op == "placeholder":
            return (0, 1) if isinstance(out, Tensor) and out.dim() >= 2 else (0, None)
        if n.op == "get_attr":
            return _UNKNOWN
        first = n.args[0] if n.args else None
        ax = self._in(first)
        x = self.values.get(first) if isinstance(first, fx.Node) else None
        name = target_name(n)
        if isinstance(out, (tuple, list)):  # element axes, for getitem
            same_rank = isinstance(x, Tensor) and all(
                isinstance(o, Tensor) and o.dim() == x.dim() for o in out
            )
            return ("elements", ax if same_rank else _UNKNOWN)
        if not isinstance(out, Tensor):
            return _UNKNOWN
        if n.op == "call_module":
            m = self.root.get_submodule(str(n.target))
            if isinstance(m, _FIRST_MODULES):
                return (ax[0], 1)
            if isinstance(m, nn.Embedding):  # indices in, (batch, ..., D) out
                return (0, out.dim() - 1)
            if isinstance(m, nn.Linear) or (
                isinstance(m, nn.LayerNorm) and len(m.normalized_shape) == 1
            ):
                return (ax[0], out.dim() - 1)
            if isinstance(m, nn.Flatten) and isinstance(x, Tensor):
                return self._reshaped(_map_reshape(ax, tuple(x.shape), tuple(out.shape)), out)
            return ax if isinstance(x, Tensor) and x.shape == out.shape else _UNKNOWN
        if n.op == "call_function" and name == "getitem":
            parent = self.axes.get(first) if isinstance(first, fx.Node) else None
            if isinstance(parent, tuple) and len(parent) == 2 and parent[0] == "elements":
                return parent[1]
            if isinstance(x, Tensor):
                return _map_index(ax, n.args[1], x.dim())
            return _UNKNOWN
        if name in _FIRST_FUNCTIONS:
            return (ax[0], 1)
        if name == "linear" and isinstance(x, Tensor):  # x @ W.T over x's last axis
            return _map_contract_last(ax, x.dim())
        if name in _LAST_FUNCTIONS:
            if name == "layer_norm":
                shape = n.args[1] if len(n.args) > 1 else n.kwargs.get("normalized_shape")
                if shape is not None and len(tuple(shape)) != 1:
                    return _UNKNOWN
            if name == "embedding":
                return (0, out.dim() - 1)
            return (ax[0], out.dim() - 1)
        if name in ("cat", "concat", "concatenate", "stack"):
            parts = first if isinstance(first, (tuple, list)) else []
            pa = self._agree([self._in(p) for p in parts])
            if name != "stack":
                return pa
            d = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
            d = _norm_dim(int(d), out.dim())
            return tuple(None if a is None else a + (1 if a >= d else 0) for a in pa)
        if name == "einsum":
            return self._einsum(n, out)
        if not isinstance(x, Tensor):
            return self._broadcast(n, out)
        if name == "permute":
            dims = n.args[1:] if n.op == "call_method" else n.args[1]
            if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
                dims = dims[0]
            return _map_permute(ax, list(dims))
        if name in ("transpose", "swapaxes", "swapdims"):
            return _map_swap(ax, int(n.args[1]), int(n.args[2]), x.dim())
        if name == "movedim":
            src, dst = n.args[1], n.args[2]
            src = [src] if isinstance(src, int) else list(src)
            dst = [dst] if isinstance(dst, int) else list(dst)
            srcs = [_norm_dim(s, x.dim()) for s in src]
            perm: list[int | None] = [None] * x.dim()
            for s, d in zip(srcs, dst):
                perm[_norm_dim(d, x.dim())] = s
            rest = iter([d for d in range(x.dim()) if d not in srcs])
            return _map_permute(ax, [p if p is not None else next(rest) for p in perm])
        if name in _RESHAPE:
            return self._reshaped(_map_reshape(ax, tuple(x.shape), tuple(out.shape)), out)
        if name in _REDUCE:
            dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
            keep = n.kwargs.get("keepdim", n.args[2] if len(n.args) > 2 else False)
            return _map_reduce(ax, dims, bool(keep), x.dim())
        if name == "pad" and out.dim() == x.dim():
            return ax
        if name in ("matmul", "mm") and len(n.args) == 2:
            return self._matmul(n, out)
        if name in ("matmul", "bmm", "baddbmm", "mm", "scaled_dot_product_attention"):
            return _UNKNOWN
        ax_out = self._broadcast(n, out)
        if ax_out[0] is None and ax[0] == 0 and out.dim() == x.dim() and out.shape[0] == x.shape[0]:
            return (0, ax_out[1])  # an op this analysis does not know that keeps the batch
        return ax_out

    def _weight(self, a) -> Tensor | None:
        """The value of ``a`` when it is a 2-D tensor that does not depend on the input
        (a parameter, or one computed from parameters only)."""
        v = self.values.get(a) if isinstance(a, fx.Node) else a
        if not isinstance(v, Tensor) or v.dim() != 2:
            return None
        if isinstance(a, fx.Node) and self.from_input.get(a, True):
            return None
        return v

    def _matmul(self, n: fx.Node, out: Tensor) -> Axes:
        """An activation times a 2-D weight: ``x @ W`` maps x's last axis, ``W @ x`` its
        second to last; the other axes keep their places."""
        a, b = n.args[0], n.args[1]
        xa, xb = self.values.get(a), self.values.get(b)
        if isinstance(xa, Tensor) and xa.dim() >= 2 and self._weight(b) is not None:
            if out.dim() == xa.dim():
                return _map_contract_last(self._in(a), xa.dim())
        if isinstance(xb, Tensor) and xb.dim() >= 3 and self._weight(a) is not None:
            if out.dim() == xb.dim():
                return _map_contract_last(self._in(b), xb.dim(), xb.dim() - 2)
        return _UNKNOWN

    def _einsum(self, n: fx.Node, out: Tensor) -> Axes:
        """``einsum`` of one activation with weights: the batch follows its letter, the
        channels their letter or, where it is summed over, the one new letter."""
        eq = n.args[0] if n.args else None
        ops = list(n.args[1:])
        if len(ops) == 1 and isinstance(ops[0], (tuple, list)):
            ops = list(ops[0])
        if not isinstance(eq, str) or "..." in eq or "->" not in eq:
            return _UNKNOWN
        ins, res = eq.replace(" ", "").split("->")
        terms = ins.split(",")
        acts = [i for i, o in enumerate(ops) if isinstance(o, fx.Node)
                and self.from_input.get(o, False)]  # fmt: skip
        if len(terms) != len(ops) or len(acts) != 1:
            return _UNKNOWN
        i = acts[0]
        if any(self._weight(o) is None and j != i for j, o in enumerate(ops)):
            return _UNKNOWN
        letters = terms[i]
        b, c = self._in(ops[i])
        bl = letters[b] if b is not None and b < len(letters) else None
        cl = letters[c] if c is not None and c < len(letters) else None
        batch = res.index(bl) if bl is not None and bl in res else None
        new = [ch for ch in res if ch not in letters]
        if cl is not None and cl in res:
            chan: int | None = res.index(cl)
        else:
            summed = [ch for ch in letters if ch not in res]
            chan = res.index(new[0]) if len(new) == 1 and (cl is not None or len(summed) == 1) \
                else None
        return (batch, chan)

    def consumer_channel(self, node: fx.Node) -> int | None:
        """The axis of ``node``'s value that the first channel map reading it acts on
        (a convolution: axis 1; Linear, ``linear``, ``x @ W``: the last), following
        element-wise operations that keep its shape; None when none is found."""
        value = self.values.get(node)
        if not isinstance(value, Tensor):
            return None
        shape, last = value.shape, value.dim() - 1
        todo, seen = [node], {node}
        while todo:
            cur = todo.pop()
            for u in cur.users:
                if u in seen:
                    continue
                seen.add(u)
                first = u.args[0] if u.args else None
                name = target_name(u)
                if u.op == "call_module" and first is cur:
                    m = self.root.get_submodule(str(u.target))
                    if isinstance(m, nn.modules.conv._ConvNd):
                        return 1
                    if isinstance(m, nn.Linear):
                        return last
                if first is cur and (name == "linear" or (
                        name in ("matmul", "mm") and len(u.args) == 2
                        and self._weight(u.args[1]) is not None)):  # fmt: skip
                    return last
                v = self.values.get(u)
                if (isinstance(v, Tensor) and v.shape == shape and name not in _MOVES
                        and u.op != "call_module"):  # fmt: skip
                    todo.append(u)
        return None

    def _reshaped(self, ax: Axes, out: Tensor) -> Axes:
        if ax[0] is None and out.dim() >= 1 and out.shape[0] == self.batch:
            return (0, ax[1])
        return ax

    @staticmethod
    def _agree(parts: Sequence[Axes]) -> Axes:
        def one(i: int) -> int | None:
            vals = {p[i] for p in parts if p[i] is not None}
            return vals.pop() if len(vals) == 1 else None

        return (one(0), one(1)) if parts else _UNKNOWN

    def _broadcast(self, n: fx.Node, out: Tensor) -> Axes:
        """Element-wise (and unknown shape-preserving) ops: the axes that the inputs of
        the output's shape agree on."""
        parts = [
            self._in(a)
            for a in n.all_input_nodes
            if isinstance(self.values.get(a), Tensor) and self.values[a].shape == out.shape
        ]
        return self._agree(parts)


def layout_of(shape: tuple[int, ...], axes: Axes, batch: int) -> str | None:
    b, c = axes if axes is not None else (None, None)
    if b != 0 or shape[0] != batch:
        return None
    rank = len(shape)
    if rank == 2 and c == 1:
        return "NC"
    if rank == 3:
        return {1: "NCL", 2: "NLC"}.get(c)  # type: ignore[arg-type]
    if rank == 4:
        return {1: "NCHW", 3: "NHWC"}.get(c)  # type: ignore[arg-type]
    return None


def why_no_layout(shape: tuple[int, ...], axes: Axes, batch: int) -> str:
    b, c = axes if axes is not None else (None, None)
    if len(shape) not in (2, 3, 4):
        return f"its activation {shape} has {len(shape) - 1} axes per sample (1-3 expected)"
    if shape[0] != batch or (b is not None and b != 0):
        return (
            f"the first axis of its activation {shape} is not the batch of {batch} (windows "
            "or patches folded into the batch, or a sequence-first layout)"
        )
    if b is None:
        return f"stitchlab cannot follow the batch axis of its activation {shape}"
    if c is None:
        return (
            f"stitchlab cannot tell which axis of its activation {shape} holds the channels "
            "(the graph reshapes it in a way it does not follow)"
        )
    return f"its channel axis is {c} of {shape}, a layout stitchlab does not stitch"
