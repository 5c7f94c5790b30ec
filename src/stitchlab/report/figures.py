"""Figures from the result tables: matplotlib's object API on an Agg canvas (no pyplot, no
display, no change to the global backend). Every function returns a ``Figure``."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, ParamSpec, TypeVar

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .inputs import IRIExamples
from .tables import (
    OBJECTIVES,
    PROTOCOLS,
    curve_stats,
    front_reference,
    marker_label,
    objective_label,
    ordered,
    protocol_label,
    variant_keys,
)

__all__ = [
    "STYLE",
    "Spread",
    "plot_agreement_curves",
    "plot_robust_curves",
    "plot_excess_agreement",
    "plot_cka",
    "plot_iri_examples",
    "plot_audio_examples",
    "spectrogram",
    "waveform_envelope",
    "plot_iri_quality",
    "plot_layer_averages",
    "robust_pairs",
]

Spread = Literal["minmax", "std", "none"]

STYLE: dict[str, object] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 9,
    "figure.titlesize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.grid.axis": "y",
    "grid.color": "0.9",
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.6,
    "lines.markersize": 4.5,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "savefig.dpi": 150,
}

# Okabe-Ito colours (colour-blind safe); shapes also tell the objectives apart in grey.
_COLOURS = {"hlm": "#E69F00", "slm": "#0072B2", "dm": "#009E73", "fula": "#D55E00", "cka": "k"}
_EXTRA_COLOURS = ("#CC79A7", "#56B4E9", "#8C564B", "#7F7F7F", "#BCBD22", "#17BECF")
_SHAPES = {"hlm": "o", "slm": "s", "dm": "^", "fula": "D", "cka": "P"}
_LINESTYLES = {"standard": "-", "iris": "--"}
_EXTRA_LINESTYLES = ("-.", ":", (0, (5, 1, 1, 1)))
_REF_COLOUR = "0.15"
_CHANCE_COLOUR = "0.45"

P = ParamSpec("P")
R = TypeVar("R")


def _styled(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a plotting function inside :data:`STYLE` (the global rcParams stay untouched)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with mpl.rc_context(STYLE):
            return fn(*args, **kwargs)

    return wrapper


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _colour(objective: str, objectives: Sequence[str]) -> str:
    if objective in _COLOURS:
        return _COLOURS[objective]
    extra = [o for o in objectives if o not in _COLOURS]
    return _EXTRA_COLOURS[extra.index(objective) % len(_EXTRA_COLOURS)]


def _linestyle(protocol: str, protocols: Sequence[str]) -> object:
    if protocol in _LINESTYLES:
        return _LINESTYLES[protocol]
    extra = [p for p in protocols if p not in _LINESTYLES]
    return _EXTRA_LINESTYLES[extra.index(protocol) % len(_EXTRA_LINESTYLES)]


def _open(protocol: str) -> bool:
    """IRI curves get open markers (so they differ also where the lines overlap)."""
    return protocol != "standard"


@dataclass
class _Panel:
    """One axes of curves: ``stats`` from :func:`curve_stats` keyed by objective/protocol."""

    title: str
    stats: pd.DataFrame
    ylabel: str = "agreement (%)"
    ylim: tuple[float, float] | None = (0.0, 100.0)
    references: bool = True  # Front/End slots on the x axis
    front: tuple[float, float, float] | None = None
    end: float | None = 100.0
    chance: float | None = None
    zero_line: bool = False
    scale: float = 1.0  # values are multiplied by this (agreement / 100 next to CKA)


def _point_axis(ax: Axes, names: Sequence[str], references: bool) -> None:
    labels = list(names)
    if references:
        labels = ["Front", *labels, "End"]
        ticks = list(range(len(labels)))
        ax.set_xlim(-0.5, len(labels) - 0.5)
        for x in (0.5, len(labels) - 1.5):
            ax.axvline(x, color="0.8", lw=0.8, ls=(0, (1, 2)), zorder=0)
    else:
        ticks = list(range(1, len(labels) + 1))
        ax.set_xlim(0.5, len(labels) + 0.5)
    rotate = _names_turned(labels)
    ax.set_xticks(ticks)
    ax.set_xticklabels(
        labels, rotation=45 if rotate else 0, ha="right" if rotate else "center",
        rotation_mode="anchor",
    )  # fmt: skip
    ax.grid(False, axis="x")


def _names_turned(labels: Sequence[str]) -> bool:
    """Whether :func:`_point_axis` turns these point names 45 degrees (by their count and
    lengths alone)."""
    longest = max((len(s) for s in labels), default=0)
    return len(labels) > 6 or longest * len(labels) > 45


def tick_labels_overlap(fig: Figure, ax: Axes) -> bool:
    """Whether any two of ``ax``'s x tick labels overlap as ``fig`` is drawn now."""
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()]
    return any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))


