"""``make_report``: the figures of a run directory and one self-contained HTML page."""

from __future__ import annotations

import datetime as _dt
import os
import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from ..vocabulary import OBJECTIVES
from . import _html
from .figures import (
    STYLE,
    Spread,
    example_rows,
    plot_agreement_curves,
    plot_audio_examples,
    plot_cka,
    plot_excess_agreement,
    plot_iri_examples,
    plot_iri_quality,
    plot_layer_averages,
    plot_robust_curves,
    robust_pairs,
)
from .inputs import IRIExamples, RunData, load_run, wav_bytes
from .tables import (
    front_reference,
    infer_num_classes,
    iri_quality,
    iri_transfer,
    layer_averages,
    marker_label,
    normalised_to_identical,
    objective_label,
    ordered,
    protocol_label,
)

__all__ = ["make_report", "save_figure", "layer_average_matrix"]


def _renamed(df, columns: dict[str, tuple[str, int | None]]):
    """``df`` with its columns renamed for display and formatted to the given digits
    (None: as they are); columns it lacks are skipped."""
    out = df.rename(columns={k: v[0] for k, v in columns.items()})
    for name, digits in columns.values():
        if name in out and digits is not None:
            out[name] = [_html.fmt(v, digits) for v in out[name]]
    return out

DEFAULT_NUM_CLASSES = 10
_TEXT_COLUMNS = {"experiment", "pair", "marker", "stitch training", "front", "back", "point"}
_METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None}}  # reproducible files


