"""IRI generation speed: stitchlab against the released loop, same batch, same run.

Released loop (baseline): every step runs the full front network and the full back
network on x' and again on x (a hook grabs the activation at the point), then
backpropagates the relative error to x'.

stitchlab: only the front prefix runs, the target f(x) is computed once per batch.

Limit: the prefix's own forward + backward (to the input) for the same batch and steps.

Time to quality: stitchlab's default recipe (270 Adam steps 0.1 -> 0.01 whitened by the
first convolution, bfloat16 where fast with a float32 tail, smooth inner-ReLU gradient,
tolerance), and it in pixels, against the paper's
recipe on a trained small CNN: seconds and median error, same run.

    python benchmarks/iris.py [--width 16] [--batch 128] [--steps 20] [--tables quality]
    python benchmarks/iris.py --tables memory   # channels-last against contiguous
    python benchmarks/iris.py --tables amp      # bfloat16 autocast against float32
    python benchmarks/iris.py --tables fold     # BatchNorm folded into the convs, or not
    python benchmarks/iris.py --tables whiten   # the whitened Adam update, now and before
    python benchmarks/iris.py --tables compile  # the prefix's step under torch.compile
    python benchmarks/iris.py --config CONFIG --store STORE --front seed1 [--repeats 2]
    python benchmarks/iris.py --tables budget [--config CONFIG --store STORE --front F]

The second form times the paper's recipe against the default on a trained front of an
experiment's store (its data must be on disk: e.g. experiment A's CPU-size ResNet-18s).
The third prices the default's phases per step against the paper recipe's step, on the
small CNN or a stored front, with the bfloat16 error floor at each point.
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import torch

import stitchlab as sl
from stitchlab import models
from stitchlab._batchnorm import folded
from stitchlab._batchnorm import mode as fold_mode
from stitchlab._memory_format import memory_format_for
from stitchlab._memory_format import mode as memory_format_mode
from stitchlab.data import shapes
from stitchlab.iris import generate_iris
from stitchlab.iris.descent import _batch_generator


def released_loop(front_model, back_model, point, x, steps, step_size, seed):
    """The released code's IRI loop; returns (seconds, IRIs before quantisation)."""
    front_model = copy.deepcopy(front_model).eval().requires_grad_(False)
    back_model = copy.deepcopy(back_model).eval().requires_grad_(False)
    grabbed = {}
    front_model.get_submodule(point).register_forward_hook(
        lambda m, i, o: grabbed.__setitem__("a", o)
    )
    gen = _batch_generator(seed, 0)
    x_adv = torch.rand(x.shape, generator=gen)
    start = time.perf_counter()
    for _ in range(steps):
        x_adv = x_adv.detach().requires_grad_(True)
        front_model(x_adv)
        f = grabbed["a"]
        back_model(x_adv)
        with torch.no_grad():
            front_model(x)
            target = grabbed["a"]
            back_model(x)
        err = (f - target).flatten(1).norm(dim=1) / target.flatten(1).norm(dim=1)
        err.sum().backward()
        with torch.no_grad():
            x_adv = (x_adv - step_size * x_adv.grad.sign()).clamp(0, 1)
    return time.perf_counter() - start, x_adv.detach()


def _as_made(front: torch.nn.Module, x: torch.Tensor) -> tuple[torch.nn.Module, torch.Tensor]:
    """``front`` as stitchlab runs it for IRIs of ``x``: eval-mode BatchNorm folded into the
    convolutions (stitchlab._batchnorm), and ``x`` in the memory layout it chose for that
    front (channels-last on the CPU, stitchlab._memory_format)."""
    front, _ = folded(front, x)
    return front, x.contiguous(memory_format=memory_format_for(front, x))


