"""The plan of a comparison: the runs and their store keys, the images each cell's least
squares needs, what is stored already, and a time estimate."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..store import stable_hash
from .points import _depths
from .settings import CompareSettings, _iri_seed, _unpack
from .sides import _leaves, _null_front, _Side

if TYPE_CHECKING:
    from ..runs import Plan

log = logging.getLogger("stitchlab.compare")

def _key(obj: dict[str, Any]) -> str:
    """A run's content key: the experiments' hash of its settings (20 hex digits)."""
    return stable_hash(obj, 20)


_VERSION = 2  # of the stored run format


def plan_runs(s: CompareSettings, front: _Side, back: _Side, data, cells, objectives,
              n_init: dict, recipe) -> list[dict[str, Any]]:  # fmt: skip
    """Every run of a comparison with its store key: per cell, protocol and objective the
    seeds of the real front and of the null fronts, then the ceilings (the back into
    itself at each back point: one per back point, budget and seed, shared by the cells
    that need it). A key hashes both models' weights and input pipelines, the data's
    content, the run and every setting that changes it."""
    from ..data.fingerprint import fingerprint

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
    return runs + list(ceilings.values())


def _need(needs: dict, cell: tuple[str, str]) -> int:
    """The images a cell's least squares needs: for its front (and null fronts) and for
    its ceiling (the back into itself at the back point)."""
    return max(needs[cell])


def _images_needed(s, front: _Side, back: _Side, cells, data) -> dict[tuple, tuple[int, int]]:
    """``(front -> back, back -> back)`` images each cell's least squares needs
    (:func:`stitchlab.fit.images_needed`), from one traced pass of each model on 3 images."""
    from .._data import as_dataset
    from ..fit import images_needed
    from ..splitting import TracedModel

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


def _stored_run(path: Path, echo: Callable[[str], None]) -> dict | None:
    """A stored run's entry, or None when it is not stored or is damaged (truncated,
    edited, agreements not in [0, 1]: reported, and computed again, which overwrites it)."""
    from ..store import DamagedEntry, read_json

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


def comparison_plan(s, data, front, back, cells, objectives, runs, todo, needs, n_init,
                    n_stitch: int, iri_steps: int, stored_sets: set[tuple]) -> Plan:  # fmt: skip
    """The plan of a comparison: what it compares on what, its stages (the IRI sets its
    runs to compute need, the stitch runs), what is stored and a time estimate from one
    timed batch of each model; notes name the cells whose least squares is
    under-determined."""
    from ..runs import Plan, Stage

    n_ceiling = sum(1 for r in runs if r.get("ceiling"))
    lines = (
        f"front: {front.source.describe()}", f"  input: {front.source.input}",
        f"back:  {back.source.describe()}", f"  input: {back.source.input}",
        f"data:  {data.kind} {data.source}: {len(data.stitch)} stitching, {len(data.test)} "
        f"test {data.describe_items()}, "
        f"{'labelled' if data.labelled else 'unlabelled'} ({data.split})",
        f"cells: {', '.join(f'{a}->{b}' for a, b in cells)}",
        f"runs:  {len(runs)} = {len(cells)} cells x {len(s.protocols)} protocols x "
        f"{len(objectives)} objectives x ({s.seeds} seeds + {s.nulls} null fronts) + "
        f"{n_ceiling} ceiling runs (the back into itself at each back point, {s.seeds} seeds)",
    )  # fmt: skip
    needed = _iri_sets_of(s, todo, front.fingerprint == back.fingerprint)
    iris, fits = _estimate(s, front, back, data.item_shape, iri_steps, todo, needed - stored_sets)
    stages = (
        Stage("IRI sets", len(needed), len(needed & stored_sets), iris,
              f"{iri_steps} steps of {n_stitch} images each; samples stop at the recipe's "
              "tolerance", at_most=True),
        Stage("stitch runs", len(runs), len(runs) - len(todo), fits),
    )  # fmt: skip
    notes = []
    for f, b in cells:
        have = min(n_init[(f, b)], n_stitch)
        for what, need in ((f"{f} -> {b}", needs[(f, b)][0]),
                           (f"{b} -> {b} (ceiling)", needs[(f, b)][1])):  # fmt: skip
            if have < need:
                notes.append(f"  {what}: {have} images, needs {need}")
    if notes:
        from ..fit import UNDERDETERMINED_RIDGE

        notes.insert(0, f"under-determined least squares (fewer rows, images x positions, than "
                     f"input channels + 1): these use ridge {UNDERDETERMINED_RIDGE:g} and their "
                     "ceiling will show what the budget loses; for a determined fit give "
                     "--n-init and --n-stitch of at least the images needed")  # fmt: skip
    return Plan("comparison", stages, lines, tuple(notes))


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
    from .._data import as_dataset
    from ..iris.store import data_fingerprint, iris_set_stored

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


def _estimate(s, front, back, shape, iri_steps, todo,
              to_make: set[tuple]) -> tuple[float | None, float | None]:  # fmt: skip
    """Seconds of the IRI sets ``to_make`` (every step: an upper bound) and of the stitch
    runs ``todo``, from one timed batch of each model; ``(None, None)`` when a model cannot
    be timed (the run itself reports why)."""
    from ..runs.plan import TIMING_BATCH, iri_seconds, seconds_per_image, stitch_seconds

    if not todo:
        return 0.0, 0.0
    x = torch.rand(min(TIMING_BATCH, s.n_stitch), *shape, device=s.device)
    try:
        tf, tb = (seconds_per_image(m, x, parameters=False) for m in (front.model, back.model))
    except Exception:  # noqa: BLE001 - only an estimate: the real run reports the error
        return None, None
    depth = dict(zip(front.points, _depths(front.points)))
    back_depth = dict(zip(back.points, _depths(back.points)))
    # an IRI step runs the front's prefix only (about its relative depth of the network)
    iris = sum(iri_seconds(tb if c else tf, s.n_stitch, iri_steps, back_depth[f] if c else depth[f])
               for f, _, _, c in to_make)  # fmt: skip
    fits = sum(stitch_seconds(tb if r.get("ceiling") else tf, tb, s.n_stitch, s.epochs, s.n_test)
               for r in todo)  # fmt: skip
    return iris, fits
