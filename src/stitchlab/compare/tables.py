"""The tables of a comparison: per-cell scores with intervals, null, ceiling and the
normalised score; the console table; results.csv/.parquet, runs.csv, summary.json and the
report."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..metrics import bootstrap_agreement
from ..vocabulary import IRI_TRANSFER_COLUMNS
from .points import _depths
from .settings import CEILING_LIMIT, _unpack


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
    ratio of the replicates' means. All three are NaN unless every replicate's ceiling
    exceeds its null: where the ceiling is not resolved above the null, the ratio is
    unbounded and no number is given."""
    from ..metrics import _agreement_values, _resampled_means

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
    if ceiling > null:
        a, z, c = (replicates(v) for v in sets)
        if (c - z > 0).all():
            ratio = (a - z) / (c - z)
            alpha = (1 - confidence) / 2
            return {"normalised": (score - null) / (ceiling - null),
                    "normalised_ci_low": float(np.quantile(ratio, alpha)),
                    "normalised_ci_high": float(np.quantile(ratio, 1 - alpha))}  # fmt: skip
    nan = float("nan")
    return {"normalised": nan, "normalised_ci_low": nan, "normalised_ci_high": nan}


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
        if r.protocol == "iris" and bool(r.iri_flagged):
            mark += "  IRIS-FLAGGED"
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
    flagged = results[(results["protocol"] == "iris") & results["iri_flagged"].astype(bool)]
    if len(flagged):
        from ..iris.quality import MIN_NULL_RATIO, THRESHOLD

        lines.append("IRIs flagged (the front does not represent them like their sources: "
                     f"median relative error above {THRESHOLD:g} or less than "
                     f"{MIN_NULL_RATIO:g}x closer than another image): these rows do not "
                     "measure shared invariances; do not read them as invariance-aware "
                     "scores:")  # fmt: skip
        lines += [f"  {r.front_point} -> {r.back_point} {r.objective}: IRI median error "
                  f"{r.iri_median_error:.3f}, {r.iri_null_ratio:.1f}x closer than another "
                  "image" for r in flagged.itertuples()]  # fmt: skip
    return "\n".join(lines)


def _write(out, s, data, front, back, rows, per_run, skipped, seconds, recipe, plan) -> None:
    from ..runs import write_table
    from ..store import write_json

    df = write_table(out / "results.csv", rows, parquet=True)
    run_rows = [e["run"] | {k: e[k] for k in ("accuracy", "iri_median_error", "iri_flagged",
                                               "init_residual", "seconds")}
                | {k: e.get(k) for k in ("init_samples", "init_images_needed",
                                         "init_underdetermined", "init_ridge")}
                | {"agreement": 100 * float(_unpack(e["values"], e["n"]).mean()),
                   "hard_agreement": e["hard_agreement"]}
                for e in per_run]  # fmt: skip
    write_table(out / "runs.csv", run_rows)
    summary = {
        "front": front.source.describe(), "back": back.source.describe(),
        "front_input": str(front.source.input), "back_input": str(back.source.input),
        "data": {"kind": data.kind, "source": data.source, "split": data.split,
                 "stitch": len(data.stitch), "test": len(data.test),
                 "labelled": data.labelled, "modality": data.modality,
                 "items": data.describe_items()},
        "settings": dataclasses.asdict(s), "iri_recipe": recipe.as_dict(), "skipped": skipped,
        "plan": plan.as_dict(), "seconds": round(seconds, 1),
    }  # fmt: skip
    write_json(out / "summary.json", summary)
    from ..report.compare import write_compare_report

    write_compare_report(out, df, summary, grid=s.points == "grid")