def prefix_limit(model, point, x, steps):
    """Seconds of ``steps`` forward+backward passes of the prefix alone, as stitchlab runs
    it: eval-mode BatchNorm folded into the convolutions (stitchlab._batchnorm), in
    channels-last memory layout on the CPU (stitchlab._memory_format)."""
    front = copy.deepcopy(sl.split(model, point)[0]).eval().requires_grad_(False)
    front, xa = _as_made(front, x)
    xa = xa.clone().requires_grad_(True)
    with torch.no_grad():
        grad_out = torch.randn_like(front(x))
    start = time.perf_counter()
    for _ in range(steps):
        out = front(xa)
        (g,) = torch.autograd.grad(out, xa, grad_outputs=grad_out)
    return time.perf_counter() - start


def measure_iris(width: int = 16, batch: int = 128, steps: int = 20, ks=(1, 5, 9)) -> list[dict]:
    """Per point: throughput (images x steps / s) of the released loop, stitchlab, limit."""
    from stitchlab.iris import dequantise, quantise

    torch.manual_seed(0)
    front = models.create("resnet18", width=width).eval()
    torch.manual_seed(1)
    back = models.create("resnet18", width=width).eval()
    x, _ = shapes(batch, seed=0)
    points = sl.stitch_points(front)
    n_img_steps = batch * steps
    rows = []
    for k in ks:
        point = points[k - 1]
        generate_iris(front, point, x[:8], steps=1, preset="paper")  # warm-up
        base_s, base_iris = released_loop(front, back, point, x, steps, 1 / 255, 0)
        t0 = time.perf_counter()  # the released loop's recipe: signed steps of 1/255
        ours = generate_iris(front, point, x, steps=steps, batch_size=batch, preset="paper")
        ours_s = time.perf_counter() - t0
        limit_s = prefix_limit(front, point, x, steps)
        diff = (dequantise(quantise(base_iris)) - ours.iris).abs()
        rows.append({
            "point": f"{k} ({point})", "released loop": round(n_img_steps / base_s),
            "stitchlab": round(n_img_steps / ours_s), "speed-up": f"{base_s / ours_s:.1f}x",
            "prefix limit": round(n_img_steps / limit_s),
            "stitchlab / limit": f"{ours_s / limit_s:.2f}x",
            "max IRI diff (pixels differing)": f"{float(diff.max()) * 255:.0f}/255 "
            f"({float((diff > 0).float().mean()) * 100:.3f}%)",
        })  # fmt: skip
    return rows


def _two_settings(width: int, batch: int, repeats: int, run, settings: tuple[str, str]):
    """Per random-weight front (a ResNet-18 of ``width`` and a small CNN) and stitch point:
    ``run(net, point, x, setting)`` under each of ``settings``, interleaved ``repeats``
    times; yields (front, point, fastest seconds by setting, results by setting)."""
    torch.manual_seed(0)
    nets = {
        f"resnet18 w{width}": models.create("resnet18", width=width).eval(),
        "small_cnn w16": models.create("small_cnn", width=16).eval(),
    }
    x, _ = shapes(batch, seed=0)
    for name, net in nets.items():
        for point in sl.stitch_points(net)[:-1]:
            sec, res = {}, {}
            for _ in range(repeats):
                for setting in settings:
                    t0 = time.perf_counter()
                    res[setting] = run(net, point, x, setting)
                    sec[setting] = min(sec.get(setting, math.inf), time.perf_counter() - t0)
            yield name, point, sec, res


def measure_memory_format(width: int = 16, batch: int = 128, steps: int = 20, repeats: int = 3):
    """Per front: seconds of the default recipe's IRIs (``steps`` steps, no early stop, one
    batch) with the front's activations contiguous (NCHW, the baseline) and channels-last
    (NHWC, stitchlab's choice on the CPU), each layout's fastest of ``repeats`` interleaved
    runs; and how far the two sets of IRIs are apart (the same optimisation up to rounding)."""

    def run(net, point, x, layout):
        with memory_format_mode(layout):
            return generate_iris(net, point, x, steps=steps, tolerance=None)

    rows = []
    for name, point, sec, res in _two_settings(width, batch, repeats, run, ("0", "auto")):
        a, b = res["0"], res["auto"]
        rows.append({
            "front": name, "point": point,
            "contiguous s": f"{sec['0']:.2f}", "channels-last s": f"{sec['auto']:.2f}",
            "speed-up": f"{sec['0'] / sec['auto']:.2f}x",
            "median error (contiguous / channels-last)":
                f"{a.quality().median_error:.4f} / {b.quality().median_error:.4f}",
            "IRI pixels differing": f"{(a.iris != b.iris).float().mean().item():.2%}",
        })  # fmt: skip
    return rows


