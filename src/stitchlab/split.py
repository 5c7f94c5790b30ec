"""Stitch points and exact splitting of a model into a front and a back half.

A model is traced once with :mod:`torch.fx`. Every submodule that is called exactly
once and returns a single tensor names a node of that graph (its output). Cutting at
such a node gives

* the **front**: the node's ancestors only, so that no layer after the point runs;
* the **back**: the nodes between the point and the logits (and, on request, the
  activations at later points, the *taps*), with the point replaced by an input.

``back(front(x))`` then performs exactly the operations of ``model(x)``.

Corner cases (as in torchvision's ``feature_extraction``):

* Python control flow is frozen at trace time. Optional ``forward`` arguments are
  specialised to their default values (timm ViTs: ``attn_mask=None``).
* A point is only valid when nothing but its own activation crosses the cut: a residual
  branch that starts before the point and joins after it makes it invalid (cut at the
  block output instead), and so does a back half that needs the input image itself.
* A submodule called more than once (a shared ``ReLU``) has no single output and is not
  a point; use the enclosing block.
* The halves run the traced operations of non-leaf modules inline: forward hooks on
  leaf modules (Conv2d, Linear, ...) still fire, hooks on blocks do not.
* Models that torch.fx cannot trace can still be split when they are
  ``nn.Sequential``: the points are then the top-level children.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch import nn

__all__ = [
    "SplitError",
    "stitch_points",
    "split",
    "tap_model",
    "later_points",
    "PRE_LOGITS",
]

PRE_LOGITS = "pre_logits"


class SplitError(ValueError):
    """A model cannot be split at the requested point."""


def _timm_fx_extras() -> tuple[tuple, tuple]:
    try:  # timm marks some functions/modules as untraceable; respect that when present
        from timm.layers import _fx as tfx

        return tuple(tfx._autowrap_functions), tuple(tfx._leaf_modules)
    except Exception:  # pragma: no cover - timm missing or internals moved
        return (), ()


class _RecordingTracer(fx.Tracer):
    """An FX tracer that records which graph node each submodule call returned."""

    def __init__(self, leaf_modules: tuple[type, ...] = ()) -> None:
        autowrap_functions, timm_leaves = _timm_fx_extras()
        super().__init__(autowrap_functions=autowrap_functions)
        self._leaf_types = tuple(leaf_modules) + timm_leaves
        self.module_outputs: dict[str, list[object]] = {}

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if self._leaf_types and isinstance(m, self._leaf_types):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m, forward, args, kwargs):  # noqa: D102
        out = super().call_module(m, forward, args, kwargs)
        try:
            name = self.path_of_module(m)
        except NameError:  # pragma: no cover - module not in hierarchy
            return out
        if name:
            self.module_outputs.setdefault(name, []).append(out)
        return out


@dataclass
class _Traced:
    """A traced model: its graph and the node each point name refers to."""

    root: nn.Module
    graph: fx.Graph
    input: fx.Node
    output: fx.Node
    points: dict[str, fx.Node] = field(default_factory=dict)  # every valid name -> node
    order: list[str] = field(default_factory=list)  # one name per node, execution order
    rejected: dict[str, str] = field(default_factory=dict)  # name -> why it is no point


def _concrete_args(model: nn.Module) -> dict[str, object]:
    params = list(inspect.signature(model.forward).parameters.values())
    if not params:
        raise SplitError(f"{type(model).__name__}.forward takes no input; nothing to split.")
    concrete: dict[str, object] = {}
    for p in params[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is inspect.Parameter.empty:
            raise SplitError(
                f"{type(model).__name__}.forward needs a second input {p.name!r}; stitchlab "
                "splits models of one image input. Wrap the model in a module whose forward "
                "takes only the image."
            )
        concrete[p.name] = p.default
    return concrete


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


def _cut_problem(t: _Traced, node: fx.Node) -> str | None:
    """Why cutting at ``node`` is not exact, or None when it is."""
    if t.output.args[0] is node:
        return "it is the model's output, so the back would be empty"
    needed = _ancestors([t.output], stop=node)
    if node not in needed:
        return "the output does not depend on it"
    if any(n.op == "placeholder" for n in needed):
        return (
            "later layers also use activations from before it (a residual branch that "
            "crosses the cut, or the input itself); cut at the enclosing block's output"
        )
    return None


def _trace(model: nn.Module, leaf_modules: tuple[type, ...] = ()) -> _Traced:
    tracer = _RecordingTracer(leaf_modules)
    try:
        graph = tracer.trace(model, concrete_args=_concrete_args(model) or None)
    except SplitError:
        raise
    except Exception as exc:
        raise SplitError(
            f"torch.fx cannot trace {type(model).__name__}: {type(exc).__name__}: {exc}. "
            "Make the failing submodule a leaf (split(..., leaf_modules=(ItsClass,))), "
            "remove data-dependent Python control flow from forward, or express the "
            "model as nn.Sequential, which is split by its children."
        ) from exc
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = next(n for n in graph.nodes if n.op == "output")
    t = _Traced(root=model, graph=graph, input=placeholders[0], output=output)
    position = {n: i for i, n in enumerate(graph.nodes)}
    named: list[tuple[int, str, fx.Node]] = []
    for name, outs in tracer.module_outputs.items():
        if len(outs) != 1:
            t.rejected[name] = f"it is called {len(outs)} times, so it has no single output"
            continue
        proxy = outs[0]
        if not isinstance(proxy, fx.Proxy):
            t.rejected[name] = "its output is not a single tensor"
            continue
        named.append((position[proxy.node], name, proxy.node))
    # the input of the classifier head, when the model has one called `head` (timm)
    head = tracer.module_outputs.get("head")
    if head and len(head) == 1 and isinstance(head[0], fx.Proxy):
        feats = head[0].node.args[0] if head[0].node.op == "call_module" else None
        if isinstance(feats, fx.Node):
            named.append((position[feats], PRE_LOGITS, feats))
    seen_nodes: set[fx.Node] = set()
    problems: dict[fx.Node, str | None] = {}
    for _, name, node in sorted(named, key=lambda x: x[0]):
        if node not in problems:
            problems[node] = _cut_problem(t, node)
        if problems[node] is not None:
            t.rejected[name] = problems[node]  # type: ignore[assignment]
            continue
        t.points[name] = node
        if node not in seen_nodes:  # list one name per node: the first (innermost) one
            seen_nodes.add(node)
            t.order.append(name)
    return t


# ---------------------------------------------------------------------------
# Known architectures: the points of PROTOCOL section 1


def _paper_points(model: nn.Module) -> list[str] | None:
    """The paper's stitch points for torchvision ResNets, VGG-BN and timm ViTs."""
    try:
        from torchvision.models import VGG, ResNet
    except Exception:  # pragma: no cover
        ResNet = VGG = ()  # type: ignore[assignment]
    if ResNet and isinstance(model, ResNet):
        pts = ["relu"]
        for layer in ("layer1", "layer2", "layer3", "layer4"):
            pts += [f"{layer}.{i}" for i in range(len(getattr(model, layer)))]
        return pts
    if VGG and isinstance(model, VGG):
        # the ReLU after the last conv of each stage, plus after conv1_1
        feats = list(model.features)
        relus = [i for i, m in enumerate(feats) if isinstance(m, nn.ReLU)]
        stage_ends = [i - 1 for i, m in enumerate(feats) if isinstance(m, nn.MaxPool2d)]
        pts = [relus[0]] + [i for i in stage_ends if i in relus]
        return [f"features.{i}" for i in sorted(set(pts))]
    try:
        from timm.models.vision_transformer import VisionTransformer
    except Exception:  # pragma: no cover
        VisionTransformer = ()  # type: ignore[assignment]
    if VisionTransformer and isinstance(model, VisionTransformer):
        depth = len(model.blocks)
        patch = model.patch_embed.patch_size[0]
        every = 2 if (model.embed_dim >= 768 and patch >= 16 and depth == 12) else 1
        return [f"blocks.{i}" for i in range(0, depth, every)] + [PRE_LOGITS]
    return None


