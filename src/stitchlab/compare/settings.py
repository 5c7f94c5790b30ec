"""The settings of a comparison: :class:`CompareSettings` (a config's ``[compare]`` table),
read and checked at the edge."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..vocabulary import OBJECTIVES

__all__ = ["CEILING_LIMIT", "QUICK_MAX_IMAGES", "CompareSettings", "is_compare_config",
           "load_compare_config"]  # fmt: skip

#: A row whose ceiling (the back stitched into itself) is below this is budget-limited.
CEILING_LIMIT = 90.0
#: ``quick`` raises a cell's least-squares images to what it needs up to this many; a
#: cell that needs more is left out.
QUICK_MAX_IMAGES = 1000


@dataclass(frozen=True)
class CompareSettings:
    """Everything a comparison depends on (a config's ``[compare]`` table has these keys).

    ``front``/``back``: model sources; ``*_weights``: their weights files; ``*_size``,
    ``*_mean``, ``*_std``: override an image model's input pipeline; ``*_rate``: the sample
    rate (Hz) a speech model reads (needed when the model does not say; a registry speech
    model is built at it); ``clip_seconds``: the seconds of audio every speech model reads
    (default: each model's own clip length); ``data``: the data path (``image_size`` resizes
    its images, ``test_fraction`` splits a folder without train/test folders). ``points``:
    ``"depth"``, ``"grid"`` or a list (see the module docstring). ``null_seeds``: random
    fronts per cell (default: ``seeds``; 0 turns the null off). ``iri_steps``: IRI
    optimisation steps (default: the IRI recipe's, 270 for images and the ``audio``
    preset's 300 for speech models). ``iri_seeds``: each stitch seed on IRIs of its own
    random start (seed k uses IRI seed k), so that the interval includes IRI-generation
    variability; the real front's IRIs then cost ``seeds`` times as much (null fronts
    keep start 0). ``auto_init``: each cell's least-squares images (``n_init``, and
    ``n_stitch`` with them) raised to what the cell and its ceiling need, up to
    :data:`QUICK_MAX_IMAGES`; a cell that needs more is left out (on under ``quick``).
    """

    front: str
    back: str
    data: str
    front_weights: str | None = None
    back_weights: str | None = None
    random_init: bool = False
    front_num_classes: int | None = None
    back_num_classes: int | None = None
    front_size: int | None = None
    back_size: int | None = None
    front_mean: tuple[float, ...] | None = None
    front_std: tuple[float, ...] | None = None
    back_mean: tuple[float, ...] | None = None
    back_std: tuple[float, ...] | None = None
    front_rate: int | None = None
    back_rate: int | None = None
    clip_seconds: float | None = None
    image_size: int | None = None
    test_fraction: float = 0.2
    points: str | tuple[str, ...] = "depth"
    n_points: int = 5
    objectives: tuple[str, ...] = OBJECTIVES
    protocols: tuple[str, ...] = ("standard", "iris")
    seeds: int = 3
    null_seeds: int | None = None
    n_stitch: int = 2000
    n_test: int = 1000
    n_init: int = 500
    epochs: int = 6
    lr: float = 3e-3
    batch_size: int = 128
    iri_steps: int | None = None  # None: the recipe's (200 for images, 300 for audio)
    iri_seeds: bool = False  # each stitch seed on IRIs of its own random start
    bootstrap: int = 1000
    confidence: float = 0.95
    data_seed: int = 0
    device: str = "cpu"
    auto_init: bool = False  # each cell's least-squares images raised to what it needs

    @classmethod
    def quick(cls, **overrides: Any) -> CompareSettings:
        """A run of well under a minute on small models: 3 points, SLM, one seed and one
        null, few images and steps (a smoke test of the whole pipeline, not a result).
        A cell whose least squares needs more than ``n_init`` images gets them (and the
        stitching images with them), up to :data:`QUICK_MAX_IMAGES`; beyond, it is left
        out."""
        base: dict[str, Any] = dict(
            n_points=3, objectives=("slm",), seeds=1, null_seeds=1, n_stitch=128, n_test=128,
            n_init=64, epochs=2, iri_steps=20, bootstrap=200, auto_init=True,
        )  # fmt: skip
        return cls(**{**base, **overrides})

    def __post_init__(self) -> None:
        from .._checks import check_field_types

        if isinstance(self.points, (list, tuple)):
            object.__setattr__(self, "points", tuple(self.points))
        for name in ("objectives", "protocols", "front_mean", "front_std", "back_mean",
                     "back_std"):  # fmt: skip
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, tuple(v))
        check_field_types(self, "compare")
        bad = [o for o in self.objectives if o not in OBJECTIVES]
        if bad or not self.objectives:
            raise ValueError(f"objectives must be a non-empty subset of {OBJECTIVES}, got "
                             f"{self.objectives}")  # fmt: skip
        bad = [p for p in self.protocols if p not in ("standard", "iris")]
        if bad or not self.protocols:
            raise ValueError(f"protocols must be a non-empty subset of ('standard', 'iris'), "
                             f"got {self.protocols}")  # fmt: skip
        if isinstance(self.points, str) and self.points not in ("depth", "grid"):
            raise ValueError(f"points must be 'depth', 'grid' or a list of point names, got "
                             f"{self.points!r}")  # fmt: skip
        for name in ("seeds", "n_points", "n_stitch", "n_test", "n_init", "bootstrap"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_test < 2:
            raise ValueError(f"n_test must be >= 2 (an interval over test images needs two), "
                             f"got {self.n_test}")  # fmt: skip
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be finite and > 0, got {self.lr}")
        for name in ("epochs", "iri_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.null_seeds is not None and self.null_seeds < 0:
            raise ValueError(f"null_seeds must be >= 0, got {self.null_seeds}")
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        for name in ("front_rate", "back_rate", "clip_seconds"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"{name} must be > 0, got {v}")

    @property
    def nulls(self) -> int:
        """Random fronts per cell."""
        return self.seeds if self.null_seeds is None else self.null_seeds

    @classmethod
    def from_table(cls, table: dict[str, Any], base: Path | None = None,
                   quick: bool = False) -> CompareSettings:  # fmt: skip
        """From a config's ``[compare]`` table; relative paths are read from ``base``."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(table) - names)
        if unknown:
            raise ValueError(f"unknown [compare] keys {unknown}; valid: {sorted(names)}")
        table = dict(table)
        if base is not None:
            for key in ("data", "front_weights", "back_weights", "front", "back"):
                v = table.get(key)
                if isinstance(v, str) and not v.startswith(("timm:", "torchvision:")):
                    prefix = "hf:" if v.startswith("hf:") else ""
                    p = Path(v[len(prefix):]).expanduser()
                    if not p.is_absolute() and (base / p).exists():
                        table[key] = prefix + str(base / p)
        return cls.quick(**table) if quick else cls(**table)


