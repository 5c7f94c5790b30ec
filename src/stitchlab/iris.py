"""Identically represented inputs (IRIs): inputs that a front represents like real ones.

For a source input x and a stitch point i, an IRI is
``x' = argmin ||f_{<=i}(x') - f_{<=i}(x)||_F / ||f_{<=i}(x)||_F`` over valid inputs (the
box), found by projected gradient steps that run only the front prefix (PROTOCOL section 3).
Inputs are images ``(N, C, H, W)`` or of any other rank with a batch axis, e.g. waveforms
``(N, C, T)``: for audio use ``preset="audio"`` (box (-1, 1), a quiet Gaussian start, Adam in
short-time Fourier coordinates and int16 storage; uint8 levels are far too coarse for a
waveform).

* :func:`generate_iris` optimises a batch of images in memory.
* :func:`generate_iris_set` streams a whole data set in chunks into a cache keyed by what
  determines the result (front weights, point, source data, recipe); it resumes after an
  interruption and checks every chunk on load.
* :class:`IRISet` is the stored result: a Dataset of ``(iri, source label)`` with the
  per-sample quality (relative error after quantisation to the recipe's storage
  ``precision``, uint8 by default; pixel distance).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import math
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.fusion import fuse_conv_bn_weights
from torch.utils.data import Dataset

from ._batchnorm import _hooked, folded
from ._data import DataLike, _module_device, as_dataset, batches, check_images, check_options
from ._memory_format import memory_format_for
from .splitting import split
from .store import DamagedEntry, atomic_write, file_sha256, lock, read_json, write_json

__all__ = [
    "IRIRecipe",
    "IRIResult",
    "IRIQuality",
    "IRISet",
    "IRIError",
    "THRESHOLD",
    "MIN_NULL_RATIO",
    "generate_iris",
    "generate_iris_set",
    "iris_set_stored",
    "quantise",
    "dequantise",
]

FORMAT_VERSION = 3  # 3: the smooth gradient of saturating nonlinearities and max-pooling


#: IRIs must be at least this many times closer (median relative error at the point) to
#: their sources' representations than another real image is, or the set is flagged.
MIN_NULL_RATIO = 10.0

#: An IRI set whose median relative error is above this is flagged (PROTOCOL section 3).
THRESHOLD = 0.5

#: Under ``exact_relu_mismatch``, every this many smooth steps the inner ReLUs' states are
#: compared with the sources' (one comparison per inner ReLU in that step's forward).
MISMATCH_EVERY = 10


class IRIError(RuntimeError):
    """An IRI set cannot be used (damaged, mismatched or of poor quality)."""


@dataclass(frozen=True)
class IRIRecipe:
    """How IRIs are optimised.

    The defaults are stitchlab's recipe, chosen on the IRI zoo (docs/iri_zoo.md; the
    convergence study of docs/validation/iri_convergence.md before it): 270 Adam steps
    whose size decays geometrically
    from 0.1 to 0.01 (box units), in bfloat16 where the hardware has bf16 matrix units
    (``amp="fast"``) but the last 30 (``float32_steps``), second-moment decay
    ``adam_beta2`` 0.95, in coordinates whitened by the front's first convolution
    (``precondition="first_layer"``), the momentum
    that pushes a pixel out of the box dropped (``drop_outward_momentum``), from uniform
    noise over the box, the gradient passed straight through a ReLU that ends the front
    and smoothly through its inner ReLUs, its saturating nonlinearities (ReLU6, Hardtanh,
    Hardsigmoid, Hardswish modules) and its max-pooling of non-overlapping windows
    (``relu_grad="smooth"``) but in the last 90 steps
    (``exact_relu_steps``), where they take their exact gradient (and in all
    steps after a check at which each inner ReLU's on/off states agree with the source's
    at all but 10% of its units, ``exact_relu_mismatch``), and a sample
    stops once its relative error is below ``tolerance`` (0.01), keeping the iterate that
    met it (``keep_converged``); on a front that is affine up to its final ReLU (a stem's
    convolution, BatchNorm and ReLU) each sample's step is at most 0.3 of its Polyak step
    (``polyak``). :meth:`paper` is PROTOCOL section 3
    exactly (200 signed steps of 1/255, no early stop), also reachable as
    ``preset="paper"`` wherever recipe options are given. ``preset="v1"`` to ``"v7"``
    are stitchlab's earlier defaults, each the current default less the changes made after
    it (docs/recipes.md lists them); pages measured with one name it. The smooth gradient
    of saturating nonlinearities and max-pooling is in every ``relu_grad="smooth"``
    recipe (store format 3).

    ``polyak`` caps each sample's step at that fraction of its Polyak step ``err /
    <grad, step>``: the size at which the error's linearisation along the step reaches 0,
    the error's known least value (the source itself is an exact IRI). The cap applies on
    fronts that are affine up to a straight-through final ReLU (:func:`affine_front`;
    ``polyak_fronts="affine"``, resolved by :meth:`for_front`) or on every front
    (``"all"``); L-BFGS, which accepts its own steps, ignores it. The relative error is a
    norm, so Adam's step keeps about the step size's length up to the solution, and at a
    point where the IRI is the image (experiment A's relu) samples circle the image until
    the schedule has shrunk the step to about twice the tolerance. There the linearisation
    is exact, and the cap takes samples to the tolerance sooner: 0.56-0.75x the paper
    recipe's time at A's relu, against 0.98-1.69x uncapped. Past an inner ReLU it is not
    exact, and capping there raised the error 11-17% at layer1.1 and 20-26% at layer4.1
    (docs/validation/iri_convergence.md, "The Polyak cap on affine fronts").

    ``amp`` is the arithmetic of the steps: ``"fast"`` (the default) runs them under
    bfloat16 autocast where :func:`bf16_is_fast` (CUDA, a CPU with AMX tiles, where a
    ResNet-18 front's step takes about half the float32 time) and in float32 elsewhere,
    resolved when IRIs are made, so a stored set's key names ``"bf16"`` or ``"off"``;
    ``"auto"`` (what every recipe did before ``"fast"``) is bfloat16 on CUDA only. The last
    ``float32_steps`` steps of a batch run in float32 whatever ``amp`` says: bfloat16
    gradients stall about 20% above float32 ones at experiment A's layer2.1, and 30
    float32 steps at the end close that gap (docs/validation/iri_convergence.md,
    "bfloat16 steps where they are fast"). ``float32_below`` (0.02) ends the bfloat16
    steps of a batch earlier, once its median error is below it: a bfloat16 forward
    cannot measure errors much below about 0.01 (its rounding), so without it samples
    reach the tolerance only in the float32 tail (the relu point took twice the paper
    recipe's time). The targets, the measured errors and the stored IRIs are float32
    always. ``"fast"`` is for Adam in pixels or whitened coordinates; other optimizers and
    coordinates keep ``"auto"`` (L-BFGS runs neither ``float32_below`` nor ``"fast"``).

    ``precondition="first_layer"`` runs Adam in coordinates ``z`` with ``x = S z``, ``S =
    (W^T W + lam)^(-1/2)`` for the front's first convolution ``W`` (with the scale of an
    eval-mode BatchNorm after it): a weak direction of the first layer gets a larger step,
    a strong one a smaller, so Adam's step is the first layer's Gauss-Newton step scaled
    per coordinate. ``W^T W`` is taken on periodic images, where it is one ``C x C`` block
    per 2-D frequency (zero padding differs at the border only; a preconditioner needs no
    exactness, the error reported is the exact one). On experiment A's ResNet-18 fronts
    it lowers the median error 20-32% from layer2.1 on and up to 77% at a shortcut front's
    layer1.1, at 1.04-1.12x the time of Adam in pixels (docs/validation/iri_convergence.md,
    "Adam whitened by the first layer"). It applies where the input goes straight into an
    ``nn.Conv2d`` of stride 1 and one group (:func:`input_convolution`); asked of another
    front (a strided stem, a patch embedding, a normalisation first, 1-D inputs) it is an
    error. The default, ``"auto"``, is ``"none"`` for other optimizers, ``colour_basis`` or
    ``stft_window`` (resolved when the recipe is made) and, for Adam in pixels, resolved
    against the front when IRIs are made: ``"first_layer"`` where it applies, ``"none"``
    elsewhere. So a stored set's key, and the recipe its report names, say what ran (a
    ViT's sets under the default are those of ``preset="v3"``, bit for bit).

    ``relu_grad="straight_through"`` backpropagates through a ReLU that ends the front
    (a post-activation point) as if it were the identity, as model-metamer work does: a
    unit that is dead in the IRI but alive in the source still gets a gradient. The
    forward pass, and so every reported error, is the exact ReLU.
    ``relu_grad="surrogate"`` does the same at the final ReLU and, at every earlier ReLU of
    the prefix, backpropagates a slope of ``relu_slope`` where the unit is off (a leaky
    ReLU's derivative; 0 is the exact gradient, 1 the identity, which diverges: the
    linearised net is a poor guide), so that units dead inside the prefix still pass some
    gradient. ``relu_grad="smooth"`` instead backpropagates ``max(relu_floor,
    sigmoid(z / w))`` at an inner ReLU with pre-activation ``z``, ``w`` = ``relu_width``
    x the standard deviation of the *source's* pre-activation over the map (per sample
    and channel): a unit just below zero passes about half the gradient, one far below
    ``relu_floor`` of it, one well above all of it. A saturating nonlinearity (a clamp to
    ``[lo, hi]``: ReLU6, Hardtanh; Hardsigmoid and Hardswish, kinked at -3 and 3) takes
    the derivative of its softplus-smoothed version over the same ``w``, at least
    ``relu_floor``, and a max-pooling of non-overlapping windows spreads each window's
    gradient over its inputs by a softmax of ``(x - max) / w``
    (:class:`_SmoothSaturatingFn`, :class:`_SoftMaxPoolFn`). Only the descent direction changes;
    the forward pass stays exact. The smooth gradient is not the gradient of the error, so
    it leaves a floor under the error that it cannot descend below: the last
    ``exact_relu_steps`` steps of a batch take the exact gradient of the inner ReLUs (the
    final one stays straight through), which lowers the median error 2-23% from layer2.1
    on at experiment A's fronts (L-BFGS takes it too; not measured there), and costs less
    than a smooth step (no sigmoid derivative to keep; docs/validation/iri_convergence.md,
    "The exact inner-ReLU gradient in the last steps").
    ``exact_relu_mismatch`` (0.1) ends the smooth steps earlier where they have done
    their work: every :data:`MISMATCH_EVERY` smooth steps, each inner ReLU's on/off states
    in the step are compared with the sources' (recorded with the targets), and once at
    most this fraction of every inner ReLU's units differ, all later steps take the exact
    gradient. The mismatch is over the units of all samples still running, so single
    samples can be above it; the sources' states are float32's, a bfloat16 step's may
    differ by rounding near 0 (the threshold was measured with bfloat16 steps). The smooth
    gradient is there to move units that are off in the IRI but on in the source (or the
    reverse); where the states agree, the IRI is near the source's linear region, where
    the exact gradient is the error's own. On experiment A's ResNet-18 fronts the worst
    inner ReLU's mismatch falls to 2-6% by step 60 at layer1.1, and stays above 25% to
    the last step at the layer2.1 and layer4.1 cells traced (from layer2.1 on the medians
    are v7's at all 15 cells, so the switch did not come); at layer1.1 it took 11-22%
    less time than v7 in two runs for the same errors (0.0107-0.0145 against
    0.0110-0.0149), and 33-36% less at the demo's small CNN's blocks.1
    (docs/validation/iri_convergence.md, "The inner ReLUs' states"). L-BFGS ignores it.

    ``colour_basis="opponent"`` runs Adam (its moments, its per-coordinate step) in an
    orthonormal opponent colour basis of each RGB pixel (luminance, red-green,
    blue-yellow) instead of in R, G and B; the error, the box and the stored IRIs are the
    same. On the shortcut fronts of experiment A it lowers the error 13-16% at layer2.1,
    and it moves invariance-aware scores (docs/validation/iri_convergence.md, "Adam in an
    opponent colour basis"); it needs ``(N, 3, H, W)`` inputs.
    ``stft_window=n`` (``n`` even, > 0) does the same for 1-D signals ``(N, C, T)`` in
    short-time Fourier coordinates: each channel's STFT with a sqrt-Hann window of ``n``
    samples and hop ``n / 2`` (a tight frame), Adam's second moment one scale per
    time-frequency coefficient, so a log-spectral front's quiet bins and loud ones get
    steps of their own size (docs/validation/audio.md, "IRIs in STFT coordinates").

    ``optimizer="lbfgs"`` runs L-BFGS on each sample's squared relative error, vectorised
    over the batch: each sample keeps its own ``history`` curvature pairs, its own step
    and acceptance (a step that does not lower the error is backed off, at the cost of one
    evaluation), and ``step_size`` -> ``final_step_size`` caps each step's RMS over the
    pixels. One forward and backward per step, as Adam; lower errors at deep points of
    a ResNet-18, not at all points (docs/validation/iri_convergence.md, "Per-sample
    L-BFGS").

    ``start`` is where the optimisation begins: ``"noise"`` (uniform over the box),
    ``"image"`` (another source of the batch), ``"blur"`` (the source smoothed: a 5x5
    binomial filter on images, a 5-tap one along time on ``(N, C, T)`` inputs) or
    ``"scaled_noise"`` (Gaussian of standard deviation ``start_scale``, in input units,
    around the box centre, clipped to the box: a quiet start, which waveforms need because
    uniform noise over the box is full-scale white noise). ``precision`` is how IRIs are
    stored and so measured: ``"uint8"`` (255 steps over the box, as images are),
    ``"int16"`` (65535 steps) or ``"float32"`` (unquantised).
    """

    # with bfloat16 where it is fast, a set costs about the paper recipe's 200 signed steps
    steps: int = 270
    step_size: float = 0.1
    final_step_size: float | None = 0.01  # geometric decay to this size (None: constant)
    optimizer: Literal["sign", "adam", "l2", "lbfgs"] = "adam"
    start: Literal["noise", "image", "blur", "scaled_noise"] = "noise"  # image: another source
    tolerance: float | None = 0.01  # a sample stops once its relative error is below
    # a sample that meets the tolerance keeps the iterate that met it (False: it also takes
    # that iteration's step, as presets up to v5 do)
    keep_converged: bool = True
    box: tuple[float, float] = (0.0, 1.0)
    batch_size: int = 128
    # bf16 autocast: "fast" where the device has bf16 matrix units (CUDA, a CPU with AMX),
    # "auto" on CUDA only, "bf16" always, "off" never; the last float32_steps in float32
    amp: Literal["fast", "auto", "off", "bf16"] = "fast"
    relu_grad: Literal["exact", "straight_through", "surrogate", "smooth"] = "smooth"
    relu_slope: float = 0.1  # backward slope of the inner ReLUs under relu_grad="surrogate"
    relu_width: float = 0.3  # under relu_grad="smooth": sigmoid width / source's sd
    relu_floor: float = 0.05  # under relu_grad="smooth": the least backward slope
    # under relu_grad="smooth": the last steps of a batch take the exact inner-ReLU gradient
    exact_relu_steps: int = 90
    # ... and all steps from the first check (every MISMATCH_EVERY smooth steps) at which at
    # most this fraction of every inner ReLU's units is on where the source's is off or the
    # reverse (None: never)
    exact_relu_mismatch: float | None = 0.1
    adam_beta2: float = 0.95  # Adam's second-moment decay
    drop_outward_momentum: bool = True  # Adam: no momentum that pushes a pixel out of the box
    start_scale: float = 0.003  # standard deviation of the "scaled_noise" start
    precision: Literal["uint8", "int16", "float32"] = "uint8"  # storage of the IRIs
    history: int = 20  # curvature pairs kept per sample by optimizer="lbfgs"
    colour_basis: Literal["rgb", "opponent"] = "rgb"  # Adam's coordinates for RGB images
    stft_window: int = 0  # > 0: Adam's coordinates for (N, C, T) inputs, an STFT of this window
    # Adam's coordinates whitened by the front's first convolution (see the class docstring);
    # "auto": "none" unless Adam runs in pixels, then resolved against the front
    precondition: Literal["auto", "first_layer", "none"] = "auto"
    float32_steps: int = 30  # the last steps of a batch run in float32 when amp is on
    float32_below: float | None = 0.02  # and all the rest once the batch's median is below
    # each sample's step at most this fraction of its Polyak step (None: no cap), on fronts
    # that are affine up to a straight-through final ReLU ("affine") or on every front ("all")
    polyak: float | None = 0.3
    polyak_fronts: Literal["affine", "all"] = "affine"

    def __post_init__(self) -> None:
        plain_adam = (
            self.optimizer == "adam" and self.colour_basis == "rgb" and not self.stft_window
        )
        if not plain_adam:  # what these optimizers and coordinates did before both fields
            if self.precondition == "auto":
                object.__setattr__(self, "precondition", "none")
            if self.amp == "fast":  # measured for Adam in pixels only (L-BFGS's pairs,
                object.__setattr__(self, "amp", "auto")  # for one, need float32 gradients)

    def for_front(
        self, front: nn.Module, example: Tensor, device: torch.device | None = None
    ) -> IRIRecipe:
        """This recipe resolved for ``front``, inputs like ``example`` (a batch) and
        ``device`` (default: the example's): ``amp="fast"`` becomes ``"bf16"`` where
        :func:`bf16_is_fast` (CUDA, a CPU with AMX), ``"off"`` elsewhere;
        ``precondition="auto"`` becomes ``"first_layer"`` where :func:`input_convolution`
        finds the convolution, ``"none"`` elsewhere; ``polyak`` becomes None where
        :meth:`caps_steps` says no; ``exact_relu_mismatch`` becomes None on a front without
        inner smooth ReLUs and for L-BFGS. So a stored set's key says what ran.
        A ValueError for ``"first_layer"`` asked of a front it does not apply to."""
        rec = self
        if rec.amp == "fast":
            fast = bf16_is_fast(device if device is not None else example.device)
            rec = dataclasses.replace(rec, amp="bf16" if fast else "off")
        if not rec.caps_steps(front):
            rec = dataclasses.replace(rec, polyak=None)
        if rec.exact_relu_mismatch is not None and (
            not rec.switches_on_states() or _smooth_relus_of(front) is None
        ):  # no inner ReLU to switch (or L-BFGS, which ignores it): the key says so
            rec = dataclasses.replace(rec, exact_relu_mismatch=None)
        if rec.precondition == "none":
            return rec
        fits = _FirstLayer.applies(front, example)
        if rec.precondition == "first_layer" and not fits:
            raise ValueError(
                "precondition='first_layer' needs a front whose input (N, C, H, W) goes "
                "straight into one nn.Conv2d of stride 1, dilation 1 and one group; this "
                "front's does not (a strided stem, a patch embedding or another first "
                "layer). Use precondition='auto' or 'none'."
            )
        return dataclasses.replace(rec, precondition="first_layer" if fits else "none")

    def switches_on_states(self) -> bool:
        """Whether this recipe switches the inner ReLUs to the exact gradient once their
        states agree with the sources' (``exact_relu_mismatch`` set, the smooth gradient,
        not L-BFGS, which ignores it)."""
        return (
            self.exact_relu_mismatch is not None and self.relu_grad == "smooth"
            and self.optimizer != "lbfgs"
        )  # fmt: skip

    def caps_steps(self, front: nn.Module) -> bool:
        """Whether this recipe's steps on ``front`` are capped by ``polyak``: a cap is
        set, the optimizer is not L-BFGS (which has its own step acceptance) and
        ``polyak_fronts`` is ``"all"`` or the front is affine up to a straight-through
        final ReLU (:func:`affine_front`)."""
        if self.polyak is None or self.optimizer == "lbfgs":
            return False
        return self.polyak_fronts == "all" or affine_front(front)

    @classmethod
    def paper(cls, **overrides) -> IRIRecipe:
        """PROTOCOL section 3: 200 signed steps of 1/255 from uniform noise, no early stop,
        the exact ReLU gradient (for exact reproduction of the paper)."""
        return cls.from_kwargs(preset="paper", **overrides)

    def validate(self) -> None:
        """Raise a ValueError (a TypeError for a wrong type) naming the first bad field."""
        from ._checks import check_field_types

        check_field_types(self, "IRI recipe")
        for f in dataclasses.fields(self):  # NaN passes every "x <= 0" test below
            value = getattr(self, f.name)
            values = value if isinstance(value, tuple) else (value,)
            if any(isinstance(v, float) and not math.isfinite(v) for v in values):
                raise ValueError(f"{f.name} must be finite, got {value}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.step_size <= 0:
            raise ValueError(f"step_size must be positive, got {self.step_size}")
        if self.final_step_size is not None and self.final_step_size <= 0:
            raise ValueError(f"final_step_size must be positive, got {self.final_step_size}")
        if self.optimizer not in ("sign", "adam", "l2", "lbfgs"):
            raise ValueError(
                f"optimizer must be 'sign', 'adam', 'l2' or 'lbfgs', got {self.optimizer!r}"
            )
        if self.colour_basis != "rgb" and self.optimizer != "adam":
            raise ValueError(
                f"colour_basis={self.colour_basis!r} is an option of Adam's steps; with "
                f"optimizer={self.optimizer!r} leave it at 'rgb'"
            )
        if self.stft_window and self.optimizer != "adam":
            raise ValueError(
                f"stft_window={self.stft_window} is an option of Adam's steps; with "
                f"optimizer={self.optimizer!r} leave it at 0"
            )
        if self.stft_window < 0 or self.stft_window % 2 or self.stft_window == 2:
            raise ValueError(
                f"stft_window must be 0 (off) or an even number of samples >= 4, got "
                f"{self.stft_window}"
            )
        if self.stft_window and self.colour_basis != "rgb":
            raise ValueError("stft_window and colour_basis are for different inputs; set one")
        if self.precondition not in ("auto", "first_layer", "none"):
            raise ValueError(
                f"precondition must be 'auto', 'first_layer' or 'none', got "
                f"{self.precondition!r}"
            )
        if self.precondition == "first_layer":
            other = (
                f"optimizer={self.optimizer!r}" if self.optimizer != "adam"
                else f"colour_basis={self.colour_basis!r}" if self.colour_basis != "rgb"
                else f"stft_window={self.stft_window}" if self.stft_window
                else None
            )  # fmt: skip
            if other is not None:
                raise ValueError(
                    f"precondition={self.precondition!r} sets Adam's coordinates, which "
                    f"{other} sets otherwise; add precondition='none' to use {other}"
                )
        if self.history < 1:
            raise ValueError(f"history must be >= 1, got {self.history}")
        if self.start not in ("noise", "image", "blur", "scaled_noise"):
            raise ValueError(
                f"start must be 'noise', 'image', 'blur' or 'scaled_noise', got {self.start!r}"
            )
        if not self.start_scale > 0:
            raise ValueError(f"start_scale must be positive, got {self.start_scale}")
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"precision must be 'uint8', 'int16' or 'float32', got {self.precision!r}"
            )
        lo, hi = self.box
        if not hi > lo:
            raise ValueError(f"box must be (low, high) with high > low, got {self.box}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.amp not in ("fast", "auto", "off", "bf16"):
            raise ValueError(f"amp must be 'fast', 'auto', 'off' or 'bf16', got {self.amp!r}")
        if not 0 <= self.float32_steps:
            raise ValueError(f"float32_steps must be >= 0, got {self.float32_steps}")
        if self.polyak is not None and not 0 < self.polyak <= 1:
            raise ValueError(f"polyak must be in (0, 1] or None, got {self.polyak}")
        if self.polyak_fronts not in ("affine", "all"):
            raise ValueError(
                f"polyak_fronts must be 'affine' or 'all', got {self.polyak_fronts!r}"
            )
        if self.float32_below is not None and not self.float32_below > 0:
            raise ValueError(f"float32_below must be positive or None, got {self.float32_below}")
        if self.relu_grad not in ("exact", "straight_through", "surrogate", "smooth"):
            raise ValueError(
                "relu_grad must be 'exact', 'straight_through', 'surrogate' or 'smooth', got "
                f"{self.relu_grad!r}"
            )
        if not 0.0 <= self.relu_floor < 1.0:
            raise ValueError(f"relu_floor must be in [0, 1), got {self.relu_floor}")
        if self.exact_relu_steps < 0:
            raise ValueError(f"exact_relu_steps must be >= 0, got {self.exact_relu_steps}")
        if self.exact_relu_mismatch is not None and not 0 < self.exact_relu_mismatch < 1:
            raise ValueError(
                f"exact_relu_mismatch must be in (0, 1) (a fraction of units) or None, got "
                f"{self.exact_relu_mismatch}"
            )
        if not self.relu_width > 0:
            raise ValueError(f"relu_width must be positive, got {self.relu_width}")
        if not 0.0 <= self.adam_beta2 < 1.0:
            raise ValueError(f"adam_beta2 must be in [0, 1), got {self.adam_beta2}")
        if not 0.0 <= self.relu_slope < 1.0:
            raise ValueError(
                f"relu_slope must be in [0, 1) (1 is the identity, which diverges), got "
                f"{self.relu_slope}"
            )

    def step_at(self, t: int) -> float:
        """The step size of step ``t`` (0-based)."""
        if self.final_step_size is None or self.steps <= 1:
            return self.step_size
        ratio = self.final_step_size / self.step_size
        return self.step_size * ratio ** (t / (self.steps - 1))

    @classmethod
    def from_kwargs(cls, **kwargs) -> IRIRecipe:
        """Build and validate; an unknown option is an error listing the valid ones.

        ``preset="paper"`` starts from :meth:`paper`'s settings, ``"default"`` (or none)
        from stitchlab's; the other options override the preset's."""
        preset = kwargs.pop("preset", "default")
        if preset not in PRESETS:
            raise ValueError(f"IRI preset must be one of {sorted(PRESETS)}, got {preset!r}")
        kwargs = {**PRESETS[preset], **kwargs}
        check_options(cls, kwargs, "IRI")
        if "box" in kwargs:
            kwargs["box"] = tuple(float(v) for v in kwargs["box"])
        recipe = cls(**kwargs)
        recipe.validate()
        return recipe

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        d = dataclasses.asdict(self)
        d["box"] = list(self.box)
        return d

    def describe(self) -> str:
        """One line for reports, e.g. "180 adam steps 0.1 -> 0.01 (beta2 0.95, ...) from
        uniform noise over the box, ReLU gradient smooth inside (...), ..., stored as uint8".
        Invariance-aware scores depend on the whole recipe, the start included
        (docs/validation/iri_convergence.md), so a score is reported with it."""
        from .vocabulary import describe_iri_recipe

        return describe_iri_recipe(self.as_dict())

    def key_dict(self) -> dict:
        """The fields that name a stored IRI set (:func:`generate_iris_set`'s key): all of
        :meth:`as_dict`, except the fields added after the first stored sets where they
        say what those sets did: ``precision`` when it is ``"uint8"``, ``start_scale``
        unless the start is ``"scaled_noise"``, ``relu_slope`` unless ``relu_grad`` is
        ``"surrogate"``, ``history`` unless the optimizer is ``"lbfgs"``, ``relu_width``
        and ``relu_floor`` unless ``relu_grad`` is ``"smooth"``, ``exact_relu_steps`` unless
        ``relu_grad`` is ``"smooth"`` and it is above 0, ``keep_converged`` when it is False
        or does nothing (no tolerance, L-BFGS), ``exact_relu_mismatch`` when it is None or
        does nothing (as :meth:`for_front` resolves it on a front without inner ReLUs;
        another ``relu_grad``; L-BFGS), ``adam_beta2`` when it is 0.999,
        ``drop_outward_momentum`` when it is False (what Adam did before these fields) and
        ``colour_basis`` when it is ``"rgb"``, ``stft_window`` when it is 0 and
        ``precondition`` when it is ``"none"``, ``float32_steps`` when it is 0 and
        ``float32_below`` when it is None (either when ``amp`` is ``"off"``, where they
        change nothing), ``polyak`` and ``polyak_fronts`` when there is no cap (None, as
        :meth:`for_front` resolves it on a front that is not affine, or L-BFGS); a cap on
        affine fronts adds ``affine_rule`` (:data:`AFFINE_RULE`). A set stored before these
        fields existed keeps its key."""
        d = self.as_dict()
        if d["relu_grad"] != "smooth":
            del d["relu_width"], d["relu_floor"]
        if d["relu_grad"] != "smooth" or not d["exact_relu_steps"]:
            del d["exact_relu_steps"]
        if not self.switches_on_states():
            del d["exact_relu_mismatch"]
        if not d["keep_converged"] or d["tolerance"] is None or d["optimizer"] == "lbfgs":
            del d["keep_converged"]
        if d["adam_beta2"] == 0.999:
            del d["adam_beta2"]
        if not d["drop_outward_momentum"]:
            del d["drop_outward_momentum"]
        if d["precision"] == "uint8":
            del d["precision"]
        if d["start"] != "scaled_noise":
            del d["start_scale"]
        if d["relu_grad"] != "surrogate":
            del d["relu_slope"]
        if d["optimizer"] != "lbfgs":
            del d["history"]
        if d["colour_basis"] == "rgb":
            del d["colour_basis"]
        if not d["stft_window"]:
            del d["stft_window"]
        if d["precondition"] == "none":
            del d["precondition"]
        if not d["float32_steps"] or d["amp"] == "off":  # it changes nothing then
            del d["float32_steps"]
        if d["float32_below"] is None or d["amp"] == "off":
            del d["float32_below"]
        if d["polyak"] is None or d["optimizer"] == "lbfgs":  # no cap: as before the field
            del d["polyak"], d["polyak_fronts"]
        elif d["polyak_fronts"] == "affine":
            d["affine_rule"] = AFFINE_RULE
        return d


#: Storage precisions of IRIs (:attr:`IRIRecipe.precision`).
PRECISIONS = ("uint8", "int16", "float32")


#: Named starting points for IRI recipes (see :class:`IRIRecipe`).
# Adam with its usual moments, in the inputs' own coordinates (v1, v2, paper)
_ADAM_V1 = {"adam_beta2": 0.999, "drop_outward_momentum": False, "precondition": "none"}
# mixed precision of presets up to v4: bf16 on CUDA only, to the last step
_AMP_V1 = {"amp": "auto", "float32_steps": 0, "float32_below": None}
# a converged sample also takes that iteration's step (presets up to v5)
_STOP_V1 = {"keep_converged": False}
# every step its full size, without the Polyak cap of affine fronts (presets up to v6)
_CAP_V1 = {"polyak": None}
# the smooth inner-ReLU gradient up to the exact tail whatever the ReLUs' states, without
# the switch on on/off agreement with the source (presets up to v7)
_MISMATCH_V1 = {"exact_relu_mismatch": None}

PRESETS: dict[str, dict] = {
    "default": {},
    "paper": {
        "steps": 200, "step_size": 1 / 255, "final_step_size": None, "optimizer": "sign",
        "start": "noise", "tolerance": None, "relu_grad": "exact", **_ADAM_V1, **_AMP_V1,
        **_STOP_V1, **_CAP_V1, "amp": "off",  # the released loop: float32 on every device
    },
    # Adam in pixels (no first-layer preconditioner), 180 steps
    "v3": {"steps": 180, "precondition": "none", "exact_relu_steps": 0, **_AMP_V1, **_STOP_V1,
           **_CAP_V1, **_MISMATCH_V1},
    # whitened by the first convolution, 180 steps, float32 on a CPU
    "v4": {"steps": 180, "exact_relu_steps": 0, **_AMP_V1, **_STOP_V1, **_CAP_V1,
           **_MISMATCH_V1},
    # bfloat16 where fast, 270 steps: the smooth gradient to the last step, and a converged
    # sample's last step taken
    "v5": {"exact_relu_steps": 0, **_STOP_V1, **_CAP_V1, **_MISMATCH_V1},
    # the exact inner-ReLU gradient in the last steps; every step its full size
    "v6": {**_CAP_V1, **_MISMATCH_V1},
    # the Polyak cap on affine fronts; no switch on the ReLUs' states agreeing with the source's
    "v7": {**_MISMATCH_V1},
    # Adam 0.05 -> 0.002 with a straight-through final ReLU only; reproduces the sets and
    # pages made with it exactly
    "v1": {"steps": 200, "step_size": 0.05, "final_step_size": 0.002,
           "relu_grad": "straight_through", **_ADAM_V1, **_AMP_V1, **_STOP_V1, **_CAP_V1},
    # surrogate inner-ReLU gradient, Adam's usual moments
    "v2": {"steps": 200, "step_size": 0.1, "final_step_size": 0.01, "relu_grad": "surrogate",
           "relu_slope": 0.1, **_ADAM_V1, **_AMP_V1, **_STOP_V1, **_CAP_V1},
    # waveforms in [-1, 1]: a quiet Gaussian start (uniform noise over the box never
    # converges), 300 Adam steps of 0.003 decaying to 0.0001 (the image steps leave a log-mel
    # front 0.5-0.7 off), int16 storage (uint8 levels are 1/127 of full scale); in
    # STFT coordinates with the image default's smooth inner-ReLU gradient and moments
    # (docs/validation/audio.md, "IRIs in STFT coordinates")
    "audio": {
        "steps": 300, "step_size": 0.003, "final_step_size": 0.0001, "start": "scaled_noise",
        "start_scale": 0.003, "box": (-1.0, 1.0), "precision": "int16", "stft_window": 256,
        "precondition": "none", "exact_relu_steps": 0, **_AMP_V1, **_STOP_V1, **_CAP_V1,
        **_MISMATCH_V1,
    },
    # the earlier audio preset (straight-through final ReLU, Adam's usual moments, in
    # samples), with which the earlier speech pages were made
    "audio-v1": {
        "steps": 300, "step_size": 0.003, "final_step_size": 0.0001, "start": "scaled_noise",
        "start_scale": 0.003, "box": (-1.0, 1.0), "precision": "int16",
        "relu_grad": "straight_through", **_ADAM_V1, **_AMP_V1, **_STOP_V1, **_CAP_V1,
    },
}  # fmt: skip


@dataclass
class IRIQuality:
    """Summary of how well a set of IRIs converged."""

    n: int
    median_error: float  # relative error at the point, after quantisation for storage
    mean_error: float
    p90_error: float
    max_error: float
    median_pixel_rms: float  # RMS pixel distance between IRI and source, in box units
    threshold: float
    # the null: relative distance at the point between the representations of two
    # different real images of the same data (median), and how many times closer the
    # IRIs must be to count as identically represented
    null_median: float | None = None
    min_null_ratio: float = MIN_NULL_RATIO
    precision: str | None = None  # storage precision the errors were measured at (None: unknown)
    flagged: bool = field(init=False)
    why_flagged: str = field(init=False, default="")

    def __post_init__(self) -> None:
        why = []
        if not math.isfinite(self.median_error) or not math.isfinite(self.p90_error):
            why.append("errors are not finite")
        elif self.median_error > self.threshold:
            why.append(f"median above the threshold {self.threshold:g}")
        ratio = self.null_ratio
        if ratio is not None and not ratio >= self.min_null_ratio:
            why.append(
                f"only {ratio:.1f}x closer than another {self.input_word} (at least "
                f"{self.min_null_ratio:g}x required)"
            )
        self.why_flagged = "; ".join(why)
        self.flagged = bool(why)

    @property
    def input_word(self) -> str:
        """What the inputs are called in messages: "image" (uint8 storage) or "input"
        (int16 / float32 storage: waveforms and other non-image inputs)."""
        return "image" if self.precision in (None, "uint8") else "input"

    @property
    def null_ratio(self) -> float | None:
        """How many times closer an IRI is to its source's representation than another
        real image is (null median / IRI median), or None without a null."""
        if self.null_median is None or not math.isfinite(self.null_median):
            return None
        return self.null_median / max(self.median_error, 1e-12)

    @classmethod
    def of(
        cls,
        rel_error: Tensor,
        pixel_rms: Tensor,
        threshold: float,
        null_error: Tensor | None = None,
        min_null_ratio: float = MIN_NULL_RATIO,
        precision: str | None = None,
    ) -> IRIQuality:
        """Summarise per-sample errors, distances and (optionally) null distances;
        ``precision`` is the storage precision the errors were measured at."""
        e = rel_error.double()
        null = None
        if null_error is not None:
            finite = null_error.double()[torch.isfinite(null_error.double())]
            null = float(finite.median()) if finite.numel() else None
        return cls(
            n=int(e.numel()),
            median_error=float(e.median()),
            mean_error=float(e.mean()),
            p90_error=float(torch.quantile(e, 0.9)),
            max_error=float(e.max()),
            median_pixel_rms=float(pixel_rms.double().median()),
            threshold=threshold,
            null_median=null,
            min_null_ratio=min_null_ratio,
            precision=precision,
        )

    def __str__(self) -> str:
        flag = f"  ** FLAGGED: {self.why_flagged} **" if self.flagged else ""
        ratio = self.null_ratio
        null = (
            f", {ratio:.0f}x closer than another {self.input_word} (null {self.null_median:.3f})"
            if ratio is not None
            else ""
        )
        stored = f", stored as {self.precision}" if self.precision not in (None, "uint8") else ""
        return (
            f"IRIs: n={self.n}, relative error median {self.median_error:.3f} "
            f"(mean {self.mean_error:.3f}, p90 {self.p90_error:.3f}, max {self.max_error:.3f})"
            f"{null}, {'pixel' if self.input_word == 'image' else 'sample'} RMS distance to "
            f"source {self.median_pixel_rms:.3f}{stored}{flag}"
        )


@dataclass
class IRIResult:
    """IRIs of one batch, and their quality per sample."""

    iris: Tensor  # float, in the box, quantised to the storage precision's levels
    rel_error: Tensor  # achieved relative error after quantisation
    rel_error_float: Tensor  # before quantisation
    pixel_rms: Tensor  # RMS pixel distance from the source image
    null_error: Tensor | None = None  # relative distance of another real image (the null)
    precision: str = "uint8"  # the storage precision the IRIs were quantised to

    def quality(self, threshold: float = THRESHOLD) -> IRIQuality:
        """The quality summary of these IRIs."""
        return IRIQuality.of(
            self.rel_error, self.pixel_rms, threshold, self.null_error, precision=self.precision
        )


def quantise(x: Tensor, box: tuple[float, float] = (0.0, 1.0), precision: str = "uint8") -> Tensor:
    """Inputs in ``box`` to stored levels: ``uint8`` (255 steps over the box), ``int16``
    (65535 steps; level ``k`` stored as ``k - 32768``) or ``float32`` (the values)."""
    lo, hi = box
    if precision == "uint8":
        return ((x - lo) / (hi - lo) * 255).round().clamp(0, 255).to(torch.uint8)
    if precision == "int16":
        k = ((x.double() - lo) / (hi - lo) * 65535).round().clamp(0, 65535)
        return (k - 32768).to(torch.int16)
    if precision == "float32":
        return x.detach().float().clone()
    raise ValueError(f"precision must be 'uint8', 'int16' or 'float32', got {precision!r}")


def dequantise(q: Tensor, box: tuple[float, float] = (0.0, 1.0)) -> Tensor:
    """Stored levels back to float inputs in ``box`` (the dtype says the precision: uint8,
    int16 or float)."""
    lo, hi = box
    if q.dtype == torch.int16:
        return ((q.double() + 32768) / 65535 * (hi - lo) + lo).float()
    if q.is_floating_point():
        return q.float()
    return q.float() / 255 * (hi - lo) + lo


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


def _relu_forward(ctx, x: Tensor, inplace: bool) -> Tensor:
    """The exact ReLU of an autograd function's forward: in place (``x`` marked dirty) where
    the model's own ReLU was, so that the front's memory use stays the model's."""
    if inplace:
        ctx.mark_dirty(x)
        return x.clamp_min_(0)
    return x.clamp_min(0)


class _SurrogateReLU(torch.autograd.Function):
    """ReLU forward; backward with slope 1 where the input is positive, ``slope`` elsewhere.

    The output is saved for the backward pass (it is positive exactly where the input
    is), so that the forward can overwrite its input where the model's own ReLU did."""

    @staticmethod
    def forward(ctx, x: Tensor, slope: float, inplace: bool) -> Tensor:  # noqa: D102
        y = _relu_forward(ctx, x, inplace)
        ctx.save_for_backward(y)
        ctx.slope = slope
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        (y,) = ctx.saved_tensors  # leaky ReLU's own backward kernel on the result: one pass
        return torch.ops.aten.leaky_relu_backward(grad, y, ctx.slope, True), None, None


def surrogate_relu(x: Tensor, slope: float = 0.1, inplace: bool = False) -> Tensor:
    """``relu(x)`` whose gradient is ``slope`` (not 0) where ``x <= 0``; ``inplace``
    overwrites ``x`` as ``relu_`` does."""
    return _SurrogateReLU.apply(x, slope, inplace)


class _SmoothReLUFn(torch.autograd.Function):
    """ReLU forward; backward ``max(floor, sigmoid(x * inv_width))``, computed as
    ``sigmoid(max(x * inv_width, logit(floor)))`` (the same number: the sigmoid is
    monotone) by one fused kernel, ``softplus_backward``, on what the forward keeps: the
    scaled pre-activation, clamped, in the activation's own dtype (bfloat16 under autocast
    on a GPU). The forward keeps it because the model's in-place ReLUs overwrite the
    pre-activation; two passes over the activation (scale, clamp) and no float32 copy,
    since on a GPU these elementwise passes, not the convolutions, are the smooth
    gradient's cost."""

    @staticmethod
    def forward(ctx, x: Tensor, inv_width: Tensor, floor: float, inplace: bool) -> Tensor:  # noqa: D102
        scaled = x.detach() * inv_width.to(x.dtype)
        if floor > 0:
            scaled.clamp_min_(math.log(floor / (1.0 - floor)))
        ctx.save_for_backward(scaled)
        return _relu_forward(ctx, x, inplace)

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        (scaled,) = ctx.saved_tensors
        d = torch.ops.aten.softplus_backward(grad, scaled.to(grad.dtype), 1.0, 20.0)
        return d, None, None, None


def _relu_state(t: Tensor) -> Tensor:
    return t > 0


class _SmoothSaturatingFn(torch.autograd.Function):
    """A saturating piecewise-linear nonlinearity (clamp to ``[lo, hi]``: ReLU6,
    Hardtanh; Hardsigmoid, Hardswish) with its exact forward and, backward, the
    derivative of its softplus-smoothed version: for a clamp ``s(x) = sigmoid((x - lo) /
    w) - sigmoid((x - hi) / w)`` (the kinks rounded over ``w``), at least ``floor``;
    Hardsigmoid ``s(x) / 6`` over ``[-3, 3]``; Hardswish ``x * h(x)`` with ``h`` the
    smoothed Hardsigmoid, plus ``floor`` below -3. ``w`` as for the ReLUs."""

    @staticmethod
    def forward(ctx, x, inv_width, kind, lo, hi, floor, exact):  # noqa: D102
        kept = x.detach().clone()  # an in-place module overwrites what it is given
        ctx.save_for_backward(kept, inv_width)
        ctx.kind, ctx.lo, ctx.hi, ctx.floor = kind, lo, hi, floor
        return exact(kept.clone())

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        x, inv = ctx.saved_tensors
        x = x.to(grad.dtype)
        inv = inv.to(grad.dtype)
        a, b = torch.sigmoid((x - ctx.lo) * inv), torch.sigmoid((x - ctx.hi) * inv)
        inside = a - b  # the smoothed clamp's derivative
        if ctx.kind == "clamp":
            d = inside.clamp_min_(ctx.floor)
        elif ctx.kind == "hardsigmoid":
            d = inside.clamp_min_(ctx.floor) / (ctx.hi - ctx.lo)
        else:  # hardswish: x * h(x), h the smoothed (x + 3) / 6 clamped to [0, 1]
            width = inv.reciprocal()
            h = width * (F.softplus((x - ctx.lo) * inv) - F.softplus((x - ctx.hi) * inv))
            d = h / (ctx.hi - ctx.lo) + x * inside / (ctx.hi - ctx.lo)
            d = d + ctx.floor * (x <= ctx.lo)
        return grad * d, None, None, None, None, None, None


class _SoftMaxPoolFn(torch.autograd.Function):
    """Max-pooling over non-overlapping windows ``k`` (kernel = stride, no padding) with
    its exact forward and, backward, each window's gradient spread over its inputs by a
    softmax of ``(x - max) / w`` (``w`` as for the ReLUs): an input just below its
    window's maximum gets about as much as the maximum, one far below none (the exact
    gradient as ``w`` -> 0)."""

    @staticmethod
    def forward(ctx, x, inv_width, k, exact):  # noqa: D102
        y = exact(x)
        ctx.save_for_backward(x.detach(), y.detach(), inv_width)
        ctx.k = k
        return y

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        x, y, inv = ctx.saved_tensors
        k = ctx.k
        pool = F.avg_pool1d if len(k) == 1 else F.avg_pool2d
        size = tuple(o * kk for o, kk in zip(y.shape[2:], k, strict=True))
        cut = tuple(x.shape[2:]) != size  # floor mode left a border out of every window
        xc = x[(slice(None), slice(None), *(slice(0, n) for n in size))] if cut else x
        e = torch.exp((xc - F.interpolate(y, size=size, mode="nearest")) * inv.to(x.dtype))
        total = pool(e, k) * math.prod(k)  # each window's sum (its maximum contributes 1)
        gx = e.mul_(F.interpolate(grad / total, size=size, mode="nearest"))
        if not cut:
            return gx, None, None, None
        full = torch.zeros_like(x, dtype=grad.dtype)
        full[(slice(None), slice(None), *(slice(0, n) for n in size))] = gx
        return full, None, None, None


def _saturating_kind(module: nn.Module) -> tuple[str, float, float] | None:
    """(kind, lo, hi) of a saturating nonlinearity module the smooth gradient treats:
    ``nn.Hardtanh`` and ``nn.ReLU6`` (a clamp to ``[lo, hi]``), ``nn.Hardsigmoid`` and
    ``nn.Hardswish`` (kinks at -3 and 3); None for another module."""
    if isinstance(module, nn.Hardtanh):  # ReLU6 is one
        return "clamp", float(module.min_val), float(module.max_val)
    if isinstance(module, nn.Hardsigmoid):
        return "hardsigmoid", -3.0, 3.0
    if isinstance(module, nn.Hardswish):
        return "hardswish", -3.0, 3.0
    return None


def _pool_windows(module: nn.Module) -> tuple[int, ...] | None:
    """The windows of a max-pooling module whose windows do not overlap (kernel =
    stride, no padding or dilation, floor mode, no indices), else None."""
    if not isinstance(module, (nn.MaxPool1d, nn.MaxPool2d)) or module.return_indices:
        return None
    nd = 1 if isinstance(module, nn.MaxPool1d) else 2

    def tup(v) -> tuple[int, ...]:
        return tuple(v) if isinstance(v, (tuple, list)) else (int(v),) * nd

    k, st = tup(module.kernel_size), tup(module.stride or module.kernel_size)
    if k != st or any(tup(module.padding)) or set(tup(module.dilation)) != {1} \
            or module.ceil_mode:
        return None
    return k


class _SmoothModule(nn.Module):
    """A saturating nonlinearity or max-pooling module of a front, run by the front's
    :class:`_SmoothReLUs` (exact outside a smooth step)."""

    def __init__(self, inner: nn.Module, smooth: _SmoothReLUs) -> None:
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "smooth", smooth)  # not a submodule

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        windows = _pool_windows(self.inner)
        if windows is not None:
            return self.smooth.max_pool(x, windows, self.inner)
        kind, lo, hi = _saturating_kind(self.inner)
        return self.smooth.saturating(x, kind, lo, hi, self.inner)


def _smooth_saturating(front: nn.Module, smooth: _SmoothReLUs) -> None:
    """Run every saturating nonlinearity module (:func:`_saturating_kind`) and every
    max-pooling of non-overlapping windows in ``front`` (inside leaf modules too) through
    ``smooth``."""
    roots = [front, *_front_graphs(front)]
    for root in roots:
        for parent in list(root.modules()):
            if isinstance(parent, _SmoothModule):
                continue
            for name, child in list(parent.named_children()):
                if isinstance(child, _SmoothModule):
                    continue
                if _saturating_kind(child) is not None or _pool_windows(child) is not None:
                    setattr(parent, name, _SmoothModule(child, smooth))


class _SmoothReLUs:
    """The inner ReLUs of a front under ``relu_grad="smooth"``: exact forward; backward
    ``max(floor, sigmoid(x / w))`` with ``w = width`` x the standard deviation of the
    *source's* pre-activation over every axis after the second (the map of ``(N, C, H, W)``
    and ``(N, C, T)`` activations: per sample and channel), or over all of a sample's
    units where that leaves fewer than two values (``(N, C)``, a 1x1 map), so that a unit
    just below zero passes about half the gradient and one far below ``floor`` of it. A
    constant pre-activation gives a width of 1e-12 x ``width`` (about the exact gradient).
    The widths are recorded once per batch, at the targets' forward (:meth:`recording`); a
    step's forward then runs on the rows :meth:`step` names. Outside both the ReLUs are
    plain (measurement, BatchNorm folding)."""

    def __init__(self, width: float, floor: float = 0.0) -> None:
        self.width, self.floor = width, floor
        self.mode = "off"
        self.inv_widths: list[Tensor] = []
        # each inner ReLU's on/off states for the sources, when recorded (keep_states)
        self.source_on: list[Tensor] = []
        self._keep_states = False
        self._measure: float | None = None  # the threshold of a measured step
        self._mismatches: list[float] = []
        self._k = 0
        self._rows: Tensor | None = None

    def _next(self, x: Tensor, state: Callable[[Tensor], Tensor] | None) -> Tensor | None:
        """The inverse widths of the next smooth op in a step (None outside a step); in
        a recording forward, records them (and, with ``keep_states``, the op's ``state``
        of the sources, None for an op whose states are not compared)."""
        if self.mode == "step":
            if self._k >= len(self.inv_widths):
                raise RuntimeError(
                    f"the front ran more nonlinearities in an IRI step ({self._k + 1}) than "
                    f"when the smooth gradient's widths were recorded "
                    f"({len(self.inv_widths)}): its forward depends on its input; use "
                    "relu_grad='exact' for this model"
                )
            inv = self._of_rows(self.inv_widths[self._k])
            # before the op, which may overwrite x; none after an op above the threshold
            on = self.source_on[self._k] if self._k < len(self.source_on) else None
            if (
                self._measure is not None and on is not None and state is not None
                and max(self._mismatches, default=0) <= self._measure
            ):  # fmt: skip
                differ = torch.count_nonzero(state(x.detach()).ne_(self._of_rows(on)))
                self._mismatches.append(float(differ) / max(x.numel(), 1))
            self._k += 1
            return inv
        if self.mode == "record":
            if self._keep_states:
                self.source_on.append(state(x.detach()) if state is not None else None)
            dims = tuple(range(2, x.dim()))
            if math.prod(x.shape[2:]) < 2:  # no map to measure: the sample's units
                dims = tuple(range(1, x.dim()))
            if math.prod(x.shape[1:]) < 2:  # one unit: no spread at all
                sd = x.new_zeros((x.shape[0],) + (1,) * (x.dim() - 1), dtype=torch.float32)
            else:
                sd = x.detach().float().std(dim=dims, keepdim=True)
            self.inv_widths.append((sd * self.width).clamp_min(1e-12).reciprocal())
        return None

    def relu(self, x: Tensor, inplace: bool = False) -> Tensor:
        """Replaces each inner ReLU of the front (``inplace`` as the model's own): the
        smooth one in a step, a plain one otherwise (an exact step, measurement)."""
        inv = self._next(x, _relu_state)
        if inv is not None:
            return _SmoothReLUFn.apply(x, inv, self.floor, inplace)
        # torch's ReLU: its backward (in an exact step) reads the result, keeps no copy
        return torch.relu_(x) if inplace else torch.relu(x)

    def saturating(self, x: Tensor, kind: str, lo: float, hi: float, exact: Callable) -> Tensor:
        """A saturating nonlinearity of the front (:func:`_saturating_kind`): ``exact(x)``
        forward; in a smooth step the backward of :class:`_SmoothSaturatingFn`."""
        inv = self._next(x, lambda t: (t > lo) & (t < hi))
        if inv is None:
            return exact(x)
        return _SmoothSaturatingFn.apply(x, inv, kind, lo, hi, self.floor, exact)

    def max_pool(self, x: Tensor, k: tuple[int, ...], exact: Callable) -> Tensor:
        """A max-pooling of non-overlapping windows ``k``: exact forward; in a smooth
        step the backward of :class:`_SoftMaxPoolFn` (each window's gradient spread by a
        softmax of its inputs)."""
        inv = self._next(x, None)
        if inv is None:
            return exact(x)
        return _SoftMaxPoolFn.apply(x, inv, k, exact)

    def __deepcopy__(self, memo: dict) -> _SmoothReLUs:
        # one state per front: a copy of the front (BatchNorm folding) runs the same ops
        return self

    def _of_rows(self, t: Tensor) -> Tensor:
        """``t``'s rows of this step's samples (all of them before any stopped)."""
        return t if self._rows is None else t[self._rows]

    @contextlib.contextmanager
    def recording(self, keep_states: bool = False) -> Iterator[None]:
        """Context in which the front's forward records the widths of a new batch (and,
        if ``keep_states``, each inner ReLU's on/off states, for :meth:`mismatch`)."""
        self.mode, self.inv_widths, self.source_on = "record", [], []
        self._keep_states = keep_states
        try:
            yield
        finally:
            self.mode = "off"

    def step(
        self, rows: Tensor | None, exact: bool = False, measure: float | None = None
    ) -> None:
        """The next forward is an optimisation step on the batch rows ``rows`` (None:
        all); ``exact``: with the exact ReLU gradient (the recipe's last
        ``exact_relu_steps``); ``measure`` (a threshold, in a smooth step of a batch
        recorded with ``keep_states``): measure :meth:`mismatch` in it, up to the first
        inner ReLU above that threshold."""
        self.mode, self._k, self._rows = ("exact" if exact else "step"), 0, rows
        self._measure, self._mismatches = (None if exact else measure), []

    def mismatch(self) -> float:
        """Of the last measured step: the largest, over the inner ReLUs measured, fraction
        of units (over the step's rows) that are on where the source's are off or off
        where they are on (the ReLUs after the first above the threshold are not measured:
        the largest is above it either way); ``inf`` where nothing was measured."""
        return max(self._mismatches, default=math.inf)

    def off(self) -> None:
        """Plain ReLUs from now on (the sources' states, kept for a batch, released)."""
        self.mode, self._rows, self.source_on = "off", None, []


def _smooth_relus_of(front: nn.Module) -> _SmoothReLUs | None:
    """The :class:`_SmoothReLUs` whose ReLUs ``front`` runs, if any."""
    for gm in _front_graphs(front):
        for node in gm.graph.nodes:
            owner = getattr(node.target, "__self__", None) if node.op == "call_function" else None
            if isinstance(owner, _SmoothReLUs):
                return owner
    for m in front.modules():
        if isinstance(m, _SmoothModule):
            return m.smooth
    return None


class _NoSmooth:
    """Stands in for :class:`_SmoothReLUs` on fronts without it (every call a no-op)."""

    def recording(self, keep_states: bool = False) -> contextlib.AbstractContextManager[None]:  # noqa: D102
        return contextlib.nullcontext()

    def step(  # noqa: D102
        self, rows: Tensor | None, exact: bool = False, measure: float | None = None
    ) -> None:
        pass

    def mismatch(self) -> float:  # noqa: D102
        return math.inf

    def off(self) -> None:  # noqa: D102
        pass


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


def _front_graphs(front: nn.Module) -> list:
    import torch.fx as fx

    if isinstance(front, fx.GraphModule):
        return [front]
    return [
        m for m in (getattr(front, "train_graph", None), getattr(front, "eval_graph", None))
        if isinstance(m, fx.GraphModule)
    ]  # fmt: skip


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


def _surrogate_inner(front: nn.Module, slope: float) -> None:
    """Give every ReLU of ``front`` still in place the surrogate gradient of slope
    ``slope``."""
    _replace_relus(front, surrogate_relu, slope, pass_inplace=True)


def _frozen_front(
    model: nn.Module,
    point: str,
    leaf_modules: tuple = (),
    output=None,
    relu_grad="exact",
    relu_slope: float = 0.1,
    relu_width: float = 0.3,
    relu_floor: float = 0.0,
) -> nn.Module:
    front, _ = split(model, point, leaf_modules=leaf_modules, output=output)
    front = copy.deepcopy(front).eval()
    for p in front.parameters():
        p.requires_grad_(False)
    if relu_grad in ("straight_through", "surrogate", "smooth"):
        _straight_through_output(front)
    if relu_grad == "surrogate":
        _surrogate_inner(front, relu_slope)
    if relu_grad == "smooth":
        smooth = _SmoothReLUs(relu_width, relu_floor)
        _replace_relus(front, smooth.relu, pass_inplace=True)
        _smooth_saturating(front, smooth)
    return front


def _recipe_front(model: nn.Module, point: str, leaf_modules: tuple, output, rec) -> nn.Module:
    """:func:`_frozen_front` with the ReLU gradient of the recipe ``rec``."""
    return _frozen_front(
        model, point, leaf_modules, output, rec.relu_grad, rec.relu_slope, rec.relu_width,
        rec.relu_floor,
    )  # fmt: skip


def _per_sample_error(f: Tensor, t: Tensor) -> Tensor:
    diff = (f.float() - t).flatten(1).norm(dim=1)
    return diff / t.flatten(1).norm(dim=1).clamp_min(1e-12)


def _start(x: Tensor, recipe: IRIRecipe, gen: torch.Generator) -> Tensor:
    lo, hi = recipe.box
    if recipe.start == "noise":
        u = torch.rand(x.shape, generator=gen)
        return (lo + (hi - lo) * u).to(x.device, x.dtype)
    if recipe.start == "scaled_noise":  # quiet Gaussian noise around the box centre
        z = torch.randn(x.shape, generator=gen)
        return ((lo + hi) / 2 + recipe.start_scale * z).clamp(lo, hi).to(x.device, x.dtype)
    if recipe.start == "image":  # another image of the batch (a derangement)
        if x.shape[0] < 2:
            raise ValueError("start='image' needs batches of at least 2 images")
        shift = int(torch.randint(1, x.shape[0], (1,), generator=gen))
        return x.roll(shift, dims=0).clone()
    # blurred copy of the source
    if x.dim() == 3:  # (N, C, T): the same binomial filter along time
        k = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0], device=x.device, dtype=x.dtype) / 16
        c = x.shape[1]
        out = x
        for _ in range(3):
            out = F.conv1d(F.pad(out, (2, 2), mode="replicate"), k.expand(c, 1, 5), groups=c)
        return out
    if x.dim() != 4:
        raise ValueError(
            f"start='blur' smooths images (N, C, H, W) and sequences (N, C, T); inputs of "
            f"shape {tuple(x.shape)} need start='noise', 'scaled_noise' or 'image'"
        )
    k = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0], device=x.device, dtype=x.dtype)
    k = (k[:, None] * k[None, :]) / 256
    c = x.shape[1]
    weight = k.expand(c, 1, 5, 5)
    out = x
    for _ in range(3):
        out = F.conv2d(F.pad(out, (2, 2, 2, 2), mode="replicate"), weight, groups=c)
    return out


