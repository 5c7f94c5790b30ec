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

from .coordinates import FIRST_LAYER_DAMPING, _FirstLayer, _TimeFrequency, input_convolution
from .descent import (
    _adam_moments,
    _batch_generator,
    _bf16_steps,
    _check_images,
    _error_and_grad,
    _per_sample_error,
    _precision,
    _run_batch,
    _start,
    generate_iris,
)
from .front import (
    AFFINE_RULE,
    _frozen_front,
    _is_relu,
    _recipe_front,
    _relu_is_inplace,
    _replace_relus,
    _STReLUModule,
    affine_front,
    straight_through_relu,
)
from .presets import PRESETS
from .quality import (
    MIN_NULL_RATIO,
    PRECISIONS,
    THRESHOLD,
    IRIError,
    IRIQuality,
    IRIResult,
    dequantise,
    quantise,
)
from .recipe import MISMATCH_EVERY, IRIRecipe, uses_bf16
from .smooth import _smooth_relus_of, _SmoothModule, _SmoothReLUFn, _SmoothReLUs
from .store import (
    FORMAT_VERSION,
    IRISet,
    clear_cache,
    data_fingerprint,
    generate_iris_set,
    iris_set_stored,
    model_fingerprint,
)

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

_INTERNAL = (  # used by other modules, tests and benchmarks through this package
    FIRST_LAYER_DAMPING, _FirstLayer, _TimeFrequency, input_convolution, _adam_moments,
    _batch_generator, _bf16_steps, _check_images, _error_and_grad, _per_sample_error,
    _precision, _run_batch, _start, AFFINE_RULE, _frozen_front, _is_relu, _recipe_front,
    _relu_is_inplace, _replace_relus, _STReLUModule, affine_front, straight_through_relu,
    PRECISIONS, MISMATCH_EVERY, uses_bf16, _SmoothModule, _SmoothReLUFn,
    _SmoothReLUs, _smooth_relus_of, FORMAT_VERSION, clear_cache, data_fingerprint,
    model_fingerprint,
)  # fmt: skip
