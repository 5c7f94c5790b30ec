"""Optimisers the IRI recipe does not offer, tried at one hard ResNet-18 point.

The convergence study (validation/iri_convergence.py) leaves experiment A's clean fronts at
median errors of 0.08-0.11 after layer2.1 with 200 Adam steps. This script tries what else
might get there in the same budget of 200 network evaluations, on 32 stitching images:

* Adam at other initial step sizes (stitchlab's recipe with ``step_size`` changed);
* L-BFGS (torch.optim.LBFGS, strong-Wolfe line search) on sigmoid-parameterised pixels
  and the squared relative error (a smooth least-squares objective);
* Adam on a Fourier parameterisation of the image (spectrum scaled by 1/f^d, orthonormal
  FFT), the preconditioning used in feature visualisation;
* Levenberg-Marquardt: Gauss-Newton steps solved by conjugate gradients (Jacobian-vector
  products by forward-mode AD, the transpose by a VJP), per-sample damping, on the
  pre-activation of the final ReLU with the rows of units off in both source and IRI
  dropped (a ReLU network in eval mode is piecewise linear in its input, so within one
  activation pattern a Gauss-Newton step is exact);
* and whether uint8 quantisation is the floor (the error before and after it).

    python validation/iri_alternatives.py CONFIG --store STORE [--front seed1] [--point layer2.1]

``--variants seed1:layer4.1,shortcut2:layer2.1`` instead runs, at each (front, point),
variants of stitchlab's default loop (Adam 0.1 -> 0.01, surrogate inner ReLUs 0.1,
tolerance 0.01, 200 steps) that the recipe does not offer: other Adam moments, NAdam, a
surrogate slope that anneals over the run, a per-sample step multiplier adapted to
whether the error fell, keeping each sample's best iterate, a cosine schedule, other
first and last step sizes, quieter starts (Gaussian around mid-grey), inner ReLU
gradients gated by where the source's own units are on, momentum dropped where a
step leaves the box, and the residual's gradient weighted towards low-energy channels,
map positions or units (an output-side preconditioner), and a moving average of the
late iterates returned instead of the last one.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from _common import model_and_images, script_commit

from stitchlab.experiments import load_config, with_fingerprints
from stitchlab.iris import IRIRecipe, dequantise, quantise
from stitchlab.iris.descent import (
    _batch_generator,
    _error_and_grad,
    _per_sample_error,
    _run_batch,
    _start,
)
from stitchlab.iris.front import _frozen_front, _is_relu, _replace_relus, _straight_through_output


class _SurrogateReLU(torch.autograd.Function):
    """ReLU forward; backward slope 1 where the output is positive, ``slope`` elsewhere (the
    surrogate inner-ReLU gradient of stitchlab's earlier default, preset "v2", which the
    library no longer has)."""

    @staticmethod
    def forward(ctx, x, slope, inplace):  # noqa: D102
        y = x.clamp_min_(0) if inplace else x.clamp_min(0)
        ctx.save_for_backward(y)
        ctx.slope = slope
        return y

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        (y,) = ctx.saved_tensors
        return torch.ops.aten.leaky_relu_backward(grad, y, ctx.slope, True), None, None


def _straight_through_front(model, point):
    """The exact front with its final ReLU straight through (its inner ReLUs exact)."""
    front = _frozen_front(model, point, (), None, "exact")
    _straight_through_output(front)
    return front


def _median(front, xa, target) -> tuple[float, float]:
    xa = dequantise(quantise(xa.detach(), (0.0, 1.0)), (0.0, 1.0))
    with torch.no_grad():
        e = _per_sample_error(front(xa), target)
    return float(e.median()), float(e.quantile(0.9))


def adam(front, x, step_size: float) -> tuple[float, float, float]:
    """stitchlab's Adam loop in pixels, 200 steps to 0.002, without the exact tail, the
    switch or the cap (the page's rows were measured with the earlier default v1, Adam's
    beta2 0.999, at commit 14a97ef), with another initial step size: (median after uint8,
    median before, p90 after)."""
    recipe = IRIRecipe.from_kwargs(step_size=step_size, final_step_size=0.002, steps=200,
                                   precondition="none", exact_relu_steps=0,
                                   exact_relu_mismatch=None, polyak=None)  # fmt: skip
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


def _bc(s: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return s.view(-1, *[1] * (like.dim() - 1))


def levenberg_marquardt(model, point, x, outer: int = 10, cg: int = 10, lam0: float = 1e-2,
                        seed: int = 0) -> tuple[float, float]:  # fmt: skip
    """``outer`` damped Gauss-Newton steps, each solved by ``cg`` conjugate-gradient
    iterations (one JVP and one VJP each): about 2 x outer x cg network passes."""
    pre = _frozen_front(model, point, (), None, "exact")  # then cut before its final ReLU
    out = next(n for n in pre.graph.nodes if n.op == "output").args[0]
    if not _is_relu(out, pre):
        raise SystemExit(f"{point} does not end in a ReLU")
    out.replace_all_uses_with(out.args[0])
    pre.graph.erase_node(out)
    pre.recompile()

    def exact(v):  # the front's output: its final ReLU on the pre-activation
        return pre(v).clamp_min(0)

    with torch.no_grad():
        t = exact(x)
    tn = t.flatten(1).norm(dim=1)
    xa = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed))
    lam = torch.full((x.shape[0],), lam0)
    with torch.no_grad():
        z = pre(xa)
    err = _per_sample_error(z.clamp_min(0), t)

    def dot(a, b):
        return (a * b).flatten(1).sum(1)

    for _ in range(outer):
        rows = ~((t == 0) & (z <= 0))  # both off: the constraint is met, drop the row
        scale = 1 / _bc(tn, z)
        r = torch.where(rows, z - t, torch.zeros_like(z)) * scale
        _, vjp = torch.func.vjp(pre, xa)

        def normal(v, rows=rows, scale=scale, vjp=vjp, xa=xa, lam=lam):
            _, jv = torch.func.jvp(pre, (xa,), (v,))
            jtj = vjp(torch.where(rows, jv, torch.zeros_like(jv)) * scale * scale)[0]
            return jtj + _bc(lam, v) * v

        b = -vjp(r * scale)[0]
        d, res = torch.zeros_like(xa), b.clone()
        p, rr = res.clone(), dot(res, res)
        for _ in range(cg):
            ap = normal(p)
            a = rr / dot(p, ap).clamp_min(1e-30)
            d, res = d + _bc(a, p) * p, res - _bc(a, p) * ap
            rr_new = dot(res, res)
            p, rr = res + _bc(rr_new / rr.clamp_min(1e-30), p) * p, rr_new
        xn = (xa + d).clamp(0, 1)
        with torch.no_grad():
            zn = pre(xn)
        en = _per_sample_error(zn.clamp_min(0), t)
        ok = en < err  # accept and relax the damping, or reject and damp harder
        xa, z = torch.where(_bc(ok, xa), xn, xa), torch.where(_bc(ok, z), zn, z)
        err, lam = torch.where(ok, en, err), torch.where(ok, lam / 3, lam * 4)
    return _median(exact, xa, t)


_SLOPE = [0.1]  # the inner ReLUs' backward slope, read at every forward (annealed)


# Source-gated inner ReLU gradients: while ``_GATE["mode"]`` is "record" the front's
# inner ReLUs save where the source's units are on; under "union" (or "source") they then
# pass the gradient with slope 1 where the IRI's unit or the source's is on (only the
# source's), ``_SLOPE`` elsewhere; ``_GATE["idx"]`` picks the rows of the samples still
# active. None: the plain surrogate.
_GATE: dict = {"mode": None, "masks": [], "k": 0, "idx": None}


class _GatedReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, source_on):  # noqa: D102
        y = x.clamp_min(0)
        ctx.save_for_backward(y, source_on)
        return y

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        y, source_on = ctx.saved_tensors
        on = source_on if _GATE["mode"] == "source" else (y > 0) | source_on
        return grad * torch.where(on, 1.0, _SLOPE[0]).to(grad.dtype), None


# with ``smooth=(c, floor)``: the inner ReLUs' backward is max(floor, sigmoid(x / tau)),
# tau = c x the source's pre-activation's standard deviation over the map, per sample and
# channel (recorded once, at the target's forward, then indexed by the active rows)
_SMOOTH: dict = {"c": None, "floor": 0.0, "record": False, "taus": [], "k": 0, "hard": False}


class _SmoothReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, inv_tau, floor):  # noqa: D102
        ctx.save_for_backward(x, inv_tau)
        ctx.floor = floor
        return x.clamp_min(0)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        x, inv_tau = ctx.saved_tensors
        if _SMOOTH["hard"]:  # piecewise linear: 0.5 + x / (4 tau), clamped to [0, 1]
            d = (x * (0.25 * inv_tau)).add_(0.5).clamp_(0.0, 1.0)
        else:
            d = torch.sigmoid(x * inv_tau)
        if ctx.floor:
            d.clamp_min_(ctx.floor)
        return grad * d, None, None


def _smooth_relu(x: torch.Tensor) -> torch.Tensor:
    if _SMOOTH["record"]:
        dims = tuple(range(2, x.dim())) or (1,)
        sd = x.float().std(dim=dims, keepdim=True).clamp_min(1e-6)
        _SMOOTH["taus"].append((sd * _SMOOTH["c"]).reciprocal())
        return x.clamp_min(0)
    inv = _SMOOTH["taus"][_SMOOTH["k"]]
    _SMOOTH["k"] += 1
    idx = _GATE["idx"]
    return _SmoothReLU.apply(x, inv if idx is None else inv[idx], _SMOOTH["floor"])


def _annealed_relu(x: torch.Tensor) -> torch.Tensor:
    mode = _GATE["mode"]
    if _SMOOTH["c"] is not None:
        return _smooth_relu(x)
    if mode is None:
        return _SurrogateReLU.apply(x, _SLOPE[0], False)
    if mode == "record":
        _GATE["masks"].append(x > 0)
        return x.clamp_min(0)
    on = _GATE["masks"][_GATE["k"]]
    _GATE["k"] += 1
    return _GatedReLU.apply(x, on if _GATE["idx"] is None else on[_GATE["idx"]])


def annealable_front(model, point):
    """The default's front (straight-through final ReLU) whose inner ReLUs take the
    surrogate slope from ``_SLOPE`` at each forward (or the source-gated gradient of
    ``_GATE``)."""
    front = _straight_through_front(model, point)
    _replace_relus(front, _annealed_relu)
    return front


def _residual_weight(target: torch.Tensor, kind: str, power: float) -> torch.Tensor:
    """Weights of the residual's gradient for ``adam_variant(weight=(kind, power))``."""
    t2 = target.float().pow(2)
    dims = {"channel": (0, 2, 3), "location": (1,), "unit": (0,)}[kind]
    energy = t2.mean(dims, keepdim=True)
    w = (energy + energy.mean()).reciprocal().pow(power)
    return w / w.mean()


