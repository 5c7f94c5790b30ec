"""Stitch points and exact splitting of a model into a front and a back half.

A model is traced with :mod:`torch.fx` (once per train/eval mode, see below) into a
:class:`TracedModel`. Every submodule that is called exactly once and returns a single
tensor names a node of that graph (its output). Cutting at such a node gives

* the **front**: the node's ancestors only, so that no layer after the point runs;
* the **back**: the nodes between the point and the logits (and, on request, the
  activations at later points, the *taps*), with the point replaced by an input.

``back(front(x))`` then performs exactly the operations of ``model(x)``.

Corner cases (as in torchvision's ``feature_extraction``):

* Python control flow is frozen at trace time. Optional ``forward`` arguments are
  specialised to their default values (timm ViTs: ``attn_mask=None``).
* **Train/eval mode.** A ``forward`` that branches on ``self.training`` is traced in both
  modes; when the two graphs differ the halves carry both and run the graph of their
  current mode (``.train()`` / ``.eval()`` switch it), as torchvision's
  ``DualGraphModule`` does.
* **Tracing has no side effects.** Attributes that a ``forward`` writes while it is
  traced (timm LeViT fills an attention-bias cache) are restored afterwards, and so are
  the modules' train/eval flags: tracing never changes the caller's model.
* A point is only valid when nothing but its own activation crosses the cut: a residual
  branch that starts before the point and joins after it makes it invalid (cut at the
  block output instead), and so does a back half that needs the input image itself.
* A submodule called more than once (a shared ``ReLU``, or one module instance
  registered under two names) has no single output and is not a point; use the
  enclosing block.
* **In-place operations after a cut.** When the back (or a later layer of a tapped
  model) modifies the activation at a point in place (an ``inplace=True`` ReLU right
  after a BatchNorm, as in DenseNet), the halves copy the activation first, so the
  value at a point is the value its module returned and the caller's tensors are never
  overwritten. In-place calls whose results are unused (``h.mul_(0.5).relu_()``) are
  kept in every half that holds memory they may modify; a point after which such a call
  modifies a tensor from before it (that the activation may share) is not offered.
* **Every cut checks itself** on an example batch (``example=``; by default 2 random
  inputs of the shape the model declares or its first layer takes, else the first batch
  the halves see): the traced graph's output and each point's value must equal the
  model's own, and ``back(front(x))`` and every tap must equal the whole model's values,
  else a :class:`SplitError` names the point and the operations the back leaves out.
  The check changes no parameter, buffer, attribute, mode or random state.
* **Outputs.** A model whose ``forward`` returns a tuple, list or dict is cut like any
  other; ``output=`` says which element is the logits (default: the ``"logits"`` entry of
  a dict or named tuple; a tuple of several elements must name it). The halves return
  the logits only.
* **Activation layouts.** :meth:`TracedModel.formats` runs the graph once on example
  inputs and follows the channel axis through every operation (convolutions and
  BatchNorm put it first, Linear and LayerNorm last, ``permute``/``transpose``/
  ``reshape`` move it), so channels-last maps (Swin, MaxViT and ConvNeXt internals) are
  told from channels-first ones. A point whose channel axis cannot be followed, or whose
  first axis is not the batch, gets no format and stitching at it is an error that says
  how to name its layout (``layouts=``). Matmuls, ``einsum`` and ``F.linear`` with a
  2-D weight are followed; where the graph still cannot be followed, the batch axis is
  probed (vary one sample) and the channel axis taken from the next channel map.
* The halves run the traced operations of non-leaf modules inline: forward hooks on
  leaf modules (Conv2d, Linear, ...) still fire, hooks on blocks do not.
* Models that torch.fx cannot trace can still be split when they are
  ``nn.Sequential``: the points are then the top-level children. Otherwise make the
  failing submodule a leaf (``leaf_modules=``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.fx as fx
from torch import Tensor, nn

from .._modes import modes
from ..layouts import LAYOUTS, target_name
from ._check import _example_input, _ModelFailed, check_halves, check_on_first_call, verify_trace
from ._formats import PointFormat, point_formats
from ._halves import (
    _build_back,
    _build_front,
    _build_logits,
    _build_tapped,
    _ModeSwitch,
    _SequentialBack,
    _split_sequential,
)
from ._inplace import _ancestors, _back_keep, _with_mutations
from ._outputs import LogitsOnly, OutputSelector, SplitError, select_logits
from ._points import PRE_LOGITS, _block_names, _known_points, _sequential_points, _unknown_point
from ._trace import _as_leaf_types, _graph_code, _trace, _Traced, resolve_leaf_modules

__all__ = [
    "SplitError",
    "TracedModel",
    "stitch_points",
    "split",
    "tap_model",
    "later_points",
    "activation_formats",
    "select_logits",
    "resolve_leaf_modules",
    "PointFormat",
    "LogitsOnly",
    "PRE_LOGITS",
    "LAYOUTS",
]

# The public classes defined in the submodules are named as this module's (tracebacks,
# pickles and documentation say ``stitchlab.splitting.SplitError``).
for _cls in (SplitError, LogitsOnly, PointFormat):
    _cls.__module__ = __name__
del _cls


class TracedModel:
    """A model traced once per train/eval mode, ready to be cut at any of its points.

    Build it once and cut it as often as needed (:meth:`split`, :meth:`tap`,
    :meth:`logits_model`, :meth:`formats`); the halves share the model's parameters.
    Tracing leaves the model unchanged.

    Args:
        model: any ``nn.Module`` whose forward takes one input.
        leaf_modules: module classes not to trace into (they become single graph nodes).
        output: which element of the forward's result is the logits (an index or a key;
            default: a tensor itself, a dict's or named tuple's ``"logits"``; required for
            a tuple of several elements).
        example: a batch of inputs on which every cut is checked (see :meth:`verify`);
            by default 2 random inputs of the shape the model declares or its first
            layer takes, else the first batch :meth:`formats` or a front (a tapped
            model) is called with.
        verify: check the trace and every cut against the whole model (default).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        leaf_modules: Sequence[type] | type = (),
        output: OutputSelector = None,
        example: Tensor | None = None,
        verify: bool = True,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
        self.model = model
        self.leaf_modules = _as_leaf_types(leaf_modules)
        self.output = output
        self.verifies = bool(verify)
        self._by_mode: dict[bool, _Traced] = {}
        self._refs: dict[bool, tuple[Tensor, dict[str, Tensor]]] = {}
        self._example: Tensor | None = None
        self.sequential = False
        self._trace_both()
        if not self.verifies:
            return
        if example is not None:
            self.verify(example)
            return
        inferred = _example_input(self)
        if inferred is not None:
            try:
                self.verify(inferred)
            except _ModelFailed:  # a wrong guess: the first real batch is the example
                pass

    def _trace_both(self) -> None:
        model = self.model
        output = self.output
        try:
            with modes(model, training=False):
                self._by_mode[False] = _trace(model, self.leaf_modules, output)
            with modes(model, training=True):
                train = _trace(model, self.leaf_modules, output)
        except SplitError:
            if not isinstance(model, nn.Sequential):
                raise
            self.sequential = True
            self.same_in_both_modes = True
            return
        ev = self._by_mode[False]
        self.same_in_both_modes = _graph_code(train) == _graph_code(ev)
        self._by_mode[True] = ev if self.same_in_both_modes else train
        if not self.same_in_both_modes:  # a point must exist in both graphs
            for name in list(ev.points):
                if name not in train.points:
                    ev.rejected[name] = "it runs only in eval mode"
                    del ev.points[name]
            ev.order = [p for p in ev.order if p in ev.points]

    # -- points -------------------------------------------------------------------
    @property
    def _eval(self) -> _Traced:
        return self._by_mode[False]

    def all_points(self) -> list[str]:
        """Every exact cut, one name per activation, in execution order."""
        if self.sequential:
            return _sequential_points(self.model)  # type: ignore[arg-type]
        return list(self._eval.order)

    def points(self, which: str = "default") -> list[str]:
        """The stitch points: ``"default"`` (the paper's or the model's declared points;
        otherwise the outputs of repeated blocks plus ``pre_logits``, or every cut when
        the model has no blocks) or ``"all"`` (every exact cut)."""
        if which not in ("default", "all"):
            raise ValueError(f"which must be 'default' or 'all', got {which!r}")
        if which == "all":
            return self.all_points()
        known = _known_points(self.model)
        if known is not None:
            return known
        every = self.all_points()
        if self.sequential:
            return every
        blocks = _block_names(self.model)
        t = self._eval
        chosen = {n for q, n in t.points.items() if q in blocks or q == PRE_LOGITS}
        names = []
        for p in every:  # one name per node: pre_logits, else the outermost block
            node = t.points[p]
            if node not in chosen:
                continue
            aliases = [q for q, n in t.points.items() if n is node]
            if PRE_LOGITS in aliases:
                names.append(PRE_LOGITS)
            else:
                names.append(min((q for q in aliases if q in blocks), key=lambda q: q.count(".")))
        return names if len(names) >= 2 else every

    def _check_point(self, name: str) -> fx.Node:
        t = self._eval
        if name not in t.points:
            raise _unknown_point(name, self.all_points(), t.rejected.get(name))
        return t.points[name]

    # -- halves -------------------------------------------------------------------
    def _both(self, build) -> nn.Module:
        ev = build(self._eval)
        if self.same_in_both_modes:
            return ev
        sw = _ModeSwitch(build(self._by_mode[True]), ev)
        sw.training = self.model.training  # its own flag only: the model's flags stay
        return sw

    def _later(self, point: str, taps) -> list[str]:
        if taps == "later":  # the listed points after this one (by graph position)
            pos = self._eval.position
            here = pos[self._eval.points[point]]
            return [
                p for p in self.points() if p in self._eval.points
                and pos[self._eval.points[p]] > here
            ]  # fmt: skip
        return [taps] if isinstance(taps, str) else list(taps or [])

    def split(
        self, point: str, *, taps: Sequence[str] | str | None = None
    ) -> tuple[nn.Module, nn.Module]:
        """``(front, back)`` cut after ``point``; ``back(front(x)) == model(x)``.

        With ``taps`` (later points, or ``"later"`` for every later stitch point) the back
        returns ``(logits, {point: activation})`` from the same pass.
        """
        if self.sequential:
            halves = _split_sequential(self.model, point, taps)  # type: ignore[arg-type]
            self._check_halves(point, *halves, list(halves[1].tap_names))
            if self.verifies and not self._refs:
                self._check_on_first_call(halves[0], point, *halves, halves[1].tap_names)
            return halves
        self._check_point(point)
        tap_names = self._later(point, taps)
        for name in tap_names:
            self._check_point(name)
        pos = self._eval.position
        for name in tap_names:
            if pos[self._eval.points[name]] <= pos[self._eval.points[point]]:
                raise SplitError(f"Tap {name!r} is not after the stitch point {point!r}.")

        def front(t: _Traced) -> fx.GraphModule:
            return _build_front(t, t.points[point])

        def back(t: _Traced) -> fx.GraphModule:
            node, taps = t.points[point], {n: t.points[n] for n in tap_names}
            return _build_back(t, node, taps, _back_keep(t, node, [t.logits, *taps.values()]))

        halves = self._both(front), self._both(back)
        self._check_halves(point, *halves, tap_names)
        if self.verifies and not self._refs:
            self._check_on_first_call(halves[0], point, *halves, tap_names)
        return halves

    def tap(self, points: Sequence[str]) -> nn.Module:
        """The model returning ``(logits, {point: activation})`` in one pass from the input."""
        if self.sequential:
            unknown = [p for p in points if p not in self.all_points()]
            if unknown:
                raise _unknown_point(unknown[0], self.all_points())
            return _SequentialBack(list(self.model.named_children()), list(points))
        for p in points:
            self._check_point(p)
        tapped = self._both(lambda t: _build_tapped(t, {p: t.points[p] for p in points}))
        self._check_halves(None, None, tapped, list(points))
        if self.verifies and not self._refs:
            self._check_on_first_call(tapped, None, None, tapped, list(points))
        return tapped

    def logits_model(self) -> nn.Module:
        """The whole model returning only its logits (the selected output)."""
        if self.sequential:
            return self.model
        return self._both(_build_logits)

    # -- verification -------------------------------------------------------------
    def _modes_checked(self) -> list[bool]:
        return [False] if self.same_in_both_modes or self.sequential else [False, True]

    def _point_names(self, training: bool) -> list[str]:
        if self.sequential:
            return [n for n, _ in self.model.named_children()]
        return list(self._by_mode[training].points)

    def verify(self, example: Tensor) -> None:
        """Check the trace on ``example`` (a batch of inputs), in eval mode (and in train
        mode where that graph differs): the traced graph's output must equal the model's
        own (else :class:`SplitError`), and the value at each point must equal what its
        module returns inside the whole model (a point where it does not is no longer
        offered). Every later cut (:meth:`split`, :meth:`tap`) is checked on the same
        batch. The model's parameters, buffers, attributes and modes are unchanged."""
        verify_trace(self, example)

    def check_split(self, example: Tensor, point: str, front: nn.Module, back: nn.Module) -> None:
        """Check halves of :meth:`split` (made unchecked, ``verify=False``) on ``example``:
        what :meth:`verify` and a checked :meth:`split` do, once the data is known."""
        if self._example is not example:
            self.verify(example)
        self._check_halves(point, front, back, list(getattr(back, "tap_names", [])), True)

    def _check_on_first_call(
        self, first: nn.Module, point: str | None, front, back, tap_names: Sequence[str]
    ) -> None:
        """With no example batch yet, the halves are checked on the first batch ``first``
        (the front, or the tapped model) is called with, before it runs."""
        check_on_first_call(self, first, point, front, back, tap_names)

    def _ensure_verified(self) -> bool:
        return self.verifies and bool(self._refs)

    def _check_halves(
        self,
        point: str | None,
        front: nn.Module | None,
        back: nn.Module,
        tap_names: Sequence[str],
        force: bool = False,
    ) -> None:
        """Run the halves on the example batch and compare them with the whole model."""
        check_halves(self, point, front, back, tap_names, force)

    def _missing(self, point: str, training: bool, front: bool = False) -> str:
        """The operations of the graph on the far side of ``point`` that a half leaves out.

        What a back keeps (``_back_keep``) is looked up in this module, here and in
        :meth:`split`, so both always agree (tests replace it to build a back that leaves
        operations out)."""
        if self.sequential:
            return ""
        t = self._by_mode[training]
        node = t.points[point]
        here = t.position[node]
        if front:
            kept = _with_mutations(t, _ancestors([node]), hi=here)
            side = [n for n in t.graph.nodes if t.position[n] < here]
        else:
            kept = _back_keep(t, node, [t.logits])
            side = [n for n in t.graph.nodes if t.position[n] > here]
        left = [
            f"{target_name(n)} ({n.name})" for n in side
            if n not in kept and n.op in ("call_function", "call_method", "call_module")
        ]  # fmt: skip
        half = "front" if front else "back"
        if not left:
            return f" The {half} runs every operation of the traced graph on its side."
        more = f" and {len(left) - 8} more" if len(left) > 8 else ""
        return f" Operations the {half} does not reproduce: {', '.join(left[:8])}{more}."

    # -- formats ------------------------------------------------------------------
    @torch.no_grad()
    def layout_names(self) -> set[str]:
        """The names a ``layouts`` mapping may give: every point, offered or not."""
        if self.sequential:
            return set(self.all_points()) | {n for n, _ in self.model.named_children()}
        return set(self._eval.points) | set(self._eval.rejected)

    def formats(
        self,
        example: Tensor,
        points: Sequence[str] | None = None,
        *,
        layouts: Mapping[str, str] | None = None,
        prefix_tokens: int | None = None,
    ) -> dict[str, PointFormat]:
        """The activation format at each point, from one eval-mode pass on ``example``.

        ``layouts`` overrides the detected layout of named points (see :data:`LAYOUTS`).
        The model's modes are left as they were.
        """
        return point_formats(self, example, points, layouts=layouts, prefix_tokens=prefix_tokens)


