"""Stitching protocols as objects: what a stitch is trained on.

:class:`Standard` trains on the stitching data itself. :class:`InvarianceAware` trains on
the front's identically represented inputs (IRIs) of the stitching data: the back model's
targets are its own outputs on the IRIs, so only a back that shares the front's
invariances can be matched (docs/method.md section 3). Its ``branches`` select the sanity
variants of docs/method.md section 6 (E). A protocol turns stitching data into a training set once
(:meth:`Protocol.training_set`); the :class:`~stitchlab.stitcher.Stitcher` then caches
the activations of that set for every objective trained on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ._data import PairedImages, as_dataset
from .data.tensors import labels_of
from .iris import (
    MIN_NULL_RATIO,
    THRESHOLD,
    IRIError,
    IRIQuality,
    IRIRecipe,
    IRIResult,
    IRISet,
    generate_iris,
    generate_iris_set,
)

__all__ = ["Protocol", "Standard", "InvarianceAware", "as_protocol"]


class Protocol:
    """Base class: turns stitching data into the set a stitch is trained on."""

    name: ClassVar[str] = ""

    def training_set(
        self, front_model: nn.Module, point: str, real: Dataset, *, seed: int,
        device: torch.device, tracing: dict[str, Any],
    ) -> tuple[Dataset, IRIQuality | None]:  # fmt: skip
        """The training set for ``real`` stitching data, and the quality of its IRIs."""
        raise NotImplementedError


@dataclass(frozen=True)
class Standard(Protocol):
    """Model stitching as usual: train on the stitching data."""

    name: ClassVar[str] = "standard"

    def training_set(self, front_model, point, real, *, seed, device, tracing):  # noqa: D102
        return real, None


@dataclass(frozen=True, eq=False)
class InvarianceAware(Protocol):
    """Invariance-aware stitching: train on the front's IRIs of the stitching data.

    Args:
        iris: the IRIs to use (an :class:`~stitchlab.iris.IRISet`, an ``IRIResult``, a
            tensor aligned with the data, or data); None generates them. A stored set must
            have been made at this point, from this front and from these images (their
            labels, in order); a tensor must hold float images in the recipe's box.
        branches: ``"both"`` (the protocol), or the sanity variants of docs/method.md
            section 6 (E): ``"front"`` (IRIs into the front only, targets on real images) and
            ``"back"`` (real images into the front, targets on IRIs).
        cache: folder of the IRI cache for generated IRIs (None: in memory).
        recipe: how generated IRIs are optimised (default: stitchlab's recipe).
        threshold: an IRI set whose median relative error is above it is flagged.
        min_null_ratio: a set closer than this many times the null error is flagged.
        allow_flagged: train on a flagged set anyway (else :class:`IRIError`).

    SLM, DM and FuLA targets are the back model's outputs on the IRIs; HLM keeps the
    source labels; the least-squares initialisation always uses real images.
    """

    name: ClassVar[str] = "iris"
    iris: Any = None
    branches: Literal["both", "front", "back"] = "both"
    cache: str | None = None
    recipe: IRIRecipe = field(default_factory=IRIRecipe)
    threshold: float = THRESHOLD
    min_null_ratio: float = MIN_NULL_RATIO
    allow_flagged: bool = False

    def __post_init__(self) -> None:
        if self.branches not in ("both", "front", "back"):
            raise ValueError(
                f"branches must be 'both', 'front' or 'back', got {self.branches!r}"
            )
        if not isinstance(self.recipe, IRIRecipe):
            raise TypeError(f"recipe must be an IRIRecipe, got {type(self.recipe).__name__}")
        self.recipe.validate()

    def training_set(self, front_model, point, real, *, seed, device, tracing):  # noqa: D102
        iris = self.iris
        options = self.recipe.as_dict()
        if iris is None and self.cache is not None:
            iris = generate_iris_set(
                front_model, point, real, self.cache, seed=seed, threshold=self.threshold,
                min_null_ratio=self.min_null_ratio, device=device, **tracing, **options,
            )  # fmt: skip
        elif iris is None:
            iris = generate_iris(front_model, point, real, seed=seed, device=device,
                                 **tracing, **options)  # fmt: skip
        quality = None
        given_result = isinstance(iris, IRIResult)
        given_set = iris.dataset if isinstance(iris, DataLoader) else iris
        if isinstance(given_set, IRISet) and self.iris is not None:  # given, not made here
            _check_set_matches(given_set, front_model, point, real, tracing)
        if isinstance(iris, (IRIResult, IRISet)):  # judged with this protocol's thresholds
            quality = IRIQuality.of(
                iris.rel_error, iris.pixel_rms, self.threshold, iris.null_error,
                self.min_null_ratio, precision=getattr(iris, "precision", None),
            )  # fmt: skip
            if isinstance(iris, IRIResult):
                iris = iris.iris
        if isinstance(iris, Tensor):
            _check_iri_tensor(iris, None if given_result else self.recipe.box)
            if len(iris) != len(real):  # type: ignore[arg-type]
                raise ValueError(
                    f"{len(iris)} IRIs for {len(real)} stitching images: pass one IRI per "  # type: ignore[arg-type]
                    "image."
                )
            iris = TensorDataset(iris.float(), labels_of(real))
        iri_set, _ = as_dataset(iris, "iris")
        if len(iri_set) != len(real):  # type: ignore[arg-type]
            raise ValueError(f"{len(iri_set)} IRIs for {len(real)} stitching images.")  # type: ignore[arg-type]
        if quality is not None and quality.flagged and not self.allow_flagged:
            raise IRIError(
                f"{quality}. These IRIs do not reproduce the front's representation well "
                "enough for invariance-aware stitching; use more steps or a larger/decaying "
                "step size, or pass InvarianceAware(allow_flagged=True) to use them anyway."
            )
        if self.branches == "front":
            return PairedImages(iri_set, real), quality
        if self.branches == "back":
            return PairedImages(real, iri_set), quality
        return iri_set, quality


def _check_iri_tensor(iris: Tensor, box: tuple[float, float] | None) -> None:
    """Refuse IRIs given as a tensor that are not float images (uint8 levels from
    :func:`~stitchlab.iris.quantise` would be trained on as 0..255) or lie outside ``box``
    (the recipe's; None for an ``IRIResult``, made in its own recipe's box)."""
    if not iris.is_floating_point():
        raise ValueError(
            f"IRIs given as a tensor must be float images, got {iris.dtype}; turn stored "
            "levels back into images with stitchlab.iris.dequantise(levels, box)."
        )
    if box is None:
        return
    lo, hi = box
    slack = 1e-4 * (hi - lo)
    if len(iris) and (float(iris.min()) < lo - slack or float(iris.max()) > hi + slack):
        raise ValueError(
            f"IRIs given as a tensor must lie in the recipe's pixel box [{lo:g}, {hi:g}], got "
            f"values in [{float(iris.min()):g}, {float(iris.max()):g}]; give them on the scale "
            "of the stitching images, or set the recipe's box to theirs (InvarianceAware("
            "recipe=IRIRecipe(box=(low, high))))."
        )


def _check_set_matches(iris: IRISet, front_model: nn.Module, point: str, real: Dataset,
                       tracing: dict) -> None:  # fmt: skip
    """Refuse a stored IRI set made at another point, from another front model or from other
    stitching images than this stitch's: its IRIs would be paired with the wrong sources."""
    from .iris.front import _frozen_front
    from .iris.store import model_fingerprint

    meta = iris.meta
    made = meta.get("point")
    if made is not None and made != point:
        raise IRIError(
            f"The IRI set in {iris.root} was made at point {made!r}, but this stitch cuts "
            f"the front at {point!r}; generate the set at {point!r}."
        )
    # the front as the set's recipe built it: only its ReLU gradient changes the module (a
    # field the set's key leaves out did not apply to it, so the default stands in)
    recipe, default = meta.get("recipe") or {}, IRIRecipe()
    relu = [recipe.get(k, getattr(default, k))
            for k in ("relu_grad", "relu_width", "relu_floor")]  # fmt: skip
    front = _frozen_front(front_model, point, tuple(tracing.get("leaf_modules") or ()),
                          tracing.get("output"), *relu)  # fmt: skip
    if meta.get("front") != model_fingerprint(front):
        raise IRIError(
            f"The IRI set in {iris.root} was made from another front model (its weights up to "
            f"{point!r} differ from this stitch's front); generate the set from this front."
        )
    if not torch.equal(iris.labels.long(), labels_of(real)):
        raise IRIError(
            f"The IRI set in {iris.root} was made from other stitching images than this "
            "stitch's (their labels differ in content or order); pass the images the set was "
            "made from."
        )


def as_protocol(protocol: str | Protocol = "standard") -> Protocol:
    """A protocol object: a :class:`Protocol` as it is, ``"standard"`` as
    :class:`Standard`, ``"iris"`` as :class:`InvarianceAware` with its defaults."""
    if isinstance(protocol, Protocol):
        return protocol
    if protocol == "standard":
        return Standard()
    if protocol == "iris":
        return InvarianceAware()
    raise ValueError(
        f"protocol must be Standard(), InvarianceAware(...), 'standard' or 'iris'; got "
        f"{protocol!r}"
    )
