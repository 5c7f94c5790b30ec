"""The jobs of an experiment and their store keys.

A job is a plain function of one typed, frozen job object (:class:`TrainJob`,
:class:`IRIJob`, :class:`StitchGroup`, :class:`CKAJob`, :class:`FrontJob`), each holding
the run's :class:`RunContext` (the checked config with the data fingerprints, and the
store folder) and its own fields, so the local executor and Ray run the same code.
Each job writes only its own files, through :mod:`stitchlab.store` (atomic,
checksummed), under a lock: a second process asking for the same job waits and then
reuses the result. A damaged entry is reported by path and recomputed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..runs.executors import assigned_device
from ..store import DamagedEntry, lock, read_json, stable_hash, write_json
from .config import IRIS_SET_KEYS, model_recipe
from .datasets import (
    CACHE,
    base_data,
    content_key,
    expected_fingerprint,
    marked,
    model_data,
    stitch_data,
    test_data,
)

if TYPE_CHECKING:
    from ..iris import IRIRecipe

__all__ = [
    "RunContext",
    "TrainJob",
    "IRIJob",
    "StitchRun",
    "StitchGroup",
    "CKAJob",
    "FrontJob",
    "STORE_VERSION",
    "model_key",
    "stitch_key",
    "iris_data_key",
    "iri_recipe",
    "iri_seed",
    "train_job",
    "iris_job",
    "stitch_group_job",
    "cka_job",
    "front_job",
    "load_model",
    "reference_logits",
    "tracing",
    "threads",
]

log = logging.getLogger("stitchlab.experiments")

STORE_VERSION = 2  # 2: data keyed by content (fingerprint), not by the config's text

_SCORE_COLUMNS = ("agreement", "accuracy", "hard_agreement", "reference_accuracy")


@dataclass(frozen=True)
class RunContext:
    """What every job of one run reads: the checked config with the fingerprints of its
    data (``exp``) and the store folder."""

    exp: dict[str, Any]
    store: str

    @property
    def root(self) -> Path:
        """The store folder as a path."""
        return Path(self.store)


@dataclass(frozen=True)
class TrainJob:
    """Train (or reuse) one base model."""

    ctx: RunContext
    model: str


@dataclass(frozen=True)
class IRIJob:
    """The IRI set of one front at one point on the (marked) stitching data."""

    ctx: RunContext
    front: str
    point: str
    marker: str | None
    seed: int = 0  # the IRIs' random start (:func:`iri_seed`)


@dataclass(frozen=True)
class StitchRun:
    """One stitch run: a row of the results table."""

    pair: str
    front: str
    back: str
    marker: str | None
    point: str
    point_index: int
    objective: str
    protocol: str
    seed: int
    stitch_seed: int
    iris_path: str | None = None

    def __post_init__(self) -> None:
        if (self.protocol == "iris") != (self.iris_path is not None):
            raise ValueError("an IRI-protocol run needs its IRI set's path, a standard run none")


@dataclass(frozen=True)
class StitchGroup:
    """The stitch runs of one (pair, front, point, stitch seed): every objective under
    every protocol. They share one Stitcher: the models are loaded, copied and traced
    once, the least-squares initialisation is computed once, and each protocol's
    activations once for all objectives."""

    ctx: RunContext
    runs: tuple[StitchRun, ...]

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError("a stitch group needs at least one run")
        shared = {(r.pair, r.front, r.back, r.marker, r.point, r.stitch_seed) for r in self.runs}
        if len(shared) != 1:
            raise ValueError(f"the runs of a stitch group must share their pair, front, point "
                             f"and stitch seed; got {sorted(map(str, shared))}")  # fmt: skip


@dataclass(frozen=True)
class CKAJob:
    """Linear CKA of one pair at one point (experiment D)."""

    ctx: RunContext
    pair: str
    front: str
    back: str
    marker: str | None
    point: str
    point_index: int


@dataclass(frozen=True)
class FrontJob:
    """The Front reference point of one pair."""

    ctx: RunContext
    pair: str
    front: str
    back: str
    marker: str | None


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads, then restore the caller's setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _device(exp_raw: dict[str, Any]) -> str:
    """The device this job runs on: the run's, or the GPU Ray assigned this task."""
    return assigned_device(exp_raw["run"]["device"])


