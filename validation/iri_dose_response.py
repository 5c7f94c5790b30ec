"""Dose-response of invariance-aware stitching: agreement against IRI error, IRI count, epochs.

For the pairs of an experiment config whose models are in its store, at a few points:
IRI sets of several recipes (several error levels, from rough signed steps to
stitchlab's converged default), stitched with SLM, FuLA and DM under the IRI protocol and
scored on the pair's (marked) test set. Then, with the default recipe, more IRIs
(``--n-iris``; fewer with ``--n-subsets``, the first n of the run's own set) and more
stitch epochs (``--epochs``). Every row also has the stitch-free transfer of the IRI set:
how the front model and the back model each decide on the IRIs against their sources
(:func:`stitchlab.evaluation.iri_agreement`). Answers whether a pair's fall
under IRIs follows the IRIs' error (a rough IRI is a different image to the back model)
or stays when the IRIs are exact (a real difference in invariances).

    python validation/iri_dose_response.py CONFIG --store STORE --out DIR \\
        --pairs cross-seed,cross-bias --points blocks.2,blocks.3

writes ``DIR/dose_response.csv`` (and ``--figure PNG``).
"""

from __future__ import annotations

import argparse
import copy
import csv
import time
from pathlib import Path

import torch
from _common import pair_family, script_commit

from stitchlab import InvarianceAware, Stitcher, evaluate
from stitchlab.evaluation import iri_agreement
from stitchlab.experiments import load_config, with_fingerprints
from stitchlab.experiments.datasets import marked, stitch_data, test_data
from stitchlab.experiments.jobs import iris_data_key, load_model, reference_logits, tracing
from stitchlab.fit import TrainingConfig
from stitchlab.iris import generate_iris_set

TODAY = "default"  # stitchlab's default recipe
# from rough to converged. The page's other levels (stitchlab's earlier defaults, presets
# v1-v4, the surrogate ReLU gradient, the opponent colour basis) were measured with those
# recipes, which stitchlab no longer has: commit 14a97ef is the last that runs them
# (docs/recipes.md).
LEVELS = {
    "sign 40 steps 8/255->0.5/255": {"preset": "paper", "steps": 40, "step_size": 8 / 255,
                                     "final_step_size": 0.5 / 255},
    "paper: sign 200 x 1/255": {"preset": "paper"},
    TODAY: {},
    "default, 540 steps": {"steps": 540},
}  # fmt: skip


def _cell(raw, store, pair, point, objectives, grid, lr):
    """Every (recipe, n, epochs) of ``grid`` and every objective at one (pair, point): one
    Stitcher, one initialisation per stitching set, one training set per IRI set."""
    spec = raw["pairs"][pair]
    front_name, back_name, marker = spec["front"][0], spec["back"], spec["marker"]
    front = load_model(raw, store, front_name)
    back = load_model(raw, store, back_name)
    st = Stitcher(front, back, point, **tracing(raw, front_name, back_name))
    test = marked(test_data(raw), marker, raw["data"])
    ref = reference_logits(raw, store, back_name, marker)
    n0 = raw["stitch"]["n_stitch"]
    for recipe, n_iris, epochs in grid:
        exp = copy.deepcopy(raw)
        exp["stitch"]["n_stitch"] = max(n_iris, n0)  # fewer: the first n of the run's set
        data = stitch_data(exp, marker)
        t0 = time.perf_counter()
        # the experiment's own data key: the default recipe's sets are the run's own
        iris = generate_iris_set(front, point, data, store / "iris", min_null_ratio=0.0,
                                 threshold=10.0, data_key=iris_data_key(exp, marker),
                                 **tracing(raw, front_name), **LEVELS[recipe])  # fmt: skip
        iri_seconds = time.perf_counter() - t0
        errors, null = iris.rel_error, iris.null_error
        train_iris, train_data, items = iris, data, iris  # items: (iri, source label)
        if n_iris < len(iris):
            train_data = torch.utils.data.Subset(data, range(n_iris))
            train_iris = iris.images()[:n_iris]
            items = (train_iris, iris.labels[:n_iris])
            errors, null = errors[:n_iris], null[:n_iris] if null is not None else None
        median = float(errors.median())
        null_ratio = float(null.median()) / median if null is not None else float("nan")
        # stitch-free: does each whole model decide on the IRIs as on their sources?
        on_back = iri_agreement(back, items, train_data)
        transfer = {"front_on_iris": iri_agreement(front, items, train_data)["agreement"],
                    "back_on_iris": on_back["agreement"],
                    "back_null": on_back["null_agreement"]}  # fmt: skip
        training = {**raw["stitch"]["training"], "epochs": epochs}
        if lr is not None:
            training["lr"] = lr
        settings = TrainingConfig(init_samples=raw["stitch"]["n_init"], **training)
        protocol = InvarianceAware(iris=train_iris, allow_flagged=True, threshold=10.0,
                                   min_null_ratio=0.0)  # fmt: skip
        sset = st.collect(train_data, protocol)
        for objective in objectives:
            s = st.fit(objective, sset, settings=settings, init_data=data)
            yield {
                "pair": pair, "point": point, "objective": objective, "recipe": recipe,
                "n_iris": n_iris, "epochs": epochs,
                "agreement": evaluate(s, test, ref)["agreement"],
                "iri_median_error": median, "iri_p90_error": float(errors.quantile(0.9)),
                "iri_null_ratio": null_ratio, "iri_seconds": iri_seconds, **transfer,
            }  # fmt: skip


