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
  overwritten.
* **Outputs.** A model whose ``forward`` returns a tuple, list or dict is cut like any
  other; ``output=`` says which element is the logits (default: the first element of a
  tuple, the ``"logits"`` entry of a dict). The halves return the logits only.
* **Activation layouts.** :meth:`TracedModel.formats` runs the graph once on example
  inputs and follows the channel axis through every operation (convolutions and
  BatchNorm put it first, Linear and LayerNorm last, ``permute``/``transpose``/
  ``reshape`` move it), so channels-last maps (Swin, MaxViT and ConvNeXt internals) are
  told from channels-first ones. A point whose channel axis cannot be followed, or whose
  first axis is not the batch, gets no format and stitching at it is an error that says
  how to name its layout (``layouts=``).
* The halves run the traced operations of non-leaf modules inline: forward hooks on
  leaf modules (Conv2d, Linear, ...) still fire, hooks on blocks do not.
* Models that torch.fx cannot trace can still be split when they are
  ``nn.Sequential``: the points are then the top-level children. Otherwise make the
  failing submodule a leaf (``leaf_modules=``).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import inspect
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch import Tensor, nn

from ._modes import modes
from .layouts import (
    _FIRST_MODULES,
    _UNKNOWN,
    LAYOUTS,
    Axes,
    LayoutProp,
    layout_of,
    target_name,
    why_no_layout,
)

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

PRE_LOGITS = "pre_logits"


OutputSelector = int | str | None


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
        self.module_inputs: dict[str, list[tuple]] = {}

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
            self.module_inputs.setdefault(name, []).append(args)
        return out


@dataclass
class _Traced:
    """A traced model in one mode: its graph and the node each point name refers to."""

    root: nn.Module
    graph: fx.Graph
    input: fx.Node
    output: fx.Node
    logits: fx.Node
    points: dict[str, fx.Node] = field(default_factory=dict)  # every valid name -> node
    order: list[str] = field(default_factory=list)  # one name per node, execution order
    rejected: dict[str, str] = field(default_factory=dict)  # name -> why it is no point
    constants: dict[str, object] = field(default_factory=dict)  # tracer-made attributes
    position: dict[fx.Node, int] = field(default_factory=dict)  # node -> execution order


_HEAD_NAMES = ("head", "heads", "classifier", "fc")


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
    if t.logits is node:
        return "it is the model's output, so the back would be empty"
    needed = _ancestors([t.logits], stop=node)
    if node not in needed:
        return "the output does not depend on it"
    if any(n.op == "placeholder" for n in needed):
        return (
            "later layers also use activations from before it (a residual branch that "
            "crosses the cut, or the input itself); cut at the enclosing block's output"
        )
    return None


# ---------------------------------------------------------------------------
# Outputs: which element of what forward returns is the logits


def _select_output(out, output: OutputSelector, model_name: str):
    """The element of a (traced or real) output structure that holds the logits."""
    if isinstance(out, Mapping) or hasattr(out, "keys") and hasattr(out, "__getitem__"):
        keys = list(out.keys())
        key = "logits" if output is None else output
        if key not in keys:
            raise SplitError(
                f"{model_name}.forward returns a dict with keys {keys}; say which one is the "
                f"logits with output='<key>'"
                + (" (no 'logits' key to default to)." if output is None else ".")
            )
        return out[key]
    if isinstance(out, (tuple, list)):
        if isinstance(output, str) and hasattr(out, "_fields"):  # namedtuple
            if output not in out._fields:
                raise SplitError(
                    f"{model_name}.forward returns {type(out).__name__} with fields "
                    f"{list(out._fields)}; {output!r} is not one of them."
                )
            return getattr(out, output)
        if output is None:
            output = 0
        if not isinstance(output, int) or not -len(out) <= output < len(out):
            raise SplitError(
                f"{model_name}.forward returns a {type(out).__name__} of {len(out)} elements; "
                f"output must be an index in 0..{len(out) - 1}, got {output!r}."
            )
        return out[output]
    if output not in (None, 0):
        raise SplitError(
            f"{model_name}.forward returns a single value; output={output!r} selects nothing "
            "(leave output unset)."
        )
    return out


