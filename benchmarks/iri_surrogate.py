"""Per-step cost of stitchlab's IRI recipes: the paper's signed steps (the baseline), the
previous default (preset "v2": Adam with the leaky surrogate inner-ReLU gradient) and
today's default (Adam with the smooth inner-ReLU gradient), and the smooth gradient's
implementations.

All run the same prefix, batch and number of steps (no tolerance, so every sample pays
every step) in the same run, interleaved; both surrogates replace every inner ReLU of the
prefix by an autograd function. On a GPU the steps run under bfloat16 autocast (the
recipes' ``amp="auto"``). Prints the best seconds per step and the ratios.

The smooth gradient's implementations (``--smooth-variants``), all the same number
``max(floor, sigmoid(x / w))``: stitchlab's (the scaled, clamped pre-activation kept in
the activation's dtype; one fused ``softplus_backward``), "f32" (the implementation before
2026-12-04's GPU check: the derivative computed in the forward and kept in float32, since
the float32 widths promoted it) and "derivative" (the derivative kept in the activation's
dtype, a plain product in the backward).

    python benchmarks/iri_surrogate.py [--width 16] [--batch 128] [--steps 20] [--device cuda]
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import Tensor

import stitchlab.iris as iris_module
from stitchlab import models
from stitchlab.iris import _relu_forward, generate_iris


class _SmoothF32(torch.autograd.Function):
    """The baseline: the derivative kept in the widths' float32."""

    @staticmethod
    def forward(ctx, x: Tensor, inv_width: Tensor, floor: float, inplace: bool) -> Tensor:  # noqa: D102
        d = (x.detach() * inv_width).sigmoid_().clamp_min_(floor)
        ctx.save_for_backward(d)
        return _relu_forward(ctx, x, inplace)

    @staticmethod
    def backward(ctx, grad: Tensor):  # noqa: D102
        (d,) = ctx.saved_tensors
        return grad * d.to(grad.dtype), None, None, None


class _SmoothDerivative(_SmoothF32):
    """The derivative kept in the activation's dtype."""

    @staticmethod
    def forward(ctx, x: Tensor, inv_width: Tensor, floor: float, inplace: bool) -> Tensor:  # noqa: D102
        d = x.detach() * inv_width.to(x.dtype)
        if floor > 0:
            d.clamp_min_(math.log(floor / (1.0 - floor)))
        ctx.save_for_backward(d.sigmoid_())
        return _relu_forward(ctx, x, inplace)


SMOOTH = {"f32": _SmoothF32, "derivative": _SmoothDerivative}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    """Time the recipes at three points of a ResNet-18 and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--points", default="layer1.1,layer2.1,layer4.1")
    p.add_argument("--smooth-variants", action="store_true",
                   help="also time the smooth gradient's other implementations")  # fmt: skip
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = models.create("resnet18", width=args.width).eval().to(device)
    x = torch.rand(args.batch, 3, 32, 32, device=device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"ResNet-18 width {args.width}, batch {args.batch}, {args.steps} steps, {where}, "
          f"{torch.get_num_threads()} threads, best of {args.repeats}")  # fmt: skip
    runs = [("paper", "paper", None), ("v2", "v2", None), ("default", "default", None)]
    if args.smooth_variants:
        runs += [(f"default ({name})", "default", fn) for name, fn in SMOOTH.items()]
    names = [r[0] for r in runs]
    print("| point | " + " | ".join(f"{n} (ms/step)" for n in names) + " | "
          + " | ".join(f"{n} / paper" for n in names[1:]) + " | default / v2 |")  # fmt: skip
    print("|---" * (2 * len(names) + 1) + "|")
    library_fn = iris_module._SmoothReLUFn
    for point in args.points.split(","):
        best: dict[str, float] = {}
        generate_iris(model, point, x[:8], steps=1)  # warm-up
        for _ in range(args.repeats):  # interleaved, so that load drifts hit all of them
            for name, preset, fn in runs:
                iris_module._SmoothReLUFn = fn or library_fn
                try:
                    _sync(device)
                    t0 = time.perf_counter()
                    generate_iris(model, point, x, steps=args.steps, tolerance=None,
                                  preset=preset, batch_size=args.batch)  # fmt: skip
                    _sync(device)
                finally:
                    iris_module._SmoothReLUFn = library_fn
                dt = (time.perf_counter() - t0) / args.steps
                best[name] = min(best.get(name, dt), dt)
        base = best["paper"]
        print(f"| {point} | " + " | ".join(f"{1e3 * best[n]:.2f}" for n in names) + " | "
              + " | ".join(f"{best[n] / base:.2f}x" for n in names[1:])
              + f" | {best['default'] / best['v2']:.2f}x |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
