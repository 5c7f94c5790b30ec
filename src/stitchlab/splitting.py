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
    bases: dict[fx.Node, fx.Node] = field(default_factory=dict)  # node -> memory it may share
    mutations: list[tuple[fx.Node, fx.Node]] = field(default_factory=list)  # (op, modified)
    head: str | None = None  # the module whose input is the pre_logits point


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
        if output is None and hasattr(out, "_fields") and "logits" in out._fields:
            return out.logits  # torchvision's GoogLeNet/Inception outputs in train mode
        if output is None and len(out) == 1:
            output = 0
        if output is None:
            raise SplitError(
                f"{model_name}.forward returns a {type(out).__name__} of {len(out)} elements; "
                "stitchlab does not guess which one is the logits (a (features, logits) "
                "pair would be scored on its features): pass output=<index> (for a model "
                "given as a reference, wrap it: stitchlab.splitting.LogitsOnly(model, "
                "output=<index>))."
            )
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

    ``output`` names the element (an index or a key); by default the ``"logits"`` entry of
    a dict, Hugging Face output or named tuple, and the only element of a 1-tuple; a tuple
    of several elements without ``output`` is an error (it is not guessed).
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
    for n in graph.nodes:  # which memory each value may share, and what each op modifies
        first = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        shared = first is not None and _aliases_input(n, model)
        t.bases[n] = t.bases.get(first, first) if shared else n  # type: ignore[assignment]
        target = _mutated_input(n, model)
        if target is not None:
            t.mutations.append((n, target))
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
            t.head = prefix + head
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


def _build_back(t: _Traced, node: fx.Node, taps: dict[str, fx.Node]) -> fx.GraphModule:
    roots = [t.logits, *taps.values()]
    keep = _back_keep(t, node, roots)
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
            return _build_back(t, t.points[point], {n: t.points[n] for n in tap_names})

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
        if not isinstance(example, Tensor):
            raise TypeError(f"example must be a batch tensor, got {type(example).__name__}")
        name = type(self.model).__name__
        refs: dict[bool, tuple[Tensor, dict[str, Tensor]]] = {}
        for training in self._modes_checked():
            try:
                refs[training] = self._reference(example, training)
            except SplitError:
                raise
            except Exception as exc:
                raise _ModelFailed(f"{type(exc).__name__}: {_first_line(exc)}") from exc
        for training, (logits, values) in refs.items():
            if self.sequential:
                continue
            t = self._by_mode[training]
            names = list(t.points)
            tapped = _build_tapped(t, {p: t.points[p] for p in names})
            with _checking(self.model, training, example, tapped):
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
                    for tr in self._by_mode.values():
                        tr.points.pop(p, None)
                        tr.order = [q for q in tr.order if q != p]
                        tr.rejected[p] = (
                            f"the traced value there differs from what its module returns "
                            f"in the model ({why}, {_mode(training)} mode)"
                        )
        self._refs = refs
        self._example = example

    def _reference(self, x: Tensor, training: bool) -> tuple[Tensor, dict[str, Tensor]]:
        """The model's own logits on ``x`` and the value each point's module returns."""
        values: dict[str, Tensor] = {}
        head = None if self.sequential else self._by_mode[training].head

        def keep(name: str, value) -> None:
            if name not in values:  # a non-tensor (a tuple) is kept to name it in the refusal
                values[name] = value.detach().clone() if isinstance(value, Tensor) else value

        handles = []
        try:
            for p in self._point_names(training):
                if not self.sequential and p.endswith(PRE_LOGITS) and head is not None:
                    m = self.model.get_submodule(head)
                    handles.append(m.register_forward_pre_hook(
                        lambda _m, args, p=p: keep(p, args[0] if args else None)))  # fmt: skip
                else:
                    m = self.model.get_submodule(p)
                    handles.append(m.register_forward_hook(
                        lambda _m, _i, out, p=p: keep(p, out)))  # fmt: skip
            with _checking(self.model, training, x):
                out = self.model(x)
        finally:
            for h in handles:
                h.remove()
        logits = select_logits(out, self.output, type(self.model).__name__)
        return logits.detach().clone(), values

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
        handle = None
        done = [False]  # shared by copies of the half (deepcopy keeps the hook function)

        def hook(_module, args):
            if done[0]:
                return
            done[0] = True
            handle.remove()
            if not args or not isinstance(args[0], Tensor):
                return
            if not self._refs:
                try:
                    self.verify(args[0])
                except _ModelFailed:
                    return  # the call itself raises the model's own error
            self._check_halves(point, front, back, tap_names, True)

        handle = first.register_forward_pre_hook(hook)

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
        if not force and not self._ensure_verified():
            return
        x = self._example
        name = type(self.model).__name__
        for training, (logits, values) in self._refs.items():
            mods = [m for m in (front, back) if m is not None]
            with _checking(self.model, training, x, *mods):
                act = front(x) if front is not None else x
                out = back(act)
            where = f"{_mode(training)} mode"
            if front is not None and isinstance(values.get(point), Tensor):
                diff = _difference(act, values[point])
                if diff is not None:
                    raise SplitError(
                        f"Cutting {name} at {point!r} is not exact: the front's activation "
                        f"differs from what {point!r} returns in the model ({diff}, {where})."
                        + self._missing(point, training, front=True)
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
                    + (self._missing(point, training) if point is not None else "")
                )
            for p in tap_names:
                diff = _difference(acts.get(p), values.get(p))
                if diff is not None:
                    raise SplitError(
                        f"Cutting {name}: the tap at {p!r} differs from what {p!r} returns "
                        f"in the model ({diff}, {where})."
                        + (self._missing(point, training) if point is not None else "")
                    )

    def _missing(self, point: str, training: bool, front: bool = False) -> str:
        """The operations of the graph on the far side of ``point`` that a half leaves out."""
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
        from .layers import ActivationSpec

        if self.verifies and not self._refs:
            try:
                self.verify(example)
            except _ModelFailed:
                pass  # the pass below says why the model cannot run on it
        points = list(self.points() if points is None else points)
        layouts = dict(layouts or {})
        known = self.layout_names()
        for p, lay in layouts.items():
            if p not in known:
                hint = _closest(str(p), sorted(known))
                raise SplitError(
                    f"layouts names {p!r}, which is no point of {type(self.model).__name__}"
                    + (f" (did you mean {hint!r}?)" if hint else "")
                    + "; name the points whose layout you give (stitchlab layers lists them)."
                )
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
            unknown = {
                p: val_map[t.points[p]] for p in points
                if isinstance(values[p], Tensor) and not _followed(axes[p])
            }  # fmt: skip
            if unknown:  # where the graph cannot be followed: probe
                with modes(self.model, training=False):
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
    from .models import default_input_size

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