def bf16_is_fast(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16 matrix products natively: CUDA, or a CPU with
    AMX tiles (Intel Sapphire Rapids and later), where oneDNN's bf16 convolutions take
    about half the time of float32 ones (docs/validation/iri_convergence.md)."""
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe()) if probe is not None else False


def uses_bf16(recipe: IRIRecipe, device: torch.device) -> bool:
    """Whether ``recipe``'s steps (but its last ``float32_steps``) run under bfloat16
    autocast on ``device``."""
    if recipe.amp == "fast":
        return bf16_is_fast(device)
    return recipe.amp == "bf16" or (recipe.amp == "auto" and device.type == "cuda")


def _bf16_steps(recipe: IRIRecipe, device: torch.device) -> int:
    """How many of a batch's first steps run under bfloat16 autocast on ``device``: all but
    the last ``recipe.float32_steps`` where :func:`uses_bf16`, none elsewhere (a step ``t``
    runs in bfloat16 when ``t`` is below this)."""
    return max(recipe.steps - recipe.float32_steps, 0) if uses_bf16(recipe, device) else 0


def _precision(device: torch.device, bf16: bool) -> torch.autocast:
    """The autocast context of one step: bfloat16 if ``bf16``, float32 otherwise."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def _error_and_grad(f: Tensor, target: Tensor, target_norm: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample relative errors and their gradient with respect to ``f`` (analytic:
    d/df ||f - t|| / ||t|| = (f - t) / (||f - t|| ||t||)), so that autograd only runs
    through the network."""
    diff = torch.sub(f.detach(), target)  # float32 by type promotion from a bfloat16 f
    # over the non-batch dims in place: flatten(1) would copy a channels-last map
    dist = torch.linalg.vector_norm(diff, dim=tuple(range(1, diff.dim())))
    scale = 1.0 / (dist * target_norm).clamp_min(1e-20)
    # (a product written straight into bfloat16, torch.mul(..., out=), is 1.7x slower on
    # the CPU than this product and a vectorised copy)
    grad = diff.mul_(scale.view(-1, *[1] * (diff.dim() - 1)))
    return dist / target_norm, grad.to(f.dtype)


def _optimise(
    front: nn.Module,
    x: Tensor,
    recipe: IRIRecipe,
    gen: torch.Generator,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> tuple[Tensor, Tensor]:
    """The optimised IRIs of one batch (float, in the box) and the targets f(x);
    ``memory_format`` is how the front takes its inputs (:mod:`stitchlab._memory_format`)."""
    x = x.contiguous(memory_format=memory_format)
    smooth = _smooth_relus_of(front) or _NoSmooth()
    # the sources' inner ReLU states, for the switch to the exact gradient (not L-BFGS)
    with torch.no_grad(), smooth.recording(keep_states=recipe.switches_on_states()):
        target = front(x).float()
    target_norm = torch.linalg.vector_norm(target.flatten(1), dim=1).clamp_min(1e-12)
    try:
        if recipe.optimizer == "lbfgs":
            x_adv = _lbfgs(front, x, target, target_norm, recipe, gen, memory_format, smooth)
        else:
            x_adv = _descend(front, x, target, target_norm, recipe, gen, memory_format, smooth)
    finally:
        smooth.off()
    return x_adv, target


#: Columns: the orthonormal opponent colour axes of ``colour_basis="opponent"`` in RGB
#: (luminance, red-green, blue-yellow).
_OPPONENT = (
    (3**-0.5, 2**-0.5, 6**-0.5),
    (3**-0.5, -(2**-0.5), 6**-0.5),
    (3**-0.5, 0.0, -2 * 6**-0.5),
)


class _ColourBasis:
    """Adam's coordinates for ``colour_basis``: ``z = basis^T x`` per pixel (orthonormal,
    so synthesis is ``x = basis z``), one scale per coordinate."""

    def __init__(self, basis: Tensor) -> None:
        self.basis = basis

    @classmethod
    def of(cls, recipe: IRIRecipe, x: Tensor) -> _ColourBasis | None:
        """The basis of ``recipe.colour_basis`` for inputs like ``x`` (None for RGB); a
        ValueError for inputs that are not RGB images."""
        if recipe.colour_basis == "rgb":
            return None
        if x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(
                f"colour_basis={recipe.colour_basis!r} needs RGB images (N, 3, H, W), got "
                f"inputs of shape {tuple(x.shape)}; use colour_basis='rgb' for other inputs"
            )
        return cls(torch.tensor(_OPPONENT, dtype=torch.float32, device=x.device))

    def analysis(self, t: Tensor) -> Tensor:
        return _mix(t, self.basis)

    def synthesis(self, z: Tensor) -> Tensor:
        return _mix(z, self.basis.T)

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
        """Zeros of the shape of ``t``'s coordinates (Adam's second moment)."""
        return torch.zeros_like(t)


def _mix(t: Tensor, m: Tensor) -> Tensor:
    """Each pixel's channel vector ``v`` of ``t`` replaced by ``v @ m`` (``m`` 3x3), in
    ``t``'s memory format: a 1x1 convolution on channels-last tensors, three sums of
    scaled channels otherwise (the faster of the two ways for each layout on the CPU)."""
    if t.is_contiguous(memory_format=torch.channels_last):
        return F.conv2d(t, m.T.contiguous().view(3, 3, 1, 1))
    return torch.stack([t[:, 0] * m[0, k] + t[:, 1] * m[1, k] + t[:, 2] * m[2, k]
                        for k in range(3)], 1)  # fmt: skip


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
    def of(cls, recipe: IRIRecipe, x: Tensor) -> _TimeFrequency | None:
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
    def of(cls, recipe: IRIRecipe, x: Tensor, front: nn.Module | None) -> _FirstLayer | None:
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

    add_power_ = staticmethod(_ColourBasis.add_power_)
    scale_ = staticmethod(_ColourBasis.scale_)

    @staticmethod
    def zeros_like(t: Tensor) -> Tensor:
        """Contiguous zeros of ``t``'s shape: the second moment in the layout of
        :meth:`analysis`'s output (elementwise operations on mixed layouts, channels-last
        against contiguous, take a slow path on the CPU)."""
        return torch.zeros(t.shape, dtype=t.dtype, device=t.device)


def _adam_coordinates(
    recipe: IRIRecipe, x: Tensor, front: nn.Module | None = None
) -> _ColourBasis | _TimeFrequency | _FirstLayer | None:
    """The coordinates z of ``x`` in which Adam keeps its second moment and takes its
    steps (``colour_basis``, ``stft_window`` or ``precondition``; None: the inputs'
    own). Each has ``analysis`` (a gradient in x to its coordinates), ``synthesis`` (a step
    in z to x), ``add_power_``, ``scale_`` and ``zeros_like``; the first moment stays in
    x, where the box is."""
    for coords in (_ColourBasis.of(recipe, x), _TimeFrequency.of(recipe, x)):
        if coords is not None:
            return coords
    return _FirstLayer.of(recipe, x, front)


def _descend(front, x, target, target_norm, recipe: IRIRecipe, gen, memory_format, smooth):
    """:func:`_optimise`'s IRIs with signed, L2 or Adam steps (``x`` in ``memory_format``,
    its targets and their norms given)."""
    lo, hi = recipe.box
    device = x.device
    coords = _adam_coordinates(recipe, x, front) if recipe.optimizer == "adam" else None
    x_adv = _start(x, recipe, gen).clamp(lo, hi).contiguous(memory_format=memory_format)
    active = torch.ones(x.shape[0], dtype=torch.bool, device=device)
    m = v = None
    if recipe.optimizer == "adam":
        m = torch.zeros_like(x_adv)
        v = torch.zeros_like(x_adv) if coords is None else coords.zeros_like(x_adv)
    numel = x[0].numel()
    early = recipe.tolerance is not None
    capped = recipe.caps_steps(front)  # each sample's step at most polyak x its Polyak step
    all_active = True
    # steps before this one run in bfloat16 (where the recipe uses it): all but the float32
    # tail, fewer once the batch's median error is below recipe.float32_below
    bf16_until = _bf16_steps(recipe, device)
    exact_from = recipe.steps - recipe.exact_relu_steps  # smooth relus: exact from this step
    mismatch = recipe.exact_relu_mismatch if recipe.switches_on_states() else None
    for t in range(recipe.steps):
        # gather and scatter only once some samples have stopped
        idx = active.nonzero().squeeze(1) if early and not all_active else None
        xa = x_adv if idx is None else x_adv[idx].contiguous(memory_format=memory_format)
        xa = xa.detach().requires_grad_(True)
        ta = target if idx is None else target[idx]
        tn = target_norm if idx is None else target_norm[idx]
        check = mismatch is not None and t < exact_from and (t + 1) % MISMATCH_EVERY == 0
        smooth.step(idx, exact=t >= exact_from, measure=mismatch if check else None)
        with _precision(device, t < bf16_until):
            f = front(xa)
        if check and smooth.mismatch() <= mismatch:
            exact_from = t + 1  # the inner ReLUs' states are the sources': exact from now on
        err, g = _error_and_grad(f, ta, tn)
        (grad,) = torch.autograd.grad(f, xa, grad_outputs=g)
        below = recipe.float32_below
        if t < bf16_until and below is not None and float(err.median()) < below:
            bf16_until = t + 1  # near bfloat16's floor: the rest in float32
        alpha = recipe.step_at(t)
        done = err < recipe.tolerance if early else None
        stopping = done is not None and bool(done.any())  # one sync for both uses below
        # the iterates that met the tolerance, kept from this step's update (boolean
        # indexing gathers a copy)
        kept = xa.detach()[done] if stopping and recipe.keep_converged else None
        with torch.no_grad():
            new = xa.detach()
            if recipe.optimizer == "sign":
                if capped:
                    _polyak_update(new, grad.sign(), grad, err, recipe.polyak, alpha)
                else:
                    new.add_(grad.sign_(), alpha=-alpha)
            elif recipe.optimizer == "l2":  # per-sample L2 step of length alpha * sqrt(D)
                norm = grad.flatten(1).norm(dim=1).clamp_min(1e-12)
                if capped:
                    unit = math.sqrt(numel) / norm
                    step = grad * unit.view(-1, *[1] * (grad.dim() - 1))
                    _polyak_update(new, step, grad, err, recipe.polyak, alpha)
                else:
                    scale = (alpha * math.sqrt(numel)) / norm
                    new.sub_(grad * scale.view(-1, *[1] * (grad.dim() - 1)))
            else:  # Adam, in place on the moments (gathered copies once samples stopped)
                mi = m if idx is None else m[idx]
                vi = v if idx is None else v[idx]
                denom, step = _adam_moments(mi, vi, grad, t, recipe.adam_beta2, coords,
                                            memory_format)  # fmt: skip
                if capped:  # the step of size 1, then each sample's size
                    step = (mi / denom if step is None else step).mul_(1 / (1 - 0.9 ** (t + 1)))
                    _polyak_update(new, step, grad, err, recipe.polyak, alpha)
                elif step is None:
                    new.addcdiv_(mi, denom, value=-alpha / (1 - 0.9 ** (t + 1)))
                else:
                    new.sub_(step, alpha=alpha / (1 - 0.9 ** (t + 1)))
                if recipe.drop_outward_momentum:  # no momentum pushing a pixel out of the box
                    mi.masked_fill_((new < lo) | (new > hi), 0.0)
                if idx is not None:
                    m[idx], v[idx] = mi, vi
            new.clamp_(lo, hi)
            if kept is not None:
                new[done] = kept
            if idx is None:
                x_adv = new
            else:
                x_adv[idx] = new
            if stopping:
                active[done if idx is None else idx[done]] = False
                all_active = False
                if not bool(active.any()):
                    break
    return x_adv.detach()


def _adam_moments(
    mi: Tensor, vi: Tensor, grad: Tensor, t: int, b2: float, coords, memory_format
) -> tuple[Tensor, Tensor | None]:
    """Step ``t`` of Adam's moments, in place: the first moment ``mi`` in x (linear, so it
    is the coordinates' moment mapped back; the box is in x), the second ``vi`` in
    ``coords`` (:func:`_adam_coordinates`; None: pixels). Returns the bias-corrected
    denominator and, in coordinates, the step ``synthesis(analysis(mi) / denom)`` in the
    iterate's ``memory_format`` (in pixels None: ``mi / denom`` is formed only where it is
    needed), before the first moment's bias correction."""
    mi.mul_(0.9).add_(grad, alpha=0.1)
    vi.mul_(b2)
    if coords is None:
        vi.addcmul_(grad, grad, value=1 - b2)
    else:
        coords.add_power_(vi, coords.analysis(grad), 1 - b2)
    denom = (vi / (1 - b2 ** (t + 1))).sqrt_().add_(1e-8)
    if coords is None:
        return denom, None
    step = coords.synthesis(coords.scale_(coords.analysis(mi), denom))
    if memory_format == torch.channels_last:
        # in the iterate's layout: mixed layouts take a slow path on the CPU
        step = step.contiguous(memory_format=memory_format)
    return denom, step