def _whiten_before(fl, t: torch.Tensor) -> torch.Tensor:
    """``S t`` as stitchlab computed it before 2026-12-06 (late morning): the FFT of ``t``
    in its own layout, the blocks' broadcast product summed over the input channels."""
    coeffs = torch.fft.rfft2(t.float(), norm="ortho")
    mixed = (fl.blocks.unsqueeze(0) * coeffs.unsqueeze(1)).sum(2)
    return torch.fft.irfft2(mixed, s=fl.size, norm="ortho").to(t.dtype)


def _whitened_updates(fl, x0: torch.Tensor, grad: torch.Tensor, steps: int, now: bool):
    """``steps`` whitened Adam updates of ``x0`` with a fixed gradient, as stitchlab's
    ``_descend`` runs them now (``now``: its own ``_adam_moments``) or ran them before
    (written out here; see :func:`measure_whiten`)."""
    from stitchlab.iris.descent import _adam_moments

    x, m = x0.clone(), torch.zeros_like(x0)
    v = fl.zeros_like(x0) if now else torch.zeros_like(x0)
    for t in range(steps):
        if now:
            _, step = _adam_moments(m, v, grad, t, 0.95, fl, torch.channels_last)
        else:
            m.mul_(0.9).add_(grad, alpha=0.1)
            z = _whiten_before(fl, grad)
            v.mul_(0.95).addcmul_(z, z, value=0.05)
            denom = (v / (1 - 0.95 ** (t + 1))).sqrt_().add_(1e-8)
            step = _whiten_before(fl, _whiten_before(fl, m).div_(denom))
        x.sub_(step, alpha=0.01)
        m.masked_fill_((x < 0) | (x > 1), 0.0)
        x.clamp_(0, 1)
    return x


def measure_whiten(batches=(64, 128), steps: int = 50, repeats: int = 5) -> list[dict]:
    """The whitened Adam update of one step (the default's ``precondition="first_layer"``,
    uncapped) on channels-last 3 x 32 x 32 iterates, as stitchlab ran it before (the
    baseline: :func:`_whiten_before`, the second moment in the iterate's layout, the step
    subtracted in the FFT's layout) and now (:class:`stitchlab.iris.coordinates._FirstLayer`: the
    second moment and the FFT's input contiguous, the step in the iterate's layout), in
    milliseconds, each the fastest of ``repeats`` interleaved runs of ``steps`` updates;
    and whether the two leave bit-identical iterates."""
    from stitchlab.iris import IRIRecipe
    from stitchlab.iris.coordinates import _FirstLayer

    cl = torch.channels_last
    torch.manual_seed(0)
    front = torch.fx.symbolic_trace(models.create("small_cnn", width=16).eval())
    rows = []
    for n in batches:
        grad = torch.randn(n, 3, 32, 32).contiguous(memory_format=cl) * 1e-3
        x0 = torch.rand(n, 3, 32, 32).contiguous(memory_format=cl)
        fl = _FirstLayer.of(IRIRecipe(), x0, front)

        best = {False: math.inf, True: math.inf}
        out = {}
        for _ in range(repeats):
            for now in (False, True):
                t0 = time.perf_counter()
                out[now] = _whitened_updates(fl, x0, grad, steps, now)
                best[now] = min(best[now], (time.perf_counter() - t0) / steps)
        rows.append({
            "images": n, "before ms": f"{1e3 * best[False]:.2f}",
            "now ms": f"{1e3 * best[True]:.2f}", "speed-up": f"{best[False] / best[True]:.2f}x",
            "bit-identical": bool(torch.equal(out[False], out[True])),
        })  # fmt: skip
    return rows