def select_logits(out, output: OutputSelector = None, model_name: str = "the model") -> Tensor:
    """The logits tensor in what a model returned (a tensor, tuple, list or dict).

    ``output`` names the element (an index or a key); by default the first element of a
    tuple or list and the ``"logits"`` entry of a dict or Hugging Face output.
    """
    sel = _select_output(out, output, model_name)
    if not isinstance(sel, Tensor):
        raise SplitError(
            f"{model_name} returned {type(sel).__name__} where the logits tensor was expected; "
            "pass output=<index or key> to select the logits."
        )
    return sel


class LogitsOnly(nn.Module):
    """``model`` returning only its logits (for models whose forward returns more)."""

    def __init__(self, model: nn.Module, output: OutputSelector = None) -> None:
        super().__init__()
        self.model = model
        self.output = output

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return select_logits(self.model(x), self.output, type(self.model).__name__)


# ---------------------------------------------------------------------------
# Tracing without side effects


@contextlib.contextmanager
def _preserved_state(model: nn.Module) -> Iterator[None]:
    """Restore every module's attributes and train/eval flags after the block.

    A ``forward`` may write to its module while it is traced (caches keyed by device,
    counters); the traced code must not leave proxies behind in the caller's model.
    """
    saved = []
    for m in model.modules():
        attrs = dict(m.__dict__)
        contents = {
            k: (copy.copy(v)) for k, v in attrs.items() if type(v) in (dict, list, set)
        }
        saved.append((m, attrs, contents))
    try:
        yield
    finally:
        for m, attrs, contents in saved:
            for k in [k for k in m.__dict__ if k not in attrs]:
                del m.__dict__[k]
            for k, v in attrs.items():
                if m.__dict__.get(k, _MISSING) is not v:
                    m.__dict__[k] = v
            for k, old in contents.items():
                cur = attrs[k]
                if _changed(cur, old):
                    cur.clear()
                    if isinstance(cur, list):
                        cur.extend(old)
                    else:
                        cur.update(old)


_MISSING = object()


def _changed(cur, old) -> bool:
    """Whether a dict, list or set differs from its snapshot, by identity of its items
    (``==`` on tensors inside would be ambiguous)."""
    if isinstance(cur, dict):
        return cur.keys() != old.keys() or any(cur[k] is not old[k] for k in old)
    if isinstance(cur, list):
        return len(cur) != len(old) or any(a is not b for a, b in zip(cur, old))
    return cur != old


