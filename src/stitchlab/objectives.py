"""The four stitching objectives (docs/method.md section 2), one signature for all.

Every objective is called as ``objective(outputs, targets)`` where

* ``outputs`` is a :class:`StitchOutputs`: the stitched logits (``None`` when the
  objective does not need the back suffix to run) and the activations inside the
  stitched model keyed by back-model point (the stitch point itself included);
* ``targets`` is a dict: ``"labels"``, ``"logits"`` (the back model's own logits) and
  one entry per back-model point (its own activations), all on the same inputs.

Each objective says what it needs, so that the training loop caches and runs only that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "StitchOutputs",
    "Objective",
    "HLM",
    "SLM",
    "DM",
    "FuLA",
    "relative_error",
    "make_objective",
    "OBJECTIVES",
]


@dataclass
class StitchOutputs:
    """What the stitched model produced for one batch."""

    logits: Tensor | None
    activations: dict[str, Tensor] = field(default_factory=dict)


def relative_error(a: Tensor, b: Tensor) -> Tensor:
    """``||a - b||_F / ||b||_F`` over the whole batch tensor (not squared)."""
    return torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-12)


class Objective:
    """Base class: what an objective reads (``target_keys``) and whether the back
    suffix must run after the stitch layer (``needs_back``)."""

    name: str = ""

    @property
    def needs_back(self) -> bool:
        """True when the loss reads logits or activations after the stitch point."""
        return True

    def bind(self, point: str, later: Sequence[str]) -> Objective:
        """Fix the back-model stitch point and its later points; returns self."""
        self.point = point
        self.later = list(later)
        return self

    @property
    def taps(self) -> list[str]:
        """Later back-model points whose activations the stitched forward must return."""
        return []

    @property
    def target_keys(self) -> list[str]:
        """The keys of ``targets`` this objective reads."""
        raise NotImplementedError

    def __call__(self, outputs: StitchOutputs, targets: dict[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class HLM(Objective):
    """Hard label matching: cross-entropy with the data set's labels."""

    name = "hlm"

    @property
    def target_keys(self) -> list[str]:  # noqa: D102
        return ["labels"]

    def __call__(self, outputs: StitchOutputs, targets: dict[str, Tensor]) -> Tensor:  # noqa: D102
        return F.cross_entropy(outputs.logits, targets["labels"])


class SLM(Objective):
    """Soft label matching: ``KL(softmax(g/T) || softmax(s/T))``, batch mean."""

    name = "slm"

    def __init__(self, temperature: float = 1.0) -> None:
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"SLM temperature must be finite and positive, got {temperature}.")
        self.temperature = temperature

    @property
    def target_keys(self) -> list[str]:  # noqa: D102
        return ["logits"]

    def __call__(self, outputs: StitchOutputs, targets: dict[str, Tensor]) -> Tensor:  # noqa: D102
        t = self.temperature
        log_s = F.log_softmax(outputs.logits / t, dim=1)
        log_g = F.log_softmax(targets["logits"] / t, dim=1)
        return F.kl_div(log_s, log_g, reduction="batchmean", log_target=True)

    def __repr__(self) -> str:
        return f"SLM(temperature={self.temperature})"


class DM(Objective):
    """Direct matching: relative Frobenius error at the stitch point."""

    name = "dm"

    @property
    def needs_back(self) -> bool:  # noqa: D102
        return False

    @property
    def target_keys(self) -> list[str]:  # noqa: D102
        return [self.point]

    def __call__(self, outputs: StitchOutputs, targets: dict[str, Tensor]) -> Tensor:  # noqa: D102
        return relative_error(outputs.activations[self.point], targets[self.point])


class FuLA(Objective):
    """Functional latent alignment: weighted mean of relative errors at the stitch point
    and at later back-model points (default: every later stitch point, uniform)."""

    name = "fula"

    @property
    def needs_back(self) -> bool:  # noqa: D102
        return bool(self.chosen)  # at the last point FuLA equals DM

    def __init__(
        self, points: Sequence[str] | None = None, weights: Sequence[float] | None = None
    ) -> None:
        self.points = None if points is None else list(points)
        self.weights = None if weights is None else [float(w) for w in weights]
        w = self.weights
        if w is not None and not (all(math.isfinite(x) and x >= 0 for x in w) and sum(w) > 0):
            raise ValueError(
                f"FuLA weights must be finite, >= 0 and not all 0, got {self.weights}."
            )

    def bind(self, point: str, later: Sequence[str]) -> Objective:  # noqa: D102
        super().bind(point, later)
        chosen = list(later) if self.points is None else [p for p in self.points if p != point]
        unknown = [p for p in chosen if p not in later]
        if unknown:
            raise ValueError(
                f"FuLA points {unknown} are not later stitch points of the back model after "
                f"{point!r}; choose from {list(later)}."
            )
        self.chosen = chosen
        n = len(chosen) + 1
        w = self.weights if self.weights is not None else [1.0] * n
        if len(w) != n:
            raise ValueError(
                f"FuLA needs {n} weights (the stitch point and {chosen}), got {len(w)}."
            )
        total = sum(w)
        self.normalised = [x / total for x in w]
        return self

    @property
    def taps(self) -> list[str]:  # noqa: D102
        return list(self.chosen)

    @property
    def target_keys(self) -> list[str]:  # noqa: D102
        return [self.point, *self.chosen]

    def __call__(self, outputs: StitchOutputs, targets: dict[str, Tensor]) -> Tensor:  # noqa: D102
        keys = [self.point, *self.chosen]
        return sum(
            w * relative_error(outputs.activations[k], targets[k])
            for w, k in zip(self.normalised, keys)
        )

    def __repr__(self) -> str:
        return f"FuLA(points={self.points}, weights={self.weights})"


OBJECTIVES = {"hlm": HLM, "slm": SLM, "dm": DM, "fula": FuLA}


def make_objective(objective: str | Objective, **options) -> Objective:
    """An objective from its name (``hlm``, ``slm``, ``dm``, ``fula``) or as given."""
    if isinstance(objective, Objective):
        return objective
    key = str(objective).lower()
    if key not in OBJECTIVES:
        raise ValueError(f"Unknown objective {objective!r}; choose one of {sorted(OBJECTIVES)}.")
    return OBJECTIVES[key](**options)
