"""How far a 1x1 stitch starts from the back: a linear probe of each pair's activations.

For the pairs of an experiment config whose models are in its store, at a few points, on
the first ``--n`` stitching images (marked as the pair's stitching data is): the
least-squares map, at every spatial position, from the front's activation to the back's
(what a 1x1 stitch can be at best under direct matching; the stitch layer's own design
rows and least-squares solver, so every layout the library knows is handled), and its
centred relative residual ||F W - B|| / ||B - mean(B)||; and the effective rank
(participation ratio of the channel covariance) of the front's activation. A front whose
residual is near 1 holds nothing a linear map can turn into the back's features.

    python validation/linear_probe.py CONFIG --store STORE --pairs null,cross-seed,cross-bias \\
        --points layer1.1,layer2.1 [--out probe.csv]
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import torch

from stitchlab.experiments import load_config, with_fingerprints
from stitchlab.experiments.datasets import stitch_data
from stitchlab.experiments.jobs import load_model
from stitchlab.layers import ActivationSpec, LeastSquares, StitchLayer
from stitchlab.splitting import activation_formats, tap_model


def _nchw_or_vector(a: torch.Tensor) -> ActivationSpec:
    return (
        ActivationSpec("conv", tuple(a.shape[1:]))
        if a.dim() == 4
        else ActivationSpec("vector", tuple(a.shape[1:]))
    )


def probe(
    front_act: torch.Tensor, back_act: torch.Tensor, layer: StitchLayer | None = None
) -> dict[str, float]:
    """Centred least-squares residual (front -> back, with bias) of the stitch layer's main
    map, and the effective rank of its input rows (the front's channels at every position).

    ``layer`` fixes the formats (layouts) of both activations; without it they are taken
    as NCHW maps (4-d) or vectors (2-d).
    """
    if layer is None:
        layer = StitchLayer(_nchw_or_vector(front_act), _nchw_or_vector(back_act))
    x, y = layer.design_rows(front_act, back_act)[0]  # the per-position (main) map
    ls = LeastSquares(x.shape[1], y.shape[1])
    ls.add(x, y)
    *_, residual = ls.solve()
    d, n = x.shape[1], ls.rows
    mean_x, sum_y = ls.xtx[d, :d] / n, ls.xty[d]
    ev = torch.linalg.eigvalsh(ls.xtx[:d, :d] / n - torch.outer(mean_x, mean_x)).clamp_min(0)
    centred = ls.yty - float(sum_y @ sum_y) / n  # ||Y - mean(Y)||^2
    return {
        "channels": d,
        "effective_rank": float(ev.sum() ** 2 / (ev**2).sum()),
        "ls_residual_centred": math.sqrt(residual**2 * ls.yty / centred),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--store", required=True, type=Path)
    ap.add_argument("--pairs", required=True, help="comma-separated pair names of the config")
    ap.add_argument("--points", required=True, help="comma-separated stitch points")
    ap.add_argument("--n", type=int, default=500, help="stitching images (default 500)")
    ap.add_argument("--out", type=Path, help="CSV of the rows")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    raw = with_fingerprints(load_config(args.config).raw)
    points = args.points.split(",")
    rows = []
    for name in args.pairs.split(","):
        if name not in raw["pairs"]:
            raise SystemExit(f"no pair {name!r} in {args.config}; it has {sorted(raw['pairs'])}")
        pair = raw["pairs"][name]
        fronts = pair["front"] if isinstance(pair["front"], list) else [pair["front"]]
        data = stitch_data(raw, pair.get("marker"))
        x = torch.stack([data[i][0] for i in range(min(args.n, len(data)))])
        acts, specs = {}, {}
        for model_name in [pair["back"], *fronts]:
            if model_name not in acts:
                model = load_model(raw, args.store, model_name).eval()
                formats = activation_formats(model, x[:2], points)
                specs[model_name] = {p: formats[p].require() for p in points}
                with torch.no_grad():
                    acts[model_name] = tap_model(model, points)(x)[1]
        for front in fronts:
            for p in points:
                layer = StitchLayer(specs[front][p], specs[pair["back"]][p])
                r = probe(acts[front][p], acts[pair["back"]][p], layer)
                rows.append({"pair": name, "front": front, "back": pair["back"], "point": p,
                             "marker": pair.get("marker") or "", "n": len(x), **r})  # fmt: skip
    print("| pair | front | point | channels | effective rank | LS residual (centred) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['pair']} | {r['front']} | {r['point']} | {r['channels']} | "
            f"{r['effective_rank']:.1f} | {r['ls_residual_centred']:.3f} |"
        )
    if args.out:
        with open(args.out, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
