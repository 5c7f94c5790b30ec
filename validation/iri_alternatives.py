"""Optimisers the IRI recipe does not offer, tried at one hard ResNet-18 point.

The convergence study (validation/iri_convergence.py) leaves experiment A's clean fronts at
median errors of 0.08-0.11 after layer2.1 with 200 Adam steps. This script tries what else
might get there in the same budget of 200 network evaluations, on 32 stitching images:

* Adam at other initial step sizes (stitchlab's recipe with ``step_size`` changed);
* L-BFGS (torch.optim.LBFGS, strong-Wolfe line search) on sigmoid-parameterised pixels
  and the squared relative error (a smooth least-squares objective);
* Adam on a Fourier parameterisation of the image (spectrum scaled by 1/f^d, orthonormal
  FFT), the preconditioning used in feature visualisation;
* and whether uint8 quantisation is the floor (the error before and after it).

    python validation/iri_alternatives.py CONFIG --store STORE [--front seed1] [--point layer2.1]
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import torch

from stitchlab.experiments import load_config, with_fingerprints
from stitchlab.experiments.datasets import stitch_data
from stitchlab.experiments.jobs import load_model
from stitchlab.iris import (
    IRIRecipe,
    _frozen_front,
    _per_sample_error,
    _run_batch,
    dequantise,
    quantise,
)


def _median(front, xa, target) -> tuple[float, float]:
    xa = dequantise(quantise(xa.detach(), (0.0, 1.0)), (0.0, 1.0))
    with torch.no_grad():
        e = _per_sample_error(front(xa), target)
    return float(e.median()), float(e.quantile(0.9))


def adam(front, x, step_size: float) -> tuple[float, float, float]:
    """stitchlab's earlier default (preset "v1", as the page measured it) with another
    initial step size: (median after uint8, median before, p90 after)."""
    recipe = IRIRecipe.from_kwargs(preset="v1", step_size=step_size)
    _, err_q, err_f, *_ = _run_batch(front, x, recipe, 0, 0)
    return float(err_q.median()), float(err_f.median()), float(err_q.quantile(0.9))


def lbfgs(model, point, x, evals: int = 200, history: int = 20) -> tuple[float, float]:
    front = _frozen_front(model, point, (), None, "exact")
    with torch.no_grad():
        target = front(x)
    tn2 = target.flatten(1).pow(2).sum(1)
    x0 = torch.rand(x.shape, generator=torch.Generator().manual_seed(0)).clamp(1e-3, 1 - 1e-3)
    w = torch.logit(x0).requires_grad_(True)
    opt = torch.optim.LBFGS([w], lr=1, max_iter=evals, max_eval=evals, history_size=history,
                            line_search_fn="strong_wolfe", tolerance_grad=1e-12,
                            tolerance_change=1e-14)  # fmt: skip

    def closure():
        opt.zero_grad()
        f = front(torch.sigmoid(w))
        loss = ((f - target).flatten(1).pow(2).sum(1) / tn2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return _median(front, torch.sigmoid(w), target)


def fourier(front, x, decay: float, lr0: float = 0.05, lr1: float = 0.002,
            steps: int = 200) -> tuple[float, float]:  # fmt: skip
    with torch.no_grad():
        target = front(x)
    tn = target.flatten(1).norm(dim=1)
    h, w_ = x.shape[-2:]
    freq = (torch.fft.rfftfreq(w_)[None, :] ** 2 + torch.fft.fftfreq(h)[:, None] ** 2).sqrt()
    scale = 1.0 / freq.clamp_min(1.0 / max(h, w_)) ** decay
    scale = scale / scale.max()
    x0 = torch.rand(x.shape, generator=torch.Generator().manual_seed(0))
    w = torch.view_as_real(torch.fft.rfft2(x0, norm="ortho") / scale).clone().requires_grad_(True)
    opt = torch.optim.Adam([w], lr=lr0)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, (lr1 / lr0) ** (1 / max(steps - 1, 1)))

    def image():
        spec = torch.view_as_complex(w) * scale
        return torch.fft.irfft2(spec, s=(h, w_), norm="ortho").clamp(0, 1)

    for _ in range(steps):
        err = (front(image()) - target).flatten(1).norm(dim=1) / tn
        opt.zero_grad()
        err.sum().backward()
        opt.step()
        sched.step()
    return _median(front, image(), target)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--store", required=True)
    ap.add_argument("--front", default="seed1")
    ap.add_argument("--point", default="layer2.1")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    raw = with_fingerprints(load_config(args.config).raw)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    print(f"commit {commit}; {args.front} at {args.point}, {args.n} images, 200 evaluations")
    model = load_model(raw, Path(args.store), args.front)
    data = stitch_data(raw, raw["models"][args.front]["marker"])
    x = torch.stack([data[i][0] for i in range(args.n)])
    front = _frozen_front(model, args.point, (), None, "straight_through")
    print("| optimiser | median (p90) after uint8 | seconds |\n|---|---|---|")
    for step in (0.05, 0.1, 0.02):
        t0 = time.perf_counter()
        med, before, p90 = adam(front, x, step)
        name = "stitchlab's default" if step == 0.05 else f"Adam {step} -> 0.002"
        print(f"| {name} (before uint8: {before:.4f}) | {med:.4f} ({p90:.4f}) | "
              f"{time.perf_counter() - t0:.1f} |", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    med, p90 = lbfgs(model, args.point, x)
    print(f"| L-BFGS, sigmoid pixels, squared error | {med:.4f} ({p90:.4f}) | "
          f"{time.perf_counter() - t0:.1f} |", flush=True)  # fmt: skip
    for decay in (1.0, 0.5):
        t0 = time.perf_counter()
        med, p90 = fourier(front, x, decay)
        print(f"| Adam on a 1/f^{decay:g} Fourier parameterisation | {med:.4f} ({p90:.4f}) | "
              f"{time.perf_counter() - t0:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