def _polyak_update(
    new: Tensor, step: Tensor, grad: Tensor, err: Tensor, fraction: float, alpha: float
) -> None:
    """``new -= eta * step`` in place, each sample's ``eta`` the step size ``alpha`` capped
    at ``fraction`` x its Polyak step ``err / <grad, step>``: the size at which the
    error's linearisation along ``step`` reaches the error's least value, 0 (the source
    itself is an exact IRI). Where ``<grad, step>`` is not positive the step keeps
    ``alpha``. ``step`` (a tensor of its own) is overwritten."""
    dims = tuple(range(1, step.dim()))
    slope = (grad * step).sum(dims)
    size = (fraction * err / slope.clamp_min(1e-30)).clamp_max_(alpha)
    size.masked_fill_(~(slope > 0), alpha)
    new.sub_(step.mul_(size.view(-1, *[1] * len(dims))))


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


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-sample dot products of two ``(B, D)`` tensors: one batched GEMV."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


class _Pairs:
    """The last ``m`` L-BFGS curvature pairs of every sample, in the compact form of
    Byrd, Nocedal and Schnabel (1994): the pairs stay in one ``(B, 2m, D)`` buffer (``s``
    in rows ``:m``, ``y`` in rows ``m:``, a ring over slots) with their inner products
    ``S^T Y`` and ``Y^T Y`` (float64), so that ``H g`` costs two batched matrix products
    over the buffer, not the two-loop recursion's ``4m`` passes over ``(B, D)`` vectors.
    A pair that is not valid for a sample is stored as zeros and drops out exactly."""

    def __init__(self, n: int, d: int, m: int, like: Tensor) -> None:
        self.m = m
        self.w = like.new_zeros(n, 2 * m, d)
        self.sy = torch.zeros(n, m, m, dtype=torch.float64, device=like.device)
        self.yy = torch.zeros_like(self.sy)
        self._added = 0  # pairs stored so far; the next goes to slot _added % m

    @property
    def order(self) -> list[int]:
        """The slots that hold pairs, oldest first."""
        count = min(self._added, self.m)
        return [(self._added - count + i) % self.m for i in range(count)]

    def add(self, s: Tensor, y: Tensor, valid: Tensor, g: Tensor) -> Tensor:
        """Store the pair ``(s, y)`` (``valid``: per sample) over the oldest one and
        return ``[S Y]^T g`` for the next :meth:`apply` (one product for both)."""
        m, k = self.m, self._added % self.m
        self._added += 1
        self.w[:, k] = s
        self.w[:, m + k] = y
        if not bool(valid.all()):  # stored as zeros: s . y = 0 marks it invalid
            self.w[~valid, k] = 0
            self.w[~valid, m + k] = 0
        vecs = torch.stack((self.w[:, k], self.w[:, m + k], g), dim=1)  # (B, 3, D)
        dots = torch.bmm(vecs, self.w.transpose(1, 2)).double()  # (B, 3, 2m): the fast order
        self.sy[:, :, k] = dots[:, 1, :m]  # s_i . y_k
        self.sy[:, k, :] = dots[:, 0, m:]  # s_k . y_j
        self.yy[:, :, k] = dots[:, 1, m:]
        self.yy[:, k, :] = dots[:, 1, m:]
        return dots[:, 2]

    def forget(self, rows: Tensor) -> None:
        """Drop every pair of the samples ``rows`` (a boolean mask)."""
        self.w[rows] = 0
        self.sy[rows] = 0
        self.yy[rows] = 0

    def dots(self, g: Tensor) -> Tensor:
        """``[S Y]^T g`` per sample, ``(B, 2m)`` in float64."""
        return torch.bmm(g.unsqueeze(1), self.w.transpose(1, 2)).squeeze(1).double()

    def apply(self, g: Tensor, wg: Tensor, gamma: Tensor) -> Tensor:
        """``H g`` per sample, H the L-BFGS inverse Hessian from ``gamma * I`` and the
        stored pairs; ``wg`` is ``[S Y]^T g`` (from :meth:`add` or :meth:`dots`)."""
        out = g * gamma[:, None]
        if not self._added:
            return out
        m, idx = self.m, torch.tensor(self.order, device=g.device)
        r = self.sy[:, idx][:, :, idx].triu()  # R: s_i . y_j for i <= j, oldest first
        diag = r.diagonal(dim1=1, dim2=2)
        valid = diag > 0  # a stored pair has s . y > 0; an invalid one is zeros
        dg = torch.where(valid, diag, 0.0)
        diag.copy_(torch.where(valid, diag, 1.0))  # an invalid pair's zeros drop out
        a, b = wg[:, idx], wg[:, m + idx]
        gam = gamma.double()[:, None]
        u = torch.linalg.solve_triangular(r, a.unsqueeze(2), upper=True).squeeze(2)
        yy = self.yy[:, idx][:, :, idx]
        rhs = dg * u + gam * torch.bmm(yy, u.unsqueeze(2)).squeeze(2) - gam * b
        p = torch.linalg.solve_triangular(r.transpose(1, 2), rhs.unsqueeze(2), upper=False)
        coef = torch.zeros(g.shape[0], 2 * m, dtype=torch.float64, device=g.device)
        coef[:, idx] = p.squeeze(2)
        coef[:, m + idx] = -gam * u
        return out.add_(torch.bmm(coef.to(g.dtype).unsqueeze(1), self.w).squeeze(1))

    def select(self, keep: Tensor) -> None:
        """Keep the samples ``keep`` (a boolean mask) only."""
        self.w, self.sy, self.yy = self.w[keep], self.sy[keep], self.yy[keep]


