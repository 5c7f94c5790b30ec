"""The front an IRI optimisation runs: the frozen, traced prefix of the model up to the
point, its final ReLU straight through and its inner nonlinearities smooth where the
recipe says so, and whether it is affine (where the Polyak cap applies)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._batchnorm import _hooked
from ..splitting import split
from .smooth import _front_graphs, _smooth_saturating, _SmoothReLUs


class _StraightThroughReLU(torch.autograd.Function):
    """ReLU forward, identity backward."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # noqa: D102
        return x.clamp_min(0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # noqa: D102
        return grad


def straight_through_relu(x: Tensor) -> Tensor:
    """``relu(x)`` whose gradient is passed through unchanged."""
    return _StraightThroughReLU.apply(x)



def _is_relu(node, root: nn.Module) -> bool:
    if node.op == "call_module":
        return isinstance(root.get_submodule(str(node.target)), nn.ReLU)
    if node.op == "call_function":
        return node.target in (torch.relu, torch.relu_, F.relu)
    return node.op == "call_method" and node.target in ("relu", "relu_")


def _straight_through_output(front: nn.Module) -> bool:
    """Replace a ReLU that produces the front's output by :func:`straight_through_relu`;
    True when there was one."""
    import torch.fx as fx

    graphs = _front_graphs(front)
    if isinstance(front, nn.Sequential) and isinstance(front[-1], nn.ReLU):
        front[-1] = _STReLUModule()
        return True
    changed = False
    for gm in graphs:
        out = next(n for n in gm.graph.nodes if n.op == "output")
        node = out.args[0]
        if isinstance(node, fx.Node) and _is_relu(node, gm) and len(node.users) == 1:
            with gm.graph.inserting_after(node):
                new = gm.graph.call_function(straight_through_relu, (node.args[0],))
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
            gm.recompile()
            changed = True
    return changed


class _STReLUModule(nn.Module):
    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return straight_through_relu(x)



def _relu_is_inplace(node, root: nn.Module) -> bool:
    """Whether the ReLU ``node`` overwrites its input (``nn.ReLU(inplace=True)``,
    ``F.relu(x, inplace=True)``, ``relu_``)."""
    if node.op == "call_module":
        return bool(root.get_submodule(str(node.target)).inplace)
    if node.target in (torch.relu_, "relu_"):
        return True
    if node.target is F.relu:
        return bool(node.kwargs.get("inplace", node.args[1] if len(node.args) > 1 else False))
    return False


def _replace_relus(front: nn.Module, fn: Callable, *args, pass_inplace: bool = False) -> None:
    """Replace every ReLU of the traced ``front`` still in place (those before a
    straight-through final one) by ``fn(x, *args)``; with ``pass_inplace``, by
    ``fn(x, *args, inplace)`` where ``inplace`` says whether the model's ReLU overwrote
    its input (so that the replacement may too)."""
    graphs = _front_graphs(front)
    if not graphs:  # split() always returns traced fronts
        raise TypeError(f"replacing the ReLU gradient needs a traced front, got {type(front)}")
    for gm in graphs:
        for node in list(gm.graph.nodes):
            if _is_relu(node, gm):
                extra = (_relu_is_inplace(node, gm),) if pass_inplace else ()
                with gm.graph.inserting_after(node):
                    new = gm.graph.call_function(fn, (node.args[0], *args, *extra))
                node.replace_all_uses_with(new)
                gm.graph.erase_node(node)
        gm.recompile()



def _frozen_front(
    model: nn.Module,
    point: str,
    leaf_modules: tuple = (),
    output=None,
    relu_grad: str = "exact",
    relu_width: float = 0.3,
    relu_floor: float = 0.0,
) -> nn.Module:
    """A frozen eval-mode copy of ``model``'s traced prefix up to ``point``; under
    ``relu_grad="smooth"`` its final ReLU straight through and its inner ReLUs, saturating
    nonlinearities and max-pooling run by one :class:`~stitchlab.iris.smooth._SmoothReLUs`
    (widths ``relu_width``, least slope ``relu_floor``)."""
    front, _ = split(model, point, leaf_modules=leaf_modules, output=output)
    front = copy.deepcopy(front).eval()
    for p in front.parameters():
        p.requires_grad_(False)
    if relu_grad == "smooth":
        _straight_through_output(front)
        smooth = _SmoothReLUs(relu_width, relu_floor)
        _replace_relus(front, smooth.relu, pass_inplace=True)
        _smooth_saturating(front, smooth)
    return front


def _recipe_front(model: nn.Module, point: str, leaf_modules: tuple, output, rec) -> nn.Module:
    """:func:`_frozen_front` with the nonlinearities' gradient of the recipe ``rec``."""
    return _frozen_front(
        model, point, leaf_modules, output, rec.relu_grad, rec.relu_width, rec.relu_floor
    )


#: The version of :func:`affine_front`'s rule, in the keys of capped recipes
#: (:meth:`IRIRecipe.key_dict`): bump it when the rule changes, so that an experiment's
#: stitch runs (keyed by the unresolved recipe) are not reused for other IRIs.
AFFINE_RULE = 1

#: Modules that compute an affine map of their input (BatchNorm with running statistics
#: and dropout, in eval mode; :func:`affine_front`).
_AFFINE_MODULES = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
    nn.ConvTranspose3d, nn.Linear, nn.Identity, nn.Flatten, nn.Unflatten,
    nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d, nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d,
)  # fmt: skip
_EVAL_AFFINE_MODULES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.Dropout,
                        nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)  # fmt: skip