def _sequential_points(model: nn.Sequential) -> list[str]:
    return [name for name, _ in model.named_children()][:-1]  # not after the last child


def _closest(name: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.0)
    return close[0] if close else ""


def _unknown_point(name: str, valid: Sequence[str], why: str | None = None) -> SplitError:
    closest = _closest(name, valid)
    reason = f" It is not a cut point: {why}." if why else ""
    hint = f" Did you mean {closest!r}?" if closest else ""
    return SplitError(
        f"Unknown stitch point {name!r}.{reason}{hint} Valid points: {', '.join(valid)}"
    )


def stitch_points(model: nn.Module, *, leaf_modules: tuple[type, ...] = ()) -> list[str]:
    """The ordered stitch points of ``model``.

    For torchvision ResNets and VGG-BN and timm ViTs these are the points of the paper
    (post-activation; ``pre_logits`` is the pooled, normed feature a ViT's head reads).
    A model with a ``stitchlab_points`` attribute declares its own. For any other
    module: the names of submodules whose outputs can be cut exactly, one name per
    activation, in execution order.
    """
    known = _known_points(model)
    if known is not None:
        return known
    try:
        return list(_trace(model, leaf_modules).order)
    except SplitError:
        if isinstance(model, nn.Sequential):
            return _sequential_points(model)
        raise


def _known_points(model: nn.Module) -> list[str] | None:
    """Points declared by the model (``stitchlab_points``) or the paper's, else None."""
    declared = getattr(model, "stitchlab_points", None)
    if declared is not None:  # a model may declare its points (the registry's contract)
        return list(declared)
    return _paper_points(model)