def model_key(exp_raw: dict[str, Any], name: str) -> str:
    """Store key of a base model: its table and the content of the data it is trained on."""
    model = {k: v for k, v in exp_raw["models"][name].items() if k not in ("tracing", "data")}
    data = content_key(exp_raw, model_data(exp_raw, name))
    return f"{name}-" + stable_hash({"v": STORE_VERSION, "model": model, "data": data})


def iris_data_key(exp_raw: dict[str, Any], marker: str | None, which: str = "stitch") -> str:
    """What identifies the source images of an IRI set (stitching or test data)."""
    n = exp_raw["stitch"]["n_stitch"] if which == "stitch" else None
    return stable_hash([STORE_VERSION, which, content_key(exp_raw, exp_raw["data"]), n, marker], 24)


def tracing(exp_raw: dict[str, Any], front: str, back: str | None = None) -> dict[str, Any]:
    """How to trace a front (and a back): ``leaf_modules``, ``output``, ``layouts``."""
    from ..splitting import resolve_leaf_modules

    specs = [exp_raw["models"][front].get("tracing", {})]
    if back is not None:
        specs.append(exp_raw["models"][back].get("tracing", {}))
    leaves = resolve_leaf_modules(sorted({c for t in specs for c in t.get("leaf_modules", [])}))
    out: dict[str, Any] = {"leaf_modules": leaves}
    if back is None:
        out["output"] = specs[0].get("output")
        return out
    out["output"] = (specs[0].get("output"), specs[1].get("output"))
    layouts: dict[str, str] = {}
    for t in specs:
        for point, lay in t.get("layouts", {}).items():
            if layouts.setdefault(point, lay) != lay:
                raise ValueError(
                    f"models {front!r} and {back!r} give point {point!r} different layouts"
                )
    out["layouts"] = layouts or None
    return out


def model_dir(store: Path, exp_raw: dict[str, Any], name: str) -> Path:
    """The store folder of a base model."""
    return store / "models" / model_key(exp_raw, name)


def _usable_model(path: Path) -> bool:
    """True when a stored model file exists and its checksum holds (damaged: removed)."""
    from ..models import CheckpointError, read_weights

    if not path.exists():
        return False
    try:
        read_weights(path)
        return True
    except CheckpointError as exc:
        log.warning("%s; retraining it", exc)
        path.unlink()
        return False


def train_job(job: TrainJob) -> dict[str, Any]:
    """Train (or resume, or reuse) one base model; returns its description."""
    from .. import models
    from ..models import CheckpointError
    from ..train import MODEL_FILE, STATE_FILE, train_model

    exp_raw, name = job.ctx.exp, job.model
    store = job.ctx.root
    spec = exp_raw["models"][name]
    data = model_data(exp_raw, name)  # a model may be trained on other data
    out = model_dir(store, exp_raw, name)
    with lock(store / "models" / f".{out.name}.lock", f"model {name}"):
        if _usable_model(out / MODEL_FILE):
            return {"model": name, "reused": True, **models.describe(out / MODEL_FILE)}
        if spec["method"] == "random":  # a null front: initialised with its seed, untrained
            with torch.random.fork_rng():
                torch.manual_seed(spec["seed"])
                model = models.create(spec["arch"], num_classes=data["num_classes"],
                                      **spec["options"])  # fmt: skip
            models.save(model, out / MODEL_FILE, experiment_model=name, method="random",
                        seed=spec["seed"], data=data)  # fmt: skip
            return {"model": name, "reused": False, "evaluation": {}}
        recipe = model_recipe(spec)
        train, test = base_data(data, expected_fingerprint(exp_raw, data))
        training = marked(train, spec["marker"], data, rate=spec.get("marker_rate", 1.0))
        tests = {"clean": test}
        if spec["marker"]:
            tests["marked"] = marked(test, spec["marker"], data)
            tests["rolled"] = marked(test, spec["marker"], data, rolled=True)
        with threads(exp_raw["run"]["threads"]), torch.random.fork_rng():
            torch.manual_seed(spec["seed"])
            model = models.create(spec["arch"], num_classes=data["num_classes"], **spec["options"])
            model = model.to(_device(exp_raw))
            kwargs = dict(
                recipe=recipe, test_data=tests, robust="pgd" if spec["robust_eval"] else None,
                out=out, seed=spec["seed"],
                description={"experiment_model": name, "marker": spec["marker"], "data": data},
            )  # fmt: skip
            try:
                result = train_model(model, training, **kwargs)
            except CheckpointError as exc:  # a damaged training state: start that model over
                if not (out / STATE_FILE).exists():
                    raise
                log.warning("%s; starting %s over", exc, name)
                (out / STATE_FILE).unlink()
                result = train_model(model, training, **kwargs)
    return {"model": name, "reused": False, "evaluation": result.evaluation}


