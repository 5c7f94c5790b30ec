"""Memory layout of convolutional work: channels_last where it is faster and computes the
same numbers.

On this project's CPUs a 2-d convolutional front runs its forward and backward pass
1.1-1.6x faster with activations stored channels-last (NHWC) than contiguous (NCHW)
(``benchmarks/iris.py --tables memory``). This is the memory layout of tensors, not the
activation layouts (channels, tokens) of :mod:`stitchlab.layouts`. It changes only the
order of floating point sums, so results agree to rounding; a model whose code depends on
it (a ``.view`` of an activation, which needs NCHW order) cannot run channels-last, is
detected by a trial on two samples and left contiguous.

``STITCHLAB_CHANNELS_LAST`` chooses: unset or ``auto`` (channels-last on the CPU only, the
measured case), ``1`` (on every device, e.g. to measure it on a GPU) or ``0`` (never).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
from torch import Tensor, nn

from ._env import AGREEMENT as AGREEMENT  # the trial tolerance (shared)
from ._env import env, outputs_agree, switch

ENV = "STITCHLAB_CHANNELS_LAST"


def _wanted(device: torch.device) -> bool:
    mode = switch(ENV)
    return mode == "on" or (mode == "auto" and device.type == "cpu")


def channels_last(module: nn.Module, x: Tensor) -> bool:
    """Put ``module`` (in place) in channels-last layout if it should run ``x``-like
    inputs that way, and say whether it did.

    Chosen for a 4-d floating point input to a module holding a 2-d convolution, on the
    CPU unless ``STITCHLAB_CHANNELS_LAST`` says otherwise (see the module's docstring),
    and only when a trial on the first two samples of ``x`` runs in that layout and gives
    outputs within a relative difference of :data:`AGREEMENT` of the contiguous layout's.
    Inputs must then be passed as ``x.contiguous(memory_format=torch.channels_last)``.
    """
    if x.dim() != 4 or not x.is_floating_point() or not _wanted(x.device):
        return False
    if not any(isinstance(m, nn.Conv2d) for m in module.modules()):
        return False
    trial = x[:2].detach()
    with torch.no_grad():
        reference = module(trial)
        if not isinstance(reference, Tensor):
            return False
        _convert(module, torch.channels_last)
        try:
            out = module(trial.contiguous(memory_format=torch.channels_last))
        except RuntimeError:  # layout-dependent code, e.g. .view of an activation
            out = None
        ok = outputs_agree(reference, out)
    if not ok:
        _convert(module, torch.contiguous_format)
    return ok


def memory_format_for(module: nn.Module, x: Tensor) -> torch.memory_format:
    """:func:`channels_last` as the memory format to give ``module``'s inputs in."""
    return torch.channels_last if channels_last(module, x) else torch.contiguous_format


def _convert(module: nn.Module, memory_format: torch.memory_format) -> None:
    """Put the 4-d parameters and buffers of ``module`` in ``memory_format`` in place
    (``Module.to`` would also try 5-d ones, which channels-last cannot hold)."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            if t.dim() == 4:
                t.data = t.data.contiguous(memory_format=memory_format)


def mode(value: str) -> AbstractContextManager[None]:
    """Run the block with ``STITCHLAB_CHANNELS_LAST=value`` (``"auto"``, ``"1"`` or
    ``"0"``), restoring the variable afterwards (benchmarks compare the two formats)."""
    return env(ENV, value)
