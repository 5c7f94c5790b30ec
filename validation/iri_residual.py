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
in the IRI. For a model whose stitching images carry a marker (a shortcut front), it also
splits by place: the median share of each image's squared residual, and of its source's
squared representation, in the window of map positions over the marker (its pixels
mapped to the point's resolution, 2 positions of margin), against the window's area.

    python validation/iri_residual.py CONFIG --store STORE --models back,seed1 [--n 32]
"""

from __future__ import annotations

import time

import torch
from _common import model_and_images, model_study_args, script_commit

from stitchlab import generate_iris
from stitchlab.experiments import load_config, with_fingerprints
from stitchlab.experiments.datasets import stitch_data
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


def window_shares(source: torch.Tensor, iri: torch.Tensor, window: torch.Tensor
                  ) -> dict[str, torch.Tensor]:  # fmt: skip
    """Per sample, the shares of the squared residual ``(iri - source)^2`` and of the
    squared ``source`` (summed over channels) that lie inside ``window`` (a boolean
    ``(N, H, W)`` mask of map positions), and the window's share of the positions.
    ``source`` and ``iri`` are ``(N, C, H, W)`` activations."""
    if source.dim() != 4 or source.shape != iri.shape or window.shape != (
            source.shape[0], *source.shape[2:]):  # fmt: skip
        raise ValueError(f"need (N, C, H, W) maps and an (N, H, W) window; got "
                         f"{tuple(source.shape)}, {tuple(iri.shape)}, {tuple(window.shape)}")
    res = (iri.double() - source.double()).pow(2).sum(1)
    energy = source.double().pow(2).sum(1)
    w = window.double()
    return {
        "residual": (res * w).sum((1, 2)) / res.sum((1, 2)).clamp_min(1e-300),
        "energy": (energy * w).sum((1, 2)) / energy.sum((1, 2)).clamp_min(1e-300),
        "area": w.mean((1, 2)),
    }


def marker_windows(data, n: int, map_hw: tuple[int, int], margin: int = 2) -> torch.Tensor | None:
    """``(n, H, W)`` masks of the map positions over the marker of each of the first
    ``n`` items of a marked dataset (``stitchlab.data.markers.Marked``: its ``marker``
    method), ``margin`` positions wider on each side; None for data without markers."""
    from stitchlab.data.markers import marker_size

    if not hasattr(data, "marker"):
        return None
    masks = torch.zeros(n, *map_hw, dtype=torch.bool)
    for i in range(n):
        x, y = data[i]
        h, w = x.shape[-2:]
        _, top, left = data.marker(i, int(y), h, w)
        size = data.size or marker_size(min(h, w))
        sh, sw = h / map_hw[0], w / map_hw[1]
        r0, r1 = int(top // sh) - margin, int((top + size - 1) // sh) + margin + 1
        c0, c1 = int(left // sw) - margin, int((left + size - 1) // sw) + margin + 1
        masks[i, max(0, r0):r1, max(0, c0):c1] = True
    return masks


def main() -> None:
    args = model_study_args(__doc__, lambda ap: ap.add_argument(
        "--points", default="", help="comma-separated points (default: the config's)"))  # fmt: skip
    exp = load_config(args.config)
    raw = with_fingerprints(exp.raw)
    points = [p for p in args.points.split(",") if p] or next(iter(exp.points.values()))
    print(f"commit {script_commit()}; {args.config}; preset {args.preset}; {args.n} images")
    print("| model | point | median error | residual in dead / spurious / both-on units "
          "| source's on-units dead in IRI | marker window: residual / source energy / "
          "area | seconds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name in [m for m in args.models.split(",") if m]:
        model, x = model_and_images(raw, args.store, name, args.n, args.config)
        data = stitch_data(raw, raw["models"][name]["marker"])
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
            where = "-"
            windows = marker_windows(data, a.shape[0], a.shape[-2:]) if a.dim() == 4 else None
            if windows is not None:
                w = {k: float(v.median()) for k, v in window_shares(a, b, windows).items()}
                where = f"{w['residual']:.2f} / {w['energy']:.2f} / {w['area']:.2f}"
            print(f"| {name} | {point} | {float(res.rel_error.median()):.3f} | "
                  f"{s['dead']:.2f} / {s['spurious']:.2f} / {s['both_on']:.2f} | "
                  f"{s['dead_units']:.1%} | {where} | {time.perf_counter() - t0:.1f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
