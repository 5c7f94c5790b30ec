"""The report of the oracle testbed: each method's layer-averaged score against the oracle
(one panel per objective and protocol, CKA below), Spearman's rho with its interval, and
the networks' measured cue reliance, on the page every stitchlab report uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ._html import FigureEntry, TableEntry, figure_files, page, write_page

__all__ = ["write_oracle_report", "method_key"]


def method_key(row: dict[str, Any]) -> str:
    """The method a graded row belongs to: ``stitch/<protocol>/<objective>``,
    ``cka/<data>`` or ``iri_transfer/<soft|hard>``."""
    if row["method"] == "iri_transfer":
        return f"iri_transfer/{row['protocol']}"
    if row["method"] == "cka":
        return f"cka/{row['protocol']}"
    return f"stitch/{row['protocol']}/{row['objective']}"


def _averaged(off: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """(oracle, score averaged over the points) of each pair of different networks."""
    cells: dict[tuple, list] = {}
    for r in off:
        if method_key(r) == key:
            cells.setdefault((r["front"], r["back"]), [r["oracle"], []])[1].append(r["score"])
    return [(o, sum(s) / len(s)) for o, s in cells.values()]


def _panel(ax, points, title: str, stats: dict | None) -> None:
    if points:
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=14)
    rho = (f"rho {stats['spearman']:.2f} [{stats['ci_low']:.2f}, {stats['ci_high']:.2f}]"
           if stats else "")  # fmt: skip
    ax.set_title(f"{title}\n{rho}", fontsize=8)
    ax.set_xlabel("oracle: agreement on cue-conflict images (%)", fontsize=7)
    ax.set_ylabel("score", fontsize=7)
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 100)
    ax.tick_params(labelsize=7)


def _scatter(rows: list[dict[str, Any]], summary: dict[str, Any]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    off = [r for r in rows if not r["self"]]
    objectives = list(dict.fromkeys(r["objective"] for r in off if r["method"] == "stitch"))
    columns = [("standard", o) for o in objectives], [("iris", o) for o in objectives]
    fig, axes = plt.subplots(len(objectives) + 1, 2, figsize=(7, 2.6 * (len(objectives) + 1)),
                             squeeze=False)  # fmt: skip
    for j, column in enumerate(columns):
        for i, (protocol, objective) in enumerate(column):
            key = f"stitch/{protocol}/{objective}"
            _panel(axes[i][j], _averaged(off, key), f"{objective.upper()}, {protocol}",
                   summary["methods"].get(key, {}).get("layer_average"))  # fmt: skip
    for j, data in enumerate(("test", "iris")):
        key = f"cka/{data}"
        _panel(axes[-1][j], _averaged(off, key), f"linear CKA (x100), on {data}",
               summary["methods"].get(key, {}).get("layer_average"))  # fmt: skip
    fig.tight_layout()
    return fig


def write_oracle_report(out: str | Path, rows: list[dict[str, Any]], summary: dict[str, Any],
                        network_rows: list[dict[str, Any]]) -> Path:  # fmt: skip
    """Write ``figures/oracle.{png,pdf}`` and ``report.html`` under ``out`` from the graded
    rows, the summary (Spearman per method) and the networks' table; returns the page."""
    out = Path(out)
    png = figure_files(_scatter(rows, summary), out / "figures", "oracle")
    figure = FigureEntry(
        "oracle", "Scores against the oracle",
        "Each pair of different networks: its score averaged over the points against the "
        "oracle, the networks' agreement on cue-conflict images (every cue shows its own "
        "random class). Titles: Spearman's rho over the pairs with its 95% bootstrap "
        "interval.", png, ["figures/oracle.png", "figures/oracle.pdf"])  # fmt: skip
    points = list(summary["settings"]["points"])
    ranks = pd.DataFrame([
        {"method": key,
         **{f"rho, {p}": _rho(entry[p]) for p in ["layer_average", *points]},
         "pairs": entry["layer_average"]["pairs"]}
        for key, entry in summary["methods"].items()])  # fmt: skip
    networks = pd.DataFrame(network_rows).rename(columns=lambda c: c.replace("acc_", "on "))
    tables = [
        TableEntry("spearman", "Spearman with the oracle", ranks,
                   "Rank correlation of each method's score with the oracle over the pairs of "
                   "different networks, per point and averaged over the points; [95% bootstrap "
                   "interval over pairs]."),
        TableEntry("networks", "The networks", networks,
                   "Accuracy (%) on aligned test data and on each cue-isolated set (only "
                   "that cue carries the class): the reliance each network was measured to "
                   "have.", numeric=[c for c in networks.columns if c not in
                                     ("network", "trained_on")]),
    ]  # fmt: skip
    meta = [("networks", str(len(network_rows))),
            ("oracle", "agreement on cue-conflict images"),
            ("time", f"{summary['seconds']} s")]  # fmt: skip
    return write_page(out, page("stitchlab oracle testbed", meta, [figure], tables, []))


def _rho(stats: dict[str, Any]) -> str:
    return f"{stats['spearman']:.2f} [{stats['ci_low']:.2f}, {stats['ci_high']:.2f}]"
