"""Per-step cost of the surrogate inner-ReLU gradient against stitchlab's default recipe.

Both recipes run the same prefix, batch and number of steps (no tolerance, so every
sample pays every step) in the same run; the surrogate replaces every inner ReLU of the
prefix by a Python autograd function. Prints seconds per step and the ratio.

    python benchmarks/iri_surrogate.py [--width 16] [--batch 128] [--steps 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from stitchlab import models
from stitchlab.iris import generate_iris


def main() -> None:
    """Time both recipes at three points of a ResNet-18 and print the table."""
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
    print("| point | default (s/step) | surrogate (s/step) | surrogate / default |")
    print("|---|---|---|---|")
    for point in ("layer1.1", "layer2.1", "layer4.1"):
        best = {}
        for _ in range(args.repeats):  # interleaved, so that load drifts hit both
            for grad in ("straight_through", "surrogate"):
                t0 = time.perf_counter()
                generate_iris(model, point, x, steps=args.steps, tolerance=None, relu_grad=grad)
                dt = (time.perf_counter() - t0) / args.steps
                best[grad] = min(best.get(grad, dt), dt)
        a, b = best["straight_through"], best["surrogate"]
        print(f"| {point} | {a:.4f} | {b:.4f} | {b / a:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