def _trace(
    model: nn.Module, leaf_modules: tuple[type, ...] = (), output: OutputSelector = None
) -> _Traced:
    tracer = _RecordingTracer(leaf_modules)
    try:
        with _preserved_state(model):
            graph = tracer.trace(model, concrete_args=_concrete_args(model) or None)
            # tensors the tracer stored on the model (constants) move to the trace
            constants = {
                str(n.target): _resolve(model, str(n.target))
                for n in graph.nodes
                if n.op == "get_attr"
            }
    except SplitError:
        raise
    except Exception as exc:
        raise SplitError(
            f"torch.fx cannot trace {type(model).__name__}: {type(exc).__name__}: {exc}. "
            "Make the failing submodule a leaf (leaf_modules=(ItsClass,)), "
            "remove data-dependent Python control flow from forward, or express the "
            "model as nn.Sequential, which is split by its children."
        ) from exc
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in graph.nodes if n.op == "output")
    logits = _select_output(out_node.args[0], output, type(model).__name__)
    if not isinstance(logits, fx.Node):
        raise SplitError(
            f"{type(model).__name__}: the selected output is not a traced tensor "
            f"({type(logits).__name__}); pass output=<index or key> of the logits."
        )
    t = _Traced(
        root=model, graph=graph, input=placeholders[0], output=out_node, logits=logits
    )
    t.constants = {k: v for k, v in constants.items() if not _has_attr(model, k)}
    position = t.position = {n: i for i, n in enumerate(graph.nodes)}
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
    # modules registered under several names are recorded under the first one only
    first_name: dict[int, str] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        if not name:
            continue
        first = first_name.setdefault(id(m), name)
        if first != name and name not in tracer.module_outputs:
            why = t.rejected.get(first, "")
            t.rejected[name] = (
                f"it is the same module instance as {first!r} (registered twice)"
                + (f"; {why}" if why else "")
            )
    # the input of the classifier head (timm `head`, torchvision `heads`, `classifier`, `fc`)
    # (a wrapper that declares ``stitchlab_wraps = "net"``: the head of its ``net``, named
    # ``net.pre_logits``)
    wraps = getattr(model, "stitchlab_wraps", None)
    prefix = f"{wraps}." if wraps else ""
    for head in _HEAD_NAMES:
        head_in = tracer.module_inputs.get(prefix + head)
        if head_in and len(head_in) == 1 and head_in[0] and isinstance(head_in[0][0], fx.Proxy):
            feats = head_in[0][0].node
            named.append((position[feats], prefix + PRE_LOGITS, feats))
            break
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
        # distilled ViTs (DeiT) read two tokens: no single feature vector before the heads
        last = "norm" if getattr(model, "head_dist", None) is not None else PRE_LOGITS
        return [f"blocks.{i}" for i in range(0, depth, every)] + [last]
    return None


def _sequential_points(model: nn.Sequential) -> list[str]:
    return [name for name, _ in model.named_children()][:-1]  # not after the last child


_LAYER_TYPES = (*_FIRST_MODULES, nn.Linear, nn.LayerNorm)


def _block_names(model: nn.Module) -> set[str]:
    """Modules that are blocks: in a list of two or more siblings of their class, and
    more than a plain chain of layers (ResNet ``layer1.0``, Swin ``features.1.0``, MaxViT
    ``blocks.0.layers.1``; not a conv-norm-activation ``nn.Sequential``)."""
    blocks: set[str] = set()
    for parent_name, parent in model.named_modules():
        children = list(parent.named_children())
        counts: dict[type, int] = {}
        for _, c in children:
            counts[type(c)] = counts.get(type(c), 0) + 1
        for name, c in children:
            grandchildren = list(c.children())
            chain = isinstance(c, (nn.Sequential, nn.ModuleList)) and not any(
                any(True for _ in g.children()) for g in grandchildren
            )
            chain = chain or isinstance(c, _LAYER_TYPES)  # timm's BatchNormAct2d, ...
            if counts[type(c)] >= 2 and grandchildren and not chain:
                blocks.add(f"{parent_name}.{name}" if parent_name else name)
    return blocks


def _closest(name: str, valid: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.0)
    return close[0] if close else ""


def _unknown_point(name: str, valid: Sequence[str], why: str | None = None) -> SplitError:
    closest = _closest(name, valid) if not why else ""
    reason = f" It is not a cut point: {why}." if why else ""
    hint = f" Did you mean {closest!r}?" if closest else ""
    if not valid:
        return SplitError(
            f"Unknown stitch point {name!r}: the model has no stitch points. stitchlab cuts "
            "at the outputs of submodules (torch.fx traces their calls), and this model's "
            "forward calls none, or only its output layer (functional code such as F.conv2d "
            "with its own parameters has no names to cut at). Wrap the layers in nn.Module "
            "attributes (nn.Conv2d, nn.Sequential, ...)."
        )
    return SplitError(
        f"Unknown stitch point {name!r}.{reason}{hint} Valid points: {', '.join(valid)}"
    )


