"""Running an experiment: a graph of jobs over a store of finished results.

Stages: base models -> IRI sets per (front, point, stitching data) -> stitch runs (each
scored on the test set) -> CKA (experiment D) -> the front reference points. Every job's
result is stored under a key of what determines it (``store/models/<name>-<key>/``,
``store/iris/<key>/``, ``store/stitch/<key>.json``; see :mod:`.jobs`), so a rerun or an
extended config only runs what is missing and a killed run resumes. The data are keyed by
their content (:mod:`.datasets`), computed here once per run.

The driver alone writes the tables (:mod:`.tables`); jobs write only their own store
entries, atomically and under a lock, so concurrent workers and concurrent runs sharing a
store cannot corrupt it or compute one job twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..runs import LocalExecutor, Plan, RayExecutor, write_table
from ..store import write_json
from ..vocabulary import GENERATED_KINDS, RESULT_COLUMNS, SPEECH_KINDS
from .config import ConfigError, Experiment, load_config
from .datasets import fingerprints, model_data, resolve_root, with_speech_cache
from .jobs import (
    CKAJob,
    FrontJob,
    IRIJob,
    RunContext,
    StitchGroup,
    StitchRun,
    TrainJob,
    cka_job,
    front_job,
    iri_recipe,
    iri_seed,
    iris_job,
    stitch_group_job,
    train_job,
)
from .plan import plan_experiment
from .tables import pair_rows, write_examples

__all__ = [
    "run_experiment",
    "preflight",
    "with_fingerprints",
    "RunSummary",
    "LocalExecutor",
    "RayExecutor",
    "RESULT_COLUMNS",
]

log = logging.getLogger("stitchlab.experiments")


def with_fingerprints(raw: dict[str, Any]) -> dict[str, Any]:
    """A checked config's dict with the fingerprints of its data (what store keys need):
    for scripts that compute keys or call jobs' helpers outside :func:`run_experiment`."""
    return {**raw, "fingerprints": fingerprints(raw)}


class RunSummary(dict):
    """What a run did: counts of jobs run and reused per stage, paths, wall time."""


def preflight(exp: Experiment) -> None:
    """Everything a run checks before its first job, without running one: every data
    folder exists (variables set), the device is present. Raises :class:`ConfigError`."""
    import torch

    for name in [None, *exp.models]:
        table = model_data(exp.raw, name)
        if table["kind"] not in GENERATED_KINDS:
            resolve_root(table)
        elif table["kind"] in SPEECH_KINDS:
            from ..data.speech import espeak_version

            espeak_version()  # EspeakNotFoundError: says how to install espeak-ng
    device = exp.run["device"]
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"[run] device is {device!r} but this machine has no CUDA device; "
            'set device = "cpu" (or run where a GPU is present).'
        )
    if device.startswith("cuda") and ":" in device:
        index = int(device.split(":")[1])
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"[run] device is {device!r} but only {torch.cuda.device_count()} CUDA "
                "device(s) are present."
            )
    if device == "mps" and not torch.backends.mps.is_available():
        raise ConfigError('[run] device is "mps" but MPS is not available here; use "cpu".')


