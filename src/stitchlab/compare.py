"""``stitchlab compare``: how functionally similar are two of *your* networks?

Given two models (:mod:`stitchlab.models.sources`: checkpoints, registry names,
``torchvision:``/``timm:`` architectures with local weights, ``hf:`` folders) and a data
set (:mod:`stitchlab.data.user`), :func:`run_compare` stitches the front into the back at
matched points, with every objective and protocol asked for, and scores each stitched
model by its agreement with the back on held-out images (stitchlab's agreement
probability, :func:`stitchlab.metrics.agreement`, per image, and the hard top-1 agreement).

Every score comes with

* an **interval**: a two-level bootstrap, over stitch seeds (``seeds`` runs that differ in
  the least-squares subset and the training order) and over test images (the same image
  resample for every seed), 95% percentile interval by default;
* a **null**: the same back stitched from a *randomly initialised* front of the front's
  architecture (the random-sender control of Smith et al. 2025), with the same objective,
  protocol, point and settings (for the IRI protocol, on the random front's own IRIs). The
  excess over the null, with its own paired bootstrap interval, says what the front's
  training adds to what a stitch layer and the back achieve alone;
* a **ceiling**: the back stitched into *itself* at the back point, with the same
  objective, protocol, data, budget and seeds. An identity stitch is exactly reachable
  there, so anything below 100 is what the budget loses. ``normalised`` is (score - null)
  / (ceiling - null), with an interval from one bootstrap that resamples the test images
  jointly for the three and the seeds of each independently. A row whose ceiling is
  below :data:`CEILING_LIMIT` is ``budget_limited``: its score measures the budget as
  much as the networks.

The least-squares initialisation of a cell is under-determined when its images give
fewer rows (images x positions) than unknowns per output (input channels + 1); it then
uses a ridge (:data:`stitchlab.fit.UNDERDETERMINED_RIDGE`), and the plan names such
cells with the images each needs. ``auto_init`` (on under ``quick``) raises the images of
each cell to what it needs (at most :data:`QUICK_MAX_IMAGES`) or leaves the cell out and
says so.

SLM, DM and FuLA never need labels; HLM does and is skipped on unlabelled data (and so is
accuracy). The IRIs of one front point are generated once (seed 0) and shared by every
stitch seed: the interval does not include IRI-generation variability, unless
``iri_seeds=True`` gives every stitch seed IRIs of its own random start, at ``seeds``
times the real front's IRI cost (null fronts keep start 0: their IRIs already differ by
their weights). On the demo's small CNNs the random start moved a
score by up to 4.1 points (docs/validation/iri_convergence.md, "Over IRI seeds").

Points: by default ``n_points`` stitch points of the front spread over its depth, each
matched to the back point at the nearest relative depth (depth = (index + 1) / number of
points); ``points=["a", "b:c"]`` names them (``b:c`` front point b into back point c);
``points="grid"`` stitches every chosen front point into every chosen back point.

Speech models (``mel_cnn``, ``wave_cnn``, or any model whose ``stitchlab_input_shape`` is
``(channels, samples)``) compare the same way on audio (a folder of ``.wav`` files, or
waveforms in a .npz/.safetensors file): both read the same waveforms in [-1, 1], loaded at
the higher of the two models' sample rates and as long as the longer of their clips; each
model resamples them to its own rate and pads or crops them to its own clip length inside
its wrapper (:class:`~stitchlab.models.sources.WithAudioInput`), so IRIs live in the shared
waveform space. IRIs of audio use the ``audio`` recipe preset (a quiet Gaussian start,
the box (-1, 1), int16 storage). An image model cannot be compared with a speech model.

Each run is stored (``store/compare/<key>.json``, keyed by both models' weights and input
pipelines, the data, the points and every setting) as soon as it finishes, so an
interrupted comparison resumes without losing finished runs; IRI sets are cached in
``store/iris``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from .metrics import bootstrap_agreement
from .vocabulary import IRI_TRANSFER_COLUMNS, OBJECTIVES

__all__ = [
    "CEILING_LIMIT",
    "QUICK_MAX_IMAGES",
    "console_table",
    "CompareSettings",
    "run_compare",
    "match_points",
    "bootstrap_agreement",
    "load_compare_config",
    "is_compare_config",
]

log = logging.getLogger("stitchlab.compare")

_VERSION = 2  # of the stored run format

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
    optimisation steps (default: the IRI recipe's, 200 for images and the ``audio``
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
        from ._checks import check_field_types

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

    from ._checks import read_table_config

    table = {k: os.path.expandvars(v) if isinstance(v, str) else v
             for k, v in read_table_config(path, "compare").items()}  # fmt: skip
    return CompareSettings.from_table(table, Path(path).resolve().parent, quick=quick)


# ---------------------------------------------------------------------------
# Points


def _depths(points: Sequence[str]) -> list[float]:
    n = len(points)
    return [(i + 1) / n for i in range(n)]


def _spread(points: Sequence[str], k: int) -> list[str]:
    """``k`` points spread evenly over the depth (always the last one)."""
    n = len(points)
    if k >= n:
        return list(points)
    idx = sorted({round((j + 1) * n / k) - 1 for j in range(k)})
    return [points[i] for i in idx]


def match_points(
    front_points: Sequence[str],
    back_points: Sequence[str],
    mode: str | Sequence[str] = "depth",
    n_points: int = 5,
) -> list[tuple[str, str]]:
    """The ``(front point, back point)`` cells to stitch (see the module docstring).

    ``depth``: ``n_points`` front points spread over the depth, each with the back point
    of the nearest relative depth; ``grid``: ``n_points`` of each, every combination; a
    list: ``"p"`` (the same name in both) or ``"p:q"``.
    """
    fd = dict(zip(front_points, _depths(front_points)))
    bd = dict(zip(back_points, _depths(back_points)))
    if mode == "grid":
        return [(f, b) for f in _spread(front_points, n_points)
                for b in _spread(back_points, n_points)]  # fmt: skip
    if mode == "depth":
        cells = []
        for f in _spread(front_points, n_points):
            b = min(back_points, key=lambda p: (abs(bd[p] - fd[f]), -bd[p]))
            cells.append((f, b))
        return cells
    if isinstance(mode, str):
        raise ValueError(f"points must be 'depth', 'grid' or a list, got {mode!r}")
    cells = []
    for item in mode:
        f, _, b = item.partition(":")
        b = b or f
        for name, valid, side in ((f, front_points, "front"), (b, back_points, "back")):
            if name not in valid:
                import difflib

                close = difflib.get_close_matches(name, valid, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"{name!r} is not a stitch point of the {side} model.{hint} "
                                 f"Its points: {', '.join(valid)}")  # fmt: skip
        cells.append((f, b))
    return cells


# ---------------------------------------------------------------------------
# The run


@dataclass
class _Side:
    source: Any  # ModelSource
    model: nn.Module  # behind its input pipeline
    points: list[str]  # the model's own point names
    fingerprint: str
    wrap: Callable[[nn.Module], nn.Module]  # a net of this architecture behind the pipeline


@dataclass
class _Plan:
    cells: list[tuple[str, str]]
    runs: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class _Unlabelled(Dataset):
    """Labels -1 shown as 0 (the stitching code checks labels; nothing here reads them)."""

    def __init__(self, inner: Dataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, i: int):
        x, _ = self.inner[i]
        return x, 0


def _source(s: CompareSettings, side: str):
    """The front's or back's ModelSource (a registry speech model built at ``*_rate``)."""
    import inspect

    from .models import _REGISTRY
    from .models.sources import load_model_source

    spec, rate = getattr(s, side), getattr(s, f"{side}_rate")
    options = {}
    if rate is not None and spec in _REGISTRY and (
            "sample_rate" in inspect.signature(_REGISTRY[spec]).parameters):  # fmt: skip
        options["sample_rate"] = rate
    return load_model_source(spec, getattr(s, f"{side}_weights"), random_init=s.random_init,
                             num_classes=getattr(s, f"{side}_num_classes"),
                             options=options)  # fmt: skip


def _modality(s: CompareSettings, front, back) -> str:
    """``"audio"`` or ``"image"``: what both models read (an error when they differ, or when
    options of the other modality are given)."""
    if front.modality != back.modality:
        audio, image = (front, back) if front.modality == "audio" else (back, front)
        raise ValueError(
            f"{audio.spec} is a speech model (it reads waveforms) and {image.spec} an image "
            "model: compare needs two models that read the same kind of input (two speech "
            "models on audio data, or two image models on images)."
        )
    if front.modality == "audio":
        given = [n for n in ("front_size", "back_size", "front_mean", "front_std", "back_mean",
                             "back_std", "image_size") if getattr(s, n) is not None]  # fmt: skip
        if given:
            raise ValueError(
                f"{', '.join(given)}: image options, but both models read audio; "
                "for speech models give front_rate/back_rate or clip_seconds."
            )
    else:
        given = [n for n in ("front_rate", "back_rate", "clip_seconds") if getattr(s, n)]
        if given:
            raise ValueError(
                f"{', '.join(given)}: audio options, but both models read images "
                "(front_size/back_size, the means and stds are theirs)."
            )
    return front.modality


def _audio_spec(s: CompareSettings, source, side: str):
    """A speech model's AudioSpec: its own rate (or ``*_rate``) and clip length (or
    ``clip_seconds``)."""
    spec, rate = source.input, getattr(s, f"{side}_rate")
    if rate is not None and spec.sample_rate not in (None, rate):
        raise ValueError(
            f"{source.spec} reads {spec.sample_rate} Hz audio (its own setting), not the "
            f"{rate} Hz of --{side}-rate: drop --{side}-rate, or give a model built at "
            f"{rate} Hz."
        )
    if rate is None and spec.sample_rate is None:
        raise ValueError(f"cannot tell the sample rate {source.spec} reads: pass it "
                         f"(--{side}-rate HZ, {side}_rate in a config).")  # fmt: skip
    if rate is None and s.clip_seconds is None:
        return spec
    return spec.replace(sample_rate=rate or spec.sample_rate, seconds=s.clip_seconds)


def _side(source, spec, wrap) -> _Side:
    from .iris import model_fingerprint

    source.input = spec
    points = source.points()

    def wrapped(net: nn.Module) -> nn.Module:
        return wrap(net, points).eval()

    model = wrapped(source.model)
    return _Side(source, model, points, model_fingerprint(model), wrapped)


def _sides(s: CompareSettings, front_source, back_source) -> tuple[Any, _Side, _Side]:
    """Load the data for the two models (images, or audio at the models' rate and length)
    and put each model behind its input pipeline."""
    from .data.user import load_user_data
    from .models.sources import WithAudioInput, WithInput, for_channels, input_channels

    common = dict(test_fraction=s.test_fraction, seed=s.data_seed, n_stitch=s.n_stitch,
                  n_test=s.n_test)  # fmt: skip
    if _modality(s, front_source, back_source) == "audio":
        specs = _audio_spec(s, front_source, "front"), _audio_spec(s, back_source, "back")
        rate = max(spec.sample_rate for spec in specs)
        samples = max(round(spec.seconds * rate) for spec in specs)
        data = load_user_data(s.data, audio=True, sample_rate=rate, samples=samples, **common)

        def wrap_for(spec):
            return lambda net, points: WithAudioInput(net, spec, rate, samples, points)

        return data, *(_side(src, spec, wrap_for(spec)) for src, spec in
                       zip((front_source, back_source), specs))  # fmt: skip
    data = load_user_data(s.data, size=s.image_size, **common)
    if data.modality == "audio":
        raise ValueError(
            f"{s.data} holds audio clips, but {front_source.spec} and {back_source.spec} are "
            "image models: compare speech models (mel_cnn, wave_cnn, ...) on audio."
        )
    sides = []
    for src, size, mean, std in ((front_source, s.front_size, s.front_mean, s.front_std),
                                 (back_source, s.back_size, s.back_mean, s.back_std)):  # fmt: skip
        spec = for_channels(src.input.replace(size=size, mean=mean, std=std),
                            input_channels(src.model), src.spec)  # fmt: skip

        def wrap(net, points, spec=spec):
            return WithInput(net, spec, data.image_size, points)

        sides.append(_side(src, spec, wrap))
    return data, sides[0], sides[1]


def _key(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _pack(values: Tensor) -> str:
    """Per-image agreements as base64 float32 (exact, compact, no pickle)."""
    import base64

    return base64.b64encode(values.float().numpy().tobytes()).decode("ascii")


def _unpack(s: str, n: int) -> np.ndarray:
    import base64

    values = np.frombuffer(base64.b64decode(s), dtype=np.float32)
    if len(values) != n:
        raise ValueError(f"a stored run has {len(values)} per-image values, expected {n}")
    return values


def _need(needs: dict, cell: tuple[str, str]) -> int:
    """The images a cell's least squares needs: for its front (and null fronts) and for
    its ceiling (the back into itself at the back point)."""
    return max(needs[cell])


def _images_needed(s, front: _Side, back: _Side, cells, data) -> dict[tuple, tuple[int, int]]:
    """``(front -> back, back -> back)`` images each cell's least squares needs
    (:func:`stitchlab.fit.images_needed`), from one traced pass of each model on 3 images."""
    from ._data import as_dataset
    from .fit import images_needed
    from .splitting import TracedModel

    dataset = as_dataset(data, "data")[0]
    x0 = torch.stack([dataset[i % len(dataset)][0] for i in range(3)]).to(s.device)  # type: ignore[arg-type]

    def specs(side: _Side, points: set[str]) -> dict[str, Any]:
        traced = TracedModel(side.model.to(s.device), leaf_modules=_leaves(front, back))
        layouts = {f"net.{p}": side.source.layouts[p] for p in points
                   if p in side.source.layouts}  # fmt: skip
        with torch.no_grad():
            found = traced.formats(x0, [f"net.{p}" for p in sorted(points)], layouts=layouts)
        return {p[len("net."):]: v.require() for p, v in found.items()}

    try:
        fs = specs(front, {f for f, _ in cells})
        bs = specs(back, {b for _, b in cells})
        return {(f, b): (images_needed(fs[f], bs[b]), images_needed(bs[b], bs[b]))
                for f, b in cells}  # fmt: skip
    except Exception as exc:  # the runs themselves report any error properly
        log.warning("cannot tell the images each cell's least squares needs: %s", exc)
        return {c: (0, 0) for c in cells}


def run_compare(
    settings: CompareSettings,
    out: str | Path,
    *,
    store: str | Path | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
):
    """Run (or resume) a comparison; write ``results.csv``, ``results.parquet``,
    ``runs.csv``, ``summary.json``, figures and ``report.html`` under ``out``. Returns
    the results table (a pandas DataFrame, one row per front point, back point,
    objective and protocol)."""
    from .data.fingerprint import fingerprint

    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    store = Path(store) if store is not None else out / "store"
    s = settings
    data, front, back = _sides(s, _source(s, "front"), _source(s, "back"))
    recipe = _recipe(s, front.source.modality)
    stitch_set, test_set = data.stitch, data.test
    if not data.labelled:
        stitch_set, test_set = _Unlabelled(stitch_set), _Unlabelled(test_set)
    objectives = list(s.objectives)
    plan_skipped = []
    if not data.labelled and "hlm" in objectives:
        objectives.remove("hlm")
        plan_skipped.append("HLM: the data has no labels (SLM, DM and FuLA need none).")
        if not objectives:
            raise ValueError("the data has no labels and HLM was the only objective: choose "
                             "slm, dm or fula.")  # fmt: skip
    if data.labelled and data.num_classes and data.num_classes > back.source.num_classes:
        raise ValueError(
            f"the data has {data.num_classes} classes and the back model "
            f"{back.source.num_classes} outputs; compare on data of the back's classes."
        )
    mode = s.points if isinstance(s.points, str) else list(s.points)
    cells = match_points(front.points, back.points, mode, s.n_points)
    needs = _images_needed(s, front, back, cells, stitch_set)
    if s.auto_init:
        left_out = [(c, _need(needs, c)) for c in cells if _need(needs, c) > QUICK_MAX_IMAGES]
        cells = [c for c in cells if _need(needs, c) <= QUICK_MAX_IMAGES]
        wanted = max([s.n_stitch] + [_need(needs, c) for c in cells])
        if wanted > s.n_stitch and len(stitch_set) >= s.n_stitch:
            # more stitching images for the cells that need them (where the data has them)
            s = dataclasses.replace(s, n_stitch=wanted)
            data, front, back = _sides(s, _source(s, "front"), _source(s, "back"))
            stitch_set, test_set = data.stitch, data.test
            if not data.labelled:
                stitch_set, test_set = _Unlabelled(stitch_set), _Unlabelled(test_set)
        left_out += [(c, _need(needs, c)) for c in cells if _need(needs, c) > len(stitch_set)]
        cells = [c for c in cells if _need(needs, c) <= len(stitch_set)]
        for (f, b), need in left_out:
            limit = (f"the {QUICK_MAX_IMAGES} a quick run takes" if need > QUICK_MAX_IMAGES
                     else f"the {len(stitch_set)} stitching images the data has")
            plan_skipped.append(
                f"{f} -> {b}: its least squares needs {need} images (input channels + 1 "
                f"unknowns per output), more than {limit}; left out (run without --quick "
                f"with --n-init {need} --n-stitch {need}).")  # fmt: skip
        if not cells:
            raise ValueError("every cell's least squares needs more images than a quick run "
                             "takes: " + "; ".join(plan_skipped))  # fmt: skip
    n_init = {c: max(s.n_init, _need(needs, c)) if s.auto_init else s.n_init for c in cells}
    data_key = {"stitch": fingerprint(data.stitch), "test": fingerprint(data.test)}
    common = {"v": _VERSION, "front": front.fingerprint, "back": back.fingerprint,
              "data": data_key, "n_init": s.n_init, "epochs": s.epochs, "lr": s.lr,
              "batch_size": s.batch_size, "iri_steps": recipe.steps}  # fmt: skip
    runs, ceilings = [], {}
    for f, b in cells:
        for protocol in s.protocols:
            for objective in objectives:
                for null, count in ((False, s.seeds), (True, s.nulls)):
                    for seed in range(count):
                        spec = {"front_point": f, "back_point": b, "protocol": protocol,
                                "objective": objective, "null": null, "seed": seed}  # fmt: skip
                        # a run on IRIs of another random start than 0 is another run; all
                        # others keep their keys, whether iri_seeds is on or not
                        start = _iri_seed(s, spec)
                        key = _key(common | {"n_init": n_init[(f, b)]} | spec
                                   | ({"iri_seed": start} if start else {}))
                        runs.append(spec | {"key": key, "n_init": n_init[(f, b)]})
                for seed in range(s.seeds):
                    # the ceiling: the back into itself at b, the same budget (no front in
                    # its key: every front compared with this back shares it)
                    spec = {"front_point": b, "back_point": b, "protocol": protocol,
                            "objective": objective, "null": False, "ceiling": True,
                            "seed": seed}  # fmt: skip
                    start = _iri_seed(s, spec)
                    key = _key({k: v for k, v in common.items() if k != "front"}
                               | {"n_init": n_init[(f, b)]} | spec
                               | ({"iri_seed": start} if start else {}))
                    ceilings[key] = spec | {"key": key, "n_init": n_init[(f, b)]}
    runs += list(ceilings.values())
    entries: dict[str, dict] = {}  # stored runs, read once: checked here, tabled below
    for r in runs:
        entry = _stored_run(store / "compare" / f"{r['key']}.json", echo)
        if entry is not None:
            entries[r["key"]] = entry
    todo = [r for r in runs if r["key"] not in entries]
    null_fronts: dict[int, nn.Module] = {}  # built once, for the estimate and the runs
    stored = _stored_iri_sets(s, front, back, stitch_set, store, recipe, todo, null_fronts)
    echo(_plan_text(s, data, front, back, cells, objectives, runs, todo,
                    _estimate(s, front, back, data.item_shape, recipe.steps, todo,
                              stored), needs, n_init, len(stitch_set)))  # fmt: skip
    for line in plan_skipped[1 if plan_skipped and plan_skipped[0].startswith("HLM") else 0:]:
        echo(f"left out: {line}")
    reference = _back_logits(back.model, test_set, s.device)
    _execute(s, front, back, stitch_set, test_set, reference, todo, store, progress, recipe,
             null_fronts)  # fmt: skip
    from .store import read_json

    entries |= {r["key"]: read_json(store / "compare" / f"{r['key']}.json") for r in todo}
    rows = _aggregate(s, front, back, data, runs, entries, needs)
    _write(out, s, data, front, back, rows, [entries[r["key"]] for r in runs], plan_skipped,
           time.time() - t0, recipe)  # fmt: skip
    import pandas as pd

    return pd.DataFrame(rows)


def _stored_run(path: Path, echo: Callable[[str], None]) -> dict | None:
    """A stored run's entry, or None when it is not stored or is damaged (truncated,
    edited, agreements not in [0, 1]: reported, and computed again, which overwrites it)."""
    from .store import DamagedEntry, read_json

    if not path.exists():
        return None
    try:
        entry = read_json(path)
        values = _unpack(entry["values"], int(entry["n"]))
    except DamagedEntry as exc:
        why = exc.why
    except (KeyError, TypeError, ValueError) as exc:  # binascii.Error is a ValueError
        why = f"its per-image values cannot be read: {exc}"
    else:
        if values.size and np.isfinite(values).all() and 0 <= values.min() <= values.max() <= 1:
            return entry
        why = "its per-image agreements are not all numbers in [0, 1]"
    echo(f"warning: the stored run {path.name} is damaged ({why}); computing it again.")
    return None


def _plan_text(s, data, front, back, cells, objectives, runs, todo, estimate, needs, n_init,
               n_stitch: int) -> str:  # fmt: skip
    n_ceiling = sum(1 for r in runs if r.get("ceiling"))
    lines = [
        f"front: {front.source.describe()}", f"  input: {front.source.input}",
        f"back:  {back.source.describe()}", f"  input: {back.source.input}",
        f"data:  {data.kind} {data.source}: {len(data.stitch)} stitching, {len(data.test)} "
        f"test {data.describe_items()}, "
        f"{'labelled' if data.labelled else 'unlabelled'} ({data.split})",
        f"cells: {', '.join(f'{a}->{b}' for a, b in cells)}",
        f"runs:  {len(runs)} = {len(cells)} cells x {len(s.protocols)} protocols x "
        f"{len(objectives)} objectives x ({s.seeds} seeds + {s.nulls} null fronts) + "
        f"{n_ceiling} ceiling runs (the back into itself at each back point, {s.seeds} "
        f"seeds); {len(runs) - len(todo)} already stored",
        f"estimate: {estimate}",
    ]  # fmt: skip
    under = []
    for f, b in cells:
        have = min(n_init[(f, b)], n_stitch)
        for what, need in ((f"{f} -> {b}", needs[(f, b)][0]),
                           (f"{b} -> {b} (ceiling)", needs[(f, b)][1])):  # fmt: skip
            if have < need:
                under.append(f"  {what}: {have} images, needs {need}")
    if under:
        from .fit import UNDERDETERMINED_RIDGE

        lines += [f"under-determined least squares (fewer rows, images x positions, than "
                  f"input channels + 1): these use ridge {UNDERDETERMINED_RIDGE:g} and their "
                  "ceiling will show what the budget loses; for a determined fit give "
                  "--n-init and --n-stitch of at least the images needed"] + under
    return "\n".join(lines)


def _timed(model: nn.Module, x: Tensor) -> float:
    """Seconds per image of one forward and backward pass (after a warm-up)."""
    x = x.clone().requires_grad_(True)
    best = float("inf")
    for _ in range(3):  # the fastest of three (the first pays for allocation)
        t = time.perf_counter()
        model(x).sum().backward()
        best = min(best, time.perf_counter() - t)
    model.zero_grad(set_to_none=True)  # leave no gradients on the caller's model
    return best / len(x)


def _iri_sets_of(s: CompareSettings, todo: list[dict],
                 same: bool = False) -> set[tuple[str, bool, int, bool]]:  # fmt: skip
    """The IRI sets the runs of ``todo`` train on: (front point, null, seed, ceiling), the
    seed the null front's or, for the real front (or the back of a ceiling), the IRIs'
    random start. ``same``: front and back are one model, whose IRIs a ceiling shares."""
    return {(r["front_point"], r["null"], r["seed"] if r["null"] else _iri_seed(s, r),
             bool(r.get("ceiling")) and not same)
            for r in todo if r["protocol"] == "iris"}  # fmt: skip


def _stored_iri_sets(s, front, back, stitch_set, store: Path, recipe, todo,
                     null_fronts: dict[int, nn.Module]) -> set[tuple]:  # fmt: skip
    """Which of the IRI sets ``todo`` needs are complete in the store already (keyed as
    :func:`_execute` will generate them: the same front, point, data, start and recipe)."""
    from ._data import as_dataset
    from .iris import data_fingerprint, iris_set_stored

    needed = _iri_sets_of(s, todo, front.fingerprint == back.fingerprint)
    if not needed:
        return set()
    # the data's fingerprint once, not once per set (as data_key it is the same key part)
    fingerprint = data_fingerprint(as_dataset(stitch_set, "data")[0])
    found = set()
    for f, null, seed, ceiling in needed:
        model = (back.model if ceiling else _null_front(front, seed, null_fronts) if null
                 else front.model)  # fmt: skip
        try:
            if iris_set_stored(model, f"net.{f}", stitch_set, store / "iris",
                               seed=0 if null else seed, leaf_modules=_leaves(front, back),
                               device=s.device, data_key=fingerprint,
                               **recipe.as_dict()):  # fmt: skip
                found.add((f, null, seed, ceiling))
        except Exception:  # only an estimate: the run itself reports any error properly
            continue
    return found


def _leaves(front: _Side, back: _Side) -> tuple[type, ...]:
    """The leaf modules both models declare (each class once), for tracing a cell."""
    return tuple(dict.fromkeys(front.source.leaf_modules + back.source.leaf_modules))


def _null_front(front: _Side, seed: int, cache: dict[int, nn.Module]) -> nn.Module:
    """Null front ``seed``: a random twin of the front (initialised with ``10_000 +
    seed``) inside its input pipeline, built once per ``cache``."""
    if seed not in cache:
        cache[seed] = front.wrap(front.source.random_twin(10_000 + seed))
    return cache[seed]


def _estimate(s, front, back, shape, iri_steps, todo, stored: set[tuple]) -> str:
    """A rough time from one timed batch of each model (IRIs, stitch training, tests).
    The IRIs' part counts every step of the sets not in the store (``stored``): an upper
    bound, as samples stop at the recipe's tolerance, often far earlier."""
    if not todo:
        return "nothing to compute"
    x = torch.rand(min(32, s.n_stitch), *shape, device=s.device)
    try:
        tf, tb = _timed(front.model, x), _timed(back.model, x)
    except Exception as exc:  # the real run will report it properly
        return f"not available ({type(exc).__name__})"
    depth = dict(zip(front.points, _depths(front.points)))
    back_depth = dict(zip(back.points, _depths(back.points)))
    needed = _iri_sets_of(s, todo, front.fingerprint == back.fingerprint)
    fronts = needed - stored
    # an IRI step runs the front's prefix only (about its relative depth of the network)
    iris = sum(back_depth[f] * tb if c else depth[f] * tf
               for f, _, _, c in fronts) * iri_steps * s.n_stitch  # fmt: skip
    fits = sum(s.epochs * s.n_stitch * (tb + (tb if r.get("ceiling") else tf) / 3)
               + s.n_test * (tf + tb) / 3 for r in todo)  # fmt: skip
    total = iris + fits
    cached = f"; {len(needed & stored)} of {len(needed)} sets stored" if needed & stored else ""
    return (f"about {_duration(total)} (IRIs at most {_duration(iris)}, every step "
            f"of {len(fronts)} sets; stitching {_duration(fits)}{cached}; from one timed "
            "batch, often off by 2x)")  # fmt: skip


