"""Tracing a model with torch.fx without side effects: the graph, the node each module
call returned, the points that are exact cuts (and why the others are not), and the leaf
modules the tracer does not enter."""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch.fx as fx
from torch import nn

from ._inplace import _aliases_input, _cut_problem, _mutated_input
from ._outputs import OutputSelector, SplitError, _select_output
from ._points import PRE_LOGITS


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


def _graph_code(t: _Traced) -> str:
    return str(t.graph)