def _rotate_crowded_points(fig: Figure, ax: Axes) -> None:
    """Turn the point names 45 degrees where they overlap upright (a narrow axis beside an
    outside legend, where :func:`_point_axis`'s rule by name lengths cannot see the width).
    Names already turned are left as they are, without drawing the figure."""
    if any(label.get_rotation() for label in ax.get_xticklabels()):
        return
    if tick_labels_overlap(fig, ax):
        for label in ax.get_xticklabels():
            label.set(rotation=45, ha="right", rotation_mode="anchor")


def _spread_bounds(rows: pd.DataFrame, spread: Spread) -> tuple[np.ndarray, np.ndarray] | None:
    if spread == "none" or int(rows["n"].max()) < 2:
        return None
    if spread == "std":
        return (rows["mean"] - rows["std"]).to_numpy(), (rows["mean"] + rows["std"]).to_numpy()
    return rows["min"].to_numpy(), rows["max"].to_numpy()


def _draw_panel(ax: Axes, panel: _Panel, spread: Spread, objectives, protocols) -> None:
    stats = panel.stats.sort_values("point_index")
    order = stats.drop_duplicates("point_index")
    names = order["point"].astype(str).tolist()
    pos = {int(i): k + 1 for k, i in enumerate(order["point_index"])}
    _point_axis(ax, names, panel.references)
    if panel.chance is not None:
        ax.axhline(panel.chance * panel.scale, color=_CHANCE_COLOUR, lw=1.0, ls=":", zorder=1)
    if panel.zero_line:
        ax.axhline(0.0, color="0.5", lw=0.8, zorder=1)
    present = [o for o in objectives if o in set(stats["objective"])]
    # a single point: spread the objectives sideways so that their markers do not hide
    dodge = 0.3 / max(1, len(present) - 1) if len(names) == 1 and len(present) > 1 else 0.0
    for j, objective in enumerate(present):
        for protocol in [p for p in protocols if p in set(stats["protocol"])]:
            rows = stats[(stats["objective"] == objective) & (stats["protocol"] == protocol)]
            if rows.empty:
                continue
            x = rows["point_index"].map(pos).to_numpy(float) + dodge * (j - (len(present) - 1) / 2)
            y = rows["mean"].to_numpy(float) * panel.scale
            colour = _colour(objective, objectives)
            bounds = _spread_bounds(rows, spread)
            if bounds is not None:
                lo, hi = (b * panel.scale for b in bounds)
                if len(x) > 1:
                    ax.fill_between(x, lo, hi, color=colour, alpha=0.15, lw=0, zorder=2)
                else:
                    ax.errorbar(x, y, yerr=[y - lo, hi - y], fmt="none", ecolor=colour,
                                elinewidth=1.0, capsize=3, zorder=3)  # fmt: skip
            ax.plot(
                x, y, color=colour, ls=_linestyle(protocol, protocols),
                marker=_SHAPES.get(objective, "o"),
                mfc="white" if _open(protocol) else colour, mec=colour, zorder=4, clip_on=False,
            )  # fmt: skip
    if panel.references:
        end_x = len(names) + 1
        if panel.front is not None:
            mean, lo, hi = (v * panel.scale for v in panel.front)
            yerr = [[mean - lo], [hi - mean]] if hi > lo else None
            ax.errorbar([0], [mean], yerr=yerr, fmt="D", color=_REF_COLOUR, ms=6, capsize=3,
                        zorder=5, clip_on=False)  # fmt: skip
        if panel.end is not None:
            ax.plot([end_x], [panel.end * panel.scale], marker="*", color=_REF_COLOUR, ms=10,
                    ls="none", zorder=5, clip_on=False)  # fmt: skip
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    ax.set_title(panel.title)


