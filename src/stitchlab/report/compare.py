"""The report of ``stitchlab compare``: a depth profile with intervals, the null (floor)
and the ceiling (the back into itself), a heat map per objective and protocol for a grid
of points, and the tables; budget-limited rows are marked in each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ._html import FigureEntry, TableEntry, figure_files, fmt, page, write_page

__all__ = ["write_compare_report", "plot_profile", "plot_heatmaps"]

_PROTOCOL_LABEL = {"standard": "standard", "iris": "invariance-aware (IRIs)"}
_COLOURS = {"standard": "#1f77b4", "iris": "#d62728"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_profile(results: pd.DataFrame):
    """Agreement with the back against the front point's relative depth: one panel per
    objective, one line per protocol with its interval band, the null dotted, the
    ceiling dashed; budget-limited points (ceiling below the limit) hollow and ringed."""
    plt = _pyplot()
    objectives = list(dict.fromkeys(results["objective"]))
    fig, axes = plt.subplots(1, len(objectives), figsize=(3.6 * len(objectives), 3.2),
                             squeeze=False, sharey=True)  # fmt: skip
    for ax, objective in zip(axes[0], objectives):
        sub = results[results["objective"] == objective]
        for protocol in dict.fromkeys(sub["protocol"]):
            d = sub[sub["protocol"] == protocol]
            # one value per front point: the mean over its back points (a grid's rows)
            g = d.groupby("front_depth", sort=True).mean(numeric_only=True).reset_index()
            c = _COLOURS.get(protocol, "k")
            label = _PROTOCOL_LABEL.get(protocol, protocol)
            ax.plot(g["front_depth"], g["agreement"], "o-", color=c, label=label)
            ax.fill_between(g["front_depth"], g["agreement_ci_low"], g["agreement_ci_high"],
                            color=c, alpha=0.2, lw=0)  # fmt: skip
            if g["null_agreement"].notna().any():
                ax.plot(g["front_depth"], g["null_agreement"], ":", color=c,
                        label=f"null (random front), {protocol}")  # fmt: skip
                ax.fill_between(g["front_depth"], g["null_ci_low"], g["null_ci_high"],
                                color=c, alpha=0.08, lw=0)  # fmt: skip
            if "ceiling_agreement" in g and g["ceiling_agreement"].notna().any():
                ax.plot(g["front_depth"], g["ceiling_agreement"], "--", color=c, lw=1,
                        label=f"ceiling (back into itself), {protocol}")  # fmt: skip
                limited = d.groupby("front_depth", sort=True)["budget_limited"].any()
                low = g[g["front_depth"].map(limited).fillna(False).astype(bool)]
                if len(low):
                    ax.plot(low["front_depth"], low["agreement"], "o", ms=11, mfc="none",
                            mec="k", label="budget-limited (ceiling < 90)")  # fmt: skip
        ax.set_title(objective.upper())
        ax.set_xlabel("relative depth of the front point")
        ax.set_xlim(0, 1.02)
        ax.set_ylim(0, 101)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("agreement with the back (%)")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def plot_heatmaps(results: pd.DataFrame):
    """Agreement for every (front point, back point) of a grid, per objective (rows) and
    protocol (columns)."""
    plt = _pyplot()
    objectives = list(dict.fromkeys(results["objective"]))
    protocols = list(dict.fromkeys(results["protocol"]))
    fronts = list(dict.fromkeys(results.sort_values("front_depth")["front_point"]))
    backs = list(dict.fromkeys(results.sort_values("back_depth")["back_point"]))
    fig, axes = plt.subplots(len(objectives), len(protocols),
                             figsize=(0.55 * len(backs) * len(protocols) + 2.5,
                                      0.5 * len(fronts) * len(objectives) + 1.5),
                             squeeze=False)  # fmt: skip
    im = None
    for i, objective in enumerate(objectives):
        for j, protocol in enumerate(protocols):
            ax = axes[i][j]
            d = results[(results["objective"] == objective) & (results["protocol"] == protocol)]
            m = d.pivot_table(index="front_point", columns="back_point", values="agreement")
            m = m.reindex(index=fronts, columns=backs)
            im = ax.imshow(m.values, vmin=0, vmax=100, cmap="viridis", aspect="auto")
            for (r, c), v in pd.DataFrame(m.values).stack().items():
                ax.text(c, r, f"{v:.0f}", ha="center", va="center", fontsize=6,
                        color="w" if v < 60 else "k")  # fmt: skip
            ax.set_xticks(range(len(backs)), backs, rotation=60, fontsize=6, ha="right")
            ax.set_yticks(range(len(fronts)), fronts, fontsize=6)
            ax.set_title(f"{objective.upper()}, {_PROTOCOL_LABEL.get(protocol, protocol)}",
                         fontsize=8)  # fmt: skip
            ax.set_xlabel("back point", fontsize=7)
            ax.set_ylabel("front point", fontsize=7)
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.8, label="agreement (%)")
    return fig


def _digits(v: float, digits: int) -> str:
    return "—" if pd.isna(v) else f"{v:.{digits}f}"


def _interval(row: pd.Series, key: str, low: str, high: str, digits: int = 1) -> str:
    if pd.isna(row[key]):  # (the normalised score: the ceiling not resolved above the null)
        return "—"
    return f"{fmt(row[key], digits)} [{fmt(row[low], digits)}, {fmt(row[high], digits)}]"


def write_compare_report(out: str | Path, results: pd.DataFrame, summary: dict[str, Any],
                         grid: bool = False) -> Path:  # fmt: skip
    """Write ``figures/profile.{png,pdf}`` (and ``figures/heatmap.*`` for a grid) and
    ``report.html`` under ``out``; returns the report's path."""
    out = Path(out)
    figs = out / "figures"
    starts = ("each seed on IRIs of its own random start" if summary["settings"].get("iri_seeds")
              else "under IRIs every seed on one IRI set, so without the IRIs' random start")
    entries = [FigureEntry(
        "profile", "Similarity along the depth",
        "Agreement of the stitched model with the back on held-out images, against the "
        "front point's relative depth. Bands: the interval over stitch seeds and test images "
        f"({summary['settings']['confidence']:.0%}; {starts}). Dotted: the null, the same "
        "back stitched from a randomly initialised front of the front's architecture. "
        "Dashed: the ceiling, the back stitched into itself at the back point with the "
        "same budget (an identity stitch exists, so anything below 100 is what the budget "
        "loses). Ringed: budget-limited points, whose ceiling is below 90.",
        figure_files(plot_profile(results), figs, "profile"),
        ["figures/profile.png", "figures/profile.pdf"])]  # fmt: skip
    if grid:
        entries.append(FigureEntry(
            "heatmap", "Every front point into every back point",
            "Agreement (%) for each cell of the grid.",
            figure_files(plot_heatmaps(results), figs, "heatmap"),
            ["figures/heatmap.png", "figures/heatmap.pdf"]))  # fmt: skip
    nan_column = pd.Series(float("nan"), index=results.index)  # tables before the column
    table = pd.DataFrame({
        "front point": results["front_point"], "back point": results["back_point"],
        "objective": results["objective"].str.upper(), "protocol": results["protocol"],
        "agreement [CI]": [_interval(r, "agreement", "agreement_ci_low", "agreement_ci_high")
                           for _, r in results.iterrows()],
        "null [CI]": [_interval(r, "null_agreement", "null_ci_low", "null_ci_high")
                      for _, r in results.iterrows()],
        "excess over null [CI]": [_interval(r, "excess_over_null", "excess_ci_low",
                                            "excess_ci_high") for _, r in results.iterrows()],
        "ceiling [CI]": [_interval(r, "ceiling_agreement", "ceiling_ci_low", "ceiling_ci_high")
                         for _, r in results.iterrows()],
        "normalised [CI]": [_interval(r, "normalised", "normalised_ci_low",
                                      "normalised_ci_high", 2) for _, r in results.iterrows()],
        "budget-limited": ["yes" if v else "no" for v in results["budget_limited"]],
        "seeds": results["seeds"],
        "IRI median error": [_digits(v, 3) for v in results["iri_median_error"]],
        "IRIs x closer than another image": [_digits(v, 1) for v in results["iri_null_ratio"]],
        "IRIs flagged": results["iri_flagged"].where(results["protocol"] == "iris"),
        "back on the front's IRIs": [_digits(v, 1) for v in
                                     results.get("iri_back_agreement", nan_column)],
    })  # fmt: skip
    notes = [f"{r.front_point} -> {r.back_point} {r.objective} {r.protocol}: {r.budget_note}"
             for r in results[results["budget_limited"]].itertuples()]  # fmt: skip
    tables = [TableEntry("results", "Scores", table,
                         "One row per (front point, back point, objective, protocol); "
                         "normalised is (score - null) / (ceiling - null). "
                         + ("Budget-limited (ceiling below 90): " + "; ".join(notes) + ". "
                            if notes else "")
                         + "results.csv has every column.",
                         numeric=("seeds", "IRI median error",
                                  "IRIs x closer than another image",
                                  "back on the front's IRIs"))]  # fmt: skip
    d = summary["data"]
    meta = [
        ("front", summary["front"]), ("front input", summary["front_input"]),
        ("back", summary["back"]), ("back input", summary["back_input"]),
        ("data", f"{d['kind']} {d['source']}: {d['stitch']} stitching and {d['test']} test "
                 f"{d.get('items', 'images')}, {'labelled' if d['labelled'] else 'unlabelled'} "
                 f"({d['split']})"),
        ("time", f"{summary['seconds']} s"),
    ]  # fmt: skip
    return write_page(out, page("stitchlab compare", meta, entries, tables,
                                summary.get("skipped", [])))  # fmt: skip