def is_compare_config(path: str | Path) -> bool:
    """True when the TOML file at ``path`` has a ``[compare]`` table."""
    import tomllib

    with open(path, "rb") as f:
        return "compare" in tomllib.load(f)


def load_compare_config(path: str | Path, quick: bool = False) -> CompareSettings:
    """The settings of a compare config: one ``[compare]`` table (plus ``name`` and
    ``description``); environment variables in paths are expanded."""
    import os

    from .._checks import read_table_config

    table = {k: os.path.expandvars(v) if isinstance(v, str) else v
             for k, v in read_table_config(path, "compare").items()}  # fmt: skip
    return CompareSettings.from_table(table, Path(path).resolve().parent, quick=quick)


def _pack(values) -> str:
    """Per-image agreements (a tensor) as base64 float32 (exact, compact, no pickle)."""
    import base64

    return base64.b64encode(values.float().numpy().tobytes()).decode("ascii")


def _unpack(s: str, n: int) -> np.ndarray:
    """The per-image agreements of :func:`_pack`; a ValueError if there are not ``n``."""
    import base64

    values = np.frombuffer(base64.b64decode(s), dtype=np.float32)
    if len(values) != n:
        raise ValueError(f"a stored run has {len(values)} per-image values, expected {n}")
    return values


def _iri_seed(s: CompareSettings, run: dict) -> int:
    """The random start of a run's IRIs: the stitch seed's own under ``iri_seeds`` for the
    real front's IRI runs; 0 otherwise (a null front's IRIs vary with its weights)."""
    return run["seed"] if s.iri_seeds and run["protocol"] == "iris" and not run["null"] else 0