def _place_legend(fig: Figure, handles: Sequence[object], side: bool) -> None:
    """One legend outside the axes: at the right (``side``), else below in as many columns
    as fit the figure's width."""
    if side:
        fig.legend(handles=handles, loc="outside right center", frameon=False)
        return
    longest = max(len(h.get_label()) for h in handles)  # type: ignore[attr-defined]
    entry = 0.068 * longest + 0.85  # inches at 9 pt
    fit = max(1, min(len(handles), int((fig.get_figwidth() - 0.2) // entry)))
    ncol = math.ceil(len(handles) / math.ceil(len(handles) / fit))  # balanced rows
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False)


def _legend(
    fig: Figure,
    panels: Sequence[_Panel],
    objectives: Sequence[str],
    protocols: Sequence[str],
    spread: Spread,
    protocol_names: Mapping[str, str] | None = None,
    side: bool = False,
) -> None:
    handles: list[object] = []
    for o in objectives:
        c = _colour(o, objectives)
        label = "CKA (linear)" if o == "cka" else objective_label(o)
        handles.append(Line2D([], [], color=c, marker=_SHAPES.get(o, "o"), label=label))
    for p in protocols:
        name = (protocol_names or {}).get(p, protocol_label(p))
        handles.append(
            Line2D([], [], color="0.3", ls=_linestyle(p, protocols), marker="o",
                   mfc="white" if _open(p) else "0.3", mec="0.3", label=name)
        )  # fmt: skip
    n_max = max((int(p.stats["n"].max()) for p in panels if not p.stats.empty), default=1)
    if spread != "none" and n_max > 1:
        what = "min–max" if spread == "minmax" else "±1 std"
        handles.append(Patch(color="0.5", alpha=0.3, lw=0, label=f"{what} over seeds"))
    if any(p.references and p.front is not None for p in panels):
        handles.append(Line2D([], [], color=_REF_COLOUR, marker="D", ls="none", label="Front"))
    if any(p.references and p.end is not None for p in panels):
        handles.append(Line2D([], [], color=_REF_COLOUR, marker="*", ms=9, ls="none", label="End"))
    if any(p.chance is not None for p in panels):
        handles.append(Line2D([], [], color=_CHANCE_COLOUR, ls=":", lw=1.0, label="chance"))
    _place_legend(fig, handles, side)


def _blank() -> _Panel:
    """An empty slot in a grid."""
    return _Panel("", pd.DataFrame(columns=["objective", "protocol", "point_index", "n"]))


def _grid(
    panels: Sequence[_Panel],
    *,
    ncols: int,
    spread: Spread,
    title: str | None,
    xlabel: str = "stitch point",
    protocol_names: Mapping[str, str] | None = None,
) -> Figure:
    """Panels in rows of ``ncols`` with a shared y axis and one legend below; panels with
    empty ``stats`` leave their slot empty."""
    real = [p for p in panels if not p.stats.empty]
    ncols = max(1, min(ncols, len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    widest = max(p.stats["point_index"].nunique() + 2 * p.references for p in real)
    width = max(2.9, 0.24 * widest + 1.3)
    extra = 0.35 if any("\n" in p.title for p in real) else 0.0
    side = ncols == 1
    fig = _figure(width * ncols + 0.3 + 1.9 * side, (2.6 + extra) * nrows + 0.9 * (not side))
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    all_stats = pd.concat([p.stats for p in real])
    objectives = ordered(all_stats["objective"], (*OBJECTIVES, "cka"))
    protocols = ordered(all_stats["protocol"], PROTOCOLS)
    for k, ax in enumerate(axes.flat):
        if k >= len(panels) or panels[k].stats.empty:
            ax.set_visible(False)
            continue
        _draw_panel(ax, panels[k], spread, objectives, protocols)
        ax.tick_params(labelleft=True)
        first_in_row = all(panels[j].stats.empty for j in range(k - k % ncols, k))
        if first_in_row:
            ax.set_ylabel(panels[k].ylabel)
        below = [j for j in range(k + ncols, len(panels), ncols) if not panels[j].stats.empty]
        if not below:
            ax.set_xlabel(xlabel)
    _legend(fig, real, objectives, protocols, spread, protocol_names, side)
    if title:
        fig.suptitle(title, fontweight="bold")
    return fig


def _check_one_experiment(results: pd.DataFrame) -> None:
    experiments = results["experiment"].unique() if "experiment" in results else []
    if len(experiments) > 1:
        raise ValueError(
            f"results hold {len(experiments)} experiments ({', '.join(map(str, experiments))}); "
            "plot one at a time, e.g. results[results.experiment == name]"
        )


def _panel_title(pair: str, variant: Mapping[str, object]) -> str:
    parts = [pair]
    if variant.get("marker"):
        parts.append(marker_label(str(variant["marker"])))
    if variant.get("adversarial"):
        parts.append("adv. stitch")
    return " · ".join(parts)


def _panels(
    results: pd.DataFrame,
    value: str,
    *,
    reference: Mapping[str, tuple[float, float, float]] | None,
    chance: float | None,
    **options: object,
) -> list[_Panel]:
    """One panel per pair (and marker / adversarial variant), in order of appearance."""
    vkeys = variant_keys(results)
    keys = ["pair", *vkeys, "objective", "protocol"]
    stats = curve_stats(results, value, keys)
    panels = []
    for _, rows in stats.groupby(["pair", *vkeys], sort=False):
        first = rows.iloc[0]
        variant = {k: first[k] for k in vkeys}
        pair = str(first["pair"])
        panels.append(
            _Panel(
                title=_panel_title(pair, variant),
                stats=rows,
                front=(reference or {}).get(pair),
                chance=chance,
                **options,  # type: ignore[arg-type]
            )
        )
    return panels


_VALUE_LABELS = {
    "agreement": "agreement (%)",
    "robust_agreement": "robust agreement (%)",
    "hard_agreement": "hard agreement (%)",
    "accuracy": "accuracy (%)",
    "agreement_normalized": "chance-normalised agreement (%)",
}
_CHANCE_VALUES = {"agreement", "robust_agreement", "hard_agreement", "accuracy"}


Reference = pd.DataFrame | Mapping[str, float | tuple[float, float, float]] | None


def _reference(reference: Reference) -> dict[str, tuple[float, float, float]]:
    """Front points as ``pair -> (mean, min, max)`` from a pairs table or a mapping."""
    if reference is None:
        return {}
    if isinstance(reference, pd.DataFrame):
        return front_reference(reference)
    out = {}
    for pair, v in reference.items():
        if isinstance(v, int | float):
            out[str(pair)] = (float(v), float(v), float(v))
        else:
            mean, lo, hi = v
            out[str(pair)] = (float(mean), float(lo), float(hi))
    return out


def _chance(num_classes: int | None) -> float | None:
    return None if not num_classes else 100.0 / num_classes


@_styled
def plot_agreement_curves(
    results: pd.DataFrame,
    *,
    value: str = "agreement",
    reference: Reference = None,
    num_classes: int | None = 10,
    spread: Spread = "minmax",
    show_end: bool = True,
    title: str | None = None,
    max_cols: int = 4,
) -> Figure:
    """Agreement (or another score column, ``value``) against stitch point, one panel per
    pair (one experiment's rows; markers and adversarial stitching get their own panels).

    Colour and marker shape: objective; solid line: standard protocol, dashed with open
    markers: IRIs. Lines are means over seeds, bands their ``spread``. The x axis runs
    Front, the points in ``point_index`` order, End; ``reference`` gives the Front points
    (the ``pairs.csv`` table, or pair -> value or (mean, min, max)), End is 100, the dotted
    line chance (100 / ``num_classes``; None: no line).
    """
    _check_one_experiment(results)
    rows = results[results[value].notna()] if value in results else results.iloc[:0]
    if rows.empty:
        raise ValueError(f"no values in column {value!r} to plot")
    percent = value in _VALUE_LABELS
    panels = _panels(
        rows, value, reference=_reference(reference) if value == "agreement" else None,
        chance=_chance(num_classes) if value in _CHANCE_VALUES else None,
        end=100.0 if show_end and value != "accuracy" else None,
        ylabel=_VALUE_LABELS.get(value, value), ylim=(0.0, 100.0) if percent else None,
    )  # fmt: skip
    return _grid(panels, ncols=max_cols, spread=spread, title=title)


_ROBUST = re.compile(r"robust|clean", re.IGNORECASE)


def robust_pairs(results: pd.DataFrame) -> list[str]:
    """Pairs whose names contain "robust" or "clean", in order of appearance."""
    return [p for p in ordered(results["pair"].astype(str)) if _ROBUST.search(p)]


@_styled
def plot_robust_curves(
    results: pd.DataFrame,
    *,
    reference: Reference = None,
    num_classes: int | None = 10,
    spread: Spread = "minmax",
    title: str | None = None,
) -> Figure:
    """Robust vs non-robust pairs (names with "robust" or "clean"), one column per pair.

    Top row: clean stitch training, agreement on clean test data. Bottom row (when the
    results have adversarially trained stitches with ``robust_agreement``): agreement under
    attack, without the Front point (it is measured on clean data).
    """
    _check_one_experiment(results)
    pairs = robust_pairs(results)
    rows = results[results["pair"].isin(pairs) & results["agreement"].notna()]
    if rows.empty:
        raise ValueError('no pairs whose names contain "robust" or "clean"')
    chance = _chance(num_classes)
    clean = rows[~rows["adversarial"].astype(bool)] if "adversarial" in rows else rows
    adv = rows.iloc[:0]
    if "adversarial" in rows and "robust_agreement" in rows:
        adv = rows[rows["adversarial"].astype(bool) & rows["robust_agreement"].notna()]
    top = {}
    for p in (
        _panels(clean, "agreement", reference=_reference(reference), chance=chance)
        if len(clean)
        else []
    ):
        top[p.title] = p
        p.title += "\nclean stitching, clean data"
    bottom = {}
    if len(adv):
        for p in _panels(adv, "robust_agreement", reference=None, chance=chance):
            key = p.title.replace(" · adv. stitch", "")
            bottom[key] = p
            p.title = key + "\nadversarial stitching, attacked"
            p.ylabel = "robust agreement (%)"
    if not bottom:
        return _grid(list(top.values()), ncols=4, spread=spread, title=title)
    if not top:
        return _grid(list(bottom.values()), ncols=4, spread=spread, title=title)
    columns = ordered([*top, *bottom])
    panels = [top.get(c, _blank()) for c in columns] + [bottom.get(c, _blank()) for c in columns]
    return _grid(panels, ncols=len(columns), spread=spread, title=title)


@_styled
def plot_excess_agreement(
    results: pd.DataFrame,
    *,
    spread: Spread = "minmax",
    title: str | None = None,
) -> Figure:
    """Excess agreement (shortcut experiments) against stitch point: one column per marker
    mode, one row per pair; colour per objective, solid standard, dashed IRIs."""
    if "excess_agreement" not in results or results["excess_agreement"].notna().sum() == 0:
        raise ValueError("no values in column 'excess_agreement' to plot")
    rows = results[results["excess_agreement"].notna()].copy()
    several = rows["experiment"].nunique() > 1
    rows["_row"] = (rows["experiment"] + ": " + rows["pair"]) if several else rows["pair"]
    stats = curve_stats(rows, "excess_agreement", ["_row", "marker", "objective", "protocol"])
    row_names = ordered(stats["_row"])
    markers = ordered(stats["marker"], ("pixel+loc", "pixel", "rand"))
    lo = float(min(0.0, (stats["min"]).min()))
    hi = float(max(0.0, (stats["max"]).max()))
    pad = max(5.0, 0.08 * (hi - lo))
    ylim = (max(-100.0, lo - pad), min(100.0, hi + pad))
    panels = []
    for r in row_names:
        for m in markers:
            s = stats[(stats["_row"] == r) & (stats["marker"] == m)]
            name = marker_label(m) if m else "no marker"
            panels.append(
                _Panel(
                    title=f"{name}\n{r}" if len(row_names) > 1 else name,
                    stats=s,
                    ylabel="excess agreement (pp)",
                    ylim=ylim,
                    references=False,
                    end=None,
                    zero_line=True,
                )
            )
    return _grid(panels, ncols=len(markers), spread=spread, title=title)


@_styled
def plot_cka(
    cka: pd.DataFrame,
    results: pd.DataFrame | None = None,
    *,
    objectives: Sequence[str] = ("slm", "fula"),
    spread: Spread = "minmax",
    title: str | None = None,
    max_cols: int = 4,
) -> Figure:
    """CKA on test data (solid) and on test IRIs (dashed) against stitch point, per pair,
    next to the agreement / 100 of ``objectives`` (standard solid, IRIs dashed)."""
    d = cka[cka["cka"].notna()].copy()
    if d.empty:
        raise ValueError("no CKA values to plot")
    d["objective"] = "cka"
    d["protocol"] = np.where(d["data"].str.contains("iri", case=False), "iris", "standard")
    if "seed" not in d:
        d["seed"] = d["front"] if "front" in d else 0
    stats = curve_stats(d, "cka", ["pair", "objective", "protocol"])
    panels = []
    for pair, s in stats.groupby("pair", sort=False):
        parts = [s]
        if results is not None:
            r = results[(results["pair"] == pair) & results["objective"].isin(objectives)]
            if "adversarial" in r:
                r = r[~r["adversarial"].astype(bool)]
            if not r.empty:  # one experiment: the first that has this pair
                r = r[r["experiment"] == r["experiment"].iloc[0]]
                a = curve_stats(r, "agreement", ["pair", "objective", "protocol"])
                for c in ("mean", "min", "max", "std"):
                    a[c] = a[c] / 100.0
                parts.append(a)
        panels.append(
            _Panel(
                title=str(pair),
                stats=pd.concat(parts, ignore_index=True),
                ylabel="CKA  /  agreement ÷ 100",
                ylim=(0.0, 1.0),
                references=False,
                end=None,
            )
        )
    names = {"standard": "test data (standard)", "iris": "test IRIs (IRIs)"}
    return _grid(panels, ncols=max_cols, spread=spread, title=title, protocol_names=names)


@_styled
def plot_iri_examples(
    examples: IRIExamples,
    *,
    point_order: Mapping[str, int] | None = None,
    max_examples: int = 8,
    title: str | None = None,
) -> Figure:
    """Source images (top row) and their IRIs, one row per front and stitch point, one
    column per example; the relative error of each IRI in its title when recorded."""
    rows, k = example_rows(examples, point_order, max_examples)
    cell = 1.0
    fig = _figure(1.3 + cell * k, 0.35 + (cell + 0.18) * len(rows))
    axes = fig.subplots(len(rows), k, squeeze=False)
    for r, (label, key, images) in enumerate(rows):
        errors = examples.errors.get(key) if key is not None else None
        for c in range(k):
            ax = axes[r, c]
            img = np.asarray(images[c])
            img = img[0] if img.shape[0] == 1 else np.transpose(img, (1, 2, 0))
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=255,
                      interpolation="nearest")  # fmt: skip
            ax.set_xticks([])
            ax.set_yticks([])
            ax.grid(False)
            for spine in ax.spines.values():
                spine.set_visible(key is None)
                spine.set_color("0.3")
            if errors is not None and c < len(errors):
                ax.set_title(f"err {errors[c]:.3f}", fontsize=7, pad=2)
            elif r == 0:
                ax.set_title(f"#{c + 1}", fontsize=7, pad=2)
            if c == 0:
                ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8,
                              labelpad=6)  # fmt: skip
    if title:
        fig.suptitle(title, fontweight="bold")
    return fig


def example_rows(
    examples: IRIExamples, point_order: Mapping[str, int] | None = None, max_examples: int = 8
) -> tuple[list[tuple[str, tuple[str, str] | None, np.ndarray]], int]:
    """The rows of an example grid, ``(label, (front, point) or None, arrays)``: the
    sources first, then each front's IRIs by stitch point; and the number of columns."""
    order = point_order or {}
    fronts = ordered(f for f, _ in examples.iris)
    keys = sorted(
        examples.iris,
        key=lambda k: (fronts.index(k[0]), order.get(k[1], math.inf), list(examples.iris).index(k)),
    )
    k = min([len(examples.source), *(len(examples.iris[key]) for key in keys)])
    rows = [("source", None, examples.source), *((f"{f}\n{p}", (f, p), examples.iris[(f, p)])
                                                 for f, p in keys)]  # fmt: skip
    return rows, max(1, min(k, max_examples))


def spectrogram(
    x: np.ndarray, sample_rate: int, n_fft: int = 256, hop: int = 64
) -> tuple[np.ndarray, float]:
    """Power spectrogram of a mono waveform in dB (``(n_fft // 2 + 1, frames)``, Hann
    window, 1e-10 floor) and the seconds per frame."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if len(x) < n_fft:
        x = np.pad(x, (0, n_fft - len(x)))
    frames = 1 + (len(x) - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    spec = np.abs(np.fft.rfft(x[idx] * np.hanning(n_fft), axis=1)) ** 2
    return 10 * np.log10(spec.T + 1e-10), hop / sample_rate


@_styled
def plot_audio_examples(
    examples: IRIExamples,
    *,
    kind: Literal["waveform", "spectrogram"] = "spectrogram",
    point_order: Mapping[str, int] | None = None,
    max_examples: int = 3,
    title: str | None = None,
) -> Figure:
    """Source clips (top row) and their IRIs, one row per front and stitch point, one
    column per example, as waveforms (the min / max envelope per pixel column, as audio
    editors draw them) or as spectrograms (dB, one colour scale for the whole figure: 80 dB
    below the loudest source); the relative error in each title. Only the bottom-left
    panel has tick labels: every panel has the same axes."""
    if not examples.is_audio:
        raise ValueError("these examples are images; use plot_iri_examples")
    rate = int(examples.sample_rate)  # type: ignore[arg-type]
    rows, k = example_rows(examples, point_order, max_examples)
    fig = _figure(1.6 + 1.8 * k, 0.4 + 0.8 * len(rows))
    axes = fig.subplots(len(rows), k, squeeze=False)
    top = max(float(spectrogram(c[0], rate, hop=128)[0].max()) for c in examples.source[:k])
    levels = mpl.colormaps["magma"].resampled(20)  # page stays small (PNG of noise)
    seconds = 0.0
    for r, (label, key, clips) in enumerate(rows):
        errors = examples.errors.get(key) if key is not None else None
        for c in range(k):
            ax, x = axes[r, c], np.asarray(clips[c], dtype=np.float64).mean(axis=0)
            seconds = max(seconds, len(x) / rate)
            if kind == "waveform":
                t, lo, hi = waveform_envelope(x, rate)
                ax.fill_between(t, lo, hi, color="C0" if key is None else "C3", lw=0.3)
                ax.set_ylim(-1, 1)
            else:
                spec, dt = spectrogram(x, rate, hop=128)  # coarse in time, 20 levels: the
                ax.imshow(spec, origin="lower", aspect="auto", cmap=levels, vmin=top - 80,
                          vmax=top, extent=(0, dt * spec.shape[1], 0, rate / 2000),
                          interpolation="nearest")  # blocks compress: PNGs 10x smaller  # fmt: skip
                ax.grid(False)
            if r < len(rows) - 1 or c > 0:  # fixed empty ticks: the layout skips them
                ax.set_xticks([])
                ax.set_yticks([])
            ax.tick_params(labelsize=6)
            if errors is not None and c < len(errors):
                ax.set_title(f"err {errors[c]:.3f}", fontsize=7, pad=2)
            elif r == 0:
                ax.set_title(f"#{c + 1}", fontsize=7, pad=2)
            if c == 0:
                ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8, labelpad=6)
    for ax in axes.flat:
        ax.set_xlim(0, seconds)
    corner = axes[-1, 0]
    corner.set_xticks([0, round(seconds / 2, 3), round(seconds, 3)])
    corner.set_yticks([-1, 0, 1] if kind == "waveform" else [0, rate / 4000, rate / 2000])
    corner.set_xlabel("s" if kind == "waveform" else "s (y: kHz)", fontsize=7)
    if title:
        fig.suptitle(title, fontweight="bold")
    return fig


def waveform_envelope(
    x: np.ndarray, sample_rate: int, columns: int = 400
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(seconds, min, max)`` of a mono waveform over ``columns`` equal bins (all samples
    when it is shorter): drawn filled, it looks as the full trace does at that width."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if len(x) <= 2 * columns:
        return np.arange(len(x)) / sample_rate, x, x
    edges = np.linspace(0, len(x), columns + 1).astype(int)
    lo = np.minimum.reduceat(x, edges[:-1])
    hi = np.maximum.reduceat(x, edges[:-1])
    return edges[:-1] / sample_rate, lo, hi


@_styled
def plot_iri_quality(table: pd.DataFrame, *, title: str | None = None) -> Figure:
    """IRI convergence per front: median (solid) and 90th-percentile (dashed) relative error
    of the IRI set against stitch point, and the null (dotted: another real image's
    relative distance), from :func:`tables.iri_quality`; log scale when the null is drawn."""
    if "iri_median_error" not in table and "iri_p90_error" not in table:
        raise ValueError("the IRI quality table has no error columns")
    points = table.drop_duplicates("point_index").sort_values("point_index")
    pos = {int(i): k + 1 for k, i in enumerate(points["point_index"])}
    fronts = ordered(table["front"].astype(str))
    # room for the point names upright beside the legend (about 0.075 in a character), up
    # to 7 in; names that _point_axis turns anyway need no more than 0.35 in a point
    names = points["point"].astype(str).tolist()
    upright = not _names_turned(names)
    per_point = max(0.35, 0.075 * max(map(len, names)) + 0.1) if upright else 0.35
    fig = _figure(min(7.0, max(3.6, (2.8 if upright else 2.2) + len(pos) * per_point)), 3.2)
    ax = fig.subplots()
    palette = mpl.colormaps["tab10"]
    for n, front in enumerate(fronts):
        rows = table[table["front"] == front].sort_values("point_index")
        x = rows["point_index"].map(pos).to_numpy(float)
        for col, ls, mfc in (("iri_median_error", "-", None), ("iri_p90_error", "--", "white"),
                             ("iri_null_median", ":", "white")):  # fmt: skip
            if col in rows and rows[col].notna().any():
                colour = palette(n % 10)
                ax.plot(x, rows[col], ls=ls, marker="o", color=colour, mec=colour,
                        mfc=mfc or colour, clip_on=False)  # fmt: skip
    _point_axis(ax, names, references=False)
    if "iri_null_median" in table and table["iri_null_median"].notna().any():
        ax.set_yscale("log")  # errors of 0.01 and a null of 1 on one axis
    else:
        ax.set_ylim(bottom=0)
    ax.set_ylabel("relative error of IRIs")
    ax.set_xlabel("stitch point")
    handles = [Line2D([], [], color=palette(n % 10), marker="o", label=f) for n, f in
               enumerate(fronts)]  # fmt: skip
    handles += [
        Line2D([], [], color="0.3", ls="-", label="median"),
        Line2D([], [], color="0.3", ls="--", marker="o", mfc="white", label="90th percentile"),
    ]
    if "iri_null_median" in table and table["iri_null_median"].notna().any():
        handles.append(Line2D([], [], color="0.3", ls=":", marker="o", mfc="white",
                              label="null: another image"))  # fmt: skip
    fig.legend(handles=handles, loc="outside right center", frameon=False)
    if title:
        fig.suptitle(title, fontweight="bold")
    _rotate_crowded_points(fig, ax)
    return fig


@_styled
def plot_layer_averages(
    table: pd.DataFrame,
    *,
    num_classes: int | None = 10,
    title: str | None = None,
    ylabel: str = "layer-averaged agreement (%)",
    ylim: tuple[float, float] | None = (0.0, 100.0),
) -> Figure:
    """Bar chart of :func:`tables.layer_averages`: one panel per experiment, a group of
    bars per pair, colour per objective, hatched bars for IRIs, error bars = seed std."""
    if table.empty:
        raise ValueError("empty layer-average table")
    experiments = ordered(table["experiment"].astype(str))
    vkeys = [k for k in ("marker", "adversarial") if k in table.columns]
    objectives = ordered(table["objective"], OBJECTIVES)
    protocols = ordered(table["protocol"], PROTOCOLS)
    nbars = len(objectives) * len(protocols)
    groups_per = {}
    for e in experiments:
        t = table[table["experiment"] == e]
        groups_per[e] = list(dict.fromkeys(map(tuple, t[["pair", *vkeys]].to_numpy().tolist())))
    widest = max(len(g) for g in groups_per.values())
    fig = _figure(max(4.5, 0.16 * nbars * widest + 1.8), 2.8 * len(experiments) + 0.7)
    axes = fig.subplots(len(experiments), 1, squeeze=False)[:, 0]
    width = 0.8 / nbars
    for ax, e in zip(axes, experiments):
        t = table[table["experiment"] == e]
        groups = groups_per[e]
        for g, group in enumerate(groups):
            sel = np.ones(len(t), bool)
            for col, v in zip(["pair", *vkeys], group):
                sel &= (t[col] == v).to_numpy()
            tg = t[sel]
            for b, (o, p) in enumerate((o, p) for o in objectives for p in protocols):
                row = tg[(tg["objective"] == o) & (tg["protocol"] == p)]
                if row.empty:
                    continue
                x = g - 0.4 + width * (b + 0.5)
                y = float(row["layer_average"].iloc[0])
                err = row["seed_std"].iloc[0]
                colour = _colour(o, objectives)
                iris = _open(p)
                ax.bar(x, y, width * 0.92, color="white" if iris else colour, edgecolor=colour,
                       hatch="////" if iris else None, lw=1.0)  # fmt: skip
                if pd.notna(err) and err > 0:
                    ax.errorbar(x, y, yerr=err, fmt="none", ecolor="0.2", elinewidth=0.8,
                                capsize=2)  # fmt: skip
        ax.set_xticks(range(len(groups)))
        labels = [_panel_title(str(g[0]), dict(zip(vkeys, g[1:]))) for g in groups]
        ax.set_xticklabels([label.replace(" · ", "\n") for label in labels])
        ax.set_xlim(-0.6, len(groups) - 0.4)
        ax.grid(False, axis="x")
        if ylim is not None:
            ax.set_ylim(*ylim)
        if num_classes:
            ax.axhline(100.0 / num_classes, color=_CHANCE_COLOUR, lw=1.0, ls=":")
        ax.set_ylabel(ylabel)
        if len(experiments) > 1:
            ax.set_title(e)
    handles: list[object] = [Patch(color=_colour(o, objectives), label=objective_label(o))
                             for o in objectives]  # fmt: skip
    for p in protocols:
        iris = _open(p)
        handles.append(Patch(facecolor="white" if iris else "0.45", edgecolor="0.45",
                             hatch="////" if iris else None, label=protocol_label(p)))  # fmt: skip
    if num_classes:
        handles.append(Line2D([], [], color=_CHANCE_COLOUR, ls=":", label="chance"))
    _place_legend(fig, handles, side=False)
    if title:
        fig.suptitle(title, fontweight="bold")
    return fig
