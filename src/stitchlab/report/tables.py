"""Summary tables computed from ``results.csv`` (the scores of docs/method.md, section 4)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from ..vocabulary import (
    MARKER_LABELS,
    MARKERS,
    OBJECTIVE_LABELS,
    OBJECTIVES,
    PROTOCOL_LABELS,
    PROTOCOLS,
)

__all__ = [
    "OBJECTIVES",
    "PROTOCOLS",
    "MARKERS",
    "objective_label",
    "protocol_label",
    "variant_keys",
    "curve_stats",
    "layer_averages",
    "normalised_to_identical",
    "iri_quality",
    "front_reference",
    "infer_num_classes",
]

_OBJECTIVE_LABELS = OBJECTIVE_LABELS
_PROTOCOL_LABELS = PROTOCOL_LABELS
_MARKER_LABELS = MARKER_LABELS


def objective_label(objective: str) -> str:
    """Display name of an objective (``"fula"`` -> ``"FuLA"``)."""
    return _OBJECTIVE_LABELS.get(objective, objective)


def protocol_label(protocol: str) -> str:
    """Display name of a protocol (``"iris"`` -> ``"IRIs"``)."""
    return _PROTOCOL_LABELS.get(protocol, protocol)


def marker_label(marker: str) -> str:
    """Display name of a shortcut-marker mode (``"pixel+loc"`` -> ``"Pixel+Loc"``)."""
    return _MARKER_LABELS.get(marker.lower(), marker)


def ordered(values: Iterable[str], preferred: Sequence[str] = ()) -> list[str]:
    """Unique values: those in ``preferred`` first in that order, then by first appearance."""
    seen = list(dict.fromkeys(values))
    first = [p for p in preferred if p in seen]
    return first + [v for v in seen if v not in preferred]


def variant_keys(results: pd.DataFrame) -> list[str]:
    """Optional grouping columns that distinguish curves: ``marker``, ``adversarial``."""
    keys = []
    if "marker" in results.columns and (results["marker"].astype(str) != "").any():
        keys.append("marker")
    if "adversarial" in results.columns and results["adversarial"].astype(bool).any():
        keys.append("adversarial")
    return keys


def _sort(df: pd.DataFrame, source: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Sort rows by ``keys``: text in order of appearance in ``source`` (objectives,
    protocols and markers in their canonical order), numbers ascending."""
    if df.empty:
        return df.reset_index(drop=True)
    preferred = {"objective": OBJECTIVES, "protocol": PROTOCOLS, "marker": ("", *MARKERS)}
    ranks = {}
    for k in keys:
        if k in source.columns and not pd.api.types.is_numeric_dtype(source[k]):
            order = ordered(source[k].astype(str), preferred.get(k, ()))
            ranks[k] = df[k].astype(str).map({v: i for i, v in enumerate(order)})
        else:
            ranks[k] = df[k]
    order = pd.DataFrame(ranks).sort_values(list(keys), kind="stable").index
    return df.loc[order].reset_index(drop=True)


def _per_seed(results: pd.DataFrame, value: str, keys: Sequence[str]) -> pd.DataFrame:
    """One value per (keys, point, seed): repeated runs (e.g. stitch seeds) averaged."""
    d = results[results[value].notna()]
    return (
        d.groupby([*keys, "point_index", "seed"], sort=False, dropna=False)
        .agg(point=("point", "first"), value=(value, "mean"))
        .reset_index()
    )


def curve_stats(results: pd.DataFrame, value: str, keys: Sequence[str]) -> pd.DataFrame:
    """Per (``keys``, point): ``mean``, ``min``, ``max``, ``std`` over seeds and ``n`` seeds.

    Runs that share a seed are averaged first; ``std`` is 0 for a single seed.
    """
    if value not in results.columns:
        raise KeyError(f"results have no column {value!r}")
    per_seed = _per_seed(results, value, keys)
    stats = (
        per_seed.groupby([*keys, "point_index"], sort=False, dropna=False)
        .agg(
            point=("point", "first"),
            mean=("value", "mean"),
            min=("value", "min"),
            max=("value", "max"),
            std=("value", "std"),
            n=("value", "size"),
        )
        .reset_index()
    )
    stats["std"] = stats["std"].fillna(0.0)
    return _sort(stats, results, [*keys, "point_index"])


def layer_averages(results: pd.DataFrame, value: str = "agreement") -> pd.DataFrame:
    """Layer-averaged ``value`` per experiment, pair, (marker, adversarial,) objective, protocol.

    The curve is first averaged over seeds per stitch point; ``layer_average`` is its mean
    over the stitch points (End/Front excluded). ``seed_std`` is the standard deviation over
    seeds of the per-seed layer averages (NaN for one seed); ``n_seeds``, ``n_points`` count;
    ``min_seeds`` is the fewest seeds at any point (below ``n_seeds`` when some runs are
    missing: the seeds' layer averages then cover different points).
    """
    keys = ["experiment", "pair", *variant_keys(results), "objective", "protocol"]
    columns = [*keys, "layer_average", "seed_std", "n_seeds", "min_seeds", "n_points"]
    if value not in results.columns or results[value].notna().sum() == 0:
        return pd.DataFrame(columns=columns)
    stats = curve_stats(results, value, keys)
    table = (
        stats.groupby(keys, sort=False, dropna=False)
        .agg(layer_average=("mean", "mean"), n_points=("mean", "size"))
        .reset_index()
    )
    per_seed = _per_seed(results, value, keys)
    seeds = (
        per_seed.groupby([*keys, "seed"], sort=False, dropna=False)["value"]
        .mean()
        .groupby(keys, sort=False, dropna=False)
        .agg(seed_std="std", n_seeds="size")
        .reset_index()
    )
    table = table.merge(seeds, on=keys, how="left")
    fewest = (
        per_seed.groupby([*keys, "point_index"], sort=False, dropna=False)["seed"].nunique()
        .groupby(keys, sort=False, dropna=False).min().rename("min_seeds").reset_index()
    )  # fmt: skip
    table = table.merge(fewest, on=keys, how="left")
    table["min_seeds"] = table["min_seeds"].astype(int)
    table["n_seeds"] = table["n_seeds"].astype(int)
    table["n_points"] = table["n_points"].astype(int)
    return _sort(table[columns], results, keys)


