"""The self-check of a traced model and its cuts, on an example batch: the trace's
output and every point's value against the model's own (:meth:`TracedModel.verify`), the
halves of each cut against the whole model, deferred to the first batch when no example
is known; each run deterministic and free of side effects. Also the example batch
guessed from the model when the caller gives none."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from .._modes import modes
from ._halves import _build_tapped
from ._inplace import _ancestors
from ._outputs import SplitError, select_logits
from ._points import PRE_LOGITS
from ._trace import _preserved_state

if TYPE_CHECKING:
    from . import TracedModel


class _ModelFailed(SplitError):
    """The model itself raised on the example batch."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _mode(training: bool) -> str:
    return "train" if training else "eval"


def _difference(got, want) -> str | None:
    """None when ``got`` equals ``want`` up to float rounding, else what differs."""
    if not isinstance(got, Tensor) or not isinstance(want, Tensor):
        return f"got {type(got).__name__} where a tensor was expected"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} instead of {tuple(want.shape)}"
    if got.dtype == want.dtype and torch.equal(got, want):  # the same operations: bitwise
        return None
    if not got.is_floating_point() or not want.is_floating_point():
        return None if torch.equal(got, want) else "integer values differ"
    g, w = got.detach().double(), want.detach().double()
    finite = torch.isfinite(w)
    if not torch.equal(finite, torch.isfinite(g)) or not torch.equal(
        torch.isnan(g), torch.isnan(w)
    ):
        return "non-finite values at other places"
    if not bool(finite.any()):
        return None
    err = float((g - w)[finite].abs().max())
    scale = float(w[finite].abs().max())
    if err <= 1e-6 + 1e-5 * scale:
        return None
    return f"largest difference {err:.3g} on values up to {scale:.3g}"


@contextlib.contextmanager
def _checking(model: nn.Module, training: bool, x: Tensor, *halves: nn.Module) -> Iterator[None]:
    """A deterministic, side-effect-free run of ``model`` (or its halves) in one mode: no
    gradients, the random generator seeded (train-mode dropout draws the same masks in
    every run) and restored, and the model's buffers (BatchNorm statistics),
    attributes and train/eval flags as they were before."""
    devices = [x.device.index or 0] if x.device.type == "cuda" else []
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(torch.random.fork_rng(devices=devices))
        stack.enter_context(_unchanged_tensors(model))
        stack.enter_context(_preserved_state(model))
        stack.enter_context(modes(model, *halves, training=training))
        for h in halves:  # a _ModeSwitch picks its graph by its own flag
            h.train(training)
        torch.manual_seed(0)
        yield


@contextlib.contextmanager
def _unchanged_tensors(model: nn.Module) -> Iterator[None]:
    """Buffers a run modifies (BatchNorm statistics in train mode) are restored; a
    parameter modified in place is an error (it cannot be checked, nor stitched)."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    params = [(n, p, p._version) for n, p in model.named_parameters()]
    try:
        yield
    finally:  # every buffer (kernels update BatchNorm statistics without a version bump)
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    changed = [n for n, p, version in params if p._version != version]
    if changed:
        raise SplitError(
            f"{type(model).__name__} modifies its parameter {changed[0]!r} in place when it "
            "runs; stitchlab splits models whose weights a forward pass leaves unchanged."
        )


def _example_input(tm: TracedModel) -> Tensor | None:
    """A batch of 2 random inputs of the shape ``tm.model`` declares (``stitchlab_input_shape``,
    timm's or torchvision's input size) or its first layer takes; None when unknown."""
    from ..models import default_input_size

    model = tm.model
    shape: tuple[int, ...] | None = None
    declared = getattr(model, "stitchlab_input_shape", None)
    if isinstance(declared, (tuple, list)) and declared:
        shape = tuple(int(s) for s in declared)
    else:
        size = default_input_size(model)
        if size:
            shape = tuple(int(s) for s in size)
    first: nn.Module | None = None
    if tm.sequential:
        first = next(iter(model.children()), None)
        while first is not None and not isinstance(first, _INPUT_LAYERS):
            first = next(iter(first.children()), None)
    else:
        t = tm._eval
        for n in t.graph.nodes:  # the first layer with weights that reads the input
            if n.op == "call_module" and t.input in _ancestors([n]):
                m = model.get_submodule(str(n.target))
                if isinstance(m, _INPUT_LAYERS):
                    first = m
                    break
                if any(True for _ in m.parameters()):
                    break
    param = next(iter(model.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    gen = torch.Generator().manual_seed(0)
    if shape is None and isinstance(first, nn.Embedding):
        idx = torch.randint(0, first.num_embeddings, (2, 8), generator=gen)
        return idx.to(device)
    if shape is None and first is not None:
        if isinstance(first, nn.Linear):
            shape = (first.in_features,)
        elif isinstance(first, nn.LayerNorm):
            shape = tuple(first.normalized_shape)
        elif isinstance(first, (nn.modules.conv._ConvNd, nn.modules.batchnorm._BatchNorm)):
            c = first.in_channels if hasattr(first, "in_channels") else first.num_features
            dims = {nn.Conv1d: 1, nn.Conv3d: 3, nn.BatchNorm1d: 0, nn.BatchNorm3d: 3}
            k = next((v for cls, v in dims.items() if isinstance(first, cls)), 2)
            shape = (int(c), *([{1: 64, 2: 32, 3: 16}.get(k, 0)] * k))
    if shape is None:
        return None
    return torch.rand(2, *shape, generator=gen).to(device=device, dtype=dtype)


_INPUT_LAYERS = (
    nn.modules.conv._ConvNd, nn.Linear, nn.LayerNorm, nn.modules.batchnorm._BatchNorm,
    nn.Embedding,
)  # fmt: skip


def verify_trace(tm: TracedModel, example: Tensor) -> None:
    """:meth:`TracedModel.verify`: check the trace and every point on ``example``; keep it
    and the model's own values as the reference of every later cut."""
    if not isinstance(example, Tensor):
        raise TypeError(f"example must be a batch tensor, got {type(example).__name__}")
    name = type(tm.model).__name__
    refs: dict[bool, tuple[Tensor, dict[str, Tensor]]] = {}
    for training in tm._modes_checked():
        try:
            refs[training] = _reference(tm, example, training)
        except SplitError:
            raise
        except Exception as exc:
            raise _ModelFailed(f"{type(exc).__name__}: {_first_line(exc)}") from exc
    for training, (logits, values) in refs.items():
        if tm.sequential:
            continue
        t = tm._by_mode[training]
        names = list(t.points)
        tapped = _build_tapped(t, {p: t.points[p] for p in names})
        with _checking(tm.model, training, example, tapped):
            got, acts = tapped(example)
        diff = _difference(got, logits)
        if diff is not None:
            raise SplitError(
                f"The torch.fx trace of {name} does not reproduce its output on the "
                f"example batch ({diff}, {_mode(training)} mode): its forward does "
                "something the trace does not record (Python control flow on values, "
                "state kept between calls). Make the module that does it a leaf "
                "(leaf_modules=(ItsClass,))."
            )
        for p in names:
            if p not in values:
                why = "its module does not run in the model's forward"
            elif not isinstance(values[p], Tensor):
                why = f"its module returns {type(values[p]).__name__} at run time, not a tensor"
            else:
                why = _difference(acts[p], values[p])
            if why is not None:
                for tr in tm._by_mode.values():
                    tr.points.pop(p, None)
                    tr.order = [q for q in tr.order if q != p]
                    tr.rejected[p] = (
                        f"the traced value there differs from what its module returns "
                        f"in the model ({why}, {_mode(training)} mode)"
                    )
    tm._refs = refs
    tm._example = example