def _setting_rows(width, batch, repeats, run, settings, labels) -> list[dict]:
    """Rows of :func:`_two_settings`: each setting's seconds (``labels`` name them), the
    speed-up of the second against the first, and both median errors."""
    (a, b), (la, lb) = settings, labels
    rows = []
    for name, point, sec, res in _two_settings(width, batch, repeats, run, settings):
        rows.append({
            "front": name, "point": point, f"{la} s": f"{sec[a]:.2f}", f"{lb} s": f"{sec[b]:.2f}",
            "speed-up": f"{sec[a] / sec[b]:.2f}x",
            f"median error ({la} / {lb})": f"{res[a].quality().median_error:.4f} / "
            f"{res[b].quality().median_error:.4f}",
        })  # fmt: skip
    return rows


def measure_amp(width: int = 16, batch: int = 128, steps: int = 20, repeats: int = 3):
    """Per front and point: seconds of the default recipe's IRIs (``steps`` steps, no early
    stop, one batch) in float32 (the baseline) and under bfloat16 autocast (the recipe's
    ``amp="bf16"``), each the fastest of ``repeats`` interleaved runs, and both median
    errors: whether cheaper arithmetic could buy the default more steps on this CPU."""

    def run(net, point, x, amp):
        return generate_iris(net, point, x, steps=steps, tolerance=None, amp=amp)

    return _setting_rows(width, batch, repeats, run, ("off", "bf16"), ("float32", "bf16"))


def measure_fold(width: int = 16, batch: int = 128, steps: int = 20, repeats: int = 3):
    """Per front and point: seconds of the default recipe's IRIs (``steps`` steps, no early
    stop, one batch) with the front's eval-mode BatchNorms as they are (the baseline) and
    folded into the convolutions before them (stitchlab's choice, stitchlab._batchnorm),
    each the fastest of ``repeats`` interleaved runs, and both median errors."""

    def run(net, point, x, fold):
        with fold_mode(fold):
            return generate_iris(net, point, x, steps=steps, tolerance=None)

    return _setting_rows(width, batch, repeats, run, ("0", "auto"), ("as is", "folded"))


def _prefix_steps(front, x: torch.Tensor, grad_out: torch.Tensor, steps: int) -> float:
    """Seconds of ``steps`` forward+backward passes (to the input) of ``front`` on ``x``."""
    xa = x.clone().requires_grad_(True)
    start = time.perf_counter()
    for _ in range(steps):
        (g,) = torch.autograd.grad(front(xa), xa, grad_outputs=grad_out)
    return time.perf_counter() - start


def measure_compile(width: int = 16, batch: int = 128, steps: int = 20, repeats: int = 3):
    """Per random-weight front and point: seconds of ``steps`` forward+backward passes of
    the prefix as IRIs are made (BatchNorm folded, channels-last on the CPU; the part
    every recipe's step shares) in eager mode (the baseline) and under ``torch.compile``
    (after its first call, timed apart as the compile time), each the fastest of
    ``repeats`` interleaved runs, and the largest difference of the input gradients."""
    torch.manual_seed(0)
    nets = {
        f"resnet18 w{width}": models.create("resnet18", width=width).eval(),
        "small_cnn w16": models.create("small_cnn", width=16).eval(),
    }
    x, _ = shapes(batch, seed=0)
    rows = []
    for name, net in nets.items():
        for point in sl.stitch_points(net)[:-1]:
            front = copy.deepcopy(sl.split(net, point)[0]).eval().requires_grad_(False)
            front, xa = _as_made(front, x)
            with torch.no_grad():
                grad_out = torch.randn_like(front(xa))
            torch._dynamo.reset()
            compiled = torch.compile(front)
            t0 = time.perf_counter()
            _prefix_steps(compiled, xa, grad_out, 1)
            compile_s = time.perf_counter() - t0
            sec = {"eager": math.inf, "compiled": math.inf}
            for _ in range(repeats):
                for label, f in (("eager", front), ("compiled", compiled)):
                    sec[label] = min(sec[label], _prefix_steps(f, xa, grad_out, steps))
            grads = []
            for f in (front, compiled):
                xg = xa.clone().requires_grad_(True)
                grads.append(torch.autograd.grad(f(xg), xg, grad_outputs=grad_out)[0])
            scale = grads[0].abs().max().clamp_min(1e-30)
            saved = (sec["eager"] - sec["compiled"]) / steps
            rows.append({
                "front": name, "point": point, "eager s": f"{sec['eager']:.2f}",
                "compiled s": f"{sec['compiled']:.2f}",
                "speed-up": f"{sec['eager'] / sec['compiled']:.2f}x",
                "compile s": f"{compile_s:.1f}",
                "steps to repay it": f"{compile_s / saved:.0f}" if saved > 0 else "never",
                "max gradient difference (relative)":
                    f"{float((grads[0] - grads[1]).abs().max() / scale):.1e}",
            })  # fmt: skip
    return rows


