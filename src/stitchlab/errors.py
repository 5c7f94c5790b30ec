"""Every error stitchlab raises on purpose, in one place to catch or look up.

Each is defined beside the code that raises it and re-exported here."""

from ._data import DataError
from .data.safe_pickle import UnsafePickleError
from .data.speech import EspeakNotFoundError, SpeechSynthesisError
from .data.tensors import DataFileError
from .experiments.config import ConfigError
from .fit import StitchDivergedError
from .iris import IRIError
from .layers import StitchShapeError
from .models.checkpoint import CheckpointError
from .splitting import SplitError
from .store import DamagedEntry
from .train.loop import TrainingDivergedError

__all__ = [
    "DataError",
    "DataFileError",
    "UnsafePickleError",
    "SpeechSynthesisError",
    "EspeakNotFoundError",
    "ConfigError",
    "StitchDivergedError",
    "IRIError",
    "StitchShapeError",
    "CheckpointError",
    "SplitError",
    "DamagedEntry",
    "TrainingDivergedError",
]
