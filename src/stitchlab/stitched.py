"""A stitched network and the typed record of how it was trained."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from .layers import StitchLayer
from .objectives import StitchOutputs

if TYPE_CHECKING:
    from .fit import TrainingConfig

__all__ = ["StitchedModel", "StitchRecord"]


@dataclass(frozen=True)
class StitchRecord:
    """How a stitch layer was trained: what :meth:`Stitcher.fit` measured along the way.

    ``init_residual`` is the normalised least-squares residual of the initialisation (None
    without one), ``init_reused`` whether that initialisation was computed for an earlier
    fit of the same :class:`~stitchlab.stitcher.Stitcher` and reused, ``history`` the mean
    loss per epoch, ``step_losses`` the loss of every step, ``cache_used`` whether training
    ran on cached activations (None when nothing was trained), ``timings`` seconds spent
    (init, cache, train), ``iri_quality`` the quality of the IRIs trained on (None under
    the standard protocol).
    """

    objective: str
    protocol: str
    point: str
    back_point: str
    settings: TrainingConfig
    init_residual: float | None = None
    init_reused: bool = False
    history: tuple[float, ...] = ()
    step_losses: tuple[float, ...] = ()
    cache_used: bool | None = None
    timings: Mapping[str, float] = None  # type: ignore[assignment]
    iri_quality: Any = None  # IRIQuality

    def __post_init__(self) -> None:
        object.__setattr__(self, "timings", dict(self.timings or {}))


class StitchedModel(nn.Module):
    """``back_{>j}(stitch_layer(front_{<=i}(x)))``: images in, logits out.

    ``stitch_layer`` is the only trainable part. A trained model carries its
    :class:`StitchRecord` (``record``); ``history``, ``init_residual``, ``cache_used``,
    ``timings``, ``objective``, ``protocol`` and ``iri_quality`` read from it. Models fitted
    by one :class:`~stitchlab.stitcher.Stitcher` share its frozen front and back modules.
    """

    def __init__(
        self,
        front: nn.Module,
        stitch_layer: StitchLayer,
        back: nn.Module,
        point: str,
        back_point: str,
        later_points: Sequence[str],
        frozen_mode: str = "eval",
        record: StitchRecord | None = None,
    ) -> None:
        super().__init__()
        self.front = front
        self.stitch_layer = stitch_layer
        self.back = back  # returns (logits, {later point: activation})
        self.point = point
        self.back_point = back_point
        self.later_points = list(later_points)
        self.frozen_mode = frozen_mode
        self.record = record

    # what the record holds, for code that reads it off the model
    @property
    def history(self) -> list[float]:
        """Mean training loss per epoch."""
        return list(self.record.history) if self.record else []

    @property
    def step_losses(self) -> list[float]:
        """The loss of every training step."""
        return list(self.record.step_losses) if self.record else []

    @property
    def init_residual(self) -> float | None:
        """Normalised least-squares residual of the initialisation (None without one)."""
        return self.record.init_residual if self.record else None

    @property
    def cache_used(self) -> bool | None:
        """Whether training ran on cached activations (None when not trained)."""
        return self.record.cache_used if self.record else None

    @property
    def timings(self) -> dict[str, float]:
        """Seconds spent: init, cache, train."""
        return dict(self.record.timings) if self.record else {}

    @property
    def objective(self) -> str | None:
        """The objective it was trained with."""
        return self.record.objective if self.record else None

    @property
    def protocol(self) -> str:
        """``"standard"`` or ``"iris"``."""
        return self.record.protocol if self.record else "standard"

    @property
    def iri_quality(self):
        """The IRIQuality of the IRIs it was trained on (None under the standard protocol)."""
        return self.record.iri_quality if self.record else None

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        return self.from_activation(self.front(x)).logits  # type: ignore[return-value]

    def from_activation(self, a: Tensor, *, need_logits: bool = True) -> StitchOutputs:
        """Run the stitch layer (and the back suffix when needed) on a front activation."""
        z = self.stitch_layer(a)
        if not need_logits:
            return StitchOutputs(None, {self.back_point: z})
        out = self.back(z)
        logits, later = out if isinstance(out, tuple) else (out, {})
        return StitchOutputs(logits, {self.back_point: z, **later})

    def train(self, mode: bool = True) -> StitchedModel:
        """Train mode affects the stitch layer; the frozen networks follow ``frozen_mode``."""
        super().train(mode)
        frozen_train = mode and self.frozen_mode == "train"
        self.front.train(frozen_train)
        self.back.train(frozen_train)
        return self

    def with_record(self, record: StitchRecord) -> StitchedModel:
        """The same modules as a model carrying ``record`` (the trained result)."""
        return StitchedModel(
            self.front, self.stitch_layer, self.back, self.point, self.back_point,
            self.later_points, self.frozen_mode, record,
        )  # fmt: skip