#: Recipes of the time-to-quality tables by name (stitchlab's earlier defaults, presets
#: v1-v7, and the options they used were removed: commit 14a97ef is the last that runs them).
RECIPES = {
    "paper": {"preset": "paper"},
    # the cap's fraction (docs/validation/iri_convergence.md)
    "polyak-0.5": {"polyak": 0.5},
    "polyak-1": {"polyak": 1.0},
    "default": {},
    # what the default runs on a machine where bfloat16 is not fast (a CPU without AMX)
    "default-float32": {"amp": "off"},
    # the default with Adam in pixels (no first-layer whitening)
    "default-pixels": {"precondition": "none"},
    "default-200": {"steps": 200},
    "default-170": {"steps": 170},
    "default-270": {"steps": 270},
    "default-360": {"steps": 360},
    # waveforms: the audio preset (STFT coordinates) and it without them
    "audio": {"preset": "audio"},
    "audio-samples": {"preset": "audio", "stft_window": 0},
}


def _quality_rows(model, src, points, presets, repeats: int) -> list[dict]:
    """Seconds and median error of each recipe's IRIs of ``src`` at each point (names of
    :data:`RECIPES`), each recipe's fastest of ``repeats`` interleaved runs; every later
    recipe's time and error against the first's."""
    rows = []
    for point in points:
        generate_iris(model, point, src[:8], **{**RECIPES[presets[0]], "steps": 1})  # warm-up
        res, sec = {}, {}
        for _ in range(repeats):
            for preset in presets:
                t0 = time.perf_counter()
                res[preset] = generate_iris(model, point, src, **RECIPES[preset]).quality()
                sec[preset] = min(sec.get(preset, math.inf), time.perf_counter() - t0)
        row = {"point": point}
        for preset in presets:
            row[f"{preset}: median error"] = f"{res[preset].median_error:.4f}"
            row[f"{preset}: s"] = f"{sec[preset]:.1f}"
        first = presets[0]
        for last in presets[1:]:
            row[f"time {last} / {first}"] = f"{sec[last] / sec[first]:.2f}x"
            row[f"error {last} / {first}"] = (
                f"{res[last].median_error / res[first].median_error:.3f}"
            )
        row["null"] = f"{res[presets[-1]].null_median:.3f}"
        rows.append(row)
    return rows


#: The recipes of the small CNN's time-to-quality table (the first is the baseline).
QUALITY_RECIPES = ("paper", "default-pixels", "default")


def time_to_quality(
    n: int = 128, seed: int = 0, repeats: int = 3, recipes: tuple[str, ...] = QUALITY_RECIPES
) -> list[dict]:
    """stitchlab's default recipe (whitened, and in pixels) against the paper's (200 signed
    steps of 1/255; ``recipes``: the first is the baseline)
    on a trained small CNN (generated shapes, 3 epochs):
    seconds and median relative error per point, and the time ratio. The recipes are
    run interleaved ``repeats`` times and each keeps its fastest run, so a burst of load on
    the machine does not land on one recipe only (the errors are the same every time)."""
    model, x = _small_cnn(seed)
    return _quality_rows(model, x[:n], sl.stitch_points(model), recipes, repeats)