def adam_variant(front, x, steps=200, lr0=0.1, lr1=0.01, b1=0.9, b2=0.999, schedule="geom",
                 adapt=None, best=False, slope=(0.1, 0.1), tol=0.01, start="noise",
                 start_scale=0.003, gate=None, nesterov=False, project=False,
                 weight=None, ema=None, restart=None,
                 smooth=None, hard=False) -> tuple[float, float, float]:  # fmt: skip
    """stitchlab's default loop with the knobs above; (median, p90 after uint8, median
    pixel RMS distance to the source). With the defaults it reproduces the recipe.
    ``gate``: "union" or "source" (see ``_GATE``); ``nesterov``: NAdam's look-ahead;
    ``project``: zero the momentum of pixels that a step pushes out of the box;
    ``weight``: (``"channel"``, ``"location"`` or ``"unit"``, power): weight the residual's
    gradient by 1 / (the target's mean square energy per channel, per map position or per
    unit, plus its mean) to that power, normalised to mean 1 (the error stays unweighted);
    ``ema``: return the exponential moving average (this decay) of the iterates of the
    second half of the run instead of the last iterate (Polyak averaging);
    ``restart``: adaptive momentum restart per sample (O'Donoghue and Candes): zero a
    sample's first moment (and restart its bias correction) when its error rose over the
    last step (``"value"``) or when its last step pointed uphill, i.e. the gradient has a
    positive inner product with that step (``"gradient"``); ``smooth``: (c, floor): the
    inner ReLUs' backward is max(floor, sigmoid(x / (c x the channel's pre-activation
    standard deviation over the source's map, per sample))) instead of the surrogate slope
    (see ``_SMOOTH``)."""
    gen = _batch_generator(0, 0)  # the noise of generate_iris's first batch, seed 0
    _GATE.update(mode="record" if gate else None, masks=[], k=0, idx=None)
    _SMOOTH.update(c=smooth[0] if smooth else None, floor=smooth[1] if smooth else 0.0,
                   record=bool(smooth), taus=[], k=0, hard=hard)
    with torch.no_grad():
        target = front(x).float()
    _SMOOTH["record"] = False
    _GATE["mode"] = gate
    tn = target.flatten(1).norm(dim=1).clamp_min(1e-12)
    w = _residual_weight(target, *weight) if weight else None
    xa = _start(x, IRIRecipe(start=start, start_scale=start_scale), gen).clamp(0, 1)
    m, v = torch.zeros_like(xa), torch.zeros_like(xa)
    n = x.shape[0]
    mult, prev = torch.ones(n), torch.full((n,), float("inf"))
    best_err, best_x = torch.full((n,), float("inf")), xa.clone()
    active = torch.ones(n, dtype=torch.bool)
    avg = None  # with ema: the moving average of the iterates
    age = torch.zeros(n)  # steps since each sample's first moment was (re)started
    last_step = torch.zeros_like(xa)
    for t in range(steps):
        frac = t / (steps - 1)
        _SLOPE[0] = slope[0] + (slope[1] - slope[0]) * frac
        if schedule == "geom":
            lr = lr0 * (lr1 / lr0) ** frac
        else:  # cosine
            lr = lr1 + 0.5 * (lr0 - lr1) * (1 + math.cos(math.pi * frac))
        idx = active.nonzero().squeeze(1)
        _GATE.update(k=0, idx=idx)
        _SMOOTH["k"] = 0
        xi = xa[idx].detach().requires_grad_(True)
        f = front(xi)
        err, g = _error_and_grad(f, target[idx], tn[idx])
        if w is not None:
            g = g * (w if w.shape[0] == 1 else w[idx])
        (grad,) = torch.autograd.grad(f, xi, grad_outputs=g)
        with torch.no_grad():
            if best:
                better = err < best_err[idx]
                best_err[idx[better]] = err[better]
                best_x[idx[better]] = xi.detach()[better]
            if adapt is not None:  # x up while the error falls, x down when it rises
                worse = err > prev[idx]
                mult[idx] = torch.where(worse, mult[idx] * adapt[1],
                                        (mult[idx] * adapt[0]).clamp(max=4.0))  # fmt: skip
                prev[idx] = err
            mi, vi = m[idx], v[idx]
            if restart is not None:
                if restart == "value":
                    up = err > prev[idx]
                    prev[idx] = err
                else:
                    up = (grad * last_step[idx]).flatten(1).sum(1) > 0
                mi[up] = 0
                age[idx[up]] = 0
            age[idx] += 1
            mi.mul_(b1).add_(grad, alpha=1 - b1)
            vi.mul_(b2).addcmul_(grad, grad, value=1 - b2)
            denom = (vi / (1 - b2 ** (t + 1))).sqrt_().add_(1e-8)
            step = lr * mult[idx]
            if nesterov:  # NAdam: the next step's momentum plus this gradient's share
                mhat = b1 * mi / (1 - b1 ** (t + 2)) + (1 - b1) * grad / (1 - b1 ** (t + 1))
            else:
                mhat = mi / _bc(1 - b1 ** age[idx], mi)
            new = xi.detach() - _bc(step, mi) * mhat / denom
            if project:  # a pixel pushed past the box keeps no momentum pointing out of it
                mi[((new < 0) & (mi > 0)) | ((new > 1) & (mi < 0))] = 0
            m[idx], v[idx] = mi, vi
            new.clamp_(0, 1)
            if restart == "gradient":
                last_step[idx] = new - xi.detach()
            xa[idx] = new
            if ema is not None and t >= steps // 2:
                avg = xa.clone() if avg is None else avg.mul_(ema).add_(xa, alpha=1 - ema)
            active[idx[err < tol]] = False
            if not active.any():
                break
    _GATE.update(k=0, idx=None)
    _SMOOTH.update(c=None, taus=[])  # the forward below is a plain ReLU's
    if avg is not None:
        xa = avg
    if best:
        with torch.no_grad():
            last = _per_sample_error(front(xa), target)
        xa = torch.where(_bc(last < best_err, xa), xa, best_x)
    q = dequantise(quantise(xa, (0.0, 1.0)), (0.0, 1.0))
    with torch.no_grad():
        e = _per_sample_error(front(q), target)
    rms = (q - x).flatten(1).pow(2).mean(1).sqrt()
    _GATE.update(mode=None, masks=[])
    return float(e.median()), float(e.quantile(0.9)), float(rms.median())


