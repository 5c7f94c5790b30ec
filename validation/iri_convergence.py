"""IRI convergence study: relative error against steps and wall time, per recipe and point.

For every front model of an experiment config (trained into its store beforehand, e.g. by
``stitchlab run``), every stitch point of the config and every recipe below, IRIs of the
first ``--n`` stitching images (with the pair's marker, as the protocol uses them) are
generated with step budgets of ``--steps`` (each a full run with its own schedule, as a
user would run it). Recorded per run: median and 90th-percentile relative error after
uint8 quantisation, the null (median relative distance of another real image), the wall
time, and, at post-ReLU points, the fraction of units alive in the source but dead in the
IRI (what the straight-through gradient addresses).

    python validation/iri_convergence.py CONFIG --store STORE --out DIR [--n 64]

writes ``DIR/iri_convergence.csv``; ``--tables CSV`` prints the markdown tables of the
validation page from such a file (``--figure PNG`` draws its figure).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import time
from pathlib import Path

import torch

from stitchlab.experiments import load_config, with_fingerprints
from stitchlab.experiments.datasets import stitch_data
from stitchlab.experiments.jobs import load_model
from stitchlab.iris import generate_iris
from stitchlab.splitting import TracedModel

# Recipe names as the page's tables give them. The page's other rows (stitchlab's earlier
# defaults, presets v1-v7, L2 steps, per-sample L-BFGS, the surrogate ReLU gradient, the
# opponent colour basis) were measured with those recipes, which stitchlab no longer has:
# commit 14a97ef is the last that runs them (docs/recipes.md).
RECIPES = {
    "paper: sign 1/255": {"preset": "paper"},
    "sign 8/255->0.5/255": {"preset": "paper", "step_size": 8 / 255,
                            "final_step_size": 0.5 / 255},
    "paper, exact gradient, adam in pixels": {"preset": "paper", "optimizer": "adam",
                                              "step_size": 0.1, "final_step_size": 0.01},
    "default": {},
    "default in pixels": {"precondition": "none"},
}  # fmt: skip


def _dead_in_iri(front: torch.nn.Module, x: torch.Tensor, iris: torch.Tensor) -> float:
    """Fraction of units active (> 0) in the source's activation that are 0 in the IRI's
    (:func:`iri_residual.residual_split`'s ``dead_units``)."""
    from iri_residual import residual_split

    with torch.no_grad():
        return residual_split(front(x), front(iris))["dead_units"]


def _ends_in_relu(model: torch.nn.Module, point: str) -> bool:
    from stitchlab.iris.front import _is_relu

    front, _ = TracedModel(model).split(point)
    gm = getattr(front, "eval_graph", front)
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return _is_relu(out, gm)


def study(
    config: str,
    store: Path,
    n: int,
    steps: list[int],
    recipes: list[str],
    only: list[str] | None = None,
) -> list[dict]:
    """One row per (front, point, recipe, step budget); ``only``: these models (a back
    too), each with the marker of the first pair that uses it."""
    exp = load_config(config)
    raw = with_fingerprints(exp.raw)
    fronts: dict[str, str | None] = {}
    for spec in exp.pairs.values():
        for front in spec["front"] + ([spec["back"]] if only else []):
            fronts.setdefault(front, spec.get("marker"))
    if only:
        unknown = sorted(set(only) - set(fronts))
        if unknown:
            raise SystemExit(f"--fronts: {unknown} are in no pair of {config}")
        fronts = {k: fronts[k] for k in only}
    points = next(iter(exp.points.values()))
    rows = []
    for front_name, marker in fronts.items():
        model = load_model(raw, store, front_name)
        data = stitch_data(raw, marker)
        x = torch.stack([data[i][0] for i in range(n)])
        for point in points:
            relu = _ends_in_relu(model, point)
            front, _ = TracedModel(model).split(point)
            for recipe in recipes:
                for k in steps:
                    t0 = time.perf_counter()
                    res = generate_iris(model, point, x, steps=k, **RECIPES[recipe])
                    seconds = time.perf_counter() - t0
                    q = res.quality()
                    rows.append({
                        "n": n, "front": front_name, "point": point, "ends_in_relu": relu,
                        "recipe": recipe, "steps": k, "median_error": q.median_error,
                        "p90_error": q.p90_error, "null_median": q.null_median,
                        "null_ratio": q.null_ratio, "seconds": seconds,
                        "dead_in_iri": _dead_in_iri(front, x, res.iris) if relu else None,
                        "pixel_rms": q.median_pixel_rms,
                    })  # fmt: skip
                    print(f"{front_name:10s} {point:10s} {recipe:34s} {k:4d} steps: median "
                          f"{q.median_error:.4f} p90 {q.p90_error:.4f} ({q.null_ratio:.0f}x) "
                          f"pixel RMS {q.median_pixel_rms:.3f} {seconds:.1f}s",
                          flush=True)  # fmt: skip
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    """The rows as CSV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


#: Errors below this are drawn at it (a log axis has no 0; the tables give the values).
FLOOR = 1e-4


def figure(rows: list[dict], path: Path, title: str, n: int | None = None) -> None:
    """Median error against seconds (one marker per step budget), per recipe, one row of
    panels per front; ``n``: the IRIs per run, for the axis label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fronts = list(dict.fromkeys(r["front"] for r in rows))
    points = list(dict.fromkeys(r["point"] for r in rows))
    recipes = list(dict.fromkeys(r["recipe"] for r in rows))
    fig, axes = plt.subplots(len(fronts), len(points), figsize=(2.6 * len(points),
                             2.3 * len(fronts)), squeeze=False, sharey=True)  # fmt: skip
    colours = plt.get_cmap("tab10")
    for i, front in enumerate(fronts):
        for j, point in enumerate(points):
            ax = axes[i][j]
            null = None
            for c, recipe in enumerate(recipes):
                sel = [r for r in rows if (r["front"], r["point"], r["recipe"]) ==
                       (front, point, recipe)]  # fmt: skip
                if not sel:
                    continue
                ax.plot([r["seconds"] for r in sel],
                        [max(r["median_error"], FLOOR) for r in sel],
                        marker="o", ms=3, color=colours(c), label=recipe)  # fmt: skip
                null = sel[0]["null_median"]
            if null:
                ax.axhline(null, color="0.5", ls=":", lw=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.tick_params(labelsize=7)
            ax.set_title(f"{front} {point}", fontsize=8)
            if j == 0:
                ax.set_ylabel("median rel. error")
            if i == len(fronts) - 1:
                ax.set_xlabel(f"seconds ({n} IRIs)" if n else "seconds")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle(f"{title} (errors below {FLOOR:g} drawn at it)", fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV written by :func:`write_csv`, numbers as floats."""
    rows = []
    with path.open() as f:
        for r in csv.DictReader(f):
            for k in ("median_error", "p90_error", "null_median", "null_ratio", "seconds",
                      "dead_in_iri", "pixel_rms"):  # fmt: skip
                r[k] = float(r[k]) if r.get(k) not in (None, "") else None
            r["steps"] = int(r["steps"])
            if r.get("n"):
                r["n"] = int(r["n"])
            rows.append(r)
    return rows


def tables(rows: list[dict]) -> str:
    """Markdown: per front, median / p90 error and seconds (and the median pixel RMS
    distance to the source, where recorded) of every recipe at its largest budget per
    point, the null, and the dead-unit fractions where both recipes that give them ran."""
    from stitchlab.report import markdown_table

    out = []
    top = max(r["steps"] for r in rows)
    for front in dict.fromkeys(r["front"] for r in rows):
        sel = [r for r in rows if r["front"] == front and r["steps"] == top]
        points = list(dict.fromkeys(r["point"] for r in sel))
        table = []
        for recipe in dict.fromkeys(r["recipe"] for r in sel):
            row = {"recipe": recipe}
            for point in points:
                (r,) = [r for r in sel if (r["recipe"], r["point"]) == (recipe, point)]
                rms = f"; pixel RMS {r['pixel_rms']:.3f}" if r.get("pixel_rms") is not None else ""
                row[point] = (
                    f"{r['median_error']:.3f} / {r['p90_error']:.3f} ({r['seconds']:.1f} s{rms})"
                )
            table.append(row)
        nulls = {"recipe": "null: another image"}
        for point in points:
            nulls[point] = f"{[r for r in sel if r['point'] == point][0]['null_median']:.3f}"
        table.append(nulls)
        dead = {"recipe": "alive in source, dead in IRI (exact / smooth gradient)"}
        for point in points:
            d = {r["recipe"]: r["dead_in_iri"] for r in sel if r["point"] == point}
            a, b = d.get("paper, exact gradient, adam in pixels"), d.get("default in pixels")
            dead[point] = f"{a:.1%} / {b:.1%}" if a is not None and b is not None else "-"
        if any(v != "-" for k, v in dead.items() if k != "recipe"):
            table.append(dead)
        out.append(f"**{front}**, {top} steps: median / p90 relative error (seconds)\n")
        out.append(markdown_table(table))
        out.append("")
    return "\n".join(out)


def main() -> None:
    """Run the study and write the CSV (and optionally the figure)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?")
    p.add_argument("--store")
    p.add_argument("--out")
    p.add_argument("--tables", default=None, help="print the page's tables from this CSV")
    p.add_argument("--n", type=int, default=None, help="IRIs per run (default 64)")
    p.add_argument("--steps", default="50,100,200")
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--figure", default=None, help="PNG path for the figure")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fronts", default="", help="only these models (e.g. back,shortcut1)")
    args = p.parse_args()
    if args.tables:
        rows = read_csv(Path(args.tables))
        print(tables(rows))
        if args.figure:
            figure(rows, Path(args.figure), "IRI convergence", rows[0].get("n") or args.n)
        return
    recipes = [r for r in args.recipes.split(",") if r]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        raise SystemExit(f"unknown recipe(s) {unknown}; the names (comma-separated) are "
                         f"{list(RECIPES)}")  # fmt: skip
    args.n = args.n or 64
    torch.set_num_threads(args.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
    print(f"commit {commit}; {args.config}; n={args.n}; steps {args.steps}", flush=True)
    t0 = time.perf_counter()
    rows = study(args.config, Path(args.store), args.n, [int(s) for s in args.steps.split(",")],
                 recipes,
                 [f for f in args.fronts.split(",") if f] or None)  # fmt: skip
    write_csv(rows, Path(args.out) / "iri_convergence.csv")
    if args.figure:
        figure(rows, Path(args.figure), f"IRI convergence: {Path(args.config).stem}", args.n)
    print(f"done in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
