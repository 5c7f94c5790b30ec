"""Building the halves of a cut from a traced graph: the front, the back (with taps),
the tapped whole model and the logits-only model, each a GraphModule over the model's
own parameters (or, traced in both modes, a switch between the two graphs); and the
halves of an untraced ``nn.Sequential``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.fx as fx
from torch import nn

from .._modes import modes
from ._inplace import _ancestors, _needs_copy, _with_mutations
from ._outputs import SplitError
from ._points import _sequential_points, _unknown_point

if TYPE_CHECKING:
    from ._trace import _Traced


class _SequentialBack(nn.Module):
    """The back of an ``nn.Sequential`` that could not be traced, with optional taps."""

    def __init__(self, children: list[tuple[str, nn.Module]], taps: Sequence[str]) -> None:
        super().__init__()
        self.names = [n for n, _ in children]
        self.layers = nn.ModuleList([m for _, m in children])
        self.taps = list(taps)
        self.tap_names = self.taps

    def forward(self, x: torch.Tensor):  # noqa: D102
        acts: dict[str, torch.Tensor] = {}
        for name, layer in zip(self.names, self.layers):
            x = layer(x)
            if name in self.taps:
                acts[name] = x.clone()
        return (x, acts) if self.taps else x


class _ModeSwitch(nn.Module):
    """Two graphs of one half, traced in train and in eval mode; runs the current one."""

    def __init__(self, train_graph: fx.GraphModule, eval_graph: fx.GraphModule) -> None:
        super().__init__()
        self.train_graph = train_graph
        self.eval_graph = eval_graph
        self.tap_names = list(getattr(eval_graph, "tap_names", []))

    def forward(self, x):  # noqa: D102
        return (self.train_graph if self.training else self.eval_graph)(x)


def _graph_module(t: _Traced, graph: fx.Graph, name: str) -> fx.GraphModule:
    """A GraphModule over ``t``'s model (shared parameters) and the trace's constants."""
    graph.lint()
    root = t.root
    for k, v in t.constants.items():  # the constants exist only while the module is built
        root.__dict__[k] = v
    try:
        with modes(root):
            gm = fx.GraphModule(root, graph, class_name=name)
    finally:
        for k in t.constants:
            root.__dict__.pop(k, None)
    gm.training = root.training
    return gm


def _build_front(t: _Traced, node: fx.Node) -> fx.GraphModule:
    keep = _with_mutations(t, _ancestors([node]), hi=t.position[node])
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in t.graph.nodes:
        if n in keep:
            env[n] = g.node_copy(n, lambda a: env[a])
    g.output(env[node])
    return _graph_module(t, g, "Front")


def _copy_graph(
    t: _Traced,
    keep: set[fx.Node],
    env: dict[fx.Node, fx.Node],
    g: fx.Graph,
    taps: dict[str, fx.Node],
) -> dict[str, fx.Node]:
    """Copy the kept nodes into ``g``; return the graph node of each tap (a copy of the
    activation when a later in-place operation would change it)."""
    kept = [n for n in t.graph.nodes if n in keep and n not in env and n.op != "output"]
    tap_nodes = set(taps.values())
    copies: dict[fx.Node, fx.Node] = {}
    for i, n in enumerate(kept):
        env[n] = g.node_copy(n, lambda a: env[a])
        if n in tap_nodes:
            copies[n] = (
                g.call_function(torch.clone, (env[n],))
                if _needs_copy(t, n, kept[i + 1 :])
                else env[n]
            )
    return {name: copies[n] for name, n in taps.items()}


def _build_back(
    t: _Traced, node: fx.Node, taps: dict[str, fx.Node], keep: set[fx.Node]
) -> fx.GraphModule:
    """The back cut at ``node``, running the nodes ``keep`` (``_back_keep`` of the logits
    and the taps), and returning the logits, or ``(logits, {tap: activation})``."""
    g = fx.Graph()
    placeholder = g.placeholder("activation")
    after = [n for n in t.graph.nodes if n in keep and n is not node and n.op != "output"]
    if _needs_copy(t, node, after):  # never overwrite the caller's activation
        placeholder = g.call_function(torch.clone, (placeholder,))
    env: dict[fx.Node, fx.Node] = {node: placeholder}
    if node in taps.values():  # pragma: no cover - taps are after the point
        raise SplitError("a tap cannot be the stitch point itself")
    tap_out = _copy_graph(t, keep, env, g, taps)
    out = env[t.logits]
    if taps:
        out = (out, tap_out)
    g.output(out)
    gm = _graph_module(t, g, "Back")
    gm.tap_names = list(taps)
    return gm


def _build_tapped(t: _Traced, nodes: dict[str, fx.Node]) -> fx.GraphModule:
    keep = _with_mutations(t, _ancestors([t.logits, *nodes.values()]))
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    tap_out = _copy_graph(t, keep, env, g, nodes)
    g.output((env[t.logits], tap_out))
    gm = _graph_module(t, g, "Tapped")
    gm.tap_names = list(nodes)
    return gm


def _build_logits(t: _Traced) -> fx.GraphModule:
    keep = _with_mutations(t, _ancestors([t.logits]))
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    _copy_graph(t, keep, env, g, {})
    g.output(env[t.logits])
    return _graph_module(t, g, "Logits")


def _split_sequential(model: nn.Sequential, point: str, taps) -> tuple[nn.Module, nn.Module]:
    names = _sequential_points(model)
    if point not in names:
        raise _unknown_point(point, names)
    k = names.index(point)
    children = list(model.named_children())
    front = nn.Sequential(*[m for _, m in children[: k + 1]])
    if taps == "later":
        tap_names = names[k + 1 :]
    else:
        tap_names = [taps] if isinstance(taps, str) else list(taps or [])
    for name in tap_names:
        if name not in names[k + 1 :]:
            raise _unknown_point(name, names[k + 1 :])
    return front, _SequentialBack(children[k + 1 :], tap_names)
