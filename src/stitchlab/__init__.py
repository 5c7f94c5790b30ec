"""stitchlab: functional similarity of neural networks by (invariance-aware) model stitching.

The public API::

    stitch_points(model)                -> ordered cut points
    split(model, point)                 -> (front, back) with back(front(x)) == model(x)
    TracedModel(model)                  -> trace once, cut often
    stitch(front, back, point, data)    -> a trained StitchedModel: one Stitcher, one fit
    Stitcher(front, back, point)        -> the life cycle: .initialise(data),
                                           .collect(data, protocol), .fit(objective, ...),
                                           .evaluate(model, test_data); shares the work
                                           that does not depend on the objective
    Standard(), InvarianceAware(...)    -> the protocols: stitch(..., protocol=...)
    generate_iris(model, point, images) -> identically represented inputs (an IRIResult)
    generate_iris_set(...)              -> the same, chunked and stored (an IRISet)
    IRIRecipe, IRIResult, IRIQuality    -> how IRIs are made, what they are, how good
    evaluate(stitched, test_data, ref)  -> scores (agreement, accuracy, ...)
    compare(front, back, data, ...)     -> two models stitched at matched points: the
                                           results table (score, interval, null,
                                           ceiling, normalised) as a DataFrame

The rest lives in submodules: :mod:`stitchlab.metrics` (agreement, CKA, intervals),
:mod:`stitchlab.objectives` (HLM, SLM, DM, FuLA), :mod:`stitchlab.fit` (TrainingConfig),
:mod:`stitchlab.stitched` (StitchedModel, StitchRecord), :mod:`stitchlab.errors` (every
error stitchlab raises), :mod:`stitchlab.experiments`, :mod:`stitchlab.models`,
:mod:`stitchlab.data`. Names are spelled the British way (``initialise``, ``normalised``).
"""

from .compare import compare
from .evaluation import evaluate
from .iris import IRIQuality, IRIRecipe, IRIResult, generate_iris, generate_iris_set
from .protocols import InvarianceAware, Standard
from .splitting import TracedModel, split, stitch_points
from .stitcher import Stitcher, stitch

__version__ = "0.1.0"

# `stitchlab.compare` is the function here; `from stitchlab.compare import ...` still
# reaches the module (CompareSettings, run_compare, ...).
__all__ = [
    "split",
    "stitch_points",
    "TracedModel",
    "Stitcher",
    "stitch",
    "Standard",
    "InvarianceAware",
    "generate_iris",
    "generate_iris_set",
    "IRIRecipe",
    "IRIResult",
    "IRIQuality",
    "evaluate",
    "compare",
]