VARIANTS = {
    "default (this loop)": {},
    "keep each sample's best iterate": {"best": True},
    "Adam beta2 0.99": {"b2": 0.99},
    "surrogate slope 0.3 -> 0 over the run": {"slope": (0.3, 0.0)},
    "surrogate slope 0.2 -> 0.05": {"slope": (0.2, 0.05)},
    "beta2 0.99 + slope 0.2 -> 0.05": {"b2": 0.99, "slope": (0.2, 0.05)},
    "per-sample step x1.05 / x0.7": {"adapt": (1.05, 0.7)},
    "cosine 0.1 -> 0.005": {"schedule": "cos", "lr1": 0.005},
    "geometric 0.15 -> 0.005": {"lr0": 0.15, "lr1": 0.005},
    "uniform start, 0.05 -> 0.01": {"lr0": 0.05},
    "quiet start 0.1, 0.05 -> 0.01": {"start": "scaled_noise", "start_scale": 0.1, "lr0": 0.05},
    "quiet start 0.1, 0.03 -> 0.01": {"start": "scaled_noise", "start_scale": 0.1, "lr0": 0.03},
    "quiet start 0.03, 0.1 -> 0.01": {"start": "scaled_noise", "start_scale": 0.03},
    "quiet start 0.2, 0.05 -> 0.01": {"start": "scaled_noise", "start_scale": 0.2, "lr0": 0.05},
    "NAdam (Nesterov momentum)": {"nesterov": True},
    "Adam beta1 0.95": {"b1": 0.95},
    "Adam beta1 0.98": {"b1": 0.98},
    "beta1 0.95, 0.05 -> 0.005": {"b1": 0.95, "lr0": 0.05, "lr1": 0.005},
    "beta1 0.95, beta2 0.99": {"b1": 0.95, "b2": 0.99},
    "average of the second half's iterates, decay 0.9": {"ema": 0.9},
    "average of the second half's iterates, decay 0.97": {"ema": 0.97},
    "residual weighted 1/channel energy": {"weight": ("channel", 1.0)},
    "residual weighted 1/position energy ^0.5": {"weight": ("location", 0.5)},
    "residual weighted 1/position energy": {"weight": ("location", 1.0)},
    "residual weighted 1/unit energy ^0.5": {"weight": ("unit", 0.5)},
    "no momentum out of the box": {"project": True},
    "inner gradient 1 where IRI or source unit on": {"gate": "union"},
    "inner gradient 1 where source unit on": {"gate": "source"},
    "beta2 0.99 + slope 0.2 -> 0.05 + no momentum out of the box": {
        "b2": 0.99, "slope": (0.2, 0.05), "project": True},
    "value restart": {"restart": "value"},
    "value restart, beta1 0.95": {"restart": "value", "b1": 0.95},
    "value restart, beta1 0.98": {"restart": "value", "b1": 0.98},
    "gradient restart": {"restart": "gradient"},
    "gradient restart, beta1 0.95": {"restart": "gradient", "b1": 0.95},
    "gradient restart, beta1 0.98": {"restart": "gradient", "b1": 0.98},
    "beta2 0.99 + slope 0.3 -> 0 + no momentum out of the box": {
        "b2": 0.99, "slope": (0.3, 0.0), "project": True},
    "beta2 0.99 + slope 0.2 -> 0 + no momentum out of the box": {
        "b2": 0.99, "slope": (0.2, 0.0), "project": True},
    "beta2 0.95 + slope 0.2 -> 0.05 + no momentum out of the box": {
        "b2": 0.95, "slope": (0.2, 0.05), "project": True},
    "beta2 0.99 + slope 0.2 -> 0.05 + no momentum out of the box, 0.1 -> 0.02": {
        "b2": 0.99, "slope": (0.2, 0.05), "project": True, "lr1": 0.02},
    "smooth inner ReLU gradient, tau 0.3 sd": {"smooth": (0.3, 0.0)},
    "smooth inner ReLU gradient, tau 1 sd": {"smooth": (1.0, 0.0)},
    "smooth inner ReLU gradient, tau 0.3 sd, floor 0.05": {"smooth": (0.3, 0.05)},
    "smooth inner ReLU gradient, tau 0.2 sd, floor 0.05": {"smooth": (0.2, 0.05)},
    "smooth inner ReLU gradient, tau 0.5 sd, floor 0.05": {"smooth": (0.5, 0.05)},
    "smooth 0.3 sd, floor 0.05 + beta2 0.95 + no momentum out of the box": {
        "smooth": (0.3, 0.05), "b2": 0.95, "project": True},
    "beta2 0.95 + slope 0.1 + no momentum out of the box": {"b2": 0.95, "project": True},
    "beta2 0.95": {"b2": 0.95},
    "smooth 0.3 sd (hard sigmoid), floor 0.05 + beta2 0.95 + no momentum out of the box": {
        "smooth": (0.3, 0.05), "hard": True, "b2": 0.95, "project": True},
    "smooth 0.4 sd, floor 0.05 + beta2 0.95 + no momentum out of the box": {
        "smooth": (0.4, 0.05), "b2": 0.95, "project": True},
    "smooth 0.3 sd, floor 0.05 + beta2 0.9 + no momentum out of the box": {
        "smooth": (0.3, 0.05), "b2": 0.9, "project": True},
    "smooth 0.3 sd + beta2 0.95 + no momentum out of the box": {
        "smooth": (0.3, 0.0), "b2": 0.95, "project": True},
    "smooth 0.4 sd + beta2 0.95 + no momentum out of the box": {
        "smooth": (0.4, 0.0), "b2": 0.95, "project": True},
    "smooth 0.3 sd, floor 0.05 + beta2 0.95 + no momentum out of the box, 0.1 -> 0.02": {
        "smooth": (0.3, 0.05), "b2": 0.95, "project": True, "lr1": 0.02},
}  # fmt: skip