def _reference(tm: TracedModel, x: Tensor, training: bool) -> tuple[Tensor, dict[str, Tensor]]:
    """The model's own logits on ``x`` and the value each point's module returns."""
    values: dict[str, Tensor] = {}
    head = None if tm.sequential else tm._by_mode[training].head

    def keep(name: str, value) -> None:
        if name not in values:  # a non-tensor (a tuple) is kept to name it in the refusal
            values[name] = value.detach().clone() if isinstance(value, Tensor) else value

    handles = []
    try:
        for p in tm._point_names(training):
            if not tm.sequential and p.endswith(PRE_LOGITS) and head is not None:
                m = tm.model.get_submodule(head)
                handles.append(m.register_forward_pre_hook(
                    lambda _m, args, p=p: keep(p, args[0] if args else None)))  # fmt: skip
            else:
                m = tm.model.get_submodule(p)
                handles.append(m.register_forward_hook(
                    lambda _m, _i, out, p=p: keep(p, out)))  # fmt: skip
        with _checking(tm.model, training, x):
            out = tm.model(x)
    finally:
        for h in handles:
            h.remove()
    logits = select_logits(out, tm.output, type(tm.model).__name__)
    return logits.detach().clone(), values


def check_on_first_call(
    tm: TracedModel, first: nn.Module, point: str | None, front, back, tap_names: Sequence[str]
) -> None:
    """With no example batch yet, the halves are checked on the first batch ``first``
    (the front, or the tapped model) is called with, before it runs."""
    handle = None
    done = [False]  # shared by copies of the half (deepcopy keeps the hook function)

    def hook(_module, args):
        if done[0]:
            return
        done[0] = True
        handle.remove()
        if not args or not isinstance(args[0], Tensor):
            return
        if not tm._refs:
            try:
                tm.verify(args[0])
            except _ModelFailed:
                return  # the call itself raises the model's own error
        tm._check_halves(point, front, back, tap_names, True)

    handle = first.register_forward_pre_hook(hook)


def check_halves(
    tm: TracedModel,
    point: str | None,
    front: nn.Module | None,
    back: nn.Module,
    tap_names: Sequence[str],
    force: bool = False,
) -> None:
    """Run the halves on the example batch and compare them with the whole model."""
    if not force and not tm._ensure_verified():
        return
    x = tm._example
    name = type(tm.model).__name__
    for training, (logits, values) in tm._refs.items():
        mods = [m for m in (front, back) if m is not None]
        with _checking(tm.model, training, x, *mods):
            act = front(x) if front is not None else x
            out = back(act)
        where = f"{_mode(training)} mode"
        if front is not None and isinstance(values.get(point), Tensor):
            diff = _difference(act, values[point])
            if diff is not None:
                raise SplitError(
                    f"Cutting {name} at {point!r} is not exact: the front's activation "
                    f"differs from what {point!r} returns in the model ({diff}, {where})."
                    + tm._missing(point, training, front=True)
                )
        acts: Mapping[str, Tensor] = {}
        if tap_names:
            out, acts = out
        diff = _difference(out, logits)
        if diff is not None:
            at = f"at {point!r}" if point is not None else "with taps"
            raise SplitError(
                f"Cutting {name} {at} is not exact: the halves' output differs from "
                f"the model's own on the example batch ({diff}, {where})."
                + (tm._missing(point, training) if point is not None else "")
            )
        for p in tap_names:
            diff = _difference(acts.get(p), values.get(p))
            if diff is not None:
                raise SplitError(
                    f"Cutting {name}: the tap at {p!r} differs from what {p!r} returns "
                    f"in the model ({diff}, {where})."
                    + (tm._missing(point, training) if point is not None else "")
                )
