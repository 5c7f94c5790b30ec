"""Per-step cost of stitchlab's IRI recipes: the paper's signed steps (the baseline), the
earlier default (preset "v1": Adam, straight-through final ReLU) and today's default
(Adam with the surrogate inner-ReLU gradient).

All run the same prefix, batch and number of steps (no tolerance, so every sample pays
every step) in the same run, interleaved; the surrogate replaces every inner ReLU of the
prefix by an autograd function. Prints the best seconds per step and the ratios.

    python benchmarks/iri_surrogate.py [--width 16] [--batch 128] [--steps 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from stitchlab import models
from stitchlab.iris import generate_iris


def main() -> None:
    """Time the three recipes at three points of a ResNet-18 and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(0)
    model = models.create("resnet18", width=args.width).eval()
    x = torch.rand(args.batch, 3, 32, 32)
    print(f"ResNet-18 width {args.width}, batch {args.batch}, {args.steps} steps, "
          f"{torch.get_num_threads()} threads, best of {args.repeats}")  # fmt: skip
    print("| point | paper (s/step) | v1 (s/step) | default (s/step) | v1 / paper | "
          "default / paper | default / v1 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for point in ("layer1.1", "layer2.1", "layer4.1"):
        best = {}
        generate_iris(model, point, x[:8], steps=1)  # warm-up
        for _ in range(args.repeats):  # interleaved, so that load drifts hit all three
            for preset in ("paper", "v1", "default"):
                t0 = time.perf_counter()
                generate_iris(model, point, x, steps=args.steps, tolerance=None, preset=preset)
                dt = (time.perf_counter() - t0) / args.steps
                best[preset] = min(best.get(preset, dt), dt)
        p, a, b = best["paper"], best["v1"], best["default"]
        print(f"| {point} | {p:.4f} | {a:.4f} | {b:.4f} | {a / p:.2f}x | {b / p:.2f}x | "
              f"{b / a:.2f}x |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