def run_experiment(
    config: str | Path | dict[str, Any] | Experiment,
    out: str | Path,
    *,
    executor: LocalExecutor | RayExecutor | None = None,
    progress: bool = True,
    examples: int = 6,
    store: str | Path | None = None,
    echo: Callable[[str], None] | None = None,
    plan_only: bool = False,
) -> RunSummary | Plan:
    """Run (or resume) an experiment into ``out``: ``results.csv`` (and the same table as
    ``results.parquet``), ``pairs.csv``,
    ``iris_examples.safetensors`` and ``run.json``.

    Finished jobs live in ``store`` (default ``out/store``). Several experiments may share
    one store: a base model, IRI set or stitch run with the same key is then computed once
    (e.g. the clean back model of experiments A, B and C).

    The run's :class:`~stitchlab.runs.Plan` (its stages, what is stored, a time estimate)
    goes to ``echo`` (default: the log) before the first job; ``plan_only`` returns it
    and computes nothing."""
    exp = config if isinstance(config, Experiment) else load_config(config)
    preflight(exp)
    executor = executor or LocalExecutor(progress)
    # Ray: each job asks for the run's threads and, on CUDA, its GPUs; a request no node
    # can meet stops here, before anything is submitted
    executor.configure(exp.run)
    if not progress:
        executor.progress = False
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    store = Path(store) if store is not None else out / "store"
    store.mkdir(parents=True, exist_ok=True)
    start = time.time()
    # the data are read once here and keyed by content; every job checks the fingerprint
    raw = with_fingerprints(with_speech_cache(exp.raw, str(store / "data")))
    plan = plan_experiment(exp, raw, store)
    for line in plan.text().splitlines():
        (echo or log.info)(line)
    if plan_only:
        return plan
    ctx = RunContext(raw, str(store))
    summary = RunSummary(experiment=exp.name, out=str(out), executor=executor.name)

    # 1. base models
    needed = sorted({m for p in exp.pairs.values() for m in [*p["front"], p["back"]]})
    log.info("[%s] %d base models", exp.name, len(needed))
    trained = executor.map(train_job, [TrainJob(ctx, m) for m in needed], "models")
    summary["models"] = {"run": sum(not t["reused"] for t in trained), "total": len(trained)}

    # 2. IRI sets per (front, point, stitching data)
    # (and random start: one per stitch seed under [iris] per_stitch_seed)
    iri_jobs: dict[tuple, IRIJob] = {}
    if "iris" in exp.stitch["protocols"]:
        starts = sorted({iri_seed(raw, s) for s in exp.stitch["seeds"]})
        for pair, spec in exp.pairs.items():
            for front in spec["front"]:
                for point in exp.points[pair]:
                    for iri_start in starts:
                        key = (front, point, spec["marker"], iri_start)
                        iri_jobs.setdefault(key, IRIJob(ctx, front, point, spec["marker"],
                                                        iri_start))  # fmt: skip
    log.info("[%s] %d IRI sets", exp.name, len(iri_jobs))
    iri_results = executor.map(iris_job, list(iri_jobs.values()), "IRI sets")
    iri_paths = {k: r for k, r in zip(iri_jobs, iri_results)}

    # 3. stitch runs, grouped by (pair, front, point, stitch seed): one Stitcher per group
    groups = []
    for pair, spec in exp.pairs.items():
        for front in spec["front"]:
            seed = exp.models[front]["seed"]
            for i, point in enumerate(exp.points[pair], start=1):
                for stitch_seed in exp.stitch["seeds"]:
                    iris = iri_paths.get((front, point, spec["marker"], iri_seed(raw, stitch_seed)))
                    runs = tuple(
                        StitchRun(
                            pair, front, spec["back"], spec["marker"], point, i, objective,
                            protocol, seed, stitch_seed,
                            iris["path"] if protocol == "iris" else None,
                        )  # fmt: skip
                        for protocol in exp.stitch["protocols"]
                        for objective in exp.stitch["objectives"]
                    )
                    groups.append(StitchGroup(ctx, runs))
    n_runs = sum(len(g.runs) for g in groups)
    log.info("[%s] %d stitch runs in %d groups", exp.name, n_runs, len(groups))
    rows = [r for g in executor.map(stitch_group_job, groups, "stitch groups") for r in g]
    summary["stitch"] = {"run": sum(not r["_reused"] for r in rows), "total": len(rows)}
    write_table(out / "results.csv", rows, RESULT_COLUMNS, parquet=True)

    # 4. CKA on test data and on test IRIs (experiment D)
    cka_rows: list[dict[str, Any]] = []
    if exp.stitch["cka"]:
        cka_jobs = [
            CKAJob(ctx, pair, f, spec["back"], spec["marker"], point, i)
            for pair, spec in exp.pairs.items()
            for f in spec["front"]
            for i, point in enumerate(exp.points[pair], start=1)
        ]  # fmt: skip
        cka_rows = [r for rows_ in executor.map(cka_job, cka_jobs, "CKA") for r in rows_]
        write_table(out / "cka.csv", cka_rows)

    # 5. Front reference points and example IRIs
    front_jobs = [
        FrontJob(ctx, pair, f, spec["back"], spec["marker"])
        for pair, spec in exp.pairs.items()
        for f in spec["front"]
    ]
    fronts = LocalExecutor(False).map(front_job, front_jobs) if front_jobs else []
    pairs = pair_rows(fronts)
    write_table(out / "pairs.csv", pairs, None if pairs else ["pair"])
    if iri_paths:
        write_examples(out / "iris_examples.safetensors", raw, iri_paths, examples)
    cka_sets = len(cka_jobs) if exp.stitch["cka"] else 0  # IRI sets of the test data
    summary["iris"] = {"total": len(iri_paths), "cka_sets": cka_sets}
    if iri_paths or exp.stitch["cka"]:
        # the resolved recipe (the [iris] table's text may rely on the default), also of a
        # run whose only IRIs are CKA's test IRIs
        summary["iris"]["recipe"] = iri_recipe(raw).as_dict()
        summary["iris"]["seed"] = raw["iris"].get("seed", 0)  # the random start
        summary["iris"]["per_stitch_seed"] = bool(raw["iris"].get("per_stitch_seed", False))
        # the arithmetic of the IRIs behind this run's scores (amp resolved where each set
        # was made: bfloat16 on CUDA, float32 on a CPU), from the rows, since a reused row
        # may come from another machine's set; "unrecorded" for rows stored before the column
        amps = [r.get("iri_amp") for r in rows if r["protocol"] == "iris"]
        amps += [r["iri_amp"] for r in cka_rows if r["data"] == "test_iris"]
        summary["iris"]["amp_ran"] = sorted({a or "unrecorded" for a in amps})
    summary["plan"] = plan.as_dict()
    summary["seconds"] = round(time.time() - start, 1)
    write_json(out / "run.json", {**summary, "config": raw})
    log.info(
        "[%s] done in %s s: %d stitch runs computed, %d reused; table %s",
        exp.name, summary["seconds"], summary["stitch"]["run"],
        summary["stitch"]["total"] - summary["stitch"]["run"], out / "results.csv",
    )  # fmt: skip
    return summary


