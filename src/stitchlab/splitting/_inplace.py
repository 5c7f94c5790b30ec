"""What a half runs, safe against in-place operations: the ancestors of a value, the
in-place calls whose results are unused but modify memory a kept value may share
(``h.mul_(0.5).relu_()``), whether a cut at a node is exact, and whether a later in-place
operation may modify an activation (so a half copies it first)."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Protocol

import torch.fx as fx
from torch import nn

from ..layouts import target_name


class _Traced(Protocol):
    """What this module reads of a traced model (``_trace._Traced`` provides it)."""

    root: nn.Module
    logits: fx.Node
    position: dict[fx.Node, int]
    bases: dict[fx.Node, fx.Node]
    mutations: list[tuple[fx.Node, fx.Node]]


def _ancestors(roots: Iterable[fx.Node], stop: fx.Node | None = None) -> set[fx.Node]:
    """Nodes the roots depend on; the traversal does not pass through ``stop``."""
    seen: set[fx.Node] = set()
    todo = [r for r in roots if isinstance(r, fx.Node)]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node is stop:
            continue
        todo.extend(node.all_input_nodes)
    return seen


_END = 1 << 62


def _with_mutations(
    t: _Traced, keep: set[fx.Node], lo: int = -1, hi: int = _END, stop: fx.Node | None = None
) -> set[fx.Node]:
    """``keep`` plus every in-place operation placed between positions ``lo`` and ``hi``
    that modifies memory a kept value may share (``h.mul_(0.5)`` whose result is unused),
    with the nodes those operations read (not through ``stop``)."""
    keep = set(keep)
    pending = [(m, target) for m, target in t.mutations if lo < t.position[m] < hi]
    while pending:
        bases = {t.bases[n] for n in keep}
        hit = [(m, tg) for m, tg in pending if m not in keep and t.bases[tg] in bases]
        if not hit:
            break
        for m, _ in hit:
            keep |= _ancestors([m], stop=stop)
        pending = [(m, tg) for m, tg in pending if m not in keep]
    return keep


def _back_keep(t: _Traced, node: fx.Node, roots: Sequence[fx.Node]) -> set[fx.Node]:
    """The nodes a back cut at ``node`` runs to compute ``roots`` (``node`` included)."""
    return _with_mutations(
        t, _ancestors(roots, stop=node), lo=t.position[node], stop=node
    )


def _cut_problem(t: _Traced, node: fx.Node) -> str | None:
    """Why cutting at ``node`` is not exact, or None when it is."""
    if t.logits is node:
        return "it is the model's output, so the back would be empty"
    plain = _ancestors([t.logits], stop=node)
    if node not in plain:
        return "the output does not depend on it"
    if any(n.op == "placeholder" for n in plain):
        return (
            "later layers also use activations from before it (a residual branch that "
            "crosses the cut, or the input itself); cut at the enclosing block's output"
        )
    needed = _back_keep(t, node, [t.logits])
    if any(n.op == "placeholder" for n in needed):
        here = t.position[node]
        ops = [
            m for m, tg in t.mutations
            if m in needed and t.position[m] > here and t.position[tg] < here
        ]  # fmt: skip
        what = ", ".join(f"{target_name(m)} ({m.name})" for m in ops[:3]) or "an in-place op"
        return (
            f"the in-place operation {what} after it modifies a tensor computed before it "
            "that its activation may share memory with, which a back half cannot "
            "reproduce; cut at a later point"
        )
    return None


_ALIAS_METHODS = {
    "view", "view_as", "reshape", "reshape_as", "permute", "transpose", "flatten",
    "unflatten", "squeeze", "unsqueeze", "expand", "expand_as", "contiguous", "narrow",
    "select", "detach", "t", "movedim", "swapaxes", "swapdims", "as_strided", "to",
    "type", "type_as", "float", "chunk", "split", "unbind", "unfold", "diagonal",
    "real", "view_as_real",
}  # fmt: skip
_FRESH_MODULES = (
    nn.modules.conv._ConvNd, nn.Linear, nn.modules.batchnorm._BatchNorm, nn.LayerNorm,
    nn.GroupNorm, nn.modules.instancenorm._InstanceNorm, nn.modules.pooling._MaxPoolNd,
    nn.modules.pooling._AvgPoolNd, nn.modules.pooling._AdaptiveAvgPoolNd,
    nn.modules.pooling._AdaptiveMaxPoolNd, nn.Embedding, nn.Softmax,
)  # fmt: skip


def _mutated_input(n: fx.Node, root: nn.Module) -> fx.Node | None:
    """The node whose tensor ``n`` modifies in place, or None."""
    first = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
    if first is None:
        return None
    if n.op == "call_module":
        m = root.get_submodule(str(n.target))
        return first if getattr(m, "inplace", False) is True else None
    if n.op not in ("call_function", "call_method"):
        return None
    name = target_name(n)
    if n.kwargs.get("inplace") is True:
        return first
    if n.op == "call_function" and n.target in (
        operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
        operator.iand, operator.ior,
    ):  # fmt: skip
        return first
    if name.endswith("_") and not name.endswith("__"):  # relu_, add_, clamp_, copy_, ...
        return first
    return None


def _aliases_input(n: fx.Node, root: nn.Module) -> bool:
    """Whether ``n``'s output may share memory with its first input (conservative)."""
    if n.op == "call_module":
        m = root.get_submodule(str(n.target))
        return not isinstance(m, _FRESH_MODULES)
    if n.op == "call_method":
        return str(n.target) in _ALIAS_METHODS or _mutated_input(n, root) is not None
    if n.op == "call_function":
        name = target_name(n)
        return (
            n.target is operator.getitem
            or name in _ALIAS_METHODS
            or name in ("flatten", "reshape", "dropout", "identity")
            or _mutated_input(n, root) is not None
        )
    return False


def _needs_copy(t: _Traced, protected: fx.Node, nodes: Sequence[fx.Node]) -> bool:
    """Whether an in-place op among ``nodes`` (after ``protected``) may modify its value."""
    group = {protected}
    for n in nodes:  # nodes in graph order: grow the set of tensors that may alias it
        if n.all_input_nodes and n.args and n.args[0] in group and _aliases_input(n, t.root):
            group.add(n)
    return any(_mutated_input(n, t.root) in group for n in nodes)