def save_figure(
    fig: Figure, directory: str | os.PathLike[str], name: str, formats: Sequence[str] = ("png",)
) -> list[Path]:
    """Write ``fig`` as ``directory/name.<format>`` for each format (PNG at 150 dpi)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    engine = fig.get_layout_engine()
    try:
        with mpl.rc_context(STYLE):
            for f in formats:
                path = directory / f"{name}.{f}"
                fig.savefig(path, format=f, metadata=_METADATA.get(f))
                paths.append(path)
                fig.set_layout_engine("none")  # laid out once: the other formats reuse it
    finally:
        fig.set_layout_engine(engine)
    return paths


def _slug(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-_").lower()[:60] or "x"
    slug, n = base, 2
    while slug in taken:
        slug, n = f"{base}-{n}", n + 1
    taken.add(slug)
    return slug


def layer_average_matrix(table: pd.DataFrame, digits: int = 1) -> pd.DataFrame:
    """:func:`~stitchlab.report.tables.layer_averages` as one row per pair (and variant),
    one text column per objective and protocol ("mean ± seed std")."""
    keys = [c for c in ("experiment", "pair", "marker", "adversarial") if c in table.columns]
    objectives = ordered(table["objective"], OBJECTIVES)
    protocols = ordered(table["protocol"], ("standard", "iris"))
    rows = []
    for group, t in table.groupby(keys, sort=False, dropna=False):
        group = group if isinstance(group, tuple) else (group,)
        row: dict[str, object] = {}
        for k, v in zip(keys, group):
            if k == "marker":
                row[k] = marker_label(str(v)) if v else "—"
            elif k == "adversarial":
                row["stitch training"] = "adversarial" if v else "clean"
            else:
                row[k] = v
        for o in objectives:
            for p in protocols:
                r = t[(t["objective"] == o) & (t["protocol"] == p)]
                if r.empty:
                    continue
                mean, std = float(r["layer_average"].iloc[0]), r["seed_std"].iloc[0]
                text = f"{mean:.{digits}f}"
                if pd.notna(std) and int(r["n_seeds"].iloc[0]) > 1:
                    text += f" ± {float(std):.{digits}f}"
                row[f"{objective_label(o)} {protocol_label(p)}"] = text
        row["points"] = int(t["n_points"].max())
        most, fewest = int(t["n_seeds"].max()), int(t["min_seeds"].min())
        # runs missing at some points: say so rather than a count that holds nowhere whole
        row["seeds"] = most if fewest == most else f"{fewest}–{most} (runs missing)"
        rows.append(row)
    return pd.DataFrame(rows).fillna("—")


class _Builder:
    def __init__(self, data: RunData, formats: Sequence[str], strict: bool) -> None:
        self.data = data
        self.figdir = data.run_dir / "figures"
        self.formats = list(dict.fromkeys(["png", *formats]))
        self.strict = strict
        self.figures: list[_html.FigureEntry] = []
        self.tables: list[_html.TableEntry] = []
        self.skipped: list[str] = list(data.notes)
        self.audio: list[_html.AudioEntry] = []
        self._names: set[str] = set()

    def figure(self, name: str, title: str, caption: str, make: Callable[[], Figure]) -> None:
        """Draw, save and record one figure; a failure is reported (or raised if strict)."""
        try:
            fig = make()
            slug = _slug(name, self._names)
            paths = save_figure(fig, self.figdir, slug, self.formats)
        except Exception as exc:
            if self.strict:
                raise
            msg = f"{title}: the figure failed ({type(exc).__name__}: {exc})."
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            self.skipped.append(msg)
            return
        rel = [p.relative_to(self.data.run_dir).as_posix() for p in paths]
        self.figures.append(
            _html.FigureEntry(f"fig-{slug}", title, caption, paths[0].read_bytes(), rel)
        )

    def table(self, anchor: str, title: str, table: pd.DataFrame, caption: str = "") -> None:
        numeric = [c for c in table.columns if c not in _TEXT_COLUMNS]
        self.tables.append(_html.TableEntry(anchor, title, table, caption, numeric))


_SCALE = "Power in dB, 80 dB range, one colour scale."
_MAX_PLAYER_ROWS = 16  # IRI sets with players on the page (the demo has 16)


def _audio_examples(b: _Builder, examples: IRIExamples, point_order: dict[str, int]) -> None:
    """Waveform and spectrogram figures of the example IRIs, and players to listen to them."""
    what = ("Top row: source clips (with the pair's marker); below: their IRIs for each front "
            "model and stitch point, clips the front represents like the source.")  # fmt: skip
    for kind in ("spectrogram", "waveform"):
        b.figure(
            f"iris-{kind}s",
            f"Example IRIs: {kind}s",
            f"{what} {_SCALE if kind == 'spectrogram' else ''} Title: relative representation "
            "error.",
            lambda kind=kind: plot_audio_examples(examples, kind=kind, point_order=point_order),
        )  # fmt: skip
    rows, k = example_rows(examples, point_order, max_examples=3)
    if len(rows) > 1 + _MAX_PLAYER_ROWS:  # embedded WAV is ~21 kB a clip: keep pages small
        b.skipped.append(f"Audio players: {len(rows) - 1 - _MAX_PLAYER_ROWS} of "
                         f"{len(rows) - 1} IRI sets not embedded (all are in the figures "
                         "and in iris_examples.safetensors).")  # fmt: skip
        rows = rows[: 1 + _MAX_PLAYER_ROWS]
    rate = int(examples.sample_rate)  # type: ignore[arg-type]
    players = []
    for label, key, clips in rows:
        errs = examples.errors.get(key, []) if key is not None else []
        cells = [(wav_bytes(clips[c], rate), f"err {errs[c]:.3f}" if c < len(errs) else "")
                 for c in range(k)]  # fmt: skip
        players.append((label.replace("\n", " at "), cells))
    b.audio.append(_html.AudioEntry(
        "audio-iris", "Listen: sources and their IRIs",
        f"{what} Played as stored ({rate} Hz, not normalised: an IRI may be quieter or "
        "louder than its source). What sounds different but is represented the same is an "
        "invariance of the front model up to that point.",
        players,
    ))  # fmt: skip


def make_report(
    run_dir: str | os.PathLike[str],
    *,
    num_classes: int | None = None,
    spread: Spread = "minmax",
    formats: Sequence[str] = ("png", "pdf"),
    max_examples: int = 8,
    strict: bool = False,
) -> Path:
    """Write ``run_dir/figures/*.{png,pdf}`` and ``run_dir/report.html`` from the result
    files of ``run_dir`` (``results.csv``; optional ``pairs.csv``, ``cka.csv``,
    ``iris_examples.safetensors``) and return the HTML path.

    ``num_classes`` sets the chance level (default: inferred per experiment from
    ``agreement_normalized``, else 10); ``spread`` is the band over seeds ("minmax", "std",
    "none"). A figure whose data is missing is skipped and listed on the page; one that
    fails to draw is listed with its error (raised instead when ``strict``).
    """
    data = load_run(run_dir)
    results = data.results
    b = _Builder(data, formats, strict)
    reference = front_reference(data.pairs)
    experiments = ordered(results["experiment"])
    classes = {
        e: num_classes
        or infer_num_classes(results[results["experiment"] == e], DEFAULT_NUM_CLASSES)
        for e in experiments
    }
    several = len(experiments) > 1
    spread_text = {"minmax": "bands: min–max over seeds", "std": "bands: ±1 std over seeds"}
    band = spread_text.get(spread, "no bands")

    # 1. agreement curves, one figure per experiment
    for e in experiments:
        rows = results[(results["experiment"] == e) & ~results["adversarial"].astype(bool)]
        label = f"Agreement: {e}" if several or e else "Agreement"
        if rows.empty:
            b.skipped.append(f"{label}: only adversarially trained stitches (see robust pairs).")
            continue
        n_seeds = int(rows.groupby(["pair", "objective", "protocol"])["seed"].nunique().max())
        seeds = f"mean over up to {n_seeds} seeds, {band}" if n_seeds > 1 else "a single seed"
        b.figure(
            f"agreement-{e}",
            label,
            f"Agreement of the stitched model with the back model against stitch point, one "
            f"panel per pair; solid: standard stitching, dashed: IRIs; {seeds}. "
            "Front: the front model's own agreement with the back "
            f"model; End: 100; dotted: chance (K = {classes[e]}).",
            lambda rows=rows, e=e: plot_agreement_curves(
                rows, reference=reference, num_classes=classes[e], spread=spread,
                title=e or None,
            ),
        )  # fmt: skip

    # 2. robust vs non-robust pairs
    found = False
    for e in experiments:
        rows = results[results["experiment"] == e]
        if not robust_pairs(rows):
            continue
        found = True
        b.figure(
            f"robust-{e}",
            f"Robust and non-robust pairs: {e}" if several else "Robust and non-robust pairs",
            "Pairs whose names contain 'robust' or 'clean'. Top: clean stitch training, clean "
            "test data; bottom (when run): adversarial stitch training, agreement under attack.",
            lambda rows=rows, e=e: plot_robust_curves(
                rows, reference=reference, num_classes=classes[e], spread=spread, title=e or None
            ),
        )  # fmt: skip
    if not found:
        b.skipped.append("Robust pairs: no pair name contains 'robust' or 'clean'.")

    # 3. excess agreement (shortcut experiments)
    if "excess_agreement" in results and results["excess_agreement"].notna().any():
        b.figure(
            "excess-agreement",
            "Excess agreement (shortcut markers)",
            "Agreement on test data whose markers agree with the class minus agreement with the "
            f"markers rolled by one class, one panel per marker mode; {band}.",
            lambda: plot_excess_agreement(results, spread=spread),
        )
    else:
        b.skipped.append("Excess agreement: results.csv has no excess_agreement values.")

    # 4. CKA
    if data.cka is not None:
        b.figure(
            "cka",
            "CKA and stitching",
            "Linear CKA between front and back activations on test data (solid) and on test "
            "IRIs (dashed), next to SLM and FuLA agreement / 100 (solid: standard, dashed: IRIs)."
            + (f" IRI recipe: {data.iri_recipe}." if data.iri_recipe is not None else ""),
            lambda: plot_cka(data.cka, results, spread=spread),
        )

    # 5. IRI quality and examples
    quality = iri_quality(results)
    point_order = {str(p): int(i) for p, i in results.groupby("point")["point_index"].min().items()}
    if quality is not None:
        b.figure(
            "iri-quality",
            "IRI convergence",
            "Relative representation error ||f(x') - f(x)|| / ||f(x)|| of the IRI sets per "
            "front model and stitch point: median (solid) and 90th percentile (dashed); "
            "dotted: the null, the median relative distance of another real image's "
            "representation (an IRI is only identically represented far below it).",
            lambda: plot_iri_quality(quality),
        )
    else:
        b.skipped.append("IRI quality: results.csv has no iri_* values for the IRI protocol.")
    if data.examples is not None and data.examples.is_audio:
        if data.examples.iris:
            _audio_examples(b, data.examples, point_order)
        else:
            b.skipped.append("Example IRIs: iris_examples.safetensors holds no iris/* tensors.")
    elif data.examples is not None:
        if data.examples.iris:
            b.figure(
                "iris-examples",
                "Example IRIs",
                "Top row: source images; below: their IRIs for each front model and stitch "
                "point (title: relative error when recorded).",
                lambda: plot_iri_examples(
                    data.examples, point_order=point_order, max_examples=max_examples
                ),
            )
        else:
            b.skipped.append("Example IRIs: iris_examples.safetensors holds no iris/* tensors.")

    # 6. layer averages
    table = layer_averages(results)
    chance_all = classes[experiments[0]] if len(set(classes.values())) == 1 else None
    if not table.empty:
        b.figure(
            "layer-average",
            "Layer-averaged agreement",
            "Mean of each seed-averaged curve over the stitch points (End and Front excluded); "
            "error bars: std over seeds of the per-seed layer averages. Hatched: IRIs.",
            lambda: plot_layer_averages(table, num_classes=chance_all),
        )
        b.table(
            "table-layer-average",
            "Layer-averaged agreement (%)",
            layer_average_matrix(table),
            "Mean over stitch points (End/Front excluded) of the agreement averaged over seeds; "
            "± the standard deviation over seeds of the per-seed layer averages.",
        )
        normalised = normalised_to_identical(table, classes)
        if normalised is not None:
            b.table(
                "table-normalised",
                "Layer-averaged agreement between floor and ceiling",
                layer_average_matrix(normalised.assign(seed_std=float("nan")), digits=2),
                "(layer average - chance) / (identical pair's layer average - chance), "
                "chance = 100/K: 1 is the identical pair (the back stitched into itself "
                "with the same objective, protocol and budget: the ceiling), 0 chance. "
                "stitchlab compare and the oracle report the same quantity (compare with "
                "its random-front null as the floor).",
            )
    adversarial = results[results["adversarial"].astype(bool)]
    if "robust_agreement" in results and adversarial["robust_agreement"].notna().any():
        b.table(
            "table-robust",
            "Layer-averaged robust agreement (%)",
            layer_average_matrix(layer_averages(adversarial, "robust_agreement")),
            "Adversarially trained stitches: agreement under attack, averaged as above.",
        )
    excess = layer_averages(results, "excess_agreement") if "excess_agreement" in results else None
    if excess is not None and not excess.empty:
        b.table(
            "table-excess",
            "Layer-averaged excess agreement (pp)",
            layer_average_matrix(excess),
            "Mean over stitch points of the excess agreement averaged over seeds.",
        )
    if quality is not None:
        q = _renamed(quality.drop(columns="point_index"), {
            "iri_median_error": ("median rel. error", 4), "iri_p90_error": ("p90 rel. error", 4),
            "iri_pixel_rms": ("pixel RMS", 4), "iri_null_median": ("null (another image)", 4),
            "iri_null_ratio": ("times closer than null", 1), "n_runs": ("runs", None),
        })  # fmt: skip
        recipe = (
            f"IRI recipe: {data.iri_recipe}. Scores under IRIs depend on the recipe, its "
            "start included: compare them only under one recipe."
            if data.iri_recipe is not None
            else "IRI recipe: not recorded in run.json."
        )
        b.table("table-iri-quality", "IRI quality per front and point", q,
                "Mean over the IRI-protocol runs at each front and point (over their sets "
                "where each stitch seed had IRIs of its own start). The null is the "
                "median relative distance between the representations of two different "
                "real images at the point; a set less than 10x closer than it is flagged. "
                + recipe)  # fmt: skip
    transfer = iri_transfer(results)
    if transfer is not None:
        t = _renamed(transfer, {
            "iri_front_agreement": ("front on its IRIs", 1),
            "iri_back_agreement": ("back on the front's IRIs", 1),
            "iri_back_hard_agreement": ("back: same top-1 (%)", 1),
            "iri_back_null_agreement": ("back: null (another image)", 1),
        })  # fmt: skip
        b.table("table-iri-transfer", "Shared invariance without a stitch", t,
                "Agreement (%) of each whole model's outputs on the front's IRIs with its "
                "outputs on their source images. The front near 100: the IRIs are close "
                "enough to change nothing it decides. The back near 100: the back is "
                "invariant to what the IRIs changed; near its null (its agreement between "
                "two different real images): it is not.")
    if data.pairs is not None:
        pairs = data.pairs.copy()
        for c in ("front_agreement", "front_accuracy", "back_accuracy"):
            if c in pairs:
                pairs[c] = [_html.fmt(v, 2) for v in pairs[c]]
        b.table("table-pairs", "Pairs and the Front reference", pairs,
                "front_agreement is the Front point of the curves (the front model's own "
                "agreement with the back model); End is 100 by definition.")  # fmt: skip

    # 7. the page
    now = _dt.datetime.now().astimezone()
    stamp = _dt.datetime.fromtimestamp((data.run_dir / "results.csv").stat().st_mtime)
    chance = ", ".join(f"{e or '—'}: K = {k} ({100 / k:.1f}%)" for e, k in classes.items() if k)
    counts = results["experiment"].value_counts(sort=False)
    per_experiment = (
        " (" + ", ".join(f"{e or '—'}: {counts[e]}" for e in experiments) + ")" if several else ""
    )
    meta = [
        ("Experiment" + ("s" if several else ""), ", ".join(e or "—" for e in experiments)),
        ("Result rows", f"{len(results)} stitch runs in results.csv" + per_experiment),
        ("Pairs", ", ".join(ordered(results["pair"]))),
        ("Objectives", ", ".join(objective_label(o) for o in ordered(results["objective"]))),
        ("Protocols", ", ".join(protocol_label(p) for p in ordered(results["protocol"]))),
        ("Chance level", chance or "—"),
        ("Date", f"{now:%Y-%m-%d %H:%M} (results.csv written {stamp:%Y-%m-%d %H:%M})"),
        ("Run directory", str(data.run_dir)),
    ]
    title = "stitchlab report" + (f": {', '.join(experiments)}" if any(experiments) else "")
    html = _html.page(title, meta, b.figures, b.tables, b.skipped, b.audio)
    return _html.write_page(data.run_dir, html)
