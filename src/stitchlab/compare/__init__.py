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
pipelines, the data, the points and every setting) as soon as it finishes, under a lock,
so an interrupted comparison resumes without losing finished runs and two processes
never compute one run twice; IRI sets are cached in ``store/iris``. The runs are computed
by jobs, one per front model (the front, a null front, or the back for the ceiling) and
cell, on an executor of :mod:`stitchlab.experiments` (in this process, or on Ray).

:func:`compare` (``stitchlab.compare`` at the top level) takes ``nn.Module``s or specs
and tensors or a path, and returns the results table in memory; :func:`run_compare`
writes the files of ``stitchlab compare``. The modules: :mod:`.settings` (what a
comparison depends on), :mod:`.points`, :mod:`.sides` (the models and the data),
:mod:`.plan` (the runs, their keys, the estimate), :mod:`.jobs`, :mod:`.tables` (scores
and files), :mod:`.run`.
"""

from __future__ import annotations

from .points import match_points
from .run import compare, run_compare
from .settings import (
    CEILING_LIMIT,
    QUICK_MAX_IMAGES,
    CompareSettings,
    is_compare_config,
    load_compare_config,
)
from .tables import bootstrap_agreement, console_table, normalised_score

__all__ = [
    "CEILING_LIMIT",
    "QUICK_MAX_IMAGES",
    "console_table",
    "CompareSettings",
    "compare",
    "run_compare",
    "match_points",
    "normalised_score",
    "bootstrap_agreement",
    "load_compare_config",
    "is_compare_config",
]