def load_model(exp_raw: dict[str, Any], store: Path, name: str):
    """A stored base model, in eval mode (cached in this process)."""
    from .. import models
    from ..train import MODEL_FILE

    path = model_dir(store, exp_raw, name) / MODEL_FILE
    device = _device(exp_raw)
    return CACHE.get(f"model:{path}", lambda: models.load(path, device=device).eval())


def _iris_options(exp_raw: dict[str, Any]) -> tuple[dict[str, Any], float, float]:
    """``generate_iris_set``'s options of the ``[iris]`` table (the recipe's fields and the
    config's random start ``seed``), and its two quality limits."""
    from ..iris import MIN_NULL_RATIO, THRESHOLD

    opts = dict(exp_raw["iris"])
    opts.pop("per_stitch_seed", None)
    threshold = float(opts.pop("threshold", THRESHOLD))
    min_ratio = float(opts.pop("min_null_ratio", MIN_NULL_RATIO))
    return opts, threshold, min_ratio


def iri_seed(exp_raw: dict[str, Any], stitch_seed: int) -> int:
    """The random start of the IRIs that stitch seed ``stitch_seed`` trains on: ``[iris]
    seed`` (default 0), plus the stitch seed where ``[iris] per_stitch_seed`` is true (so
    the seeds' spread holds the IRIs' random start, as ``stitchlab compare --iri-seeds``)."""
    iris = exp_raw["iris"]
    return int(iris.get("seed", 0)) + (stitch_seed if iris.get("per_stitch_seed") else 0)


def iri_recipe(exp_raw: dict[str, Any]) -> IRIRecipe:
    """The resolved :class:`~stitchlab.iris.IRIRecipe` of an experiment's ``[iris]`` table
    (stitchlab's default where the table names no preset or field; ``seed``, the IRIs'
    random start, is no part of the recipe)."""
    from ..iris import IRIRecipe

    return IRIRecipe.from_kwargs(
        **{k: v for k, v in exp_raw["iris"].items() if k not in IRIS_SET_KEYS}
    )


def iris_job(job: IRIJob) -> dict[str, Any]:
    """Generate (or reuse) the IRI set of one front at one point on one stitching set."""
    from ..iris import generate_iris_set

    exp_raw, store = job.ctx.exp, job.ctx.root
    opts, threshold, min_ratio = _iris_options(exp_raw)
    with threads(exp_raw["run"]["threads"]):
        front = load_model(exp_raw, store, job.front)
        data = stitch_data(exp_raw, job.marker)
        t0 = time.perf_counter()
        iri_set = generate_iris_set(
            front, job.point, data, store / "iris", threshold=threshold,
            min_null_ratio=min_ratio, data_key=iris_data_key(exp_raw, job.marker),
            **tracing(exp_raw, job.front), **{**opts, "seed": job.seed},
        )  # fmt: skip
    q = iri_set.quality
    return {
        "front": job.front, "point": job.point, "marker": job.marker, "seed": job.seed,
        "path": str(iri_set.root), "median_error": q.median_error, "p90_error": q.p90_error,
        "pixel_rms": q.median_pixel_rms, "null_median": q.null_median,
        "null_ratio": q.null_ratio, "flagged": q.flagged,
        "amp": _set_amp(iri_set),
        "seconds": time.perf_counter() - t0,
    }  # fmt: skip


def _set_amp(iri_set) -> str | None:
    """The arithmetic an IRI set's steps ran in (``amp="auto"`` resolved where it was made:
    ``"bf16"`` on CUDA, ``"off"`` elsewhere; sets made by an earlier stitchlab may record
    ``"auto"`` or ``"fast"``); None for a set stored without it."""
    return iri_set.meta.get("recipe", {}).get("amp")


def _iris_key(exp_raw: dict[str, Any], seed: int | None = None) -> dict[str, Any]:
    """What an invariance-aware run's IRIs are: the resolved recipe (not the [iris] table's
    text, so that a change of stitchlab's default recipe is a new key, never a stale
    result), the quality limits and the random start ``seed`` (default: ``[iris] seed``).
    ``per_stitch_seed`` is not in it: a run's own start is, so switching it on reuses the
    runs whose start it leaves as it was."""
    _, threshold, min_ratio = _iris_options(exp_raw)
    recipe = iri_recipe(exp_raw).key_dict()
    key = {"recipe": recipe, "threshold": threshold, "min_null_ratio": min_ratio}
    seed = exp_raw["iris"].get("seed", 0) if seed is None else seed
    if seed:  # seed 0, the default, keeps the keys of earlier stores
        key["seed"] = seed
    return key


