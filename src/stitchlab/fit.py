"""Stitch-training settings and the one training loop of a stitch layer.

:class:`TrainingConfig` holds every setting of a stitch run (its defaults are the
stitch-training settings of docs/method.md section 5); :func:`train_layer` is the loop
every objective and protocol trains with, over batches of (front activations, back
targets) that come from an activation cache or are streamed. The life cycle around it
(copy, trace, initialise, collect, fit, evaluate) is :class:`stitchlab.stitcher.Stitcher`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from ._data import check_options

if TYPE_CHECKING:
    from .objectives import Objective

__all__ = [
    "TrainingConfig",
    "check_attack",
    "train_layer",
    "EpochBatches",
    "StitchDivergedError",
    "UNDERDETERMINED_RIDGE",
    "least_squares_sizes",
    "images_needed",
]

#: The ridge of an under-determined least-squares initialisation (fewer rows than unknowns
#: per output): relative to the mean feature energy (:meth:`stitchlab.layers.LeastSquares.
#: solve`), so it damps only directions with less than 0.1% of a mean feature's energy.
UNDERDETERMINED_RIDGE = 1e-3


@dataclass
class TrainingConfig:
    """Stitch-training settings; its defaults are those of docs/method.md section 5."""

    epochs: int = 30
    batch_size: int | None = None  # None: the DataLoader's, else 128
    lr: float = 1e-3
    weight_decay: float = 1e-4
    milestones: tuple[float, ...] = (1 / 3, 2 / 3)  # fractions of training, lr x gamma
    gamma: float = 0.1
    init: Literal["least_squares", "identity", "random"] = "least_squares"
    init_samples: int = 500
    ridge: float = 0.0
    solver: Literal["adam", "closed_form"] = "adam"
    frozen_mode: Literal["eval", "train"] = "eval"
    cache: Literal["auto"] | bool = "auto"
    cache_budget_bytes: int = 2 * 1024**3
    seed: int = 0
    device: str | torch.device | None = None
    num_workers: int = 0
    progress: bool = False
    adversarial: dict | None = None  # PGD on the stitched model: {eps, step, steps}

    def validate(self) -> None:
        """Raise a ValueError (a TypeError for a wrong type) naming the first bad setting."""
        from ._checks import check_field_types

        check_field_types(self, "training")
        # (NaN fails every comparison: "not x >= 0" refuses it, "x < 0" would not)
        if not all(math.isfinite(v) and v >= 0 for v in (self.lr, self.weight_decay, self.ridge)):
            raise ValueError(
                f"lr, weight_decay and ridge must be finite and >= 0; got lr={self.lr}, "
                f"weight_decay={self.weight_decay}, ridge={self.ridge}"
            )
        if not (math.isfinite(self.gamma) and self.gamma > 0):
            raise ValueError(f"gamma must be finite and > 0, got {self.gamma}")
        if any(not 0 < m < 1 for m in self.milestones):  # (NaN fails "0 < m" too)
            raise ValueError(
                f"milestones are fractions of the training steps in (0, 1), got "
                f"{tuple(self.milestones)}"
            )
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {self.epochs}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.init not in ("least_squares", "identity", "random"):
            raise ValueError(
                f"init must be 'least_squares', 'identity' or 'random', got {self.init!r}"
            )
        if self.solver not in ("adam", "closed_form"):
            raise ValueError(f"solver must be 'adam' or 'closed_form', got {self.solver!r}")
        if self.frozen_mode not in ("eval", "train"):
            raise ValueError(f"frozen_mode must be 'eval' or 'train', got {self.frozen_mode!r}")
        if self.cache not in ("auto", True, False):
            raise ValueError(f"cache must be 'auto', True or False, got {self.cache!r}")
        if self.init_samples < 1:
            raise ValueError(f"init_samples must be >= 1, got {self.init_samples}")
        if self.adversarial is not None:
            check_attack(self.adversarial, "adversarial")
            if self.solver == "closed_form":
                raise ValueError(
                    "solver='closed_form' cannot train adversarially (it solves least squares "
                    "on fixed activations); use solver='adam' with adversarial."
                )

    @classmethod
    def from_kwargs(cls, **kwargs) -> TrainingConfig:
        """Build from keyword arguments; an unknown one is an error that lists the valid."""
        check_options(cls, kwargs, "training")
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg


_ATTACK_KEYS = {"eps", "step", "steps"}


def check_attack(settings: dict, where: str = "attack", samples: bool = False) -> None:
    """Raise a ValueError unless ``settings`` are PGD settings (L-inf): ``eps``, ``step``,
    ``steps`` (and, for an evaluation attack, ``samples``: attack only the first that many
    test images)."""
    if not isinstance(settings, dict):
        raise ValueError(f"{where} must be a table of PGD settings, got {settings!r}")
    allowed = _ATTACK_KEYS | ({"samples"} if samples else set())
    unknown = sorted(set(settings) - allowed)
    if unknown:
        raise ValueError(f"{where} takes {', '.join(sorted(allowed))} (PGD, L-inf); got {unknown}")
    for key, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{where} {key} must be a number, got {value!r}")
        if key in ("eps", "step") and not value > 0:
            raise ValueError(f"{where} {key} must be > 0, got {value}")
        if key in ("steps", "samples") and (value != int(value) or value < 1):
            raise ValueError(f"{where} {key} must be a positive integer, got {value}")


def least_squares_sizes(src, dst) -> list[tuple[int, int]]:
    """``(rows per image, unknowns per output)`` of each affine map of the stitch layer
    from ``src`` to ``dst`` (two :class:`~stitchlab.layers.ActivationSpec`): a 1x1
    convolution has a row per position of the back's grid, a vector point one row per
    image; the unknowns are the input channels + 1 (the bias)."""
    from .layers import StitchLayer

    layer = StitchLayer(src, dst)
    with torch.no_grad():
        rows = layer.design_rows(torch.zeros(1, *src.shape), torch.zeros(1, *dst.shape))
    return [(int(x.shape[0]), int(x.shape[1]) + 1) for x, _ in rows]


def images_needed(src, dst) -> int:
    """The fewest images whose rows determine the least-squares initialisation from
    ``src`` to ``dst``: at least as many rows as unknowns per output, for every map."""
    return max(-(-unknowns // rows) for rows, unknowns in least_squares_sizes(src, dst))


class EpochBatches(torch.utils.data.Sampler):
    """Index batches of a fresh seeded permutation each epoch (as the cache draws them)."""

    def __init__(self, n: int, batch_size: int, generator: torch.Generator) -> None:
        self.n, self.batch_size, self.generator = n, batch_size, generator

    def __iter__(self):
        perm = torch.randperm(self.n, generator=self.generator).tolist()
        for i in range(0, self.n, self.batch_size):
            yield perm[i : i + self.batch_size]

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)


class StitchDivergedError(RuntimeError):
    """Stitch training reached a non-finite loss."""


def train_layer(
    stitched: torch.nn.Module,
    objective: Objective,
    epoch_batches: Callable[[int], Iterator[tuple[Tensor, dict[str, Tensor]]]],
    steps_per_epoch: int,
    cfg: TrainingConfig,
) -> tuple[list[float], list[float]]:
    """Train the stitch layer of ``stitched`` (a :class:`~stitchlab.stitched.StitchedModel`,
    whose only trainable part it is) on ``objective`` with Adam and the schedule of
    ``cfg``. ``epoch_batches(epoch)`` yields ``(front activations, targets)``. Returns the
    mean loss per epoch and the loss of every step; the model is left in eval mode."""
    params = list(stitched.stitch_layer.parameters())
    opt = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = max(cfg.epochs * steps_per_epoch, 1)
    milestones = sorted({max(1, int(round(f * total))) for f in cfg.milestones})
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=cfg.gamma)
    history: list[float] = []
    step_losses: list[float] = []
    bar = _progress(cfg, cfg.epochs * steps_per_epoch, f"stitch {objective.name}")
    stitched.train()
    for epoch in range(cfg.epochs):
        running, count = 0.0, 0
        for a, tgt in epoch_batches(epoch):
            out = stitched.from_activation(a, need_logits=objective.needs_back)
            loss = objective(out, tgt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                raise StitchDivergedError(
                    f"stitch training diverged: the {objective.name} loss is {value} at epoch "
                    f"{epoch + 1}, step {len(step_losses) + 1} (lr {cfg.lr}); lower the "
                    "learning rate or check the models' activations at the stitch point. "
                    "No stitch layer with non-finite weights is kept or scored."
                )
            step_losses.append(value)
            running += value * a.shape[0]
            count += a.shape[0]
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{value:.4f}")
        history.append(running / max(count, 1))
    if bar is not None:
        bar.close()
    stitched.eval()
    return history, step_losses


def _progress(cfg: TrainingConfig, total: int, desc: str):
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


