"""Running an experiment: a graph of jobs over a store of finished results.

Stages: base models -> IRI sets per (front, point, stitching data) -> stitch runs (each
scored on the test set). Every job's result is stored under a key of what determines it
(``store/models/<name>-<key>/``, ``store/iris/<key>/``, ``store/stitch/<key>.json``),
so a rerun or an extended config only runs what is missing and a killed run resumes.

Jobs are plain functions of one JSON-ready dict; the in-process executor calls them in
a loop, the Ray executor as Ray tasks. Each job writes only its own files (atomically),
the driver alone writes the tables, so concurrent workers cannot corrupt the store.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .config import Experiment, load_config, stable_hash

__all__ = ["run_experiment", "RunSummary", "LocalExecutor", "RayExecutor", "RESULT_COLUMNS"]

STORE_VERSION = 1
RESULT_COLUMNS = [
    "experiment", "pair", "front", "back", "point", "point_index", "objective", "protocol",
    "seed", "stitch_seed", "marker", "agreement", "agreement_normalized", "accuracy",
    "hard_agreement", "error_consistency", "reference_accuracy", "agreement_rolled",
    "excess_agreement", "init_residual", "iri_median_error", "iri_p90_error",
    "iri_pixel_rms", "iri_null_median", "iri_null_ratio", "iri_flagged", "adversarial",
    "robust_agreement", "robust_accuracy", "robust_samples", "cache_used", "seconds",
]  # fmt: skip


# ---------------------------------------------------------------------------
# Data (deterministic from the config, rebuilt inside every job)

_MEMO: dict[str, Any] = {}


def _memo(key: str, make: Callable[[], Any]) -> Any:
    if key not in _MEMO:
        if len(_MEMO) > 32:
            _MEMO.clear()
        _MEMO[key] = make()
    return _MEMO[key]


def _base_data(data: dict[str, Any]):
    """``(train, test)`` data sets of the ``[data]`` table."""
    from torch.utils.data import TensorDataset

    from .. import data as D

    def make():
        kind, opts, seed = data["kind"], dict(data["options"]), data["seed"]
        if kind in ("cues", "shapes"):
            gen = D.cues if kind == "cues" else D.shapes
            x, y = gen(data["n_train"], seed=seed, **opts)[:2]
            xt, yt = gen(data["n_test"], seed=seed + 7919, **opts)[:2]
            return TensorDataset(x, y), TensorDataset(xt, yt)
        root = os.path.expandvars(os.path.expanduser(data["root"]))
        if kind == "mnist":  # padded to 32x32 in colour, so that CIFAR-sized models take it
            opts = {"channels": 3, "size": 32, **opts}
        reader = getattr(D, kind)  # cifar10, mnist, coloured_mnist, ImageNet folders
        train, test = reader(root, train=True, **opts), reader(root, train=False, **opts)
        return (
            D.subset(train, data["n_train"], seed=seed),
            D.subset(test, data["n_test"], seed=seed),
        )

    return _memo("data:" + stable_hash(data), make)


def _marked(dataset, marker: str | None, data: dict[str, Any], rolled: bool = False):
    if marker is None:
        return dataset
    from ..data import Marked

    return Marked(dataset, marker, num_classes=data["num_classes"], seed=data["seed"],
                  rolled=rolled)  # fmt: skip


def _stitch_data(exp_raw: dict[str, Any], marker: str | None):
    """The stitching subset of the training data (with the pair's marker)."""
    from ..data import subset

    data = exp_raw["data"]
    train, _ = _base_data(data)
    n = min(exp_raw["stitch"]["n_stitch"], len(train))
    return _marked(subset(train, n, seed=data["seed"] + 1), marker, data)


# ---------------------------------------------------------------------------
# Jobs


def model_key(exp_raw: dict[str, Any], name: str) -> str:
    """Store key of a base model: its table and the data it is trained on."""
    model = {k: v for k, v in exp_raw["models"][name].items() if k != "tracing"}
    return f"{name}-" + stable_hash({"v": STORE_VERSION, "model": model, "data": exp_raw["data"]})


def _tracing(exp_raw: dict[str, Any], front: str, back: str | None = None) -> dict[str, Any]:
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


def _model_dir(store: Path, exp_raw: dict[str, Any], name: str) -> Path:
    return store / "models" / model_key(exp_raw, name)


def train_job(job: dict[str, Any]) -> dict[str, Any]:
    """Train (or resume, or reuse) one base model; returns its description."""
    from .. import models
    from ..train import MODEL_FILE, fast_recipe, paper_recipe, train_model

    exp_raw, name = job["exp"], job["model"]
    store = Path(job["store"])
    spec = exp_raw["models"][name]
    data = {**exp_raw["data"], **spec["data"]}  # a model may be trained on other data
    out = _model_dir(store, exp_raw, name)
    if (out / MODEL_FILE).exists():
        return {"model": name, "reused": True, **models.describe(out / MODEL_FILE)}
    torch.set_num_threads(exp_raw["run"]["threads"])
    make_recipe = fast_recipe if spec["base"] == "fast" else paper_recipe
    recipe_opts = {"method": spec["method"], **spec["recipe"]}
    recipe = (
        fast_recipe(**recipe_opts)
        if make_recipe is fast_recipe
        else paper_recipe(spec["arch"], **recipe_opts)
    )
    train, test = _base_data(data)
    tests = {"clean": test}
    if spec["marker"]:
        tests["marked"] = _marked(test, spec["marker"], data)
        tests["rolled"] = _marked(test, spec["marker"], data, rolled=True)
    torch.manual_seed(spec["seed"])
    model = models.create(spec["arch"], num_classes=data["num_classes"], **spec["options"])
    model = model.to(exp_raw["run"]["device"])
    result = train_model(
        model, _marked(train, spec["marker"], data), recipe=recipe, test_data=tests,
        robust="pgd" if spec["robust_eval"] else None, out=out, seed=spec["seed"],
        description={"experiment_model": name, "marker": spec["marker"], "data": data},
    )  # fmt: skip
    return {"model": name, "reused": False, "evaluation": result.evaluation}


def _load_model(exp_raw: dict[str, Any], store: Path, name: str):
    from .. import models
    from ..train import MODEL_FILE

    path = _model_dir(store, exp_raw, name) / MODEL_FILE
    device = exp_raw["run"]["device"]
    return _memo(f"model:{path}", lambda: models.load(path, device=device).eval())


def iris_job(job: dict[str, Any]) -> dict[str, Any]:
    """Generate (or reuse) the IRI set of one front at one point on one stitching set."""
    from ..iris import MIN_NULL_RATIO, generate_iris_set

    exp_raw, store = job["exp"], Path(job["store"])
    torch.set_num_threads(exp_raw["run"]["threads"])
    front = _load_model(exp_raw, store, job["front"])
    data = _stitch_data(exp_raw, job["marker"])
    opts = dict(exp_raw["iris"])
    threshold = float(opts.pop("threshold", 0.5))
    min_ratio = float(opts.pop("min_null_ratio", MIN_NULL_RATIO))
    t0 = time.perf_counter()
    iri_set = generate_iris_set(
        front, job["point"], data, store / "iris", threshold=threshold,
        min_null_ratio=min_ratio,
        data_key=stable_hash([exp_raw["data"], exp_raw["stitch"]["n_stitch"], job["marker"]]),
        **_tracing(exp_raw, job["front"]), **opts,
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
        "data": exp_raw["data"],
        "iris": exp_raw["iris"] if job["protocol"] == "iris" else None,
    }
    tracing = {
        k: exp_raw["models"][job[k]].get("tracing", {}) for k in ("front", "back")
    }  # output and layouts change results; only present when set (older keys unchanged)
    if any(t.get("output") is not None or t.get("layouts") for t in tracing.values()):
        parts["tracing"] = {
            k: {"output": t.get("output"), "layouts": t.get("layouts")} for k, t in tracing.items()
        }
    return stable_hash(parts, 24)


def _atomic_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _row_names(exp_raw: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """The columns of a result row that name the run (not part of its store key)."""
    return {
        "experiment": exp_raw["name"], "pair": job["pair"], "front": job["front"],
        "back": job["back"], "point": job["point"], "point_index": job["point_index"],
        "objective": job["objective"], "protocol": job["protocol"], "seed": job["seed"],
        "stitch_seed": job["stitch_seed"], "marker": job["marker"] or "",
    }  # fmt: skip


def stitch_job(job: dict[str, Any]) -> dict[str, Any]:
    """One stitch run, scored on the test data; the row of the results table."""
    from .. import evaluate, stitch
    from ..fit import robust_scores
    from ..iris import IRISet

    exp_raw, store = job["exp"], Path(job["store"])
    path = store / "stitch" / f"{stitch_key(exp_raw, job)}.json"
    if path.exists():
        row = json.loads(path.read_text())
        # the run may come from another experiment sharing the store: its names are ours
        row.update(_row_names(exp_raw, job), _reused=True)
        return row
    torch.set_num_threads(exp_raw["run"]["threads"])
    data, st = exp_raw["data"], exp_raw["stitch"]
    front = _load_model(exp_raw, store, job["front"])
    back = _load_model(exp_raw, store, job["back"])
    stitch_data = _stitch_data(exp_raw, job["marker"])
    _, test = _base_data(data)
    iris = IRISet(job["iris_path"]) if job["protocol"] == "iris" else None
    t0 = time.perf_counter()
    stitched = stitch(
        front, back, job["point"], stitch_data, objective=job["objective"],
        protocol=job["protocol"], iris=iris, iris_branches=st["iris_branches"],
        allow_flagged_iris=True, seed=job["stitch_seed"], init_samples=st["n_init"],
        iris_options={k: exp_raw["iris"][k] for k in ("threshold", "min_null_ratio")
                      if k in exp_raw["iris"]},
        device=exp_raw["run"]["device"], **_tracing(exp_raw, job["front"], job["back"]),
        **st["training"],
    )  # fmt: skip
    test_marked = _marked(test, job["marker"], data)
    reference = _reference_logits(exp_raw, store, job["back"], job["marker"])
    scores = evaluate(stitched, test_marked, reference, batch_size=st["eval_batch_size"])
    if st["attack"]:  # experiment B: agreement under PGD against the stitched model
        scores.update(robust_scores(stitched, test_marked, back, st["attack"],
                                    batch_size=st["eval_batch_size"]))  # fmt: skip
    row: dict[str, Any] = {
        **_row_names(exp_raw, job), **scores, "init_residual": stitched.init_residual,
        "adversarial": st["training"].get("adversarial") is not None,
        "cache_used": stitched.cache_used,
    }  # fmt: skip
    if job["marker"] and st["excess"]:
        rolled = _marked(test, job["marker"], data, rolled=True)
        ref_rolled = _reference_logits(exp_raw, store, job["back"], job["marker"], rolled=True)
        row["agreement_rolled"] = evaluate(stitched, rolled, ref_rolled)["agreement"]
        row["excess_agreement"] = row["agreement"] - row["agreement_rolled"]
    q = stitched.iri_quality
    if q is not None:
        row.update(iri_median_error=q.median_error, iri_p90_error=q.p90_error,
                   iri_pixel_rms=q.median_pixel_rms, iri_null_median=q.null_median,
                   iri_null_ratio=q.null_ratio, iri_flagged=q.flagged)  # fmt: skip
    row["seconds"] = time.perf_counter() - t0
    _atomic_json(path, row)
    row["_reused"] = False
    return row


def _pair_on_test(job: dict[str, Any]):
    """``(front, back, test data with the pair's marker)`` of a job, threads set."""
    exp_raw, store = job["exp"], Path(job["store"])
    torch.set_num_threads(exp_raw["run"]["threads"])
    front = _load_model(exp_raw, store, job["front"])
    back = _load_model(exp_raw, store, job["back"])
    _, test = _base_data(exp_raw["data"])
    return front, back, _marked(test, job["marker"], exp_raw["data"])


def cka_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Experiment D: linear CKA between front and back at one point, on the test data and
    on the front's IRIs of the test data (same IRI machinery and recipe)."""
    from ..iris import MIN_NULL_RATIO, generate_iris_set
    from ..metrics import cka
    from ..splitting import split

    exp_raw, store = job["exp"], Path(job["store"])
    front, back, test = _pair_on_test(job)
    f_front, _ = split(front, job["point"], **_tracing(exp_raw, job["front"]))
    f_back, _ = split(back, job["point"], **_tracing(exp_raw, job["back"]))
    opts = dict(exp_raw["iris"])
    threshold = float(opts.pop("threshold", 0.5))
    min_ratio = float(opts.pop("min_null_ratio", MIN_NULL_RATIO))
    iri_set = generate_iris_set(
        front, job["point"], test, store / "iris", threshold=threshold,
        min_null_ratio=min_ratio,
        data_key=stable_hash(["test", exp_raw["data"], job["marker"]]),
        **_tracing(exp_raw, job["front"]), **opts,
    )  # fmt: skip
    rows = []
    for name, data in (("test", test), ("test_iris", iri_set)):
        from .._data import batches

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


def _reference_logits(exp_raw, store: Path, back: str, marker, rolled: bool = False):
    """The back model's logits on the (marked) test data, computed once per process."""
    from .._data import predict

    def make():
        _, test = _base_data(exp_raw["data"])
        model = _load_model(exp_raw, store, back)
        return predict(model, _marked(test, marker, exp_raw["data"], rolled=rolled))[0]

    return _memo(f"ref:{model_key(exp_raw, back)}:{marker}:{rolled}", make)


def front_job(job: dict[str, Any]) -> dict[str, Any]:
    """The Front reference point: the front model's own agreement with the back."""
    from .. import evaluate
    from .._data import predict

    front, back, test = _pair_on_test(job)
    scores = evaluate(front, test, back)
    back_logits, labels = predict(back, test)
    from ..metrics import accuracy

    return {
        "pair": job["pair"], "front": job["front"], "back": job["back"],
        "front_agreement": scores["agreement"], "front_accuracy": scores["accuracy"],
        "back_accuracy": accuracy(back_logits, labels),
    }  # fmt: skip


# ---------------------------------------------------------------------------
# Executors


class LocalExecutor:
    """Runs jobs one after the other in this process."""

    name = "local"

    def map(self, fn: Callable[[dict], dict], jobs: Sequence[dict], desc: str = "") -> list:
        """Results of ``fn`` on every job, in order."""
        out = []
        bar = _bar(len(jobs), desc)
        for job in jobs:
            out.append(fn(job))
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return out


class RayExecutor:
    """Runs jobs as Ray tasks (a local cluster, or the one at ``address``)."""

    name = "ray"

    def __init__(self, address: str | None = None, cpus_per_job: int = 1, gpus_per_job=0):
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError(
                "Ray is not installed: pip install 'stitchlab[ray]' (or ray) to use --ray."
            ) from exc
        self.ray = ray
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"address": address} if address else {}
            ray.init(ignore_reinit_error=True, log_to_driver=False, **kwargs)
        self.cpus, self.gpus = cpus_per_job, gpus_per_job

    def map(self, fn: Callable[[dict], dict], jobs: Sequence[dict], desc: str = "") -> list:
        """Results of ``fn`` on every job, each a Ray task, in order."""
        remote = self.ray.remote(num_cpus=self.cpus, num_gpus=self.gpus)(fn)
        refs = [remote.remote(job) for job in jobs]
        bar = _bar(len(refs), desc)
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            if bar is not None:
                bar.update(len(done))
        if bar is not None:
            bar.close()
        return self.ray.get(refs)


_PROGRESS = {"on": True}


def _bar(total: int, desc: str):
    if not _PROGRESS["on"] or total == 0:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


# ---------------------------------------------------------------------------
# The driver


class RunSummary(dict):
    """What a run did: counts of jobs run and reused per stage, paths, wall time."""


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _fmt(row.get(c)) for c in columns})
    os.replace(tmp, path)