def _known_points(model: nn.Module) -> list[str] | None:
    """Points declared by the model (``stitchlab_points``) or the paper's, else None."""
    declared = getattr(model, "stitchlab_points", None)
    if declared is not None:  # a model may declare its points (the registry's contract)
        return list(declared)
    return _paper_points(model)


# ---------------------------------------------------------------------------
# In-place safety

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


def _resolve(model: nn.Module, target: str):
    obj = model
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _has_attr(model: nn.Module, target: str) -> bool:
    try:
        _resolve(model, target)
    except AttributeError:
        return False
    return True


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
    keep = _ancestors([node])
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


def _build_back(t: _Traced, node: fx.Node, taps: dict[str, fx.Node]) -> fx.GraphModule:
    roots = [t.logits, *taps.values()]
    keep = _ancestors(roots, stop=node)
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
    keep = _ancestors([t.logits, *nodes.values()])
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    tap_out = _copy_graph(t, keep, env, g, nodes)
    g.output((env[t.logits], tap_out))
    gm = _graph_module(t, g, "Tapped")
    gm.tap_names = list(nodes)
    return gm


def _build_logits(t: _Traced) -> fx.GraphModule:
    keep = _ancestors([t.logits])
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    _copy_graph(t, keep, env, g, {})
    g.output(env[t.logits])
    return _graph_module(t, g, "Logits")


# ---------------------------------------------------------------------------
# The traced model


def resolve_leaf_modules(names: Sequence[str]) -> tuple[type, ...]:
    """Module classes from dotted names (``"timm.layers.Mlp"``, ``"pkg.mod:Class"``), for
    configs and the command line. Importing the named module runs that library's code,
    as an ``import`` would; nothing is read from data files."""
    import importlib

    out = []
    for name in names:
        mod_name, _, cls_name = name.replace(":", ".").rpartition(".")
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValueError(
                f"leaf module {name!r} is not an importable class (write module.path.Class): "
                f"{exc}"
            ) from None
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise ValueError(f"leaf module {name!r} is not an nn.Module class")
        out.append(cls)
    return tuple(out)


def _as_leaf_types(leaf_modules) -> tuple[type, ...]:
    if isinstance(leaf_modules, type):
        leaf_modules = (leaf_modules,)
    if isinstance(leaf_modules, str):
        leaf_modules = (leaf_modules,)
    if any(isinstance(m, str) for m in leaf_modules or ()):
        leaf_modules = tuple(
            m for m in leaf_modules if not isinstance(m, str)
        ) + resolve_leaf_modules([m for m in leaf_modules if isinstance(m, str)])
    types = tuple(leaf_modules or ())
    bad = [m for m in types if not (isinstance(m, type) and issubclass(m, nn.Module))]
    if bad:
        raise TypeError(f"leaf_modules must be nn.Module classes, got {bad!r}")
    return types