def _traced_points(
    model: nn.Module, leaf_modules: tuple[type, ...]
) -> tuple[_Traced | None, list[str]]:
    """One trace of ``model`` and its points; ``(None, children)`` for an untraceable
    ``nn.Sequential``."""
    try:
        t = _trace(model, leaf_modules)
    except SplitError:
        if not isinstance(model, nn.Sequential):
            raise
        return None, _known_points(model) or _sequential_points(model)
    known = _known_points(model)
    return t, (known if known is not None else list(t.order))


# ---------------------------------------------------------------------------
# Building the halves


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
                acts[name] = x
        return (x, acts) if self.taps else x


def _graph_module(root: nn.Module, graph: fx.Graph, name: str) -> fx.GraphModule:
    graph.lint()
    gm = fx.GraphModule(root, graph, class_name=name)
    gm.train(root.training)
    return gm


def _build_front(t: _Traced, node: fx.Node) -> fx.GraphModule:
    keep = _ancestors([node])
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in t.graph.nodes:
        if n in keep:
            env[n] = g.node_copy(n, lambda a: env[a])
    g.output(env[node])
    return _graph_module(t.root, g, "Front")


def _build_back(t: _Traced, node: fx.Node, taps: dict[str, fx.Node]) -> fx.GraphModule:
    roots = [t.output, *taps.values()]
    keep = _ancestors(roots, stop=node)
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {node: g.placeholder("activation")}
    for n in t.graph.nodes:
        if n in keep and n is not node and n.op != "output":
            env[n] = g.node_copy(n, lambda a: env[a])
    out = fx.map_arg(t.output.args[0], lambda a: env[a])
    if taps:
        out = (out, {name: env[n] for name, n in taps.items()})
    g.output(out)
    gm = _graph_module(t.root, g, "Back")
    gm.tap_names = list(taps)
    return gm


def split(
    model: nn.Module,
    point: str,
    *,
    taps: Sequence[str] | str | None = None,
    leaf_modules: tuple[type, ...] = (),
) -> tuple[nn.Module, nn.Module]:
    """Cut ``model`` after ``point``: ``back(front(x))`` equals ``model(x)``.

    Only the needed layers run in each half and both share the model's parameters (no
    copy). With ``taps`` (a list of later points, or ``"later"`` for every later stitch
    point) the back returns ``(logits, {point: activation})`` from the same pass.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"split expects an nn.Module, got {type(model).__name__}")
    t, points = _traced_points(model, leaf_modules)
    if t is None:
        return _split_sequential(model, point, taps)
    if point not in t.points:
        raise _unknown_point(point, points, t.rejected.get(point))
    pos = {n: i for i, n in enumerate(t.graph.nodes)}
    if taps == "later":  # the listed points after this one (by graph position)
        tap_names = [p for p in points if p in t.points and pos[t.points[p]] > pos[t.points[point]]]
    else:
        tap_names = [taps] if isinstance(taps, str) else list(taps or [])
    tap_nodes: dict[str, fx.Node] = {}
    for name in tap_names:
        if name not in t.points:
            raise _unknown_point(name, points, t.rejected.get(name))
        tap_nodes[name] = t.points[name]
    node = t.points[point]
    for name, n in tap_nodes.items():
        if pos[n] <= pos[node]:
            raise SplitError(f"Tap {name!r} is not after the stitch point {point!r}.")
    return _build_front(t, node), _build_back(t, node, tap_nodes)


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


def later_points(model: nn.Module, point: str, *, leaf_modules: tuple[type, ...] = ()) -> list[str]:
    """The stitch points of ``model`` that come after ``point`` (FuLA's default set)."""
    _, back = split(model, point, taps="later", leaf_modules=leaf_modules)
    return list(back.tap_names)


def tap_model(
    model: nn.Module, points: Sequence[str], *, leaf_modules: tuple[type, ...] = ()
) -> nn.Module:
    """``model`` returning ``(logits, {point: activation})`` in one pass from the image."""
    t, all_points = _traced_points(model, leaf_modules)
    if t is None:
        unknown = [p for p in points if p not in all_points]
        if unknown:
            raise _unknown_point(unknown[0], all_points) from None
        return _SequentialBack(list(model.named_children()), list(points))
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    nodes = {}
    for name in points:
        if name not in t.points:
            raise _unknown_point(name, all_points, t.rejected.get(name))
        nodes[name] = t.points[name]
    keep = _ancestors([t.output, *nodes.values()])
    for n in t.graph.nodes:
        if n in keep and n.op != "output":
            env[n] = g.node_copy(n, lambda a: env[a])
    out = fx.map_arg(t.output.args[0], lambda a: env[a])
    g.output((out, {name: env[n] for name, n in nodes.items()}))
    return _graph_module(t.root, g, "Tapped")