def _small_cnn(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    """The small CNN of the time-to-quality table (width 16, 3 epochs on 2,000 generated
    shapes, eval mode) and its training images."""
    from stitchlab.train import train_classifier

    torch.manual_seed(seed)
    x, y = shapes(2000, seed=seed)
    model = models.create("small_cnn", width=16)
    train_classifier(model, (x, y), epochs=3, seed=seed)
    return model.eval(), x


def time_to_quality_stored(
    config: str, store: str, front: str, points: list[str], n: int = 64, repeats: int = 2,
    recipes: tuple[str, ...] = ("paper", "default"),
) -> list[dict]:
    """The same comparison (the first recipe, the paper's, against the others) on a trained
    front of an experiment's store (e.g. experiment A's ResNet-18s), on its first ``n``
    stitching images with the model's marker (as its IRIs are made). Needs the config's
    data."""
    model, src = stored_front(config, store, front, n)
    return _quality_rows(model, src, points, recipes, repeats)


def stored_front(
    config: str, store: str, front: str, n: int
) -> tuple[torch.nn.Module, torch.Tensor]:
    """A trained model of an experiment's store (eval mode) and its first ``n`` stitching
    images with the model's marker, as its IRIs are made. Needs the config's data."""
    from pathlib import Path

    from stitchlab.experiments import load_config, with_fingerprints
    from stitchlab.experiments.datasets import stitch_data
    from stitchlab.experiments.jobs import load_model

    raw = with_fingerprints(load_config(config).raw)
    model = load_model(raw, Path(store), front).eval()
    data = stitch_data(raw, raw["models"][front]["marker"])
    return model, torch.stack([data[i][0] for i in range(n)])


def bf16_floor(model, point, src) -> tuple[float, float]:
    """Median relative error of the sources' own representations at ``point`` as a
    bfloat16 step computes them (the front as IRIs are made) against float32, and of float32
    representations of the sources' pixels rounded to bfloat16 (the input's rounding
    alone): errors that a bfloat16 step measures are inflated by about the first. (Where
    bfloat16 is not fast, the default's steps run float32 and this floor does not apply.)"""
    from stitchlab.iris import IRIRecipe
    from stitchlab.iris.descent import _per_sample_error
    from stitchlab.iris.front import _recipe_front

    front, x = _as_made(_recipe_front(model, point, (), None, IRIRecipe()), src)
    with torch.no_grad():
        target = front(x).float()
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            low = front(x)
        rounded = front(x.bfloat16().float())
    return (float(_per_sample_error(low, target).median()),
            float(_per_sample_error(rounded, target).median()))  # fmt: skip


def _phase(bf16: bool, exact: bool, whiten: bool = True) -> dict:
    """``generate_iris`` options whose every step is one of the default's kinds of step:
    bfloat16 or float32, exact or smooth inner-ReLU gradient, whitened or in pixels; no
    sample stops early, no float32 switch and no switch to the exact gradient on the inner
    ReLUs' states."""
    return {"tolerance": None, "float32_below": None, "float32_steps": 0,
            "amp": "bf16" if bf16 else "off", "exact_relu_steps": 10**6 if exact else 0,
            "exact_relu_mismatch": None,
            "precondition": "auto" if whiten else "none"}  # fmt: skip


def step_budget(model, src, points, repeats: int = 2) -> list[dict]:
    """Where the default recipe's time goes, per point: milliseconds per step of each kind
    of step it takes (bfloat16 or float32, smooth or exact inner-ReLU gradient, whitened;
    and its first kind of step in pixels, for the whitening's cost) and of the paper
    recipe's step (the baseline), each from runs of 20 and 120 steps (the difference over
    100), all interleaved ``repeats`` times and each keeping its fastest run; the set-up
    (targets, preconditioner, measurement: the 20-step run less its 20 steps); so the
    default's time with no sample stopping early, no early float32 switch and no early
    switch to the exact gradient on the inner ReLUs' states, against the paper recipe's 200
    steps; and the bfloat16 error floor (:func:`bf16_floor`)."""
    from stitchlab.iris import IRIRecipe
    from stitchlab.iris.descent import _bf16_steps

    rec = IRIRecipe()
    bf16_until = _bf16_steps(rec, src.device)  # as the default's steps are decided
    exact_from = rec.steps - rec.exact_relu_steps
    counts: dict[str, int] = {}
    kinds: dict[str, tuple[bool, bool]] = {}
    for t in range(rec.steps):
        low, exact = t < bf16_until, t >= exact_from
        name = f"{'exact' if exact else 'smooth'} {'bf16' if low else 'float32'}"
        counts[name] = counts.get(name, 0) + 1
        kinds[name] = (low, exact)
    first = next(iter(counts))  # the kind of the first step, also run in pixels
    variants = {"paper": {"preset": "paper"}}
    variants.update({name: _phase(*kind) for name, kind in kinds.items()})
    variants[f"{first} in pixels"] = _phase(*kinds[first], whiten=False)
    paper_steps = IRIRecipe.paper().steps
    rows = []
    for point in points:
        generate_iris(model, point, src[:8], steps=2)  # warm-up
        sec: dict[tuple[str, int], float] = {}
        for _ in range(repeats):
            for name, kw in variants.items():
                for n in (20, 120):
                    t0 = time.perf_counter()
                    generate_iris(model, point, src, **{**kw, "steps": n})
                    key = (name, n)
                    sec[key] = min(sec.get(key, math.inf), time.perf_counter() - t0)
        ms = {name: (sec[name, 120] - sec[name, 20]) * 10 for name in variants}  # ms/step
        setup = {name: sec[name, 20] - 20 * ms[name] / 1e3 for name in variants}
        default_s = setup[first] + sum(ms[k] * c for k, c in counts.items()) / 1e3
        paper_s = setup["paper"] + ms["paper"] * paper_steps / 1e3
        floor, rounding = bf16_floor(model, point, src)
        row = {"point": point, "paper ms/step": f"{ms['paper']:.2f}"}
        row.update({f"{k} ms/step (x{c})": f"{ms[k]:.2f}" for k, c in counts.items()})
        row["whitening ms/step"] = f"{ms[first] - ms[f'{first} in pixels']:.2f}"
        row["set-up s (default / paper)"] = f"{setup[first]:.2f} / {setup['paper']:.2f}"
        row["default s, no early stop"] = f"{default_s:.2f}"
        row[f"paper s ({paper_steps} steps)"] = f"{paper_s:.2f}"
        row["ratio"] = f"{default_s / paper_s:.2f}x"
        row["bf16 floor (input rounding alone)"] = f"{floor:.4f} ({rounding:.4f})"
        rows.append(row)
    return rows


def main() -> None:
    from stitchlab.report import markdown_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3,
                    help="interleaved runs of each timed setting (each keeps its fastest)")
    ap.add_argument(
        "--tables",
        choices=("both", "released", "quality", "memory", "amp", "fold", "budget",
                 "whiten", "compile"),
        default="both",
        help="released-loop table, time-to-quality table, both, the memory-format table, "
        "bfloat16 autocast against float32, BatchNorm folded against as it is, or "
        "the default's time per "
        "step and phase against the paper recipe's (budget; with --config on a stored front), "
        "or the whitened Adam update now against before 2026-12-06 (whiten), or the "
        "prefix's forward+backward under torch.compile against eager mode (compile)",
    )  # fmt: skip
    ap.add_argument("--config", help="time to quality (or --tables budget) on a stored front "
                    "of this experiment")
    ap.add_argument("--store", help="with --config: its store")
    ap.add_argument("--front", default="back", help="with --config: the front model")
    ap.add_argument("--points", default="layer2.1,layer3.1,layer4.1", help="with --config")
    ap.add_argument("--n", type=int, default=64, help="with --config: IRIs per point")
    ap.add_argument("--recipes", default=None,
                    help="with --config (default paper,default) or --tables quality (default "
                    f"{','.join(QUALITY_RECIPES)}): recipes, the first the baseline "
                    f"({', '.join(RECIPES)})")  # fmt: skip
    args = ap.parse_args()
    if args.recipes is not None:
        unknown = sorted(set(args.recipes.split(",")) - set(RECIPES))
        if unknown:
            raise SystemExit(f"unknown recipe(s) {unknown}; the names are {list(RECIPES)}")
    torch.set_num_threads(args.threads)
    if args.tables == "budget":
        if args.config:
            model, src = stored_front(args.config, args.store, args.front, args.n)
            where, points = f"{args.front} of {args.config}, {args.n}", args.points.split(",")
        else:
            model, x = _small_cnn()
            src, where, points = x[:128], "small CNN, 128", sl.stitch_points(model)
        print(f"The default's time per step and phase against the paper recipe's: {where} "
              f"images, {args.threads} threads, fastest of {args.repeats} runs")  # fmt: skip
        print(markdown_table(step_budget(model, src, points, args.repeats)))
        return
    if args.config:
        recipes = tuple((args.recipes or "paper,default").split(","))
        print(f"Time to quality: {', '.join(recipes[1:])} against {recipes[0]}, {args.front} "
              f"of {args.config}, {args.n} IRIs, {args.threads} threads, fastest of "
              f"{args.repeats} interleaved runs")  # fmt: skip
        rows = time_to_quality_stored(args.config, args.store, args.front,
                                      args.points.split(","), args.n, args.repeats,
                                      recipes)  # fmt: skip
        print(markdown_table(rows))
        return
    if args.tables == "whiten":
        print(f"The whitened Adam update of one step, 3 x 32 x 32 channels-last iterates, "
              f"{args.threads} threads, fastest of {args.repeats} interleaved runs of 50 "
              f"updates; before 2026-12-06 (late morning) is the baseline")  # fmt: skip
        print(markdown_table(measure_whiten(repeats=args.repeats)))
        return
    if args.tables == "compile":
        print(f"The prefix's forward+backward as IRIs are made, {args.steps} steps, batch "
              f"{args.batch}, {args.threads} threads, fastest of {args.repeats} interleaved "
              f"runs; eager mode is the baseline")  # fmt: skip
        print(markdown_table(measure_compile(args.width, args.batch, args.steps,
                                             args.repeats)))  # fmt: skip
        return
    settings = {  # table: (what it compares, its baseline, its measurement)
        "memory": ("Memory format", "contiguous", measure_memory_format),
        "amp": ("Arithmetic", "float32", measure_amp),
        "fold": ("BatchNorm", "BatchNorm as it is", measure_fold),
    }
    if args.tables in settings:
        what, baseline, measure = settings[args.tables]
        print(
            f"{what}: the default recipe's IRIs, {args.steps} steps without early stop, "
            f"batch {args.batch}, {args.threads} threads, fastest of {args.repeats} "
            f"interleaved runs; {baseline} is the baseline"
        )
        print(markdown_table(measure(args.width, args.batch, args.steps, args.repeats)))
        return
    if args.tables in ("both", "released"):
        print(
            f"ResNet-18 width {args.width}, batch {args.batch}, {args.steps} signed steps of "
            f"1/255, {args.threads} threads; throughput in images x steps / s"
        )
        print(markdown_table(measure_iris(args.width, args.batch, args.steps)))
    if args.tables in ("both", "quality"):
        recipes = tuple(args.recipes.split(",")) if args.recipes else QUALITY_RECIPES
        print(
            f"\nTime to quality: {', '.join(recipes[1:])} against {recipes[0]}, small CNN, "
            f"128 IRIs, fastest of {args.repeats} interleaved runs"
        )
        print(markdown_table(time_to_quality(repeats=args.repeats, recipes=recipes)))


if __name__ == "__main__":
    main()