def stitch_key(exp_raw: dict[str, Any], job: StitchRun) -> str:
    """Store key of one stitch run."""
    parts = {
        "v": STORE_VERSION,
        "front": model_key(exp_raw, job.front),
        "back": model_key(exp_raw, job.back),
        "marker": job.marker,
        "point": job.point,
        "objective": job.objective,
        "protocol": job.protocol,
        "stitch_seed": job.stitch_seed,
        # the settings shared by all runs, not the lists that enumerate the runs
        "stitch": {
            k: v
            for k, v in exp_raw["stitch"].items()
            if k not in ("points", "objectives", "protocols", "seeds", "cka", "eval_batch_size")
        },
        "data": content_key(exp_raw, exp_raw["data"]),
        "iris": (
            _iris_key(exp_raw, iri_seed(exp_raw, job.stitch_seed))
            if job.protocol == "iris" else None
        ),  # fmt: skip
    }
    tracing_ = {k: exp_raw["models"][getattr(job, k)].get("tracing", {}) for k in ("front", "back")}
    if any(t.get("output") is not None or t.get("layouts") for t in tracing_.values()):
        parts["tracing"] = {
            k: {"output": t.get("output"), "layouts": t.get("layouts")} for k, t in tracing_.items()
        }
    return stable_hash(parts, 24)


def row_names(exp_raw: dict[str, Any], job: StitchRun) -> dict[str, Any]:
    """The columns of a result row that name the run (not part of its store key)."""
    return {
        "experiment": exp_raw["name"], "pair": job.pair, "front": job.front,
        "back": job.back, "point": job.point, "point_index": job.point_index,
        "objective": job.objective, "protocol": job.protocol, "seed": job.seed,
        "stitch_seed": job.stitch_seed, "marker": job.marker or "",
        "iri_seed": iri_seed(exp_raw, job.stitch_seed) if job.protocol == "iris" else None,
    }  # fmt: skip


def check_row(row: dict[str, Any], path: Path) -> dict[str, Any]:
    """A stored stitch row whose scores are numbers in [0, 100] (else DamagedEntry)."""
    for col in _SCORE_COLUMNS:
        v = row.get(col)
        if v is None and col != "agreement":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DamagedEntry(path, f"{col} is {v!r}, not a number")
        if not (math.isnan(v) and col != "agreement") and not 0.0 <= v <= 100.0:
            raise DamagedEntry(path, f"{col} is {v!r}, outside [0, 100]")
    return row


