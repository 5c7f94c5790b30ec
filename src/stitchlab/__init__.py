"""stitchlab: functional similarity of neural networks by (invariance-aware) model stitching.

The public API::

    stitch_points(model)                -> ordered cut points
    split(model, point)                 -> (front, back) with back(front(x)) == model(x)
    TracedModel(model)                  -> trace once, cut often; .formats(x) gives the
                                           activation layout (NCHW, NHWC, NCL, NLC, NC)
    Stitcher(front, back, point)        -> the life cycle: .initialise(data),
                                           .collect(data, protocol), .fit(objective, ...),
                                           .evaluate(model, test_data); shares the work
                                           that does not depend on the objective
    stitch(front, back, point, data)    -> trained StitchedModel (protocol="iris" for
                                           invariance-aware stitching): one Stitcher, one fit
    Standard(), InvarianceAware(...)    -> the protocols as objects
    generate_iris(model, point, images) -> identically represented inputs (+ quality)
    evaluate(stitched, test_data, ref)  -> scores (agreement, accuracy, ...)
    agreement(logits_a, logits_b)       -> agreement probability in percent
"""

from ._data import DataError
from .evaluation import evaluate, iri_agreement
from .fit import TrainingConfig
from .iris import IRIRecipe, IRISet, generate_iris, generate_iris_set
from .layers import ActivationSpec, StitchLayer, StitchShapeError
from .metrics import (
    accuracy,
    agreement,
    chance_normalized,
    cka,
    error_consistency,
    excess_agreement,
    hard_agreement,
    layer_average,
)
from .objectives import DM, HLM, SLM, FuLA, Objective
from .protocols import InvarianceAware, Standard
from .splitting import (
    SplitError,
    TracedModel,
    activation_formats,
    later_points,
    split,
    stitch_points,
    tap_model,
)
from .stitched import StitchedModel, StitchRecord
from .stitcher import Initialisation, Stitcher, stitch

__version__ = "0.1.0"

__all__ = [
    "stitch_points",
    "split",
    "later_points",
    "tap_model",
    "TracedModel",
    "activation_formats",
    "stitch",
    "Stitcher",
    "Initialisation",
    "Standard",
    "InvarianceAware",
    "StitchRecord",
    "evaluate",
    "iri_agreement",
    "generate_iris",
    "generate_iris_set",
    "IRISet",
    "IRIRecipe",
    "agreement",
    "accuracy",
    "hard_agreement",
    "error_consistency",
    "chance_normalized",
    "excess_agreement",
    "layer_average",
    "cka",
    "StitchedModel",
    "TrainingConfig",
    "StitchLayer",
    "ActivationSpec",
    "Objective",
    "HLM",
    "SLM",
    "DM",
    "FuLA",
    "SplitError",
    "StitchShapeError",
    "DataError",
]