def _iri_seed(s: CompareSettings, run: dict) -> int:
    """The random start of a run's IRIs: the stitch seed's own under ``iri_seeds`` for the
    real front's IRI runs; 0 otherwise (a null front's IRIs vary with its weights)."""
    return run["seed"] if s.iri_seeds and run["protocol"] == "iris" and not run["null"] else 0


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _back_logits(model: nn.Module, test: Dataset, device: str) -> Tensor:
    from ._data import predict

    model.to(device)
    with torch.no_grad():
        return predict(model, test, device=torch.device(device))[0]


def _recipe(s: CompareSettings, modality: str):
    """The IRI recipe: stitchlab's image default, or the ``audio`` preset for waveforms
    (the box (-1, 1), a quiet Gaussian start, int16 storage); ``iri_steps`` if given."""
    from .iris import IRIRecipe

    steps = {} if s.iri_steps is None else {"steps": s.iri_steps}
    return IRIRecipe.from_kwargs(preset="audio" if modality == "audio" else "default", **steps)


def _execute(s, front, back, stitch_set, test_set, reference, todo, store, progress,
             recipe, null_fronts: dict[int, nn.Module]) -> None:  # fmt: skip
    """Compute the missing runs, one Stitcher per (front model, cell), storing each run
    as soon as it is done."""
    from ._checks import check_class_labels
    from ._data import predict
    from .fit import TrainingConfig
    from .metrics import per_image_agreement
    from .protocols import InvarianceAware, Standard
    from .stitcher import Stitcher
    from .store import write_json

    if not todo:
        return
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="stitch runs", leave=False)
    groups: dict[tuple, list[dict]] = {}
    for r in todo:
        groups.setdefault((r["front_point"], r["back_point"], r["null"],
                           r["seed"] if r["null"] else -1, bool(r.get("ceiling"))),
                          []).append(r)  # fmt: skip
    for (f, b, null, null_seed, ceiling), group in groups.items():
        front_model = (back.model if ceiling else _null_front(front, null_seed, null_fronts)
                       if null else front.model)  # fmt: skip
        st = Stitcher(front_model, back.model, f"net.{f}", f"net.{b}",
                      leaf_modules=_leaves(front, back),
                      layouts=(_layouts(back, back, f, b)[1] if ceiling
                               else _layouts(front, back, f, b)),
                      device=s.device)  # fmt: skip
        sets, transfer = {}, {}
        for r in sorted(group, key=lambda r: (r["protocol"], r["seed"], r["n_init"])):
            iri_seed = _iri_seed(s, r)
            which = (r["protocol"], iri_seed)
            if which not in sets:
                sets.clear()  # one set at a time in memory
                transfer.clear()
                proto = Standard() if r["protocol"] == "standard" else InvarianceAware(
                    cache=str(store / "iris"), recipe=recipe, allow_flagged=True)
                sets[which] = st.collect(stitch_set, proto, seed=iri_seed)
                transfer[which] = _transfer(sets[which], front_model, back.model)
            sset = sets[which]
            seed = r["seed"]
            init = st.initialise(stitch_set, samples=r["n_init"], seed=seed)
            cfg = TrainingConfig(epochs=s.epochs, lr=s.lr, batch_size=s.batch_size,
                                 init_samples=r["n_init"], seed=seed, device=s.device)  # fmt: skip
            t = time.time()
            model = st.fit(r["objective"], sset, init=init, settings=cfg)
            with torch.no_grad():
                logits, labels = predict(model, test_set, device=torch.device(s.device))
            check_class_labels(labels, logits.shape[1], "the test data")
            values = per_image_agreement(logits, reference)
            hard = 100 * float((logits.argmax(1) == reference.argmax(1)).double().mean())
            q = sset.iri_quality
            write_json(store / "compare" / f"{r['key']}.json", {
                "run": {k: v for k, v in r.items() if k != "key"},
                "values": _pack(values), "n": len(values), "hard_agreement": hard,
                "accuracy": 100 * float((logits.argmax(1) == labels).float().mean()),
                "iri_median_error": None if q is None else q.median_error,
                "iri_null_ratio": None if q is None else q.null_ratio,
                "iri_flagged": None if q is None else bool(q.flagged),
                **transfer[which],
                "init_residual": model.record.init_residual,
                "init_samples": init.samples, "init_images_needed": init.images_needed,
                "init_underdetermined": init.underdetermined, "init_ridge": init.ridge,
                "seconds": round(time.time() - t, 2),
            })  # fmt: skip
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()


