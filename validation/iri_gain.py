"""How steep a front is at a point: the relative change of its representation under small
uniform pixel noise, beside the IRI error there.

An IRI is an image whose representation matches a source's to a relative error; a front
whose representation moves more per unit of pixel change needs its IRIs' pixels placed
more precisely for the same error. This prints, per model and point, the median relative
change ``||f(x + d) - f(x)|| / ||f(x)||`` for ``d`` uniform in [-eps, eps] (eps 1/255 and
4/255, clamped to the box) and the fraction of active (> 0) units, on the first ``--n``
stitching images (with the model's marker, as its IRIs are made).

    python validation/iri_gain.py CONFIG --store STORE --models shortcut1,back \
        --points layer1.1,layer2.1 [--n 64]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from _common import model_and_images, script_commit

from stitchlab import split
from stitchlab.experiments import load_config, with_fingerprints


def relative_change(front: torch.nn.Module, x: torch.Tensor, eps: float, seed: int = 0) -> float:
    """Median relative change of ``front``'s output under uniform noise of size ``eps``."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(x.shape, generator=g) * 2 - 1) * eps
    with torch.no_grad():
        t, f = front(x), front((x + d).clamp(0, 1))
    return float(((f - t).flatten(1).norm(dim=1) / t.flatten(1).norm(dim=1)).median())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--store", required=True, type=Path)
    ap.add_argument("--models", required=True, help="comma-separated model names of the config")
    ap.add_argument("--points", required=True, help="comma-separated stitch points")
    ap.add_argument("--n", type=int, default=64, help="stitching images (default 64)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    raw = with_fingerprints(load_config(args.config).raw)
    print(f"commit {script_commit()}; {args.n} images")
    print("| model | point | change under 1/255 noise | under 4/255 | active units |")
    print("|---|---|---|---|---|")
    for name in args.models.split(","):
        model, x = model_and_images(raw, args.store, name, args.n, args.config)
        model.eval()
        for point in args.points.split(","):
            front, _ = split(model, point)
            with torch.no_grad():
                alive = float((front(x) > 0).float().mean())
            small, large = (relative_change(front, x, e) for e in (1 / 255, 4 / 255))
            print(f"| {name} | {point} | {small:.4f} | {large:.4f} | {alive:.2f} |", flush=True)


if __name__ == "__main__":
    main()
