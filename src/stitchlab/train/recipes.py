"""Training recipes: the paper's base-model recipe by default, everything overridable."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..vocabulary import METHODS, PGD_TRAIN

__all__ = ["Recipe", "paper_recipe", "fast_recipe", "METHODS"]

#: standard (also shortcut training: standard on marked data), adversarial, simclr


@dataclass(frozen=True)
class Recipe:
    """How to train a base model. The defaults are the paper's ResNet-18 recipe
    (docs/method.md section 5); see :func:`paper_recipe` and :func:`fast_recipe`.

    ``milestones`` are fractions of ``epochs`` (rounded): (0.33, 0.665) of 200 epochs are
    the paper's epochs 66 and 133. ``amp`` and ``channels_last`` default to on for a GPU
    and off otherwise. Adversarial training attacks a random ``adv_fraction`` of each batch
    with PGD (``adv_steps`` steps of ``adv_step``, L-inf radius ``adv_eps``). SimCLR
    trains the backbone for ``epochs`` with InfoNCE at ``temperature`` through a projector
    Linear(d, ``projection_hidden``)-ReLU-Linear(``projection_dim``), then a linear
    classifier on frozen features for ``linear_epochs`` (AdamW, ``linear_lr``).
    """

    method: str = "standard"
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 1e-4
    epochs: int = 200
    schedule: str = "step"
    milestones: tuple[float, ...] = (0.33, 0.665)
    gamma: float = 0.1
    batch_size: int = 128
    augment: bool = True
    adv_eps: float = PGD_TRAIN["eps"]
    adv_step: float = PGD_TRAIN["step"]
    adv_steps: int = PGD_TRAIN["steps"]
    adv_fraction: float = 0.5
    temperature: float = 0.5
    projection_hidden: int = 1024
    projection_dim: int = 128
    linear_epochs: int = 100
    linear_lr: float = 1e-2
    amp: bool | None = None
    channels_last: bool | None = None
    num_workers: int = 0

    def __post_init__(self) -> None:
        from .._checks import check_field_types

        check_field_types(self, "recipe")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.optimizer not in ("sgd", "adamw"):
            raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {self.optimizer!r}")
        if self.schedule not in ("step", "onecycle", "cosine", "constant"):
            raise ValueError(
                f"schedule must be step, onecycle, cosine or constant, got {self.schedule!r}"
            )
        for name in ("epochs", "batch_size", "adv_steps", "projection_hidden", "projection_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.adv_fraction <= 1:
            raise ValueError(f"adv_fraction must be in [0, 1], got {self.adv_fraction}")
        if any(not 0 < m < 1 for m in self.milestones):
            raise ValueError(
                f"milestones are fractions of the epochs in (0, 1), got {self.milestones}"
            )
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        object.__setattr__(self, "milestones", tuple(float(m) for m in self.milestones))

    def replace(self, **changes: Any) -> Recipe:
        """A copy with ``changes``; unknown names are refused with the valid ones listed."""
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - valid)
        if unknown:
            raise TypeError(
                f"Unknown recipe option(s) {', '.join(unknown)}. Valid: {', '.join(sorted(valid))}"
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The recipe as a JSON-friendly dict."""
        d = dataclasses.asdict(self)
        d["milestones"] = list(self.milestones)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recipe:
        """Inverse of :meth:`to_dict` (unknown keys are refused)."""
        d = dict(d)
        if "milestones" in d:
            d["milestones"] = tuple(d["milestones"])
        return cls().replace(**d)

    def milestone_epochs(self) -> list[int]:
        """The epochs at which a step schedule multiplies the learning rate by ``gamma``."""
        return [round(m * self.epochs) for m in self.milestones]

    def lr_at(self, epoch: int, step: int = 0, steps_per_epoch: int = 1) -> float:
        """Learning rate at ``step`` of ``epoch`` (a pure function, so runs resume exactly)."""
        if self.schedule == "constant":
            return self.lr
        if self.schedule == "step":
            return self.lr * self.gamma ** sum(epoch >= m for m in self.milestone_epochs())
        total = max(1, self.epochs * steps_per_epoch)
        t = min(epoch * steps_per_epoch + step, total - 1) / max(1, total - 1)
        if self.schedule == "cosine":
            return self.lr * 0.5 * (1 + math.cos(math.pi * t))
        # one-cycle (torch's defaults): warm up for 30% from lr/25, then anneal to lr/25e4
        start, end, pct = self.lr / 25, self.lr / 25e4, 0.3
        if t < pct:
            return start + (self.lr - start) * (1 - math.cos(math.pi * t / pct)) / 2
        u = (t - pct) / (1 - pct)
        return end + (self.lr - end) * (1 + math.cos(math.pi * u)) / 2


def paper_recipe(architecture: str = "resnet18", **overrides: Any) -> Recipe:
    """The paper's base-model recipe: SGD (momentum 0.9, Nesterov), weight decay 1e-4,
    200 epochs, learning rate x0.1 at epochs 66 and 133, batch 128, flip + crop; lr 0.1 for
    ResNets and 0.01 for VGG and ViTs."""
    lr = 0.1 if "resnet" in architecture else 0.01
    return Recipe(lr=lr).replace(**overrides)


def fast_recipe(**overrides: Any) -> Recipe:
    """A CPU-sized recipe: AdamW (lr 3e-3, weight decay 5e-4), one-cycle, 6 epochs."""
    base = Recipe(
        optimizer="adamw",
        lr=3e-3,
        weight_decay=5e-4,
        epochs=6,
        schedule="onecycle",
        milestones=(),
    )
    return base.replace(**overrides)
