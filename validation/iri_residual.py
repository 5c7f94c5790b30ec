"""Where the IRIs' remaining error sits at a post-ReLU point: in units dead in the IRI,
in units on only in the IRI, or in units on in both.

For each model and point of an experiment config (from its store), generates IRIs with
stitchlab's default recipe (or ``--preset paper`` / ``v1``) for the first ``--n``
stitching images, then splits the squared residual ``||f(x') - f(x)||^2`` at the point by
the units' states:

* **dead**: on (> 0) in the source, 0 in the IRI: the IRI must switch the unit on, which
  the exact ReLU gradient cannot ask for (the straight-through final ReLU can);
* **spurious**: 0 in the source, on in the IRI;
* **both on**: on in both; a ReLU network in eval mode is linear in its input within one
  activation pattern, so this part is what a step that keeps the pattern could remove:
  if it holds most of the residual, the conditioning of the front, not dead units,
  limits convergence.

It prints, per (model, point), the median relative error after uint8 quantisation, the
three shares of the summed squared residual, and the share of the source's on-units dead
in the IRI.

    python validation/iri_residual.py CONFIG --store STORE --models back,seed1 [--n 32]
"""

from __future__ import annotations

import time

import torch
from _common import model_and_images, model_study_args, script_commit

from stitchlab import generate_iris
from stitchlab.experiments import load_config, with_fingerprints
from stitchlab.splitting import TracedModel


def residual_split(source: torch.Tensor, iri: torch.Tensor) -> dict[str, float]:
    """Shares of the summed squared residual ``(iri - source)^2`` in the dead, spurious
    and both-on units (they sum to 1; units off in both hold none), and the fraction of
    the source's on-units that are dead in the IRI. Both are post-ReLU activations."""
    if source.shape != iri.shape:
        raise ValueError(f"shapes differ: {tuple(source.shape)} vs {tuple(iri.shape)}")
    if bool((source < 0).any() or (iri < 0).any()):
        raise ValueError("residual_split needs post-ReLU (non-negative) activations")
    src_on, iri_on = source > 0, iri > 0
    sq = (iri.double() - source.double()).pow(2)
    total = float(sq.sum())
    parts = {
        "dead": float(sq[src_on & ~iri_on].sum()),
        "spurious": float(sq[~src_on & iri_on].sum()),
        "both_on": float(sq[src_on & iri_on].sum()),
    }
    out = {k: (v / total if total > 0 else 0.0) for k, v in parts.items()}
    out["dead_units"] = float((src_on & ~iri_on).sum() / src_on.sum().clamp_min(1))
    return out


def main() -> None:
    args = model_study_args(__doc__, lambda ap: ap.add_argument(
        "--points", default="", help="comma-separated points (default: the config's)"))  # fmt: skip
    exp = load_config(args.config)
    raw = with_fingerprints(exp.raw)
    points = [p for p in args.points.split(",") if p] or next(iter(exp.points.values()))
    print(f"commit {script_commit()}; {args.config}; preset {args.preset}; {args.n} images")
    print("| model | point | median error | residual in dead / spurious / both-on units "
          "| source's on-units dead in IRI | seconds |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name in [m for m in args.models.split(",") if m]:
        model, x = model_and_images(raw, args.store, name, args.n, args.config)
        for point in points:
            t0 = time.perf_counter()
            res = generate_iris(model, point, x, preset=args.preset)
            front, _ = TracedModel(model).split(point)
            front.eval()
            with torch.no_grad():
                a, b = front(x), front(res.iris)
            try:
                s = residual_split(a, b)
            except ValueError as e:
                print(f"| {name} | {point} | - | {e} | - | - |")
                continue
            print(f"| {name} | {point} | {float(res.rel_error.median()):.3f} | "
                  f"{s['dead']:.2f} / {s['spurious']:.2f} / {s['both_on']:.2f} | "
                  f"{s['dead_units']:.1%} | {time.perf_counter() - t0:.1f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