class TracedModel:
    """A model traced once per train/eval mode, ready to be cut at any of its points.

    Build it once and cut it as often as needed (:meth:`split`, :meth:`tap`,
    :meth:`logits_model`, :meth:`formats`); the halves share the model's parameters.
    Tracing leaves the model unchanged.

    Args:
        model: any ``nn.Module`` whose forward takes one input.
        leaf_modules: module classes not to trace into (they become single graph nodes).
        output: which element of the forward's result is the logits (an index or a key;
            default: a tensor itself, a tuple's first element, a dict's ``"logits"``).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        leaf_modules: Sequence[type] | type = (),
        output: OutputSelector = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
        self.model = model
        self.leaf_modules = _as_leaf_types(leaf_modules)
        self.output = output
        self._by_mode: dict[bool, _Traced] = {}
        self.sequential = False
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
        sw.train(self.model.training)
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
            return _split_sequential(self.model, point, taps)  # type: ignore[arg-type]
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
            return _build_back(t, t.points[point], {n: t.points[n] for n in tap_names})

        return self._both(front), self._both(back)

    def tap(self, points: Sequence[str]) -> nn.Module:
        """The model returning ``(logits, {point: activation})`` in one pass from the input."""
        if self.sequential:
            unknown = [p for p in points if p not in self.all_points()]
            if unknown:
                raise _unknown_point(unknown[0], self.all_points())
            return _SequentialBack(list(self.model.named_children()), list(points))
        for p in points:
            self._check_point(p)
        return self._both(lambda t: _build_tapped(t, {p: t.points[p] for p in points}))

    def logits_model(self) -> nn.Module:
        """The whole model returning only its logits (the selected output)."""
        if self.sequential:
            return self.model
        return self._both(_build_logits)

    # -- formats ------------------------------------------------------------------
    @torch.no_grad()
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
        from .layers import ActivationSpec

        points = list(self.points() if points is None else points)
        layouts = dict(layouts or {})
        for p, lay in layouts.items():
            if lay not in LAYOUTS:
                raise SplitError(
                    f"layout of {p!r} must be one of {', '.join(LAYOUTS)}; got {lay!r}"
                )
        if prefix_tokens is None:
            n = getattr(self.model, "num_prefix_tokens", None)
            prefix_tokens = int(n) if isinstance(n, int) else None
        if self.sequential:
            values, axes = _sequential_axes(self.model, example, points)  # type: ignore[arg-type]
        else:
            for p in points:
                self._check_point(p)
            t = self._eval
            g, val_map = _graph_copy(t)
            with modes(self.model, training=False):
                gm = _graph_module(t, g, "Full")
                prop = LayoutProp(gm, t.root, example.shape[0])
                try:
                    prop.run(example)
                except Exception as exc:
                    raise SplitError(
                        f"{type(self.model).__name__} fails on an input of shape "
                        f"{tuple(example.shape)} ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0]}); give an input of the size it expects "
                        "(stitchlab layers --input-size)"
                    ) from exc
            values = {p: prop.values.get(val_map[t.points[p]]) for p in points}
            axes = {p: prop.axes.get(val_map[t.points[p]]) for p in points}
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


def _graph_code(t: _Traced) -> str:
    return str(t.graph)


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


# ---------------------------------------------------------------------------
# Functions over a model (each traces it once)


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


def split(
    model: nn.Module,
    point: str,
    *,
    taps: Sequence[str] | str | None = None,
    leaf_modules: Sequence[type] | type = (),
    output: OutputSelector = None,
) -> tuple[nn.Module, nn.Module]:
    """Cut ``model`` after ``point``: ``back(front(x))`` equals ``model(x)`` (the logits).

    Only the needed layers run in each half and both share the model's parameters (no
    copy). With ``taps`` (a list of later points, or ``"later"`` for every later stitch
    point) the back returns ``(logits, {point: activation})`` from the same pass.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"split expects an nn.Module, got {type(model).__name__}")
    return TracedModel(model, leaf_modules=leaf_modules, output=output).split(point, taps=taps)


def later_points(
    model: nn.Module,
    point: str,
    *,
    leaf_modules: Sequence[type] | type = (),
    output: OutputSelector = None,
) -> list[str]:
    """The stitch points of ``model`` that come after ``point`` (FuLA's default set)."""
    _, back = split(model, point, taps="later", leaf_modules=leaf_modules, output=output)
    return list(back.tap_names)


def tap_model(
    model: nn.Module,
    points: Sequence[str],
    *,
    leaf_modules: Sequence[type] | type = (),
    output: OutputSelector = None,
) -> nn.Module:
    """``model`` returning ``(logits, {point: activation})`` in one pass from the input."""
    return TracedModel(model, leaf_modules=leaf_modules, output=output).tap(points)


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
    tm = TracedModel(model, leaf_modules=leaf_modules, output=output)
    return tm.formats(example, points, layouts=layouts)
