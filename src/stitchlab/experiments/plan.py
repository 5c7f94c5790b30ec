"""The plan of an experiment: its jobs per stage, what the store holds, a time estimate.

The estimate times one forward and backward pass of each architecture (untrained, on the
run's device) and of each front prefix that makes IRIs, on a batch of the stitching
data, and multiplies by each job's work (:mod:`stitchlab.runs.plan`). It reads the store
but writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..runs.plan import (
    TIMING_BATCH,
    Plan,
    Stage,
    iri_seconds,
    seconds_per_image,
    stitch_seconds,
    training_seconds,
)
from .config import Experiment, model_recipe
from .datasets import base_data, model_data, stitch_data, test_data
from .jobs import (
    _iris_options,
    iri_recipe,
    iri_seed,
    iris_data_key,
    model_dir,
    stitch_key,
    tracing,
)

__all__ = ["plan_experiment"]


def _model_stored(raw: dict[str, Any], store: Path, name: str) -> bool:
    from ..train import MODEL_FILE

    return (model_dir(store, raw, name) / MODEL_FILE).exists()


def _training(spec: dict[str, Any]) -> tuple[int, float]:
    """A base model's epochs and forward and backward passes per training image (PGD's
    steps on the adversarial share of a batch for adversarial training, two views for
    SimCLR)."""
    recipe = model_recipe(spec)
    if spec["method"] == "adversarial":
        return recipe.epochs, 1 + recipe.adv_steps * recipe.adv_fraction
    return recipe.epochs, 2.0 if spec["method"] == "simclr" else 1.0


def plan_experiment(exp: Experiment, raw: dict[str, Any], store: Path) -> Plan:
    """The plan of experiment ``exp`` (``raw``: its checked config with the data's
    fingerprints, as :func:`~stitchlab.experiments.run_experiment` keys its jobs) over the
    store folder ``store``: base models, IRI sets, stitch runs and CKA, each with what is
    stored and the estimated time of the rest."""
    from .. import models
    from ..splitting import split

    device = raw["run"]["device"]
    recipe = iri_recipe(raw)
    stitch, training = exp.stitch, exp.stitch["training"]
    n_test = len(test_data(raw))
    markers = {spec["marker"] for spec in exp.pairs.values()}
    sets = {m: stitch_data(raw, m) for m in markers}
    n_stitch = len(next(iter(sets.values())))
    some = sets[next(iter(markers))]
    x = torch.stack([some[i][0] for i in range(min(TIMING_BATCH, n_stitch))]).to(device)

    nets: dict[str, torch.nn.Module] = {}

    def net(name: str) -> torch.nn.Module:  # untrained, for timing: what matters is the shape
        if name not in nets:
            spec = exp.models[name]
            with torch.random.fork_rng():
                nets[name] = models.create(spec["arch"], num_classes=model_data(raw, name)[
                    "num_classes"], **spec["options"]).to(device).eval()  # fmt: skip
        return nets[name]

    timed: dict[tuple[str, str | None, bool], float] = {}

    def per_image(name: str, point: str | None = None, train: bool = False) -> float:
        """Seconds per image through model ``name`` (its prefix up to ``point``), with
        parameter gradients where it is ``train``ed, frozen otherwise."""
        if (name, point, train) not in timed:
            model = net(name)
            if point is not None:
                model = split(model, point, **tracing(raw, name))[0]
            timed[name, point, train] = seconds_per_image(model, x, parameters=train)
        return timed[name, point, train]

    # 1. base models
    needed = sorted({m for p in exp.pairs.values() for m in [*p["front"], p["back"]]})
    todo = [m for m in needed if not _model_stored(raw, store, m)]
    train_s = sum(
        training_seconds(per_image(m, train=True), len(base_data(model_data(raw, m))[0]),
                         *_training(exp.models[m]))  # fmt: skip
        for m in todo if exp.models[m]["method"] != "random"
    )
    stages = [Stage("base models", len(needed), len(needed) - len(todo), train_s)]

    # 2. IRI sets per (front, point, marker, random start), 4. CKA's IRIs of the test data
    opts, threshold, min_ratio = _iris_options(raw)
    starts = sorted({iri_seed(raw, s) for s in stitch["seeds"]})
    iri_sets = {(f, point, spec["marker"], start)
                for pair, spec in exp.pairs.items() for f in spec["front"]
                for point in exp.points[pair] for start in starts}  # fmt: skip
    if "iris" not in stitch["protocols"]:
        iri_sets = set()

    def set_stored(front: str, point: str, marker, start: int, which: str) -> bool:
        """As :func:`~.jobs.iris_job` (``which="stitch"``) or :func:`~.jobs.cka_job`
        (``"test"``) would key the set."""
        from ..iris import iris_set_stored

        if not _model_stored(raw, store, front):
            return False
        from .jobs import load_model

        data = sets[marker] if which == "stitch" else test_data(raw)
        return iris_set_stored(
            load_model(raw, store, front), point, data, store / "iris", threshold=threshold,
            min_null_ratio=min_ratio, data_key=iris_data_key(raw, marker, which),
            **tracing(raw, front), **{**opts, "seed": start},
        )  # fmt: skip

    stored = {k for k in iri_sets if set_stored(*k, "stitch")}
    iri_s = sum(iri_seconds(per_image(f, p), n_stitch, recipe.steps)
                for f, p, _, _ in iri_sets - stored)  # fmt: skip
    stages.append(Stage("IRI sets", len(iri_sets), len(stored), iri_s,
                        f"{recipe.steps} steps of {n_stitch} images each; samples stop at "
                        "the recipe's tolerance", at_most=True))

    # 3. stitch runs
    runs = []
    for pair, spec in exp.pairs.items():
        for front in spec["front"]:
            for i, point in enumerate(exp.points[pair], start=1):
                for seed in stitch["seeds"]:
                    for protocol in stitch["protocols"]:
                        for objective in stitch["objectives"]:
                            runs.append((pair, front, spec["back"], spec["marker"], point, i,
                                         objective, protocol, seed))  # fmt: skip
    left = [r for r in runs if not _run_stored(raw, store, exp, r)]
    stitch_s = sum(stitch_seconds(per_image(f, p), per_image(b), n_stitch, training["epochs"],
                                  n_test) for _, f, b, _, p, *_ in left)  # fmt: skip
    stages.append(Stage("stitch runs", len(runs), len(runs) - len(left), stitch_s))

    if stitch["cka"]:
        cka = {(f, p, spec["marker"]) for pair, spec in exp.pairs.items()
               for f in spec["front"] for p in exp.points[pair]}  # fmt: skip
        start = int(raw["iris"].get("seed", 0))
        done = {k for k in cka if set_stored(*k, start, "test")}
        cka_s = sum(iri_seconds(per_image(f, p), n_test, recipe.steps) for f, p, _ in cka - done)
        stages.append(Stage("CKA (test IRIs)", len(cka), len(done), cka_s, at_most=True))
    lines = (f"experiment {exp.name}: {len(exp.pairs)} pairs, {len(needed)} models, "
             f"{sum(len(p) for p in exp.points.values())} pair-points on {device}",)  # fmt: skip
    return Plan(f"plan of {exp.name}", tuple(stages), lines)


def _run_stored(raw: dict[str, Any], store: Path, exp: Experiment, run: tuple) -> bool:
    from .jobs import StitchRun

    pair, front, back, marker, point, i, objective, protocol, seed = run
    iris = "" if protocol == "iris" else None  # the set's path is no part of the key
    job = StitchRun(pair, front, back, marker, point, i, objective, protocol,
                    exp.models[front]["seed"], seed, iris)  # fmt: skip
    return (store / "stitch" / f"{stitch_key(raw, job)}.json").exists()