def _transfer(sset, front: nn.Module, back: nn.Module) -> dict[str, float | None]:
    """Stitch-free: the whole front and back models on the IRIs against their sources
    (:func:`stitchlab.iri_agreement`), and the back's agreement between two different
    real images (its null); None for the standard protocol."""
    from .evaluation import iri_transfer_columns

    if sset.protocol != "iris":
        return dict.fromkeys(IRI_TRANSFER_COLUMNS)
    return iri_transfer_columns(front, back, sset.dataset, sset.real)


def _layouts(front: _Side, back: _Side, f: str, b: str) -> tuple[dict | None, dict | None]:
    """The layouts the two models declare for the cell's points (``net.``-prefixed)."""

    def one(side: _Side, point: str) -> dict[str, str] | None:
        layout = side.source.layouts.get(point)
        return None if layout is None else {f"net.{point}": layout}

    return one(front, f), one(back, b)


def normalised_score(
    values: np.ndarray,
    null_values: np.ndarray,
    ceiling_values: np.ndarray,
    *,
    reps: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """``(score - null) / (ceiling - null)`` of three sets of per-image agreements (seeds x
    the same test images, each in [0, 1]) with a percentile bootstrap interval: one image
    resample shared by the three (paired), the seeds of each drawn independently, the
    ratio of the replicates' means. NaN where the ceiling does not exceed the null (and
    NaN bounds where a replicate's ceiling does not)."""
    from .metrics import _agreement_values, _resampled_means

    sets = [_agreement_values(v, what) for v, what in ((values, "values"),
            (null_values, "null_values"), (ceiling_values, "ceiling_values"))]  # fmt: skip
    n = sets[0].shape[1]
    if any(v.shape[1] != n for v in sets):
        raise ValueError("values, null_values and ceiling_values must score the same images")
    rng = np.random.default_rng(seed)
    img = rng.integers(0, n, size=(reps, n), dtype=np.int32)

    def replicates(h: np.ndarray) -> np.ndarray:
        per_seed = np.stack([_resampled_means(row, img) for row in h])  # (seeds, reps)
        pick = rng.integers(0, len(h), size=(reps, len(h)))
        return per_seed[pick, np.arange(reps)[:, None]].mean(axis=1)

    score, null, ceiling = (float(v.mean()) for v in sets)
    nan = float("nan")
    if not ceiling > null:
        return {"normalised": nan, "normalised_ci_low": nan, "normalised_ci_high": nan}
    a, z, c = (replicates(v) for v in sets)
    out = {"normalised": (score - null) / (ceiling - null)}
    if (c - z > 0).all():
        ratio = (a - z) / (c - z)
        alpha = (1 - confidence) / 2
        return out | {"normalised_ci_low": float(np.quantile(ratio, alpha)),
                      "normalised_ci_high": float(np.quantile(ratio, 1 - alpha))}  # fmt: skip
    return out | {"normalised_ci_low": nan, "normalised_ci_high": nan}


def _budget_note(s, b: str, ceiling: float, real: list[dict], top: list[dict]) -> str:
    """Why a row is budget-limited, and the data its cell needs ('' when it is not)."""
    if not ceiling < CEILING_LIMIT:
        return ""

    def init(entries: list[dict]) -> tuple[int, int, bool]:
        return (min(e.get("init_samples", 0) for e in entries),
                max(e.get("init_images_needed", 0) for e in entries),
                any(e.get("init_underdetermined") for e in entries))  # fmt: skip

    samples, need, under = init(top)
    note = f"ceiling {ceiling:.1f} < {CEILING_LIMIT:g}: "
    if under:
        note += (f"the least squares of {b} -> {b} had {samples} images for the {need} it "
                 f"needs (a ridge solution); give --n-init {need} --n-stitch {need} or more")
    elif max(e.get("init_residual") or 0.0 for e in top) < 1e-3:
        note += (f"the least squares had {samples} images ({need} needed) and reproduced "
                 f"the back (residual < 0.001); the stitch's training ({s.epochs} epochs on "
                 f"{s.n_stitch} images, lr {s.lr:g}) moved it away from there")
    else:
        note += (f"the least squares had {samples} images ({need} needed), and the "
                 f"training budget ({s.epochs} epochs on {s.n_stitch} images) does not "
                 "reach the identity; give more --epochs or --n-stitch")
    fs, fneed, funder = init(real)
    if funder:
        note += f"; the front's least squares too had {fs} images for {fneed}"
    return note


def _aggregate(s, front, back, data, runs, entries, needs) -> list[dict[str, Any]]:

    fd = dict(zip(front.points, _depths(front.points)))
    bd = dict(zip(back.points, _depths(back.points)))
    cells: dict[tuple, dict[str, list]] = {}
    tops: dict[tuple, list[dict]] = {}
    for r in runs:
        if r.get("ceiling"):
            tops.setdefault((r["back_point"], r["objective"], r["protocol"], r["n_init"]),
                            []).append(entries[r["key"]])  # fmt: skip
            continue
        cell = cells.setdefault((r["front_point"], r["back_point"], r["objective"],
                                 r["protocol"]),
                                {"real": [], "null": [], "n_init": r["n_init"]})  # fmt: skip
        cell["null" if r["null"] else "real"].append(entries[r["key"]])
    rows = []
    nan = float("nan")
    for (f, b, objective, protocol), cell in cells.items():
        real, null = cell["real"], cell["null"]
        top = tops[(b, objective, protocol, cell["n_init"])]
        values = np.stack([_unpack(e["values"], e["n"]) for e in real])
        null_values = np.stack([_unpack(e["values"], e["n"]) for e in null]) if null else None
        top_values = np.stack([_unpack(e["values"], e["n"]) for e in top])
        stats = bootstrap_agreement(values, null_values, reps=s.bootstrap,
                                    confidence=s.confidence, seed=s.data_seed)  # fmt: skip
        if null_values is None:
            stats |= {k: nan for k in ("null_agreement", "null_ci_low", "null_ci_high",
                                       "excess_over_null", "excess_ci_low",
                                       "excess_ci_high")}  # fmt: skip
        ceiling = bootstrap_agreement(top_values, reps=s.bootstrap, confidence=s.confidence,
                                      seed=s.data_seed)  # fmt: skip
        stats |= {"ceiling_agreement": ceiling["agreement"],
                  "ceiling_ci_low": ceiling["agreement_ci_low"],
                  "ceiling_ci_high": ceiling["agreement_ci_high"]}  # fmt: skip
        if null_values is None:
            stats |= {"normalised": nan, "normalised_ci_low": nan, "normalised_ci_high": nan}
        else:
            stats |= normalised_score(values, null_values, top_values, reps=s.bootstrap,
                                      confidence=s.confidence, seed=s.data_seed)  # fmt: skip

        def mean_of(key, entries=real):
            vals = [e[key] for e in entries if e.get(key) is not None]
            return float(np.mean(vals)) if vals else nan

        note = _budget_note(s, b, ceiling["agreement"], real, top)
        rows.append({
            "front_point": f, "back_point": b, "front_depth": round(fd[f], 4),
            "back_depth": round(bd[b], 4), "objective": objective, "protocol": protocol,
            **stats, "budget_limited": bool(note), "budget_note": note,
            "seeds": len(real), "null_seeds": len(null), "ceiling_seeds": len(top),
            "n_test": int(values.shape[1]), "n_init": cell["n_init"],
            "init_images_needed": needs[(f, b)][0],
            "ceiling_init_images_needed": needs[(f, b)][1],
            "init_underdetermined": any(bool(e.get("init_underdetermined")) for e in real),
            "ceiling_init_underdetermined": any(bool(e.get("init_underdetermined"))
                                                for e in top),
            "hard_agreement": mean_of("hard_agreement"),
            "accuracy": mean_of("accuracy") if data.labelled else nan,
            "iri_median_error": mean_of("iri_median_error"),
            "iri_null_ratio": mean_of("iri_null_ratio"),
            "iri_flagged": any(bool(e.get("iri_flagged")) for e in real),
            **{key: mean_of(key) for key in IRI_TRANSFER_COLUMNS},
            "null_iri_back_agreement": mean_of("iri_back_agreement", null),
            "null_iri_median_error": mean_of("iri_median_error", null),
            "seconds": round(sum(e["seconds"] for e in real + null + top), 1),
        })  # fmt: skip
    return rows


def console_table(results) -> str:
    """The console's table of a comparison's results (one line per row: score, null,
    ceiling, normalised score, excess) and which rows are budget-limited, and why."""
    lines = ["agreement with the back (%) [interval]; null: random front; ceiling: the back "
             "into itself; norm: (score - null) / (ceiling - null)"]  # fmt: skip

    def interval(v, lo, hi, spec) -> str:
        return "—" if v != v else f"{v:{spec}} [{lo:{spec}}, {hi:{spec}}]"

    for r in results.itertuples():
        mark = "  BUDGET-LIMITED" if r.budget_limited else ""
        null = "" if r.null_agreement != r.null_agreement else (
            f"  null {r.null_agreement:5.1f}")
        lines.append(
            f"  {r.front_point:>12} -> {r.back_point:<12} {r.objective:<4} {r.protocol:<8} "
            f"{interval(r.agreement, r.agreement_ci_low, r.agreement_ci_high, '5.1f')}"
            f"{null}  ceiling {r.ceiling_agreement:5.1f}  norm "
            f"{interval(r.normalised, r.normalised_ci_low, r.normalised_ci_high, '.2f')}"
            + ("" if r.null_agreement != r.null_agreement else
               f"  excess {r.excess_over_null:+6.1f} [{r.excess_ci_low:+.1f}, "
               f"{r.excess_ci_high:+.1f}]") + mark)  # fmt: skip
    limited = results[results["budget_limited"]]
    if len(limited):
        lines.append(f"budget-limited (the back stitched into itself scores below "
                     f"{CEILING_LIMIT:g} at this budget: these scores measure the budget as "
                     "much as the networks):")  # fmt: skip
        lines += [f"  {r.front_point} -> {r.back_point} {r.objective} {r.protocol}: "
                  f"{r.budget_note}" for r in limited.itertuples()]  # fmt: skip
    return "\n".join(lines)


def _write(out, s, data, front, back, rows, per_run, skipped, seconds, recipe) -> None:
    import pandas as pd

    from .store import write_json, write_text

    df = pd.DataFrame(rows)
    write_text(out / "results.csv", df.to_csv(index=False))
    df.to_parquet(out / "results.parquet", index=False)
    run_rows = [e["run"] | {k: e[k] for k in ("accuracy", "iri_median_error", "iri_flagged",
                                               "init_residual", "seconds")}
                | {k: e.get(k) for k in ("init_samples", "init_images_needed",
                                         "init_underdetermined", "init_ridge")}
                | {"agreement": 100 * float(_unpack(e["values"], e["n"]).mean()),
                   "hard_agreement": e["hard_agreement"]}
                for e in per_run]  # fmt: skip
    write_text(out / "runs.csv", pd.DataFrame(run_rows).to_csv(index=False))
    summary = {
        "front": front.source.describe(), "back": back.source.describe(),
        "front_input": str(front.source.input), "back_input": str(back.source.input),
        "data": {"kind": data.kind, "source": data.source, "split": data.split,
                 "stitch": len(data.stitch), "test": len(data.test),
                 "labelled": data.labelled, "modality": data.modality,
                 "items": data.describe_items()},
        "settings": dataclasses.asdict(s), "iri_recipe": recipe.as_dict(), "skipped": skipped,
        "seconds": round(seconds, 1),
    }  # fmt: skip
    write_json(out / "summary.json", summary)
    from .report.compare import write_compare_report

    write_compare_report(out, df, summary, grid=s.points == "grid")