def normalised_to_identical(table: pd.DataFrame, classes: dict) -> pd.DataFrame | None:
    """The layer averages (:func:`layer_averages`) between their floor and ceiling:
    ``(layer_average - chance) / (identical - chance)``, where ``identical`` is the layer
    average of the experiment's ``identical`` pair (the back stitched into itself, same
    objective, protocol and budget: the ceiling) and chance is 100/K (``classes``: K per
    experiment), the floor of a run without a random-front null. 1: as good as the
    identical pair, 0: chance. None when no experiment has an ``identical`` pair."""
    if table.empty or "identical" not in set(table["pair"]):
        return None
    rows = []
    for experiment, t in table.groupby("experiment", sort=False, dropna=False):
        top = t[t["pair"] == "identical"]
        if top.empty:
            continue
        # match the identical pair on its variants only where it has several
        keys = ["objective", "protocol"] + [k for k in variant_keys(t)
                                            if k in top and top[k].nunique(dropna=False) > 1]
        ceiling = top.set_index(keys)["layer_average"]
        chance = 100.0 / classes[experiment]
        for r in t.to_dict("records"):
            c = ceiling.get(tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]])
            value = (r["layer_average"] - chance) / (c - chance) \
                if c is not None and c > chance else float("nan")
            rows.append(r | {"layer_average": value})
    return pd.DataFrame(rows, columns=table.columns) if rows else None


def iri_quality(results: pd.DataFrame) -> pd.DataFrame | None:
    """IRI quality per front and stitch point (mean over the IRI-protocol rows), or None
    when ``results`` records none."""
    cols = [
        c
        for c in ("iri_median_error", "iri_p90_error", "iri_null_median", "iri_null_ratio",
                  "iri_pixel_rms")
        if c in results
    ]  # fmt: skip
    if not cols:
        return None
    d = results[results["protocol"] == "iris"]
    d = d[d[cols].notna().any(axis=1)]
    if d.empty:
        return None
    agg = {c: (c, "mean") for c in cols}
    if "iri_flagged" in d.columns:
        agg["flagged"] = ("iri_flagged", "any")
    agg["n_runs"] = (cols[0], "size")
    table = (
        d.groupby(["front", "point_index"], sort=False)
        .agg(point=("point", "first"), **agg)
        .reset_index()
    )
    table = _sort(table, results, ["front", "point_index"])
    return table[["front", "point", "point_index", *[c for c in table if c in agg]]]


def iri_transfer(results: pd.DataFrame) -> pd.DataFrame | None:
    """Per pair and stitch point, how the whole front and back models decide on the front's
    IRIs against their sources (``iri_front_agreement``, ``iri_back_agreement``, and the
    back's null ``iri_back_null_agreement`` where recorded: mean over the IRI-protocol
    rows), or None when ``results`` records none."""
    cols = [c for c in ("iri_front_agreement", "iri_back_agreement") if c in results]
    if len(cols) < 2:
        return None
    # runs made before these columns have none
    cols += [c for c in ("iri_back_hard_agreement", "iri_back_null_agreement") if c in results]
    d = results[results["protocol"] == "iris"]
    d = d[d[cols[:2]].notna().all(axis=1)]
    if d.empty:
        return None
    table = (
        d.groupby(["pair", "point_index"], sort=False)
        .agg(front=("front", "first"), back=("back", "first"), point=("point", "first"),
             **{c: (c, "mean") for c in cols})
        .reset_index()
    )  # fmt: skip
    table = _sort(table, results, ["pair", "point_index"])
    return table[["pair", "front", "back", "point", *cols]]


def front_reference(pairs: pd.DataFrame | None) -> dict[str, tuple[float, float, float]]:
    """Front reference per pair from ``pairs.csv``: ``(mean, min, max)`` of ``front_agreement``
    over the pair's rows (several rows: several front models)."""
    if pairs is None or "front_agreement" not in pairs.columns:
        return {}
    out = {}
    for pair, rows in pairs.groupby("pair", sort=False):
        v = rows["front_agreement"].dropna()
        if len(v):
            out[str(pair)] = (float(v.mean()), float(v.min()), float(v.max()))
    return out


def infer_num_classes(results: pd.DataFrame, default: int | None = None) -> int | None:
    """Number of classes K implied by ``agreement`` and ``agreement_normalized``
    (``n = (a - 100/K) / (100 - 100/K) * 100``); ``default`` when they do not determine it."""
    if not {"agreement", "agreement_normalized"} <= set(results.columns):
        return default
    a = results["agreement"].to_numpy(float)
    n = results["agreement_normalized"].to_numpy(float)
    ok = np.isfinite(a) & np.isfinite(n) & (np.abs(100 - n) > 1.0) & (np.abs(a - n) > 1e-3)
    if ok.sum() == 0:
        return default
    k = float(np.median((100 - n[ok]) / (a[ok] - n[ok])))
    if not np.isfinite(k) or round(k) < 2 or abs(k - round(k)) > 0.05 * round(k):
        return default
    return int(round(k))
