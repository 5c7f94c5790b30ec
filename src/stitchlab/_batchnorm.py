"""Eval-mode BatchNorm folded into the convolution before it, for frozen networks that run
many times: IRI fronts, and the back suffix of the stitch training loop (1.12-1.30x faster
epochs, ``benchmarks/stitch_training.py --tables fold``; fitted models keep the unfolded
suffix, so their modules are the model's own).

An IRI front is frozen and in eval mode, so each of its BatchNorms is a fixed per-channel
affine map, ``(x - running_mean) / sqrt(running_var + eps) * weight + bias``. After a
convolution it can be folded into that convolution's weights and bias
(:func:`torch.nn.utils.fusion.fuse_conv_bn_eval`), which saves a pass over every activation
in the forward and in the backward pass: 1.17-1.55x faster IRI steps on this project's
CPUs (``benchmarks/iris.py --tables fold``), whole IRI sets of experiment A's trained
ResNet-18s 1.18-1.59x (docs/benchmarks.md). The network computes the same function; only
the rounding changes (relative differences of 1e-7 to 7e-7 on ResNet-18, VGG-16-BN and the
audio CNNs).

A pair is folded only where that is exact: a traced front (:class:`torch.fx.GraphModule`),
a ``nn.Conv1d/2d/3d`` node whose only user is a ``nn.BatchNorm1d/2d/3d`` node with running
statistics and as many features as the convolution has output channels, both in eval
mode, without hooks, neither called anywhere else in the graph nor read directly (as
``F.conv2d(x, self.conv.weight)`` would). Everything else (functional batch norm, a
convolution whose output is also used elsewhere, a BatchNorm without running statistics,
which normalises by the batch even in eval mode, a spectral-normalised convolution) is
left as it is. :func:`folded` works on a copy
and keeps it only when a trial on two samples agrees with the unfolded front to a relative
difference of :data:`AGREEMENT`.

``STITCHLAB_FOLD_BN`` chooses: unset, ``auto`` or ``1`` (fold), ``0`` (never, e.g. to
measure the difference).
"""

from __future__ import annotations

import copy
from collections import Counter
from contextlib import AbstractContextManager

import torch
import torch.fx as fx
from torch import Tensor, nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from ._env import AGREEMENT as AGREEMENT  # the trial tolerance (shared)
from ._env import env, outputs_agree, switch

ENV = "STITCHLAB_FOLD_BN"

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _wanted() -> bool:
    return switch(ENV) != "off"


def mode(value: str) -> AbstractContextManager[None]:
    """Set ``STITCHLAB_FOLD_BN`` for the duration of a block (benchmarks, tests)."""
    return env(ENV, value)


def _hooked(m: nn.Module) -> bool:
    """Whether ``m`` has hooks (spectral or weight norm, user hooks) that a folded copy
    would run on weights they were not written for."""
    return any(
        getattr(m, name, None)
        for name in ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks",
                     "_backward_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks")
    )  # fmt: skip


def _foldable_pairs(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """The (convolution node, BatchNorm node) pairs of ``gm`` that fold exactly."""
    calls = Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_module")
    # attributes read directly (e.g. F.conv2d(x, self.conv.weight)) would see folded weights
    read = [str(n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    pairs = []
    for node in gm.graph.nodes:
        if node.op != "call_module" or not isinstance(gm.get_submodule(str(node.target)), _NORMS):
            continue
        bn = gm.get_submodule(str(node.target))
        prev = node.args[0] if node.args else None
        if not isinstance(prev, fx.Node) or prev.op != "call_module" or len(node.args) != 1:
            continue
        conv = gm.get_submodule(str(prev.target))
        if (
            type(conv) in _CONVS
            and type(bn) in _NORMS
            and len(prev.users) == 1
            and calls[str(prev.target)] == 1
            and calls[str(node.target)] == 1
            and not any(r.startswith(f"{prev.target}.") or r.startswith(f"{node.target}.")
                        for r in read)
            and not _hooked(conv)
            and not _hooked(bn)
            and not conv.training
            and not bn.training
            and bn.track_running_stats
            and bn.running_mean is not None
            and bn.running_var is not None
            and bn.num_features == conv.out_channels
            and conv.weight.is_floating_point()
        ):
            pairs.append((prev, node))
    return pairs


def fold_batchnorm(gm: fx.GraphModule) -> int:
    """Fold, in place, every eval-mode BatchNorm of the traced ``gm`` that follows a
    convolution into it (see the module docstring for which pairs); returns how many."""
    pairs = _foldable_pairs(gm)
    for conv_node, bn_node in pairs:
        conv = gm.get_submodule(str(conv_node.target))
        bn = gm.get_submodule(str(bn_node.target))
        fused = fuse_conv_bn_eval(conv, bn)
        fused.requires_grad_(conv.weight.requires_grad)
        parent, _, name = str(conv_node.target).rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, name, fused)
        bn_node.replace_all_uses_with(conv_node)
        gm.graph.erase_node(bn_node)
    if pairs:
        gm.graph.lint()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return len(pairs)


def folded(front: nn.Module, x: Tensor) -> tuple[nn.Module, int]:
    """A copy of the eval-mode traced ``front`` (its eval graph, for a front traced in both
    modes) with its BatchNorms folded into their convolutions, and how many were folded.

    ``(front, 0)`` itself when ``STITCHLAB_FOLD_BN=0``, when nothing folds, or when the
    copy's output on the first two samples of ``x`` differs from ``front``'s by more than
    :data:`AGREEMENT` (relative)."""
    if not _wanted() or front.training:
        return front, 0
    # a front traced in both modes (stitchlab.split's mode switch) runs its eval graph
    graph = getattr(front, "eval_graph", front)
    if not isinstance(graph, fx.GraphModule) or not _foldable_pairs(graph):
        return front, 0
    trial = x[:2].detach()
    try:  # a front that does not copy or fold cleanly keeps its BatchNorms
        copy_ = copy.deepcopy(graph)
        count = fold_batchnorm(copy_)
        with torch.no_grad():
            reference, out = front(trial), copy_(trial)
    except Exception:
        return front, 0
    return (copy_, count) if outputs_agree(reference, out) else (front, 0)