def main() -> None:
    """Run the grid and write the CSV (and figure)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?")
    p.add_argument("--store")
    p.add_argument("--out")
    p.add_argument("--plot", default=None, help="only draw --figure from this CSV")
    p.add_argument("--pairs", default="cross-seed,cross-bias")
    p.add_argument("--points", default="")
    p.add_argument("--objectives", default="slm,fula,dm")
    p.add_argument(
        "--levels",
        default=";".join(LEVELS),
        help="';'-separated IRI recipes of LEVELS (default: all)",
    )
    p.add_argument("--n-iris", default="", help="more IRIs with --count-level, e.g. 4000")
    p.add_argument(
        "--count-level",
        default=TODAY,
        help="the recipe of LEVELS for --n-iris, --n-subsets and --epochs (default: "
        "stitchlab's default recipe)",
    )
    p.add_argument(
        "--n-subsets",
        default="",
        help="fewer IRIs: the first n of the default set, e.g. 250,500,1000",
    )
    p.add_argument("--epochs", default="", help="more stitch epochs, e.g. 30")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--figure", default=None)
    p.add_argument("--count-figure", default=None,
                   help="agreement against the number of IRIs (with --n-subsets / --n-iris)")
    p.add_argument("--n0", type=int, default=2000, help="with --plot: the config's n_stitch")
    p.add_argument("--e0", type=int, default=6, help="with --plot: the config's epochs")
    args = p.parse_args()
    if args.plot:
        with open(args.plot) as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            for k in ("agreement", "iri_median_error", "front_on_iris", "back_on_iris"):
                r[k] = float(r[k]) if r.get(k) not in (None, "") else float("nan")
            r["n_iris"], r["epochs"] = int(r["n_iris"]), int(r["epochs"])
        if args.figure:
            _figure(rows, Path(args.figure), args.n0, args.e0)
        if args.count_figure:
            _count_figure(rows, Path(args.count_figure), args.e0, args.count_level)
        return
    torch.set_num_threads(args.threads)
    raw = with_fingerprints(load_config(args.config).raw)
    store = Path(args.store)
    print(f"commit {script_commit()}; {args.config}", flush=True)
    n0, e0 = raw["stitch"]["n_stitch"], raw["stitch"]["training"].get("epochs", 30)
    pairs = args.pairs.split(",")
    if unknown_pairs := sorted(set(pairs) - set(raw["pairs"])):
        raise SystemExit(f"unknown pairs {unknown_pairs}; the config has {list(raw['pairs'])}")
    levels = args.levels.split(";")
    unknown = sorted(set(levels + [args.count_level]) - set(LEVELS))
    if unknown:
        raise SystemExit(f"unknown levels {unknown}; choose from {list(LEVELS)}")
    grid = [(r, n0, e0) for r in levels]
    count = args.count_level
    grid += [(count, int(n), e0) for n in args.n_iris.split(",") if n]
    grid += [(count, int(n), e0) for n in args.n_subsets.split(",") if n]
    grid += [(count, n0, int(e)) for e in args.epochs.split(",") if e]
    rows = []
    t_start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for pair in pairs:
        for point in args.points.split(","):
            objectives = args.objectives.split(",")
            for row in _cell(raw, store, pair, point, objectives, grid, args.lr):
                rows.append(row)
                r = row
                print(f"{pair:10s} {point:9s} {r['objective']:4s} {r['recipe']:30s} "
                      f"n={r['n_iris']} ep={r['epochs']}: agreement {r['agreement']:.1f} "
                      f"(IRI median {r['iri_median_error']:.3f}; front/back on IRIs "
                      f"{r['front_on_iris']:.1f}/{r['back_on_iris']:.1f})", flush=True)  # fmt: skip
                # rewritten after every row: an interrupted run keeps what it measured
                with (out / "dose_response.csv").open("w", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=list(rows[0]))
                    w.writeheader()
                    w.writerows(rows)
    if args.figure:
        _figure(rows, Path(args.figure), n0, e0)
    if args.count_figure:
        _count_figure(rows, Path(args.count_figure), e0, count)
    print(f"done in {time.perf_counter() - t_start:.0f} s", flush=True)


def _figure(rows, path: Path, n0: int, e0: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    points = list(dict.fromkeys(r["point"] for r in rows))
    objectives = list(dict.fromkeys(r["objective"] for r in rows))
    fig, axes = plt.subplots(1, len(points), figsize=(3.4 * len(points), 3.0), squeeze=False)
    colours = {"cross-seed": "tab:blue", "cross-bias": "tab:red", "identical": "tab:green"}
    markers = dict(zip(objectives, "os^Dv"))
    for j, point in enumerate(points):
        ax = axes[0][j]
        curves: dict[tuple[str, str], list] = {}  # a pair's levels, one line per objective
        for r in rows:
            if r["point"] != point or r["n_iris"] != n0 or r["epochs"] != e0:
                continue
            colour = colours.get(pair_family(r["pair"]), "k")
            ax.scatter(r["iri_median_error"], r["agreement"], color=colour,
                       marker=markers[r["objective"]], s=22)  # fmt: skip
            curves.setdefault((r["pair"], r["objective"]), []).append(r)
        for (pair, _), rs in curves.items():
            rs.sort(key=lambda r: r["iri_median_error"])
            ax.plot([r["iri_median_error"] for r in rs], [r["agreement"] for r in rs],
                    color=colours.get(pair_family(pair), "k"), lw=0.6, alpha=0.5)  # fmt: skip
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        errors = [r["iri_median_error"] for rs in curves.values() for r in rs]
        if errors:  # ticks inside the data's range, which can be narrow
            lo, hi = min(errors) / 1.3, max(errors) * 1.3
            ax.set_xlim(lo, hi)
            ticks = [t for t in (0.02, 0.03, 0.05, 0.1, 0.2, 0.5) if lo <= t <= hi]
            if ticks:  # else matplotlib's own
                ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.invert_xaxis()
        ax.set_xlabel("median relative error of the IRIs")
        ax.set_title(point, fontsize=9)
        ax.set_ylim(0, 100)
        if j == 0:
            ax.set_ylabel("agreement under IRIs (%)")
    handles = [plt.Line2D([], [], color=c, marker="o", ls="", label=p) for p, c in
               colours.items() if any(pair_family(r["pair"]) == p for r in rows)]  # fmt: skip
    handles += [plt.Line2D([], [], color="0.3", marker=m, ls="", label=o) for o, m in
                markers.items()]  # fmt: skip
    fig.legend(handles=handles, loc="center right", fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _count_figure(rows, path: Path, e0: int, recipe: str = TODAY) -> None:
    """Agreement under IRIs against the number of IRIs (of ``recipe``), one panel per
    (pair, point), with the back model's own agreement on the IRIs (no stitch) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = [r for r in rows if r["recipe"] == recipe and r["epochs"] == e0]
    cells = list(dict.fromkeys((r["pair"], r["point"]) for r in rows))
    fig, axes = plt.subplots(1, len(cells), figsize=(3.6 * len(cells), 3.0), squeeze=False)
    for ax, (pair, point) in zip(axes[0], cells):
        cell = [r for r in rows if (r["pair"], r["point"]) == (pair, point)]
        for objective, marker in zip(dict.fromkeys(r["objective"] for r in cell), "os^D"):
            pts = sorted((r["n_iris"], r["agreement"]) for r in cell if r["objective"] == objective)
            label = {"fula": "FuLA"}.get(objective, objective.upper())
            ax.plot(*zip(*pts), marker=marker, label=label)
        top = max(cell, key=lambda r: r["n_iris"])
        ax.axhline(top["back_on_iris"], ls="--", color="0.3", label="back on the IRIs (no stitch)")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(sorted({r["n_iris"] for r in cell}))
        ax.set_xticklabels([str(n) for n in sorted({r["n_iris"] for r in cell})], fontsize=7)
        ax.set_xlabel("number of IRIs")
        ax.set_ylim(0, 100)
        ax.set_title(f"{pair}, {point}", fontsize=9)
        ax.set_ylabel("agreement under IRIs (%)")
        ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
