"""The jobs of an experiment and their store keys.

A job is a plain function of one JSON-ready dict (``exp``: the checked config with the
data fingerprints, ``store``: the store folder, and the job's own fields), so the local
executor and Ray run the same code. Each job writes only its own files, through
:mod:`stitchlab.store` (atomic, checksummed), under a lock: a second process asking for
the same job waits and then reuses the result. A damaged entry is reported by path and
recomputed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..store import DamagedEntry, lock, read_json, write_json
from .config import stable_hash
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

__all__ = [
    "STORE_VERSION",
    "model_key",
    "stitch_key",
    "iris_data_key",
    "train_job",
    "iris_job",
    "stitch_job",
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


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads, then restore the caller's setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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


def train_job(job: dict[str, Any]) -> dict[str, Any]:
    """Train (or resume, or reuse) one base model; returns its description."""
    from .. import models
    from ..models import CheckpointError
    from ..train import MODEL_FILE, STATE_FILE, fast_recipe, paper_recipe, train_model

    exp_raw, name = job["exp"], job["model"]
    store = Path(job["store"])
    spec = exp_raw["models"][name]
    data = model_data(exp_raw, name)  # a model may be trained on other data
    out = model_dir(store, exp_raw, name)
    with lock(store / "models" / f".{out.name}.lock", f"model {name}"):
        if _usable_model(out / MODEL_FILE):
            return {"model": name, "reused": True, **models.describe(out / MODEL_FILE)}
        recipe_opts = {"method": spec["method"], **spec["recipe"]}
        recipe = (
            fast_recipe(**recipe_opts)
            if spec["base"] == "fast"
            else paper_recipe(spec["arch"], **recipe_opts)
        )
        train, test = base_data(data, expected_fingerprint(exp_raw, data))
        tests = {"clean": test}
        if spec["marker"]:
            tests["marked"] = marked(test, spec["marker"], data)
            tests["rolled"] = marked(test, spec["marker"], data, rolled=True)
        with threads(exp_raw["run"]["threads"]), torch.random.fork_rng():
            torch.manual_seed(spec["seed"])
            model = models.create(spec["arch"], num_classes=data["num_classes"], **spec["options"])
            model = model.to(exp_raw["run"]["device"])
            kwargs = dict(
                recipe=recipe, test_data=tests, robust="pgd" if spec["robust_eval"] else None,
                out=out, seed=spec["seed"],
                description={"experiment_model": name, "marker": spec["marker"], "data": data},
            )  # fmt: skip
            try:
                result = train_model(model, marked(train, spec["marker"], data), **kwargs)
            except CheckpointError as exc:  # a damaged training state: start that model over
                if not (out / STATE_FILE).exists():
                    raise
                log.warning("%s; starting %s over", exc, name)
                (out / STATE_FILE).unlink()
                result = train_model(model, marked(train, spec["marker"], data), **kwargs)
    return {"model": name, "reused": False, "evaluation": result.evaluation}


def load_model(exp_raw: dict[str, Any], store: Path, name: str):
    """A stored base model, in eval mode (cached in this process)."""
    from .. import models
    from ..train import MODEL_FILE

    path = model_dir(store, exp_raw, name) / MODEL_FILE
    device = exp_raw["run"]["device"]
    return CACHE.get(f"model:{path}", lambda: models.load(path, device=device).eval())


def _iris_options(exp_raw: dict[str, Any]) -> tuple[dict[str, Any], float, float]:
    from ..iris import MIN_NULL_RATIO

    opts = dict(exp_raw["iris"])
    threshold = float(opts.pop("threshold", 0.5))
    min_ratio = float(opts.pop("min_null_ratio", MIN_NULL_RATIO))
    return opts, threshold, min_ratio


def iris_job(job: dict[str, Any]) -> dict[str, Any]:
    """Generate (or reuse) the IRI set of one front at one point on one stitching set."""
    from ..iris import generate_iris_set

    exp_raw, store = job["exp"], Path(job["store"])
    opts, threshold, min_ratio = _iris_options(exp_raw)
    with threads(exp_raw["run"]["threads"]):
        front = load_model(exp_raw, store, job["front"])
        data = stitch_data(exp_raw, job["marker"])
        t0 = time.perf_counter()
        iri_set = generate_iris_set(
            front, job["point"], data, store / "iris", threshold=threshold,
            min_null_ratio=min_ratio, data_key=iris_data_key(exp_raw, job["marker"]),
            **tracing(exp_raw, job["front"]), **opts,
        )  # fmt: skip
    q = iri_set.quality
    return {
        "front": job["front"], "point": job["point"], "marker": job["marker"],
        "path": str(iri_set.root), "median_error": q.median_error, "p90_error": q.p90_error,
        "pixel_rms": q.median_pixel_rms, "null_median": q.null_median,
        "null_ratio": q.null_ratio, "flagged": q.flagged,
        "seconds": time.perf_counter() - t0,
    }  # fmt: skip


def stitch_key(exp_raw: dict[str, Any], job: dict[str, Any]) -> str:
    """Store key of one stitch run."""
    parts = {
        "v": STORE_VERSION,
        "front": model_key(exp_raw, job["front"]),
        "back": model_key(exp_raw, job["back"]),
        "marker": job["marker"],
        "point": job["point"],
        "objective": job["objective"],
        "protocol": job["protocol"],
        "stitch_seed": job["stitch_seed"],
        # the settings shared by all runs, not the lists that enumerate the runs
        "stitch": {
            k: v
            for k, v in exp_raw["stitch"].items()
            if k not in ("points", "objectives", "protocols", "seeds", "cka", "eval_batch_size")
        },
        "data": content_key(exp_raw, exp_raw["data"]),
        "iris": exp_raw["iris"] if job["protocol"] == "iris" else None,
    }
    tracing_ = {k: exp_raw["models"][job[k]].get("tracing", {}) for k in ("front", "back")}
    if any(t.get("output") is not None or t.get("layouts") for t in tracing_.values()):
        parts["tracing"] = {
            k: {"output": t.get("output"), "layouts": t.get("layouts")} for k, t in tracing_.items()
        }
    return stable_hash(parts, 24)


def row_names(exp_raw: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """The columns of a result row that name the run (not part of its store key)."""
    return {
        "experiment": exp_raw["name"], "pair": job["pair"], "front": job["front"],
        "back": job["back"], "point": job["point"], "point_index": job["point_index"],
        "objective": job["objective"], "protocol": job["protocol"], "seed": job["seed"],
        "stitch_seed": job["stitch_seed"], "marker": job["marker"] or "",
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


def stitch_job(job: dict[str, Any]) -> dict[str, Any]:
    """One stitch run, scored on the test data; the row of the results table."""
    exp_raw, store = job["exp"], Path(job["store"])
    path = store / "stitch" / f"{stitch_key(exp_raw, job)}.json"
    row = _stored_row(path)
    if row is None:
        with lock(path.with_name(f".{path.stem}.lock"), f"stitch run {path.stem}"):
            row = _stored_row(path)  # another process may have finished it meanwhile
            if row is None:
                with threads(exp_raw["run"]["threads"]):
                    row = _compute_stitch(job)
                write_json(path, row)
                return {**row, "_reused": False}
    # the run may come from another experiment sharing the store: its names are ours
    return {**row, **row_names(exp_raw, job), "_reused": True}


def _compute_stitch(job: dict[str, Any]) -> dict[str, Any]:
    from .. import evaluate, stitch
    from ..fit import robust_scores
    from ..iris import IRISet

    exp_raw, store = job["exp"], Path(job["store"])
    data, st = exp_raw["data"], exp_raw["stitch"]
    front = load_model(exp_raw, store, job["front"])
    back = load_model(exp_raw, store, job["back"])
    sdata = stitch_data(exp_raw, job["marker"])
    test = test_data(exp_raw)
    iris = IRISet(job["iris_path"]) if job["protocol"] == "iris" else None
    t0 = time.perf_counter()
    stitched = stitch(
        front, back, job["point"], sdata, objective=job["objective"],
        protocol=job["protocol"], iris=iris, iris_branches=st["iris_branches"],
        allow_flagged_iris=True, seed=job["stitch_seed"], init_samples=st["n_init"],
        iris_options={k: exp_raw["iris"][k] for k in ("threshold", "min_null_ratio")
                      if k in exp_raw["iris"]},
        device=exp_raw["run"]["device"], **tracing(exp_raw, job["front"], job["back"]),
        **st["training"],
    )  # fmt: skip
    test_marked = marked(test, job["marker"], data)
    reference = reference_logits(exp_raw, store, job["back"], job["marker"])
    scores = evaluate(stitched, test_marked, reference, batch_size=st["eval_batch_size"])
    if st["attack"]:  # experiment B: agreement under PGD against the stitched model
        scores.update(robust_scores(stitched, test_marked, back, st["attack"],
                                    batch_size=st["eval_batch_size"]))  # fmt: skip
    row: dict[str, Any] = {
        **row_names(exp_raw, job), **scores, "init_residual": stitched.init_residual,
        "adversarial": st["training"].get("adversarial") is not None,
        "cache_used": stitched.cache_used,
    }  # fmt: skip
    if job["marker"] and st["excess"]:
        rolled = marked(test, job["marker"], data, rolled=True)
        ref_rolled = reference_logits(exp_raw, store, job["back"], job["marker"], rolled=True)
        row["agreement_rolled"] = evaluate(stitched, rolled, ref_rolled)["agreement"]
        row["excess_agreement"] = row["agreement"] - row["agreement_rolled"]
    q = stitched.iri_quality
    if q is not None:
        row.update(iri_median_error=q.median_error, iri_p90_error=q.p90_error,
                   iri_pixel_rms=q.median_pixel_rms, iri_null_median=q.null_median,
                   iri_null_ratio=q.null_ratio, iri_flagged=q.flagged)  # fmt: skip
    row["seconds"] = time.perf_counter() - t0
    return row


def _pair_on_test(job: dict[str, Any]):
    """``(front, back, test data with the pair's marker)`` of a job."""
    exp_raw, store = job["exp"], Path(job["store"])
    front = load_model(exp_raw, store, job["front"])
    back = load_model(exp_raw, store, job["back"])
    return front, back, marked(test_data(exp_raw), job["marker"], exp_raw["data"])


def cka_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Experiment D: linear CKA between front and back at one point, on the test data and
    on the front's IRIs of the test data (same IRI machinery and recipe)."""
    from .._data import batches
    from ..iris import generate_iris_set
    from ..metrics import cka
    from ..splitting import split

    exp_raw, store = job["exp"], Path(job["store"])
    opts, threshold, min_ratio = _iris_options(exp_raw)
    rows = []
    with threads(exp_raw["run"]["threads"]):
        front, back, test = _pair_on_test(job)
        f_front, _ = split(front, job["point"], **tracing(exp_raw, job["front"]))
        f_back, _ = split(back, job["point"], **tracing(exp_raw, job["back"]))
        iri_set = generate_iris_set(
            front, job["point"], test, store / "iris", threshold=threshold,
            min_null_ratio=min_ratio, data_key=iris_data_key(exp_raw, job["marker"], "test"),
            **tracing(exp_raw, job["front"]), **opts,
        )  # fmt: skip
        for name, data in (("test", test), ("test_iris", iri_set)):
            fa, ba = [], []
            with torch.no_grad():
                for x, _ in batches(data, 256, torch.device(exp_raw["run"]["device"])):
                    fa.append(f_front(x).flatten(1).cpu())
                    ba.append(f_back(x).flatten(1).cpu())
            rows.append({
                "pair": job["pair"], "front": job["front"], "back": job["back"],
                "point": job["point"], "point_index": job["point_index"], "data": name,
                "cka": cka(torch.cat(fa), torch.cat(ba)),
            })  # fmt: skip
    return rows


def reference_logits(exp_raw, store: Path, back: str, marker, rolled: bool = False):
    """The back model's logits on the (marked) test data, computed once per process."""
    from .._data import predict

    def make():
        model = load_model(exp_raw, store, back)
        return predict(model, marked(test_data(exp_raw), marker, exp_raw["data"], rolled))[0]

    return CACHE.get(f"ref:{model_key(exp_raw, back)}:{marker}:{rolled}", make)


def front_job(job: dict[str, Any]) -> dict[str, Any]:
    """The Front reference point: the front model's own agreement with the back."""
    from .. import evaluate
    from .._data import predict
    from ..metrics import accuracy

    with threads(job["exp"]["run"]["threads"]):
        front, back, test = _pair_on_test(job)
        scores = evaluate(front, test, back)
        back_logits, labels = predict(back, test)
    return {
        "pair": job["pair"], "front": job["front"], "back": job["back"],
        "front_agreement": scores["agreement"], "front_accuracy": scores["accuracy"],
        "back_accuracy": accuracy(back_logits, labels),
    }  # fmt: skip
