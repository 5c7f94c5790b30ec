"""How well IRIs converged: per-sample errors, their summary against a null, and storage
levels (:func:`quantise`, :func:`dequantise`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

#: IRIs must be at least this many times closer (median relative error at the point) to
#: their sources' representations than another real image is, or the set is flagged.
MIN_NULL_RATIO = 10.0

#: An IRI set whose median relative error is above this is flagged (docs/method.md section 3).
THRESHOLD = 0.5

class IRIError(RuntimeError):
    """An IRI set cannot be used (damaged, mismatched, of an earlier store format or of
    poor quality)."""


#: Storage precisions of IRIs (:attr:`IRIRecipe.precision`).
PRECISIONS = ("uint8", "int16", "float32")


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