def _write_parquet(csv_path: Path) -> None:
    """``results.parquet`` beside ``results.csv``: the same table with typed columns."""
    import pandas as pd

    tmp = csv_path.with_name(f".{csv_path.stem}.parquet.tmp")
    pd.read_csv(csv_path).to_parquet(tmp, index=False)
    os.replace(tmp, csv_path.with_suffix(".parquet"))


def _fmt(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return v


def run_experiment(
    config: str | Path | dict[str, Any] | Experiment,
    out: str | Path,
    *,
    executor: LocalExecutor | RayExecutor | None = None,
    progress: bool = True,
    examples: int = 6,
    store: str | Path | None = None,
) -> RunSummary:
    """Run (or resume) an experiment into ``out``: ``results.csv`` (and the same table as
    ``results.parquet``), ``pairs.csv``,
    ``iris_examples.safetensors`` and ``run.json``.

    Finished jobs live in ``store`` (default ``out/store``). Several experiments may share
    one store: a base model, IRI set or stitch run with the same key is then computed once
    (e.g. the clean back model of experiments A, B and C)."""
    exp = config if isinstance(config, Experiment) else load_config(config)
    executor = executor or LocalExecutor()
    _PROGRESS["on"] = progress
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    store = Path(store) if store is not None else out / "store"
    store.mkdir(parents=True, exist_ok=True)
    start = time.time()
    base = {"exp": exp.raw, "store": str(store)}
    log = print if progress else (lambda *a, **k: None)
    summary = RunSummary(experiment=exp.name, out=str(out), executor=executor.name)

    # 1. base models
    needed = sorted({m for p in exp.pairs.values() for m in [*p["front"], p["back"]]})
    log(f"[{exp.name}] training {len(needed)} base models", flush=True)
    trained = executor.map(train_job, [{**base, "model": m} for m in needed], "models")
    summary["models"] = {"run": sum(not t["reused"] for t in trained), "total": len(trained)}

    # 2. IRI sets per (front, point, stitching data)
    iri_jobs: dict[tuple, dict] = {}
    if "iris" in exp.stitch["protocols"]:
        for pair, spec in exp.pairs.items():
            for front in spec["front"]:
                for point in exp.points[pair]:
                    key = (front, point, spec["marker"])
                    iri_jobs.setdefault(
                        key, {**base, "front": front, "point": point, "marker": spec["marker"]}
                    )
    log(f"[{exp.name}] {len(iri_jobs)} IRI sets", flush=True)
    iri_results = executor.map(iris_job, list(iri_jobs.values()), "IRI sets")
    iri_paths = {k: r for k, r in zip(iri_jobs, iri_results)}

    # 3. stitch runs
    jobs = []
    for pair, spec in exp.pairs.items():
        for front in spec["front"]:
            seed = exp.models[front]["seed"]
            for i, point in enumerate(exp.points[pair], start=1):
                for protocol in exp.stitch["protocols"]:
                    for objective in exp.stitch["objectives"]:
                        for stitch_seed in exp.stitch["seeds"]:
                            job = {
                                **base, "pair": pair, "front": front, "back": spec["back"],
                                "marker": spec["marker"], "point": point, "point_index": i,
                                "objective": objective, "protocol": protocol, "seed": seed,
                                "stitch_seed": stitch_seed,
                            }  # fmt: skip
                            if protocol == "iris":
                                job["iris_path"] = iri_paths[(front, point, spec["marker"])]["path"]
                            jobs.append(job)
    log(f"[{exp.name}] {len(jobs)} stitch runs", flush=True)
    rows = executor.map(stitch_job, jobs, "stitch runs")
    summary["stitch"] = {"run": sum(not r["_reused"] for r in rows), "total": len(rows)}
    _write_csv(out / "results.csv", rows, RESULT_COLUMNS)
    _write_parquet(out / "results.csv")

    # 4. CKA on test data and on test IRIs (experiment D)
    if exp.stitch["cka"]:
        cka_jobs = [
            {**base, "pair": pair, "front": f, "back": spec["back"], "marker": spec["marker"],
             "point": point, "point_index": i}
            for pair, spec in exp.pairs.items()
            for f in spec["front"]
            for i, point in enumerate(exp.points[pair], start=1)
        ]  # fmt: skip
        cka_rows = [r for rows_ in executor.map(cka_job, cka_jobs, "CKA") for r in rows_]
        _write_csv(out / "cka.csv", cka_rows, list(cka_rows[0]))

    # 5. Front reference points and example IRIs
    front_jobs = [
        {**base, "pair": pair, "front": f, "back": spec["back"], "marker": spec["marker"]}
        for pair, spec in exp.pairs.items()
        for f in spec["front"]
    ]
    fronts = LocalExecutor().map(front_job, front_jobs) if front_jobs else []
    pair_rows = _pair_rows(fronts)
    _write_csv(out / "pairs.csv", pair_rows, list(pair_rows[0]) if pair_rows else ["pair"])
    if iri_paths:
        _write_examples(out / "iris_examples.safetensors", exp, iri_paths, examples)
    summary["iris"] = {"total": len(iri_paths)}
    summary["seconds"] = round(time.time() - start, 1)
    _atomic_json(out / "run.json", {**summary, "config": exp.raw})
    log(
        f"[{exp.name}] done in {summary['seconds']} s: {summary['stitch']['run']} stitch runs "
        f"computed, {summary['stitch']['total'] - summary['stitch']['run']} reused; "
        f"table {out / 'results.csv'}",
        flush=True,
    )
    return summary


def _pair_rows(fronts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_pair: dict[str, list[dict[str, Any]]] = {}
    for r in fronts:
        by_pair.setdefault(r["pair"], []).append(r)
    rows = []
    for pair, rs in by_pair.items():
        rows.append({
            "pair": pair, "front": "+".join(r["front"] for r in rs), "back": rs[0]["back"],
            "front_agreement": sum(r["front_agreement"] for r in rs) / len(rs),
            "front_accuracy": sum(r["front_accuracy"] for r in rs) / len(rs),
            "back_accuracy": rs[0]["back_accuracy"],
        })  # fmt: skip
    return rows


def _write_examples(path: Path, exp: Experiment, iri_paths: dict, k: int) -> None:
    """A few IRIs per (front, point) next to their sources, for the report."""
    import numpy as np
    from safetensors.numpy import save_file

    from ..iris import IRISet, quantise

    tensors: dict[str, np.ndarray] = {}
    meta: dict[str, str] = {}
    for (front, point, _marker), info in sorted(iri_paths.items(), key=lambda kv: str(kv[0])):
        key = f"iris/{front}/{point}"
        if key in tensors:
            continue
        iri_set = IRISet(info["path"])
        n = min(k, len(iri_set))
        tensors[key] = quantise(torch.stack([iri_set[i][0] for i in range(n)])).numpy()
        meta[f"errors/{front}/{point}"] = json.dumps(
            [round(float(e), 4) for e in iri_set.rel_error[:n]]
        )
        if "source" not in tensors:
            data = _stitch_data(exp.raw, _marker)
            tensors["source"] = quantise(torch.stack([data[i][0] for i in range(n)])).numpy()
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)