def stitch_points(
    model: nn.Module,
    *,
    which: str = "default",
    leaf_modules: Sequence[type] | type = (),
    output: OutputSelector = None,
) -> list[str]:
    """The ordered stitch points of ``model``.

    For torchvision ResNets and VGG-BN and timm ViTs these are the points of the paper
    (post-activation; ``pre_logits`` is the feature vector a ``head`` reads). A model
    with a ``stitchlab_points`` attribute declares its own. For any other module: the
    outputs of its repeated blocks (composite modules in a list of siblings of their
    class) and ``pre_logits``, or every exact cut when it has no such blocks;
    ``which="all"`` lists every exact cut, one name per activation, in execution order.
    """
    if which == "default":
        known = _known_points(model)
        if known is not None:
            return known
    return TracedModel(model, leaf_modules=leaf_modules, output=output).points(which)


_CHECK_DOC = """
    Every cut checks itself on ``example`` (a batch of inputs; by default 2 random inputs
    of the shape the model declares or its first layer takes, else the first batch the
    front is called with, before it runs): the halves' output must
    equal the model's own and each tap the value the whole model computes there, else a
    :class:`SplitError` names the point and the operations the back leaves out
    (``verify=False`` skips the check)."""


def split(
    model: nn.Module,
    point: str,
    *,
    taps: Sequence[str] | str | None = None,
    leaf_modules: Sequence[type] | type = (),
    output: OutputSelector = None,
    example: Tensor | None = None,
    verify: bool = True,
) -> tuple[nn.Module, nn.Module]:
    """Cut ``model`` after ``point``: ``back(front(x))`` equals ``model(x)`` (the logits).

    Only the needed layers run in each half and both share the model's parameters (no
    copy). With ``taps`` (a list of later points, or ``"later"`` for every later stitch
    point) the back returns ``(logits, {point: activation})`` from the same pass.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"split expects an nn.Module, got {type(model).__name__}")
    tm = TracedModel(
        model, leaf_modules=leaf_modules, output=output, example=example, verify=verify
    )
    return tm.split(point, taps=taps)


split.__doc__ = (split.__doc__ or "").rstrip() + "\n" + _CHECK_DOC


def later_points(
    model: nn.Module,
    point: str,
    *,
    leaf_modules: Sequence[type] | type = (),
    output: OutputSelector = None,
) -> list[str]:
    """The stitch points of ``model`` that come after ``point`` (FuLA's default set)."""
    _, back = split(
        model, point, taps="later", leaf_modules=leaf_modules, output=output, verify=False
    )
    return list(back.tap_names)


def tap_model(
    model: nn.Module,
    points: Sequence[str],
    *,
    leaf_modules: Sequence[type] | type = (),
    output: OutputSelector = None,
    example: Tensor | None = None,
    verify: bool = True,
) -> nn.Module:
    """``model`` returning ``(logits, {point: activation})`` in one pass from the input
    (checked on ``example`` as :func:`split` is)."""
    tm = TracedModel(
        model, leaf_modules=leaf_modules, output=output, example=example, verify=verify
    )
    return tm.tap(points)


def activation_formats(
    model: nn.Module,
    example: Tensor,
    points: Sequence[str] | None = None,
    *,
    layouts: Mapping[str, str] | None = None,
    leaf_modules: Sequence[type] | type = (),
    output: OutputSelector = None,
) -> dict[str, PointFormat]:
    """Shape and format (layout: NCHW, NHWC, NCL, NLC, NC) of the activation at each point,
    from one eval-mode pass of ``model`` on ``example`` (a batch)."""
    tm = TracedModel(model, leaf_modules=leaf_modules, output=output, example=example)
    return tm.formats(example, points, layouts=layouts)
