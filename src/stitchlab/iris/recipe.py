"""The IRI recipe: every setting of the optimisation, checked, resolved against a front,
described and keyed."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from .._data import check_options
from .coordinates import _FirstLayer
from .front import AFFINE_RULE, affine_front
from .presets import PRESETS
from .smooth import _smooth_relus_of

#: Under ``exact_relu_mismatch``, every this many smooth steps the inner ReLUs' states are
#: compared with the sources' (one comparison per inner ReLU in that step's forward).
MISMATCH_EVERY = 10

#: Adam's second-moment decay (its first moment's is 0.9).
ADAM_BETA2 = 0.95

#: Presets and options that earlier versions had, with what to do instead (a clear error,
#: never a silently different recipe).
REMOVED_PRESETS = ("v1", "v2", "v3", "v4", "v5", "v6", "v7", "audio-v1")
REMOVED_VALUES = {
    ("optimizer", "lbfgs"): "per-sample L-BFGS", ("optimizer", "l2"): "L2 steps",
    ("relu_grad", "surrogate"): "the surrogate ReLU gradient",
    ("relu_grad", "straight_through"): "the straight-through final ReLU alone",
    ("start", "blur"): "the blurred source as the start",
    ("amp", "fast"): "bfloat16 on CPUs with AMX, slower than float32 at attention and "
                     "depthwise fronts (docs/iri_zoo.md, run 6); amp='auto' is bfloat16 "
                     "on CUDA and float32 on every CPU",
}  # fmt: skip
REMOVED_OPTIONS = {
    "relu_slope": "the surrogate ReLU gradient",
    "history": "per-sample L-BFGS",
    "colour_basis": "Adam in an opponent colour basis",
    "polyak_fronts": "the Polyak cap on every front (it applies to affine fronts)",
    "adam_beta2": "Adam's second-moment decay (fixed at 0.95)",
    "drop_outward_momentum": "keeping momentum that points out of the box (always dropped)",
}


@dataclass(frozen=True)
class IRIRecipe:
    """How IRIs are optimised (docs/recipes.md).

    The defaults are stitchlab's recipe, chosen on the IRI zoo (docs/iri_zoo.md): 270 Adam
    steps (second-moment decay 0.95; momentum that pushes a pixel out of the box is
    dropped) whose size decays geometrically from ``step_size`` 0.1 to
    ``final_step_size`` 0.01 (box units), from uniform noise over the box (``start``).

    * ``amp``: the steps' arithmetic. ``"auto"`` is bfloat16 autocast on CUDA and float32
      on every other device (every CPU runs the same arithmetic), resolved when IRIs
      are made (a stored set's key names ``"bf16"`` or ``"off"``); ``"bf16"`` always;
      ``"off"`` never. The last
      ``float32_steps`` steps of a batch run in float32 whatever ``amp`` says, and all the
      rest once the batch's median error is below ``float32_below`` (a bfloat16 forward
      cannot measure errors much below 0.01). Targets, measured errors and stored IRIs are
      float32 always.
    * ``precondition``: Adam's coordinates. ``"first_layer"`` whitens them by the
      front's first convolution (:class:`~stitchlab.iris.coordinates._FirstLayer`), where
      the input goes straight into an ``nn.Conv2d`` of stride 1 and one group; ``"auto"``
      resolves to it there and to ``"none"`` (the inputs' own coordinates) elsewhere.
      ``stft_window=n`` runs Adam in short-time Fourier coordinates of ``(N, C, T)``
      signals instead (sqrt-Hann window of ``n`` samples, hop ``n / 2``).
    * ``relu_grad``: ``"smooth"`` backpropagates straight through a ReLU that ends the
      front and smoothly through its inner ReLUs, saturating nonlinearities (ReLU6,
      Hardtanh, Hardsigmoid, Hardswish modules) and max-pooling of non-overlapping windows
      (:mod:`stitchlab.iris.smooth`; widths ``relu_width`` x the source's spread, slopes at
      least ``relu_floor``), except in the last ``exact_relu_steps`` steps and in all steps
      after a check (every :data:`MISMATCH_EVERY` smooth steps) at which at most
      ``exact_relu_mismatch`` of every inner ReLU's units differ in state from the
      source's; there they take the exact gradient. ``"exact"`` is the exact gradient
      throughout. The forward pass, and so every reported error, is always exact.
    * ``tolerance``: a sample stops once its relative error is below it, keeping the
      iterate that met it (``keep_converged``; False: it also takes that step).
    * ``polyak``: on a front that is affine up to its final ReLU (:func:`affine_front`)
      each sample's step is at most this fraction of its Polyak step ``err / <grad,
      step>``.
    * ``precision``: how IRIs are stored and so measured: ``"uint8"`` (255 steps over the
      box), ``"int16"`` (65535) or ``"float32"``. ``start``: ``"noise"`` (uniform over the
      box), ``"scaled_noise"`` (Gaussian of sd ``start_scale`` around the box centre) or
      ``"image"`` (another source of the batch).

    ``preset="paper"`` (:meth:`paper`) is docs/method.md section 3 exactly: 200 signed steps of
    1/255 from uniform noise, the exact gradient, no early stop, float32 on every device.
    ``preset="audio"`` is the recipe for waveforms (:mod:`stitchlab.iris.presets`).
    """

    steps: int = 270
    step_size: float = 0.1
    final_step_size: float | None = 0.01  # geometric decay to this size (None: constant)
    optimizer: Literal["sign", "adam"] = "adam"
    start: Literal["noise", "image", "scaled_noise"] = "noise"  # image: another source
    tolerance: float | None = 0.01  # a sample stops once its relative error is below
    keep_converged: bool = True  # a sample that meets the tolerance keeps that iterate
    box: tuple[float, float] = (0.0, 1.0)
    batch_size: int = 128
    amp: Literal["auto", "off", "bf16"] = "auto"
    relu_grad: Literal["exact", "smooth"] = "smooth"
    relu_width: float = 0.3  # under relu_grad="smooth": sigmoid width / source's sd
    relu_floor: float = 0.05  # under relu_grad="smooth": the least backward slope
    exact_relu_steps: int = 90  # the last steps of a batch take the exact gradient
    exact_relu_mismatch: float | None = 0.1  # ... and all after states agree (None: never)
    start_scale: float = 0.003  # standard deviation of the "scaled_noise" start
    precision: Literal["uint8", "int16", "float32"] = "uint8"  # storage of the IRIs
    stft_window: int = 0  # > 0: Adam's coordinates for (N, C, T) inputs, an STFT of this window
    precondition: Literal["auto", "first_layer", "none"] = "auto"
    float32_steps: int = 30  # the last steps of a batch run in float32 when amp is on
    float32_below: float | None = 0.02  # and all the rest once the batch's median is below
    polyak: float | None = 0.3  # on affine fronts: each step at most this x its Polyak step

    def __post_init__(self) -> None:
        if (self.optimizer != "adam" or self.stft_window) and self.precondition == "auto":
            object.__setattr__(self, "precondition", "none")  # the coordinates are Adam's

    def for_front(
        self, front: nn.Module, example: Tensor, device: torch.device | None = None
    ) -> IRIRecipe:
        """This recipe resolved for ``front``, inputs like ``example`` (a batch) and
        ``device`` (default: the example's): ``amp="auto"`` becomes ``"bf16"`` on CUDA,
        ``"off"`` elsewhere; ``precondition="auto"`` becomes
        ``"first_layer"`` where the front's first layer can be whitened, ``"none"``
        elsewhere; ``polyak`` becomes None where :meth:`caps_steps` says no;
        ``exact_relu_mismatch`` becomes None on a front without inner smooth
        nonlinearities. So a stored set's key says what ran. A ValueError for
        ``"first_layer"`` asked of a front it does not apply to."""
        rec = self
        if rec.amp == "auto":
            cuda = (device if device is not None else example.device).type == "cuda"
            rec = dataclasses.replace(rec, amp="bf16" if cuda else "off")
        if not rec.caps_steps(front):
            rec = dataclasses.replace(rec, polyak=None)
        if rec.exact_relu_mismatch is not None and (
            not rec.switches_on_states() or _smooth_relus_of(front) is None
        ):
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
        """Whether this recipe switches the inner nonlinearities to the exact gradient once
        their states agree with the sources' (``exact_relu_mismatch`` set, the smooth
        gradient)."""
        return self.exact_relu_mismatch is not None and self.relu_grad == "smooth"

    def caps_steps(self, front: nn.Module) -> bool:
        """Whether this recipe's steps on ``front`` are capped by ``polyak``: a cap is
        set and the front is affine up to a straight-through final ReLU
        (:func:`affine_front`)."""
        return self.polyak is not None and affine_front(front)

    @classmethod
    def paper(cls, **overrides) -> IRIRecipe:
        """docs/method.md section 3: 200 signed steps of 1/255 from uniform noise, no early stop,
        the exact ReLU gradient, float32 (for exact reproduction of the paper)."""
        return cls.from_kwargs(preset="paper", **overrides)

    def validate(self) -> None:
        """Raise a ValueError (a TypeError for a wrong type) naming the first bad field."""
        from .._checks import check_field_types

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
        if self.precondition == "first_layer" and (self.optimizer != "adam" or self.stft_window):
            other = (f"optimizer={self.optimizer!r}" if self.optimizer != "adam"
                     else f"stft_window={self.stft_window}")  # fmt: skip
            raise ValueError(
                f"precondition='first_layer' sets Adam's coordinates, which {other} sets "
                f"otherwise; add precondition='none' to use {other}"
            )
        if not self.start_scale > 0:
            raise ValueError(f"start_scale must be positive, got {self.start_scale}")
        lo, hi = self.box
        if not hi > lo:
            raise ValueError(f"box must be (low, high) with high > low, got {self.box}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0 <= self.float32_steps:
            raise ValueError(f"float32_steps must be >= 0, got {self.float32_steps}")
        if self.polyak is not None and not 0 < self.polyak <= 1:
            raise ValueError(f"polyak must be in (0, 1] or None, got {self.polyak}")
        if self.float32_below is not None and not self.float32_below > 0:
            raise ValueError(f"float32_below must be positive or None, got {self.float32_below}")
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

    def step_at(self, t: int) -> float:
        """The step size of step ``t`` (0-based)."""
        if self.final_step_size is None or self.steps <= 1:
            return self.step_size
        ratio = self.final_step_size / self.step_size
        return self.step_size * ratio ** (t / (self.steps - 1))

    @classmethod
    def from_kwargs(cls, **kwargs) -> IRIRecipe:
        """Build and validate; an unknown option is an error listing the valid ones.

        ``preset`` (``"default"``, ``"paper"`` or ``"audio"``) gives the starting fields;
        the other options override the preset's."""
        preset = kwargs.pop("preset", "default")
        if preset in REMOVED_PRESETS:
            raise ValueError(
                f"IRI preset {preset!r} was an earlier default and has been removed; use "
                f"one of {sorted(PRESETS)}. A page measured with it names the stitchlab "
                "commit that reproduces it (docs/recipes.md)."
            )
        if preset not in PRESETS:
            raise ValueError(f"IRI preset must be one of {sorted(PRESETS)}, got {preset!r}")
        gone = sorted(k for k in kwargs if k in REMOVED_OPTIONS)
        if gone:
            raise TypeError(
                f"IRI option {gone[0]!r} ({REMOVED_OPTIONS[gone[0]]}) has been removed; "
                "leave it out (docs/recipes.md)."
            )
        for (name, value), what in REMOVED_VALUES.items():
            if kwargs.get(name) == value:
                raise ValueError(
                    f"IRI option {name}={value!r} ({what}) has been removed; use the default "
                    "recipe or preset='paper' (docs/recipes.md)."
                )
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
        """One line for reports, e.g. "270 adam steps 0.1 -> 0.01 (beta2 0.95, ...) from
        uniform noise over the box, ReLU gradient smooth inside (...), ..., stored as
        uint8". Invariance-aware scores depend on the whole recipe, so a score is reported
        with it."""
        from ..vocabulary import describe_iri_recipe

        return describe_iri_recipe(self.as_dict())

    def key_dict(self) -> dict:
        """The fields that name a stored IRI set (:func:`generate_iris_set`'s key): all of
        :meth:`as_dict`, and with a Polyak cap ``affine_rule`` (:data:`AFFINE_RULE`, the
        version of :func:`affine_front`'s rule)."""
        d = self.as_dict()
        if d["polyak"] is not None:
            d["affine_rule"] = AFFINE_RULE
        return d


def uses_bf16(recipe: IRIRecipe, device: torch.device) -> bool:
    """Whether ``recipe``'s steps (but its last ``float32_steps``) run under bfloat16
    autocast on ``device``."""
    return recipe.amp == "bf16" or (recipe.amp == "auto" and device.type == "cuda")