def variants(raw, store: Path, cells: list[tuple[str, str]], n: int,
             names: list[str] | None = None) -> None:  # fmt: skip
    """Print the table of :data:`VARIANTS` (or only ``names``) at each (front, point) on
    ``n`` images."""
    unknown = sorted(set(names or []) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; the names are {list(VARIANTS)}")
    print("| front | point | variant | median / p90 after uint8 | pixel RMS | seconds |")
    print("|---|---|---|---|---|---|")
    loaded = {}
    for name, point in cells:
        if name not in loaded:
            loaded[name] = model_and_images(raw, store, name, n)
        model, x = loaded[name]
        front = annealable_front(model, point)
        for label, kw in VARIANTS.items():
            if names and label not in names:
                continue
            t0 = time.perf_counter()
            med, p90, rms = adam_variant(front, x, **kw)
            print(f"| {name} | {point} | {label} | {med:.4f} / {p90:.4f} | {rms:.3f} | "
                  f"{time.perf_counter() - t0:.1f} |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--store", required=True)
    ap.add_argument("--front", default="seed1")
    ap.add_argument("--point", default="layer2.1")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default="", help="FRONT:POINT,...: the default loop's variants")
    ap.add_argument("--only", default="", help="with --variants: these variants (;-separated)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    raw = with_fingerprints(load_config(args.config).raw)
    if args.variants:
        cells = [tuple(c.split(":")) for c in args.variants.split(",")]
        print(f"commit {script_commit()}; {args.n} images, 200 steps, 1 run per variant")
        variants(raw, Path(args.store), cells, args.n,
                 [v for v in args.only.split(";") if v] or None)  # fmt: skip
        return
    print(f"commit {script_commit()}; {args.front} at {args.point}, {args.n} images, 200 "
          "evaluations (Levenberg-Marquardt: about 2 per CG iteration)")
    model, x = model_and_images(raw, Path(args.store), args.front, args.n, args.config)
    front = _straight_through_front(model, args.point)
    print("| optimiser | median (p90) after uint8 | seconds |\n|---|---|---|")
    for step in (0.05, 0.1, 0.02):
        t0 = time.perf_counter()
        med, before, p90 = adam(front, x, step)
        name = f"Adam {step} -> 0.002"
        print(f"| {name} (before uint8: {before:.4f}) | {med:.4f} ({p90:.4f}) | "
              f"{time.perf_counter() - t0:.1f} |", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    med, p90, _ = adam_variant(annealable_front(model, args.point), x)
    print(f"| the earlier default v2's loop (Adam 0.1 -> 0.01, surrogate 0.1) | {med:.4f} "
          f"({p90:.4f}) | {time.perf_counter() - t0:.1f} |", flush=True)
    t0 = time.perf_counter()
    med, p90 = lbfgs(model, args.point, x)
    print(f"| L-BFGS, sigmoid pixels, squared error | {med:.4f} ({p90:.4f}) | "
          f"{time.perf_counter() - t0:.1f} |", flush=True)  # fmt: skip
    for outer, cg in ((10, 10), (20, 5), (5, 20)):
        t0 = time.perf_counter()
        med, p90 = levenberg_marquardt(model, args.point, x, outer, cg)
        print(f"| Levenberg-Marquardt, {outer} steps x {cg} CG iterations | {med:.4f} "
              f"({p90:.4f}) | {time.perf_counter() - t0:.1f} |", flush=True)  # fmt: skip
    for decay in (1.0, 0.5):
        t0 = time.perf_counter()
        med, p90 = fourier(front, x, decay)
        print(f"| Adam on a 1/f^{decay:g} Fourier parameterisation | {med:.4f} ({p90:.4f}) | "
              f"{time.perf_counter() - t0:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
