"""The smooth gradient through saturating nonlinearities: ramps against softplus smoothing.

``relu_grad="smooth"`` gives ReLU6 / Hardtanh / Hardsigmoid / Hardswish modules a slope
whose kinks are linear ramps (products and clamps, :mod:`stitchlab.iris.smooth`). The
baseline, measured in the same run, is the slope of the softplus-smoothed nonlinearity
(sigmoids and softplus, stitchlab's smoothing before), kept below as ``_softplus_slope``; the
exact gradient (no smoothing) is the floor.

Two tables: one op (forward + backward of one activation, channels-last, the size of a
MobileNet block's expanded map), and one IRI step on the IRI zoo's MobileNet-style front
(untrained weights; ReLU6 and Hardswish blocks, benchmarks/iri_zoo.py) at ``blocks.1``.

    python benchmarks/smooth_saturating.py [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

from iri_zoo import mobilenet
from stitchlab.iris import generate_iris
from stitchlab.iris import smooth as smooth_module


def _softplus_slope(xd, inv_width, kind, lo, hi, floor):
    """The baseline: the slope of the softplus-smoothed nonlinearity, ``sigmoid((x - lo) /
    w) - sigmoid((x - hi) / w)`` for a clamp (Hardswish: ``x h'(x) + h(x)`` with ``h`` the
    softplus-smoothed Hardsigmoid), at least ``floor``; it replaces
    ``stitchlab.iris.smooth._saturating_slope`` where the baseline is timed."""
    inv = inv_width.to(xd.dtype)
    a = torch.mul(xd, inv).sub_(lo * inv)
    b = a - (hi - lo) * inv
    if kind == "hardswish":
        h = F.softplus(a).sub_(F.softplus(b)).div_(inv)
        d = a.sigmoid_().sub_(b.sigmoid_()).mul_(xd).add_(h).div_(hi - lo)
        return d.add_((xd <= lo).to(d.dtype), alpha=floor)
    d = a.sigmoid_().sub_(b.sigmoid_()).clamp_min_(floor)
    return d.div_(hi - lo) if kind == "hardsigmoid" else d


def _softplus():
    """Context in which the smooth saturating slope is the softplus baseline."""
    return mock.patch.object(smooth_module, "_saturating_slope", _softplus_slope)


KINDS = {"ReLU6": ("clamp", 0.0, 6.0, nn.ReLU6()),
         "Hardsigmoid": ("hardsigmoid", -3.0, 3.0, nn.Hardsigmoid()),
         "Hardswish": ("hardswish", -3.0, 3.0, nn.Hardswish())}  # fmt: skip


def _best(fns: list, repeats: int) -> list[float]:
    """The least time of each of ``fns`` over ``repeats`` rounds that run them in turn
    (interleaved, so that a load beside the benchmark falls on all of them alike)."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [min(ts) for ts in times]


def op_table(repeats: int, shape=(32, 96, 16, 16)) -> list[str]:
    """Forward + backward of one activation: exact, ramps (now), softplus (before)."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=gen) * 2).contiguous(memory_format=torch.channels_last)
    inv = 1 / (0.3 * x.std(dim=(2, 3), keepdim=True))
    g = torch.randn(shape, generator=gen).contiguous(memory_format=torch.channels_last)
    rows = ["| op | exact ms | ramps ms (now) | softplus ms (before) | before / now |",
            "|---|---|---|---|---|"]  # fmt: skip
    for name, (kind, lo, hi, module) in KINDS.items():
        def run(smooth=False, baseline=False, kind=kind, lo=lo, hi=hi, module=module):
            xr = x.clone().requires_grad_(True)
            with _softplus() if baseline else contextlib.nullcontext():
                y = module(xr) if not smooth else smooth_module._SmoothSaturatingFn.apply(
                    xr, inv, kind, lo, hi, 0.05, module)  # fmt: skip
            torch.autograd.grad(y, xr, g)

        exact, now, before = _best(
            [run, lambda run=run: run(True), lambda run=run: run(True, True)], repeats)
        rows.append(f"| {name} | {1e3 * exact:.2f} | {1e3 * now:.2f} | {1e3 * before:.2f} "
                    f"| {before / now:.2f} |")  # fmt: skip
    return rows


def step_table(repeats: int, n: int = 32, steps: int = 20) -> list[str]:
    """ms per smooth IRI step of the MobileNet-style front at blocks.1 (no early stop, no
    switch to the exact gradient), with the ramps and with the softplus baseline, against
    the exact gradient's step."""
    torch.manual_seed(0)
    model = mobilenet().eval()
    x = torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    smooth = dict(steps=steps, tolerance=None, exact_relu_steps=0, exact_relu_mismatch=None)
    exact = dict(steps=steps, tolerance=None, relu_grad="exact")

    def run(kw, baseline=False):
        def go():
            if not baseline:
                return generate_iris(model, "blocks.1", x, **kw)
            with _softplus():
                return generate_iris(model, "blocks.1", x, **kw)
        return go

    t_exact, t_now, t_before = (
        t / steps for t in _best([run(exact), run(smooth), run(smooth, True)], repeats)
    )
    return ["| front | exact ms/step | ramps ms/step (now) | softplus ms/step (before) "
            "| before / now | now / exact |", "|---|---|---|---|---|---|",
            f"| MobileNet-style blocks.1, {n} images | {1e3 * t_exact:.1f} "
            f"| {1e3 * t_now:.1f} | {1e3 * t_before:.1f} | {t_before / t_now:.2f} "
            f"| {t_now / t_exact:.2f} |"]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), best of {args.repeats}\n")
    print("\n".join(op_table(args.repeats)))
    print()
    print("\n".join(step_table(max(args.repeats // 3, 2))))


if __name__ == "__main__":
    main()