def _lbfgs(
    front: nn.Module,
    x: Tensor,
    target: Tensor,
    target_norm: Tensor,
    recipe: IRIRecipe,
    gen: torch.Generator,
    memory_format: torch.memory_format,
    smooth: _SmoothReLUs | _NoSmooth,
) -> Tensor:
    """:func:`_optimise`'s IRIs with ``optimizer="lbfgs"`` (``x`` in ``memory_format``,
    its targets and their norms given): L-BFGS on each sample's own squared relative
    error, vectorised over the batch (each sample keeps its own curvature pairs, step and
    acceptance, so a sample's IRI does not depend on the others of its batch).

    Every step costs one forward and backward of the front, as Adam's do, plus three
    batched products over the ``(B, 2 * history, D)`` pair buffer (:class:`_Pairs`): a trial point
    whose error is not below its sample's last accepted one is rejected and the sample
    backs off to 0.3x the step along the same direction (after 6 rejections in a row its
    pairs are dropped and it takes a gradient step). A step's RMS over the sample's pixels
    is at most ``recipe.step_at(t)`` (the first step's is exactly that); pixels on the
    box's edge whose gradient points out of it are held; pairs whose curvature is not
    positive (the surrogate gradient is not an exact one) are skipped. Samples below the
    tolerance stop and leave the batch, with their state."""
    lo, hi = recipe.box
    shape = x.shape
    n, d = shape[0], x[0].numel()
    # the state is flat per sample in the inputs' physical order (channels-last: N, H, W, C),
    # so that going to and from the front's layout is a view, not a copy
    last = memory_format == torch.channels_last and x.dim() == 4
    perm = (0, 2, 3, 1) if last else tuple(range(x.dim()))
    inverse = (0, 3, 1, 2) if last else perm
    physical = [shape[i] for i in perm]

    def flat(t: Tensor) -> Tensor:
        return t.permute(*perm).reshape(-1, d)

    def image(v: Tensor) -> Tensor:
        return v.view(-1, *physical[1:]).permute(*inverse)

    x_try = flat(_start(x, recipe, gen).clamp(lo, hi).float()).contiguous()
    out = x_try.clone()  # each sample's best (last accepted) point; stopped samples' final
    pairs = _Pairs(n, d, recipe.history, x_try)
    rows = torch.arange(n, device=x.device)  # batch rows still optimised
    x_acc, g_acc = x_try.clone(), x_try.new_zeros(n, d)
    loss_acc = x_try.new_full((n,), float("inf"))
    direction, alpha = x_try.new_zeros(n, d), x_try.new_ones(n)
    gamma, rejects = x_try.new_zeros(n), torch.zeros(n, dtype=torch.long, device=x.device)
    tol2 = None if recipe.tolerance is None else recipe.tolerance**2
    bf16_until = _bf16_steps(recipe, x.device)
    exact_from = recipe.steps - recipe.exact_relu_steps  # smooth relus: exact from this step
    for t in range(recipe.steps):
        xi = image(x_try).detach().requires_grad_(True)
        smooth.step(rows, exact=t >= exact_from)
        with _precision(x.device, t < bf16_until):
            f = front(xi)
        err, g_out = _error_and_grad(f, target[rows], target_norm[rows])
        loss = err.square()  # the gradient of loss / 2 is that of err, times err
        g_out = g_out.mul_(err.view(-1, *[1] * (g_out.dim() - 1)).to(g_out.dtype))
        (g,) = torch.autograd.grad(f, xi, grad_outputs=g_out)
        g = flat(g.float().contiguous(memory_format=memory_format))
        with torch.no_grad():
            ok = loss <= loss_acc
            all_ok = bool(ok.all())
            s_k, y_k = x_try - x_acc, g - g_acc  # finite (a rejected sample's: unused)
            sy, yy = _dot(s_k, y_k), _dot(y_k, y_k)
            pair = ok & torch.isfinite(loss_acc) & (sy > 1e-10 * s_k.norm(dim=1) * yy.sqrt())
            gamma = torch.where(pair, sy.clamp_min(1e-30) / yy.clamp_min(1e-30), gamma)
            if all_ok:  # the usual case: no copies
                x_acc, g_acc, loss_acc = x_try, g, loss
            else:
                x_acc = torch.where(ok[:, None], x_try, x_acc)
                g_acc = torch.where(ok[:, None], g, g_acc)
                loss_acc = torch.where(ok, loss, loss_acc)
            rejects = torch.where(ok, 0, rejects + 1)
            reset = rejects >= 6
            if bool(reset.any()):  # a sample stuck on its pairs: drop them, a gradient step
                pairs.forget(reset)
                pair = pair & ~reset
                gamma[reset] = 0
                rejects[reset] = 0
            out_of_box = ((x_acc <= lo) & (g_acc > 0)) | ((x_acc >= hi) & (g_acc < 0))
            gp = g_acc.masked_fill(out_of_box, 0)
            wg = pairs.add(s_k, y_k, pair, gp)
            cap = recipe.step_at(t)
            fresh = gamma <= 0  # no pair yet: a gradient step of RMS ``cap``
            rms = gp.pow(2).mean(1).sqrt().clamp_min(1e-30)
            gamma = torch.where(fresh, cap / rms, gamma)
            new = pairs.apply(gp, wg, gamma).neg_()
            slope = _dot(new, gp)
            if bool((slope >= 0).any()):  # not a descent direction: the scaled gradient
                new = torch.where((slope >= 0)[:, None], -gamma[:, None] * gp, new)
            scale = (cap / new.pow(2).mean(1).sqrt().clamp_min(1e-30)).clamp(max=1.0)
            new.mul_(scale[:, None])
            if all_ok:
                direction, alpha = new, torch.ones_like(alpha)
            else:
                redo = ok | reset
                direction = torch.where(redo[:, None], new, direction)
                alpha = torch.where(redo, 1.0, alpha * 0.3)
            x_try = torch.addcmul(x_acc, direction, alpha[:, None]).clamp_(lo, hi)
            if tol2 is not None:
                done = loss_acc < tol2
                if bool(done.any()):  # stopped samples leave the batch with their state
                    out[rows[done]] = x_acc[done]
                    keep = ~done
                    rows = rows[keep]
                    if not len(rows):
                        break
                    x_try, x_acc, g_acc = x_try[keep], x_acc[keep], g_acc[keep]
                    loss_acc, direction, alpha = loss_acc[keep], direction[keep], alpha[keep]
                    gamma, rejects = gamma[keep], rejects[keep]
                    pairs.select(keep)
    if len(rows):
        out[rows] = x_acc
    return image(out).to(x.dtype)


