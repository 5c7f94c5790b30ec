"""Running a comparison: :func:`run_compare` (files under ``out``) and :func:`compare`
(the results table in memory)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from .jobs import CompareContext, cell_jobs, run_cell
from .plan import (
    _images_needed,
    _need,
    _stored_iri_sets,
    _stored_run,
    comparison_plan,
    plan_runs,
)
from .points import match_points
from .settings import QUICK_MAX_IMAGES, CompareSettings
from .sides import _back_logits, _recipe, _sides, _source, _Unlabelled, module_source, tensor_reader
from .tables import _aggregate, _write

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["compare", "run_compare"]

log = logging.getLogger("stitchlab.compare")


def compare(
    front: nn.Module | str,
    back: nn.Module | str,
    data: Any,
    *,
    points: str | Sequence[str] | None = None,
    objectives: Sequence[str] | None = None,
    protocols: Sequence[str] | None = None,
    seeds: int | None = None,
    quick: bool = False,
    device: str = "cpu",
    out: str | os.PathLike | None = None,
    store: str | os.PathLike | None = None,
    executor: Any = None,
    progress: bool = True,
    **options: Any,
) -> pd.DataFrame:
    """How functionally similar are ``front`` and ``back``? Stitch the front into the back
    at matched points and return the results table (a DataFrame with the columns of
    ``stitchlab compare``'s results.csv: the agreement with its interval, the null, the
    ceiling, the normalised score, ``budget_limited``, ...; one row per front point, back
    point, objective and protocol).

    ``front``/``back``: ``nn.Module``s (copied: never moved or switched to eval mode; one
    built by :func:`stitchlab.models.create` is read as its name is on the command line,
    any other reads [0, 1] pixels at the data's size) or model specs as the command line takes them
    (a checkpoint, a registry name, ``timm:NAME``/``torchvision:NAME`` with
    ``front_weights=``/``back_weights=``, ``hf:FOLDER``). ``data``: a path (image folder,
    CIFAR-10 folder, .npz, .safetensors, Hugging Face datasets folder, .wav folder), a
    tensor of images, a pair ``(images, labels)``, a dict of arrays named as in a .npz
    (``x``/``y`` or ``x_train``...``y_test``), or a Dataset of (image, label) items.
    ``points``: ``"depth"`` (default), ``"grid"`` or names (``"p"`` or ``"front:back"``).
    ``quick``: the smoke-test budget of :meth:`CompareSettings.quick`. Every other
    keyword is a field of :class:`CompareSettings` (``n_points``, ``null_seeds``,
    ``n_stitch``, ``n_test``, ``epochs``, ``iri_steps``, ...).

    Nothing is written unless asked: the runs are stored in a temporary folder that is
    removed; ``store=`` keeps them (a later call with the same store resumes, computing
    only what is missing) and ``out=`` writes the files of ``stitchlab compare`` there
    (its store under ``out/store`` unless ``store`` is given). ``executor``: where the
    stitch jobs run (a :class:`~stitchlab.experiments.RayExecutor` for Ray).
    """
    import tempfile

    given = {"points": points, "objectives": objectives, "protocols": protocols,
             "seeds": seeds, "device": device} | options  # fmt: skip
    given = {k: (tuple(v) if k == "points" and not isinstance(v, str) else v)
             for k, v in given.items() if v is not None}  # fmt: skip
    specs = {side: m if isinstance(m, str) else f"{side} ({type(m).__name__})"
             for side, m in (("front", front), ("back", back))}  # fmt: skip
    described = str(data) if isinstance(data, (str, os.PathLike)) else "(in memory)"
    s = (CompareSettings.quick if quick else CompareSettings)(
        front=specs["front"], back=specs["back"], data=described, **given)

    def sources() -> tuple:
        return tuple(_source(s, side) if isinstance(m, str) else
                     module_source(m, side, null=side == "front" and s.nulls > 0)
                     for side, m in (("front", front), ("back", back)))  # fmt: skip

    read = None if isinstance(data, (str, os.PathLike)) else tensor_reader(data)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        store = store if store is not None else out / "store"
    if store is not None:
        return _run(s, sources, read, out, Path(store), progress, log.info, executor)
    with tempfile.TemporaryDirectory(prefix="stitchlab-compare-") as tmp:
        return _run(s, sources, read, None, Path(tmp), progress, log.info, executor)


def run_compare(
    settings: CompareSettings,
    out: str | Path,
    *,
    store: str | Path | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
    executor: Any = None,
    plan_only: bool = False,
):
    """Run (or resume) a comparison; write ``results.csv``, ``results.parquet``,
    ``runs.csv``, ``summary.json``, figures and ``report.html`` under ``out``. Returns
    the results table (a pandas DataFrame, one row per front point, back point,
    objective and protocol). ``executor``: where the stitch jobs run
    (:class:`~stitchlab.runs.LocalExecutor` by default, or a
    :class:`~stitchlab.runs.RayExecutor`). ``plan_only``: print the plan (stages, what
    is stored, the time estimate) and return it as a :class:`~stitchlab.runs.Plan`,
    computing nothing."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    store = Path(store) if store is not None else out / "store"
    s = settings
    return _run(s, lambda: (_source(s, "front"), _source(s, "back")), None, out, store,
                progress, echo, executor, plan_only)  # fmt: skip


def _run(s: CompareSettings, sources: Callable[[], tuple], read: Callable[..., Any] | None,
         out: Path | None, store: Path, progress: bool, echo: Callable[[str], None],
         executor: Any, plan_only: bool = False):  # fmt: skip
    """A comparison: plan, compute what the store lacks (jobs on ``executor``), table;
    the files under ``out`` when given. ``plan_only``: return the :class:`~stitchlab.runs.Plan`
    after printing it, computing nothing."""
    t0 = time.time()
    data, front, back = _sides(s, *sources(), read)
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
            data, front, back = _sides(s, *sources(), read)
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
    runs = plan_runs(s, front, back, data, cells, objectives, n_init, recipe)
    entries: dict[str, dict] = {}  # stored runs, read once: checked here, tabled below
    for r in runs:
        entry = _stored_run(store / "compare" / f"{r['key']}.json", echo)
        if entry is not None:
            entries[r["key"]] = entry
    todo = [r for r in runs if r["key"] not in entries]
    null_fronts: dict[int, nn.Module] = {}  # built once, for the estimate and the runs
    stored = _stored_iri_sets(s, front, back, stitch_set, store, recipe, todo, null_fronts)
    plan = comparison_plan(s, data, front, back, cells, objectives, runs, todo, needs, n_init,
                           len(stitch_set), recipe.steps, stored)  # fmt: skip
    echo(plan.text())
    for line in plan_skipped[1 if plan_skipped and plan_skipped[0].startswith("HLM") else 0:]:
        echo(f"left out: {line}")
    if plan_only:
        return plan
    reference = _back_logits(back.model, test_set, s.device)
    context = CompareContext(s, front, back, stitch_set, test_set, reference.cpu(), store,
                             recipe, null_fronts)  # fmt: skip
    _execute(context, todo, executor, progress)
    from ..store import read_json

    entries |= {r["key"]: read_json(store / "compare" / f"{r['key']}.json") for r in todo}
    rows = _aggregate(s, front, back, data, runs, entries, needs)
    if out is not None:
        _write(out, s, data, front, back, rows, [entries[r["key"]] for r in runs],
               plan_skipped, time.time() - t0, recipe, plan)  # fmt: skip
    import pandas as pd

    return pd.DataFrame(rows)




def _execute(context: CompareContext, todo: list[dict], executor: Any,
             progress: bool) -> None:  # fmt: skip
    """Compute the runs of ``todo``: one job per (front model, cell) on ``executor``."""
    from ..runs import LocalExecutor

    if not todo:
        return
    executor = executor if executor is not None else LocalExecutor(progress=progress)
    executor.configure({"device": context.settings.device})
    if not isinstance(executor, LocalExecutor):  # jobs travel: models on the CPU, moved there
        for model in (context.front.model, context.back.model, *context.null_fronts.values()):
            model.cpu()
    executor.map(run_cell, cell_jobs(context, todo), desc="stitch cells")