def _stored_row(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        return check_row(read_json(path), path)
    except DamagedEntry as exc:
        log.warning("stitch run %s is damaged (%s); recomputing it", path, exc.why)
        return None


def stitch_group_job(group: StitchGroup) -> list[dict[str, Any]]:
    """The stitch runs of one group, each scored on the test data: the rows of the results
    table. A run already in the store is reused; the others share one
    :class:`~stitchlab.Stitcher` (built on first need), each protocol's training set and
    its cached activations."""
    exp_raw, store = group.ctx.exp, group.ctx.root
    shared: _Shared | None = None
    rows = []
    for run in group.runs:
        path = store / "stitch" / f"{stitch_key(exp_raw, run)}.json"
        row = _stored_row(path)
        if row is not None:  # it may come from another experiment sharing the store
            rows.append({**row, **row_names(exp_raw, run), "_reused": True})
            continue
        with lock(path.with_name(f".{path.stem}.lock"), f"stitch run {path.stem}"):
            row = _stored_row(path)  # another process may have finished it meanwhile
            if row is not None:
                rows.append({**row, **row_names(exp_raw, run), "_reused": True})
                continue
            with threads(exp_raw["run"]["threads"]):
                shared = shared or _Shared(group)
                row = _compute_stitch(run, shared)
            write_json(path, row)
        rows.append({**row, "_reused": False})
    return rows


class _Shared:
    """What the runs of one stitch group share: the models, the data, one Stitcher, and
    the training set of the protocol being run (one at a time, to bound memory)."""

    def __init__(self, group: StitchGroup) -> None:
        from .. import Stitcher

        run, ctx = group.runs[0], group.ctx
        exp_raw, store = ctx.exp, ctx.root
        self.ctx = ctx
        self.back = load_model(exp_raw, store, run.back)
        self.front = front = load_model(exp_raw, store, run.front)
        self.stitching = stitch_data(exp_raw, run.marker)
        trace = tracing(exp_raw, run.front, run.back)
        self.stitcher = Stitcher(front, self.back, run.point, device=_device(exp_raw),
                                 **trace)  # fmt: skip
        test = test_data(exp_raw)
        self.test = marked(test, run.marker, exp_raw["data"])
        self.rolled = marked(test, run.marker, exp_raw["data"], rolled=True) if run.marker else None
        self._sets: dict[str, Any] = {}
        self._front_acts: dict[str, Any] = {}
        self._transfer: dict[str, dict[str, Any]] = {}

    def scores(self, stitched, which: str, reference, batch_size: int) -> dict[str, float]:
        """``evaluate`` of ``stitched`` on the group's test set (``which``: "test" or
        "rolled"). The front prefix's activations of the set are computed once per group
        (the front is frozen; every run of the group scores on the same activations), when
        both sets fit the activation-cache budget; the scores equal those on the clips."""
        from ..evaluation import evaluate
        from ..fit import TrainingConfig

        data = self.test if which == "test" else self.rolled
        if stitched.front is not self.stitcher.front_prefix:  # a train-mode fit's own copy
            return evaluate(stitched, data, reference, batch_size=batch_size)
        if which not in self._front_acts:
            budget = TrainingConfig().cache_budget_bytes // 2  # the test and rolled sets
            self._front_acts[which] = self.stitcher.front_activations(
                data, batch_size=batch_size, budget_bytes=budget
            )
        acts = self._front_acts[which]
        if acts is None:  # over the budget
            return evaluate(stitched, data, reference, batch_size=batch_size)
        return self.stitcher.evaluate(stitched, acts, reference, batch_size=batch_size)

    def training_set(self, run: StitchRun):
        """The StitchingSet of ``run``'s protocol (the previous protocol's is released)."""
        from ..iris import IRISet
        from ..protocols import InvarianceAware, Standard

        key = run.iris_path or run.protocol
        if key not in self._sets:
            _, threshold, min_ratio = _iris_options(self.ctx.exp)
            protocol = (
                InvarianceAware(
                    iris=IRISet(run.iris_path), branches=self.ctx.exp["stitch"]["iris_branches"],
                    threshold=threshold, min_null_ratio=min_ratio,
                    allow_flagged=True,  # flagged sets are run and marked in the table
                )  # fmt: skip
                if run.protocol == "iris"
                else Standard()
            )
            sset = self.stitcher.collect(self.stitching, protocol, seed=run.stitch_seed)
            self._sets = {key: sset}
        return self._sets[key]

    def transfer(self, run: StitchRun) -> dict[str, Any]:
        """Stitch-free, for an IRI-protocol run: how the whole front and back models decide
        on the IRI set against its source images
        (:func:`stitchlab.evaluation.iri_agreement`), the back's share of equal top-1
        decisions, and the back's agreement between two different
        source images (its null), and the arithmetic the set's steps ran in (``iri_amp``; a
        reused row keeps its own, even where this machine would make its sets in another),
        once per set; empty for the standard protocol."""
        from ..evaluation import iri_transfer_columns
        from ..iris import IRISet

        if run.protocol != "iris" or run.iris_path is None:
            return {}
        if run.iris_path not in self._transfer:
            iris = IRISet(run.iris_path)
            self._transfer[run.iris_path] = {**iri_transfer_columns(
                self.front, self.back, iris, self.stitching,
                batch_size=self.ctx.exp["stitch"]["eval_batch_size"],
            ), "iri_amp": _set_amp(iris)}  # fmt: skip
        return self._transfer[run.iris_path]


def _compute_stitch(run: StitchRun, shared: _Shared) -> dict[str, Any]:
    from ..evaluation import robust_scores
    from ..fit import TrainingConfig

    exp_raw, store = shared.ctx.exp, shared.ctx.root
    st = exp_raw["stitch"]
    t0 = time.perf_counter()
    settings = TrainingConfig.from_kwargs(seed=run.stitch_seed, init_samples=st["n_init"],
                                          **st["training"])  # fmt: skip
    stitched = shared.stitcher.fit(run.objective, shared.training_set(run), settings=settings,
                                   init_data=shared.stitching)  # fmt: skip
    reference = reference_logits(exp_raw, store, run.back, run.marker)
    scores = shared.scores(stitched, "test", reference, st["eval_batch_size"])
    if st["attack"]:  # experiment B: agreement under PGD against the stitched model
        scores.update(robust_scores(stitched, shared.test, shared.back, st["attack"],
                                    batch_size=st["eval_batch_size"]))  # fmt: skip
    row: dict[str, Any] = {
        **row_names(exp_raw, run), **scores, "init_residual": stitched.init_residual,
        "adversarial": st["training"].get("adversarial") is not None,
        "cache_used": stitched.cache_used,
    }  # fmt: skip
    if run.marker and st["excess"]:
        ref_rolled = reference_logits(exp_raw, store, run.back, run.marker, rolled=True)
        row["agreement_rolled"] = shared.scores(stitched, "rolled", ref_rolled, 256)["agreement"]
        row["excess_agreement"] = row["agreement"] - row["agreement_rolled"]
    q = stitched.iri_quality
    if q is not None:
        row.update(iri_median_error=q.median_error, iri_p90_error=q.p90_error,
                   iri_pixel_rms=q.median_pixel_rms, iri_null_median=q.null_median,
                   iri_null_ratio=q.null_ratio, iri_flagged=q.flagged)  # fmt: skip
        row.update(shared.transfer(run))
    row["seconds"] = time.perf_counter() - t0
    return row


def _pair_on_test(job: CKAJob | FrontJob):
    """``(front, back, test data with the pair's marker)`` of a job."""
    exp_raw, store = job.ctx.exp, job.ctx.root
    front = load_model(exp_raw, store, job.front)
    back = load_model(exp_raw, store, job.back)
    return front, back, marked(test_data(exp_raw), job.marker, exp_raw["data"])


def cka_job(job: CKAJob) -> list[dict[str, Any]]:
    """Experiment D: linear CKA between front and back at one point, on the test data and
    on the front's IRIs of the test data (same IRI machinery and recipe)."""
    from .._data import batches
    from ..iris import generate_iris_set
    from ..metrics import cka
    from ..splitting import split

    exp_raw, store = job.ctx.exp, job.ctx.root
    opts, threshold, min_ratio = _iris_options(exp_raw)
    rows = []
    with threads(exp_raw["run"]["threads"]):
        front, back, test = _pair_on_test(job)
        f_front, _ = split(front, job.point, **tracing(exp_raw, job.front))
        f_back, _ = split(back, job.point, **tracing(exp_raw, job.back))
        iri_set = generate_iris_set(
            front, job.point, test, store / "iris", threshold=threshold,
            min_null_ratio=min_ratio, data_key=iris_data_key(exp_raw, job.marker, "test"),
            **tracing(exp_raw, job.front), **opts,
        )  # fmt: skip
        for name, data in (("test", test), ("test_iris", iri_set)):
            fa, ba = [], []
            with torch.no_grad():
                for x, _ in batches(data, 256, torch.device(_device(exp_raw))):
                    fa.append(f_front(x).flatten(1).cpu())
                    ba.append(f_back(x).flatten(1).cpu())
            rows.append({
                "pair": job.pair, "front": job.front, "back": job.back,
                "point": job.point, "point_index": job.point_index, "data": name,
                "cka": cka(torch.cat(fa), torch.cat(ba)),
                "iri_amp": _set_amp(iri_set) if name == "test_iris" else None,
            })  # fmt: skip
    return rows


def reference_logits(exp_raw, store: Path, back: str, marker, rolled: bool = False):
    """The back model's logits on the (marked) test data, computed once per process."""
    from .._data import predict

    def make():
        model = load_model(exp_raw, store, back)
        return predict(model, marked(test_data(exp_raw), marker, exp_raw["data"], rolled))[0]

    return CACHE.get(f"ref:{model_key(exp_raw, back)}:{marker}:{rolled}", make)


def front_job(job: FrontJob) -> dict[str, Any]:
    """The Front reference point: the front model's own agreement with the back."""
    from .. import evaluate
    from .._data import predict
    from ..metrics import accuracy

    with threads(job.ctx.exp["run"]["threads"]):
        front, back, test = _pair_on_test(job)
        scores = evaluate(front, test, back)
        back_logits, labels = predict(back, test)
    return {
        "pair": job.pair, "front": job.front, "back": job.back,
        "front_agreement": scores["agreement"], "front_accuracy": scores["accuracy"],
        "back_accuracy": accuracy(back_logits, labels),
    }  # fmt: skip