@torch.no_grad()
def _measure(
    front: nn.Module,
    x: Tensor,
    x_adv: Tensor,
    target: Tensor,
    box: tuple[float, float],
    precision: str = "uint8",
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(quantised IRIs as stored, error after quantisation, error before, pixel RMS, null:
    the relative distance of the next image's representation in the batch)."""
    err_float = _per_sample_error(front(x_adv), target)
    q = quantise(x_adv, box, precision)
    deq = dequantise(q, box).to(x_adv.device, x_adv.dtype)
    err_q = _per_sample_error(front(deq), target)
    rms = (deq - x).flatten(1).pow(2).mean(1).sqrt() / (box[1] - box[0])
    if target.shape[0] >= 2:
        null = _per_sample_error(target.roll(-1, dims=0), target)
    else:
        null = torch.full((target.shape[0],), float("nan"), device=target.device)
    return q, err_q, err_float, rms, null


def _batch_generator(seed: int, start_index: int) -> torch.Generator:
    """Noise generator of the batch that starts at ``start_index``: independent of chunking
    history, so that an interrupted run and an uninterrupted one draw the same numbers."""
    return torch.Generator().manual_seed((seed * 1_000_003 + start_index) % (2**63))


def generate_iris(
    model: nn.Module,
    point: str,
    images: Tensor | DataLike,
    steps: int | None = None,
    step_size: float | None = None,
    seed: int = 0,
    *,
    device: str | torch.device | None = None,
    leaf_modules: tuple[type, ...] = (),
    output: int | str | None = None,
    **recipe,
) -> IRIResult:
    """IRIs of ``images`` for ``model`` cut at ``point``.

    Args:
        model: the front model (not modified; a frozen eval-mode copy of its prefix runs).
        point: the stitch point whose representation the IRIs must reproduce.
        images: a tensor ``(N, C, H, W)`` (or of another rank with a batch axis first,
            e.g. waveforms ``(N, C, T)``) in the box, or data as for :func:`stitch`.
        steps: number of optimisation steps (default: the recipe's, 200).
        step_size: (initial) step size in box units (default 0.1 for Adam; the paper's
            signed steps use 1/255 at 32x32: ``preset="paper"``).
        seed: seed of the noise start; the result is deterministic for a seed (on one
            machine and memory format: a convolutional front runs channels-last on the
            CPU, see :mod:`stitchlab._memory_format`, with its eval-mode BatchNorms folded
            into the convolutions, see :mod:`stitchlab._batchnorm`; both change only the
            rounding).
        device: where to run (default: the model's device).
        leaf_modules: module classes not to trace into (see :func:`stitchlab.split`).
        output: which element of ``model``'s output is the logits (tuple/dict outputs).
        **recipe: further :class:`IRIRecipe` fields (optimizer, start, start_scale,
            tolerance, box, precision, final_step_size, batch_size, amp) or ``preset``.

    Returns:
        :class:`IRIResult` with IRIs quantised to the recipe's storage precision (uint8
        levels by default, as stored) and, per IRI, the achieved relative error after
        quantisation and the pixel distance.
    """
    given = {k: v for k, v in (("steps", steps), ("step_size", step_size)) if v is not None}
    rec = IRIRecipe.from_kwargs(**given, **recipe)
    dev = torch.device(device) if device is not None else _module_device(model)
    front = _recipe_front(model, point, leaf_modules, output, rec).to(dev)
    if isinstance(images, Tensor):
        _check_images(images, rec.box)
        sources = [images]
    else:
        dataset, _ = as_dataset(images, "images")
        sources = [x for x, _ in batches(dataset, rec.batch_size, torch.device("cpu"))]
        sources = [torch.cat(sources)]
    out = []
    x_all = sources[0]
    fmt = torch.contiguous_format
    if len(x_all):  # BatchNorm folded, then the memory format: each from a trial on two sources
        trial = x_all[:2].to(dev)
        rec = rec.for_front(front, trial)
        front, _ = folded(front, trial)
        fmt = memory_format_for(front, trial)
    for i in range(0, x_all.shape[0], rec.batch_size):
        x = x_all[i : i + rec.batch_size].to(dev)
        out.append(_run_batch(front, x, rec, seed, i, fmt))
    return IRIResult(
        iris=dequantise(torch.cat([o[0] for o in out]), rec.box),
        rel_error=torch.cat([o[1] for o in out]),
        rel_error_float=torch.cat([o[2] for o in out]),
        pixel_rms=torch.cat([o[3] for o in out]),
        null_error=torch.cat([o[4] for o in out]),
        precision=rec.precision,
    )


def _check_images(images: Tensor, box: tuple[float, float]) -> None:
    if images.dim() < 2 or not images.is_floating_point():
        raise ValueError(
            f"images must be a float tensor with a batch axis first ((N, C, H, W) images, "
            f"(N, C, T) waveforms); got {tuple(images.shape)} {images.dtype}."
        )
    check_images(images, "images")
    lo, hi = box
    if float(images.min()) < lo - 1e-4 or float(images.max()) > hi + 1e-4:
        raise ValueError(
            f"images lie outside the box {box} (min {float(images.min()):.3f}, max "
            f"{float(images.max()):.3f}); pass box=(low, high) for normalised inputs."
        )


def _run_batch(
    front, x, rec: IRIRecipe, seed: int, start: int, memory_format=torch.contiguous_format
):
    gen = _batch_generator(seed, start)
    x_adv, target = _optimise(front, x, rec, gen, memory_format)
    q, err_q, err_f, rms, null = _measure(front, x, x_adv, target, rec.box, rec.precision)
    return q.cpu().contiguous(), err_q.cpu(), err_f.cpu(), rms.cpu(), null.cpu()



# ---------------------------------------------------------------------------
# Stored IRI sets


def _hash_tensor(h, t: Tensor) -> None:
    t = t.detach().cpu().contiguous().reshape(-1)
    h.update(str(t.dtype).encode())
    h.update(str(t.numel()).encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def model_fingerprint(module: nn.Module) -> str:
    """SHA-256 of a module's parameters and buffers (names, shapes, values)."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        _hash_tensor(h, t)
    return h.hexdigest()


def data_fingerprint(dataset: Dataset, batch_size: int = 512) -> str:
    """SHA-256 of every ``(image, label)`` of a data set, streamed."""
    h = hashlib.sha256()
    for x, y in batches(dataset, batch_size, torch.device("cpu")):
        _hash_tensor(h, x.float())
        _hash_tensor(h, y.long())
    return h.hexdigest()


class IRISet(Dataset):
    """A stored IRI set: ``(iri, source label)`` items read chunk by chunk from disk."""

    def __init__(
        self, root: str | Path, threshold: float = THRESHOLD, min_null_ratio: float = MIN_NULL_RATIO
    ) -> None:
        self.root = Path(root)
        meta_path = self.root / "meta.json"
        if not meta_path.exists():
            raise IRIError(f"{self.root} holds no IRI set (no meta.json).")
        try:
            self.meta = read_json(meta_path)
        except DamagedEntry as exc:
            raise IRIError(
                f"The IRI set's metadata {meta_path} is damaged ({exc.why}); run "
                "generate_iris_set (or the experiment) again to regenerate the set."
            ) from None
        if not self.meta.get("complete"):
            raise IRIError(
                f"The IRI set in {self.root} is incomplete; run generate_iris_set again to "
                "resume it."
            )
        try:
            self.chunk_size = int(self.meta["chunk_size"])
            self.n = int(self.meta["n"])
            self.box = tuple(float(v) for v in self.meta["recipe"]["box"])
            self.precision = str(self.meta["recipe"].get("precision", "uint8"))
            if self.chunk_size < 1 or self.n < 1 or len(self.box) != 2:
                raise ValueError("chunk_size and n must be >= 1, box two numbers")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IRIError(
                f"The IRI set's metadata {meta_path} is not what generate_iris_set writes "
                f"({type(exc).__name__}: {exc}); run it again to regenerate the set."
            ) from None
        self._cached: tuple[int, dict[str, Tensor]] | None = None
        stats = [self._chunk(i) for i in range(self.num_chunks)]
        self.rel_error = torch.cat([s["rel_error"] for s in stats])
        self.pixel_rms = torch.cat([s["pixel_rms"] for s in stats])
        self.labels = torch.cat([s["labels"] for s in stats])
        if not len(self.labels) == len(self.rel_error) == self.n:
            raise IRIError(
                f"The IRI set in {self.root} holds {len(self.labels)} IRIs where its metadata "
                f"says {self.n}; run generate_iris_set again to regenerate the set."
            )
        self.null_error = (
            torch.cat([s["null_error"] for s in stats])
            if all("null_error" in s for s in stats)
            else None
        )
        self.quality = IRIQuality.of(
            self.rel_error,
            self.pixel_rms,
            threshold,
            self.null_error,
            min_null_ratio,
            self.precision,
        )

    @property
    def num_chunks(self) -> int:
        """Number of chunk files."""
        return math.ceil(self.n / self.chunk_size)

    def _chunk(self, i: int) -> dict[str, Tensor]:
        if self._cached is not None and self._cached[0] == i:
            return self._cached[1]
        path = self.root / f"chunk_{i:05d}.safetensors"
        data = _load_chunk(path, self.meta["chunks"].get(str(i)))
        if data is None:
            raise IRIError(
                f"IRI chunk {path} is missing or damaged (checksum mismatch); run "
                "generate_iris_set again to regenerate it."
            )
        self._cached = (i, data)
        return data

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        if index < 0:
            index += self.n
        if not 0 <= index < self.n:
            raise IndexError(index)
        c = self._chunk(index // self.chunk_size)
        j = index % self.chunk_size
        return dequantise(c["iris"][j], self.box), int(c["labels"][j])

    def images(self) -> Tensor:
        """All IRIs as one float tensor (loads every chunk)."""
        return torch.cat(
            [dequantise(self._chunk(i)["iris"], self.box) for i in range(self.num_chunks)]
        )


def _load_chunk(path: Path, expected_sha: str | None) -> dict[str, Tensor] | None:
    from safetensors.torch import load_file

    if not path.exists() or expected_sha is None:
        return None
    if file_sha256(path) != expected_sha:
        return None
    try:
        return load_file(str(path))
    except Exception:
        return None


def generate_iris_set(
    model: nn.Module,
    point: str,
    data: DataLike,
    cache_dir: str | Path,
    *,
    seed: int = 0,
    chunk_size: int = 1024,
    threshold: float = THRESHOLD,
    min_null_ratio: float = MIN_NULL_RATIO,
    data_key: str | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    on_chunk: Callable[[int, int], None] | None = None,
    leaf_modules: tuple[type, ...] = (),
    output: int | str | None = None,
    **recipe,
) -> IRISet:
    """Generate (or reuse, or resume) the IRI set of ``data`` for ``model`` at ``point``.

    The set lives in ``cache_dir/<key>/`` where the key hashes the front prefix's weights,
    the point, the source data (or ``data_key``), the seed, the chunk size and the recipe.
    Chunks are written atomically with a checksum; a rerun skips finished chunks and
    regenerates missing or damaged ones, so an interrupted run finishes with the same
    bytes as an uninterrupted one. Memory does not grow with the data set size.

    ``on_chunk(i, num_chunks)`` is called after each finished chunk (progress, tests);
    ``leaf_modules`` and ``output`` say how to trace ``model`` (see :func:`stitchlab.split`).
    Returns the :class:`IRISet`; a set whose median error exceeds ``threshold``, or that is
    less than ``min_null_ratio`` times closer to its sources' representations than another
    real image is, is flagged (a warning here; :func:`stitchlab.stitch` refuses it unless
    told otherwise).
    """
    rec, dataset, front, dev, key_parts, key = _iris_set_key(
        model, point, data, seed, chunk_size, data_key, device, leaf_modules, output, recipe
    )
    root = Path(cache_dir) / key
    root.mkdir(parents=True, exist_ok=True)
    with lock(root / ".lock", f"the IRI set {root}"):  # a second process waits, then reuses
        return _fill_iris_set(
            root, key, key_parts, dataset, front, rec, seed, chunk_size, dev, progress,
            on_chunk, point, threshold, min_null_ratio,
        )  # fmt: skip


def _iris_set_key(
    model: nn.Module, point: str, data: DataLike, seed: int, chunk_size: int,
    data_key: str | None, device: str | torch.device | None, leaf_modules: tuple[type, ...],
    output: int | str | None, recipe: dict[str, Any],
) -> tuple[IRIRecipe, Dataset, nn.Module, torch.device, dict[str, Any], str]:  # fmt: skip
    """What :func:`generate_iris_set` keys a set by: the resolved recipe, the dataset, the
    front prefix, the device, the key's parts and the key."""
    rec = IRIRecipe.from_kwargs(**recipe)
    if chunk_size % rec.batch_size and chunk_size > rec.batch_size:
        raise ValueError(
            f"chunk_size ({chunk_size}) must be a multiple of the batch size ({rec.batch_size})"
        )
    dataset, _ = as_dataset(data, "data")
    dev = torch.device(device) if device is not None else _module_device(model)
    front = _recipe_front(model, point, leaf_modules, output, rec)
    if len(dataset):  # "auto" resolved against the front, so the key names what runs
        rec = rec.for_front(front, dataset[0][0].unsqueeze(0), dev)
    key_parts = {
        "format": FORMAT_VERSION,
        "front": model_fingerprint(front),
        "point": point,
        "data": data_key or data_fingerprint(dataset),
        "n": len(dataset),
        "seed": seed,
        "chunk_size": chunk_size,
        "recipe": rec.key_dict(),
    }
    key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:24]
    return rec, dataset, front, dev, key_parts, key


def iris_set_stored(
    model: nn.Module, point: str, data: DataLike, cache_dir: str | Path, **options: Any
) -> bool:
    """Whether :func:`generate_iris_set` with these arguments (``options``: its keywords
    and the recipe's fields) would find its set complete in ``cache_dir`` (its chunks are
    not verified here; generating does that). For plans and time estimates: nothing is
    generated or written."""
    import inspect

    params = inspect.signature(generate_iris_set).parameters
    kw = {n: p.default for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    recipe = {k: v for k, v in options.items() if k not in kw}
    kw.update({k: v for k, v in options.items() if k in kw})
    *_, key = _iris_set_key(
        model, point, data, kw["seed"], kw["chunk_size"], kw["data_key"], kw["device"],
        kw["leaf_modules"], kw["output"], recipe,
    )  # fmt: skip
    try:
        meta = read_json(Path(cache_dir) / key / "meta.json")
    except (FileNotFoundError, DamagedEntry):
        return False
    return meta.get("key") == key and bool(meta.get("complete"))


def _fill_iris_set(
    root: Path, key: str, key_parts: dict, dataset: Dataset, front: nn.Module,
    rec: IRIRecipe, seed: int, chunk_size: int, dev: torch.device, progress: bool,
    on_chunk: Callable[[int, int], None] | None, point: str, threshold: float,
    min_null_ratio: float,
) -> IRISet:  # fmt: skip
    from safetensors.torch import save_file

    meta_path = root / "meta.json"
    meta = None
    if meta_path.exists():
        try:
            meta = read_json(meta_path)
        except DamagedEntry as exc:
            warnings.warn(
                f"IRI metadata {meta_path} is damaged ({exc.why}); regenerating the set.",
                stacklevel=3,
            )
    if meta is None or meta.get("key") != key:
        meta = {**key_parts, "key": key, "chunks": {}, "complete": False}
        write_json(meta_path, meta)
    n = len(dataset)
    num_chunks = math.ceil(n / chunk_size)
    front = front.to(dev)
    fmt = None  # the front's memory format, chosen on the first batch that is generated
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_chunks, desc=f"IRIs {point}", leave=False)
    for c in range(num_chunks):
        path = root / f"chunk_{c:05d}.safetensors"
        expected = meta["chunks"].get(str(c))
        if expected is not None and path.exists() and file_sha256(path) == expected:
            if bar is not None:
                bar.update(1)
            continue
        if expected is not None:
            warnings.warn(f"IRI chunk {path} is damaged; regenerating it.", stacklevel=3)
        lo_i, hi_i = c * chunk_size, min(n, (c + 1) * chunk_size)
        subset = torch.utils.data.Subset(dataset, range(lo_i, hi_i))
        parts = []
        offset = lo_i
        for x, y in batches(subset, rec.batch_size, dev):
            _check_images(x, rec.box)  # outside the box they would be silently clamped
            if fmt is None:  # BatchNorm folded, and channels-last (in place) where chosen
                front, meta["batchnorm_folded"] = folded(front, x)
                fmt = memory_format_for(front, x)
                cl = fmt == torch.channels_last
                meta["memory_format"] = "channels_last" if cl else "contiguous"
            q, err_q, err_f, rms, null = _run_batch(front, x, rec, seed, offset, fmt)
            parts.append((q, y.cpu().long(), err_q, err_f, rms, null))
            offset += x.shape[0]
        tensors = {
            "iris": torch.cat([p[0] for p in parts]).contiguous(),
            "labels": torch.cat([p[1] for p in parts]).contiguous(),
            "rel_error": torch.cat([p[2] for p in parts]).float().contiguous(),
            "rel_error_float": torch.cat([p[3] for p in parts]).float().contiguous(),
            "pixel_rms": torch.cat([p[4] for p in parts]).float().contiguous(),
            "null_error": torch.cat([p[5] for p in parts]).float().contiguous(),
        }
        atomic_write(path, lambda p, t=tensors: save_file(t, p))
        meta["chunks"][str(c)] = file_sha256(path)
        write_json(meta_path, meta)
        if bar is not None:
            bar.update(1)
        if on_chunk is not None:
            on_chunk(c, num_chunks)
    if bar is not None:
        bar.close()
    meta["complete"] = True
    write_json(meta_path, meta)
    result = IRISet(root, threshold, min_null_ratio)
    if result.quality.flagged:
        warnings.warn(str(result.quality), stacklevel=3)
    return result


def clear_cache(cache_dir: str | Path) -> None:
    """Remove every stored IRI set under ``cache_dir``."""
    shutil.rmtree(cache_dir, ignore_errors=True)
