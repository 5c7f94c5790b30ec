"""Identically represented inputs (IRIs): inputs that a front represents like real ones.

For a source input x and a stitch point i, an IRI is
``x' = argmin ||f_{<=i}(x') - f_{<=i}(x)||_F / ||f_{<=i}(x)||_F`` over valid inputs (the
box), found by projected gradient steps that run only the front prefix (docs/method.md section 3).
Inputs are images ``(N, C, H, W)`` or of any other rank with a batch axis, e.g. waveforms
``(N, C, T)`` (``preset="audio"``).

* :func:`generate_iris` optimises a batch of inputs in memory.
* :func:`generate_iris_set` streams a whole data set in chunks into a cache keyed by what
  determines the result (front weights, point, source data, recipe); it resumes after an
  interruption and checks every chunk on load.
* :class:`IRISet` is the stored result: a Dataset of ``(iri, source label)`` with the
  per-sample quality (:class:`IRIQuality`).

The package's modules: :mod:`~stitchlab.iris.recipe` (:class:`IRIRecipe`),
:mod:`~stitchlab.iris.presets` (default, paper, audio), :mod:`~stitchlab.iris.smooth`
(gradients through nonlinearities), :mod:`~stitchlab.iris.front` (the front that runs),
:mod:`~stitchlab.iris.coordinates` (Adam's coordinates), :mod:`~stitchlab.iris.descent`
(the steps, :func:`generate_iris`), :mod:`~stitchlab.iris.quality` and
:mod:`~stitchlab.iris.store`.
"""

from __future__ import annotations

from .descent import generate_iris
from .presets import PRESETS
from .quality import (
    MIN_NULL_RATIO,
    THRESHOLD,
    IRIError,
    IRIQuality,
    IRIResult,
    dequantise,
    quantise,
)
from .recipe import IRIRecipe
from .store import IRISet, generate_iris_set, iris_set_stored

__all__ = [
    "IRIRecipe",
    "IRIResult",
    "IRIQuality",
    "IRISet",
    "IRIError",
    "PRESETS",
    "THRESHOLD",
    "MIN_NULL_RATIO",
    "generate_iris",
    "generate_iris_set",
    "iris_set_stored",
    "quantise",
    "dequantise",
]
