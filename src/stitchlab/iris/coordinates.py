"""Adam's coordinates: where its second moment is kept and its steps are taken.

A coordinate system has ``analysis`` (a gradient in inputs to coordinates), ``synthesis``
(a step in coordinates back to inputs), ``add_power_``, ``scale_`` and ``zeros_like``; the
first moment stays in the inputs, where the box is. Two exist: the first convolution's
whitening of images (``precondition="first_layer"``) and short-time Fourier coordinates of
waveforms (``stft_window``).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.fusion import fuse_conv_bn_weights


class _CoordinateFields(Protocol):
    """The fields of :class:`stitchlab.iris.IRIRecipe` that choose the coordinates."""

    stft_window: int
    precondition: str


class _TimeFrequency:
    """Adam's coordinates for ``stft_window``: each channel's short-time Fourier transform
    with a sqrt-Hann window of ``n`` samples and hop ``n / 2`` (frames centred on every
    hop, the signal zero-padded to whole frames) and orthonormal DFTs. The squared windows
    then sum to 1 at every sample, so :meth:`synthesis` (overlap-add of the windowed
    inverse DFTs) inverts :meth:`analysis` exactly, and a step scaled per coefficient by a
    scale shared by each frequency's two signs is a symmetric preconditioner in samples.
    (``torch.stft`` / ``torch.istft`` give the same frames; ``istft`` was several times
    slower per step in a scratch timing, as it rebuilds and checks the window envelope on
    every call, which here is 1 everywhere by construction.)"""

    def __init__(self, n: int, length: int, device: torch.device) -> None:
        self.n, self.hop, self.length = n, n // 2, length
        self.frames = -(-length // self.hop) + 1  # ceil(length / hop) + 1
        self.window = torch.hann_window(n, periodic=True, device=device).sqrt_()

    @classmethod
    def of(cls, recipe: _CoordinateFields, x: Tensor) -> _TimeFrequency | None:
        """The transform of ``recipe.stft_window`` for inputs like ``x`` (None when off); a
        ValueError for inputs that are not ``(N, C, T)`` with ``T`` at least the window."""
        n = recipe.stft_window
        if not n:
            return None
        if x.dim() != 3 or x.shape[-1] < n:
            raise ValueError(
                f"stft_window={n} needs 1-D signals (N, C, T) with T >= {n}, got inputs of "
                f"shape {tuple(x.shape)}; use stft_window=0 for other inputs"
            )
        return cls(n, x.shape[-1], x.device)

    def analysis(self, t: Tensor) -> Tensor:
        """``(N, C, T)`` -> complex ``(N, C, frames, n / 2 + 1)``."""
        pad = (self.frames + 1) * self.hop - self.length - self.hop
        frames = F.pad(t.float(), (self.hop, pad)).unfold(-1, self.n, self.hop)
        return torch.fft.rfft(frames * self.window, norm="ortho")

    def synthesis(self, z: Tensor) -> Tensor:
        """Complex ``(N, C, frames, n / 2 + 1)`` -> ``(N, C, T)``."""
        frames = torch.fft.irfft(z, n=self.n, norm="ortho").mul_(self.window)
        h = self.hop
        out = frames.new_zeros(*frames.shape[:-2], self.frames + 1, h)
        out[..., :-1, :] += frames[..., :h]
        out[..., 1:, :] += frames[..., h:]
        return out.flatten(-2)[..., h : h + self.length]

    @staticmethod
    def power(z: Tensor) -> Tensor:
        """``|z|^2`` of complex coefficients (real)."""
        return z.real.square().add_(z.imag.square())

    @classmethod
    def add_power_(cls, v: Tensor, z: Tensor, weight: float) -> None:
        """``v += weight |z|^2``: one second moment per complex coefficient."""
        v.add_(cls.power(z), alpha=weight)

    @staticmethod
    def scale_(z: Tensor, s: Tensor) -> Tensor:
        """``z / s`` in place, ``s`` real of ``z``'s shape."""
        return z.mul_(s.reciprocal())

    def zeros_like(self, t: Tensor) -> Tensor:
        """Real zeros of the shape of ``t``'s coefficients (Adam's second moment)."""
        return t.new_zeros(*t.shape[:-1], self.frames, self.n // 2 + 1, dtype=torch.float32)


#: ``precondition="first_layer"``: the damping added to the first layer's Gram operator, as
#: a fraction of its median eigenvalue, so no direction's step grows more than
#: ``FIRST_LAYER_DAMPING ** -0.5`` (3.2x) over a median one's. On experiment A's fronts 0.01
#: to 0.3 give the same errors within a 32-image median's spread; 0.01 diverges on a first
#: layer with a 50x weaker colour direction (tests/test_iris_precondition.py), 0.1 does not.
FIRST_LAYER_DAMPING = 0.1


def input_convolution(front: nn.Module) -> Tensor | None:
    """The weight ``(out, in, kh, kw)`` of the 2-D convolution that ``front``'s input goes
    straight into, times the per-channel scale of an eval-mode BatchNorm that is that
    convolution's only user (folded or not, the same linear map up to a bias); None unless
    ``front`` is a traced graph whose one input's only user is an ``nn.Conv2d`` of stride 1,
    dilation 1 and one group."""
    import torch.fx as fx

    graph = getattr(front, "eval_graph", front)
    if not isinstance(graph, fx.GraphModule):
        return None
    inputs = [n for n in graph.graph.nodes if n.op == "placeholder"]
    if len(inputs) != 1 or len(inputs[0].users) != 1:
        return None
    (node,) = inputs[0].users
    if node.op != "call_module" or len(node.args) != 1:
        return None
    conv = graph.get_submodule(str(node.target))
    if (
        type(conv) is not nn.Conv2d
        or conv.groups != 1
        or tuple(conv.stride) != (1, 1)
        or tuple(conv.dilation) != (1, 1)
    ):
        return None
    weight = conv.weight.detach().float()
    if len(node.users) == 1:
        (after,) = node.users
        bn = graph.get_submodule(str(after.target)) if after.op == "call_module" else None
        if (
            isinstance(bn, nn.BatchNorm2d)
            and not bn.training
            and bn.running_var is not None
            and bn.num_features == weight.shape[0]
        ):
            # torch's folding, as stitchlab._batchnorm folds (the bias does not matter here)
            weight, _ = fuse_conv_bn_weights(
                weight, None, bn.running_mean.float(), bn.running_var.float(), bn.eps,
                None if bn.weight is None else bn.weight.detach().float(),
                None if bn.bias is None else bn.bias.detach().float(),
            )  # fmt: skip
            weight = weight.detach()
    return weight


class _FirstLayer:
    """Adam's coordinates for ``precondition="first_layer"``: ``x = S z`` with ``S = (A +
    lam)^(-1/2)``, ``A`` the Gram operator ``W^T W`` of the front's first convolution
    ``W`` (:func:`input_convolution`) on periodic images, which is one ``C x C``
    Hermitian block per 2-D frequency, ``lam`` :data:`FIRST_LAYER_DAMPING` x its median
    eigenvalue, and ``S`` scaled so that its median eigenvalue is 1 (steps keep their size
    in box units). Adam's step in z mapped back is ``S D S m``: the Gauss-Newton step of
    the first layer, each coordinate of z scaled by Adam. ``S`` is symmetric, so it maps
    gradients to z and steps back to x (:meth:`analysis` = :meth:`synthesis`)."""

    def __init__(self, blocks: Tensor, size: tuple[int, int]) -> None:
        # (C_out, C_in, H, W // 2 + 1) complex: each frequency's block, applied by one
        # scaled column per input channel over the batch (10x faster on the CPU than a
        # batched matmul or einsum of 3x3 blocks)
        self.blocks, self.size = blocks.permute(2, 3, 0, 1).contiguous(), size

    @staticmethod
    def _weight(front: nn.Module | None, x: Tensor) -> Tensor | None:
        if front is None or x.dim() != 4:
            return None
        weight = input_convolution(front)
        if weight is None or weight.shape[1] != x.shape[1]:
            return None
        if weight.shape[-2] > x.shape[-2] or weight.shape[-1] > x.shape[-1]:
            return None
        return weight

    @classmethod
    def applies(cls, front: nn.Module, x: Tensor) -> bool:
        """Whether ``front`` has a first layer to whiten for inputs like ``x``."""
        return cls._weight(front, x) is not None

    @classmethod
    def of(
        cls, recipe: _CoordinateFields, x: Tensor, front: nn.Module | None
    ) -> _FirstLayer | None:
        """The preconditioner of ``front`` for inputs like ``x``; None when the recipe
        has none (``"auto"`` counts as ``"first_layer"``), the inputs are not ``(N, C, H,
        W)`` or the front does not start with a convolution :func:`input_convolution`
        accepts (Adam then runs in the inputs' own coordinates)."""
        weight = cls._weight(front, x) if recipe.precondition != "none" else None
        if weight is None:
            return None
        h, w = x.shape[-2:]
        kh, kw = weight.shape[-2:]
        padded = weight.new_zeros(*weight.shape[:2], h, w)
        padded[..., :kh, :kw] = weight
        # cross-correlation: frequency k maps the input's coefficients by conj(W_hat(k));
        # every frequency's block, so that the medians are the operator's own
        m = torch.fft.fft2(padded).conj().permute(2, 3, 0, 1)  # (H, W, out, in)
        e, u = torch.linalg.eigh(m.mH @ m)
        d = (e + FIRST_LAYER_DAMPING * e.median()).clamp_min(1e-12).rsqrt()
        d = d / d.median()
        blocks = (u * d.unsqueeze(-2).to(u.dtype)) @ u.mH
        return cls(blocks[:, : w // 2 + 1].to(x.device), (h, w))  # the rfft2 half

    def analysis(self, t: Tensor) -> Tensor:
        """``S t`` (real, of ``t``'s shape, contiguous whatever ``t``'s layout)."""
        # the FFT of a contiguous copy, and one product per input channel accumulated in
        # place: 10-15% faster than the blocks' broadcast product summed over the input
        # channels (benchmarks/iris.py --tables whiten), and the same numbers to the bit
        # for one input channel and for 3 x 32 x 32 inputs; at some other sizes the sum's
        # rounding order differs by an ulp or two
        coeffs = torch.fft.rfft2(t.float().contiguous(), norm="ortho")  # (N, C, H, W//2+1)
        mixed = self.blocks[:, 0] * coeffs[:, :1]
        for i in range(1, self.blocks.shape[1]):
            mixed.addcmul_(self.blocks[:, i], coeffs[:, i : i + 1])
        return torch.fft.irfft2(mixed, s=self.size, norm="ortho").to(t.dtype)

    synthesis = analysis

    @staticmethod
    def add_power_(v: Tensor, z: Tensor, weight: float) -> None:
        """``v += weight z^2``: Adam's second moment of the coordinates ``z``."""
        v.addcmul_(z, z, value=weight)

    @staticmethod
    def scale_(z: Tensor, s: Tensor) -> Tensor:
        """``z / s`` in place."""
        return z.div_(s)

    @staticmethod
    def zeros_like(t: Tensor) -> Tensor:
        """Contiguous zeros of ``t``'s shape: the second moment in the layout of
        :meth:`analysis`'s output (elementwise operations on mixed layouts, channels-last
        against contiguous, take a slow path on the CPU)."""
        return torch.zeros(t.shape, dtype=t.dtype, device=t.device)


def _adam_coordinates(
    recipe: _CoordinateFields, x: Tensor, front: nn.Module | None = None
) -> _TimeFrequency | _FirstLayer | None:
    """The coordinates in which Adam keeps its second moment and takes its steps for
    inputs like ``x`` (``stft_window`` or ``precondition``); None: the inputs' own."""
    coords = _TimeFrequency.of(recipe, x)
    return coords if coords is not None else _FirstLayer.of(recipe, x, front)