_AFFINE_METHODS = {"view", "reshape", "flatten", "permute", "transpose", "contiguous",
                   "size", "add", "sub", "unsqueeze", "squeeze"}  # fmt: skip


def _affine_module(module: nn.Module) -> bool:
    """Whether ``module`` (exactly one of the listed classes, no hooks) computes an affine
    map of its input."""
    if _hooked(module):
        return False  # a hook may change the output or its gradient
    if type(module) in _EVAL_AFFINE_MODULES:
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and (
            not module.track_running_stats or module.running_mean is None
        ):
            return False  # normalises by the batch even in eval mode
        return not module.training
    return type(module) in _AFFINE_MODULES


def affine_front(front: nn.Module) -> bool:
    """Whether ``front`` (a recipe's front: traced, its final ReLU straight through where
    the recipe says so) computes an affine map of its input up to that straight-through
    final ReLU, whose gradient is the identity's: every node a convolution, linear layer,
    eval-mode BatchNorm with running statistics or dropout, average pooling, padding
    (modules of exactly these classes, without hooks), a sum, difference,
    negation, concatenation or indexing of such, or a reshape. Conservative: any other
    operation (an inner ReLU, straight-through or not, a max pool, a product, an unknown
    module) makes it False. There the descent's linearisation is exact, so
    :meth:`IRIRecipe.caps_steps` caps its steps by default."""
    import operator

    import torch.fx as fx

    functions = (operator.add, operator.sub, operator.neg, operator.getitem, torch.add,
                 torch.sub, torch.flatten, torch.cat, getattr)  # fmt: skip
    if isinstance(front, nn.Sequential) and not isinstance(front, fx.GraphModule):
        mods = list(front)
        last_st = bool(mods) and type(mods[-1]) is _STReLUModule
        return all(_affine_module(m) for m in (mods[:-1] if last_st else mods))
    graphs = _front_graphs(front)
    if not graphs:
        return False
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "output", "get_attr"):
                continue
            final = [u.op for u in node.users] == ["output"]  # the front's output alone
            if node.op == "call_module":
                module = gm.get_submodule(str(node.target))
                ok = _affine_module(module) or (final and type(module) is _STReLUModule)
            elif node.op == "call_function":
                ok = any(node.target is f for f in functions) or (
                    final and node.target is straight_through_relu
                )
            else:
                ok = node.op == "call_method" and node.target in _AFFINE_METHODS
            if not ok:
                return False
    return True


