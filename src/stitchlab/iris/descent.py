"""The descent: IRIs of a batch by projected steps that run only the front prefix.

For a source input x and a stitch point, an IRI is ``x' = argmin ||f(x') - f(x)|| /
||f(x)||`` over the box, found from a start (``recipe.start``) by signed or Adam steps
(:func:`_descend`); :func:`generate_iris` runs it over a batch of inputs and measures the
result after quantisation to the recipe's storage precision.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._allocator import keep_freed_memory
from .._batchnorm import folded
from .._data import DataLike, _module_device, as_dataset, batches, check_images
from .._memory_format import memory_format_for
from .coordinates import _adam_coordinates
from .front import _recipe_front
from .quality import IRIResult, dequantise, quantise
from .recipe import ADAM_BETA2, MISMATCH_EVERY, IRIRecipe, uses_bf16
from .smooth import _NoSmooth, _smooth_relus_of


def _per_sample_error(f: Tensor, t: Tensor) -> Tensor:
    diff = (f.float() - t).flatten(1).norm(dim=1)
    return diff / t.flatten(1).norm(dim=1).clamp_min(1e-12)


def _start(x: Tensor, recipe: IRIRecipe, gen: torch.Generator) -> Tensor:
    lo, hi = recipe.box
    if recipe.start == "noise":
        u = torch.rand(x.shape, generator=gen)
        return (lo + (hi - lo) * u).to(x.device, x.dtype)
    if recipe.start == "scaled_noise":  # quiet Gaussian noise around the box centre
        z = torch.randn(x.shape, generator=gen)
        return ((lo + hi) / 2 + recipe.start_scale * z).clamp(lo, hi).to(x.device, x.dtype)
    # another image of the batch (a derangement)
    if x.shape[0] < 2:
        raise ValueError("start='image' needs batches of at least 2 images")
    shift = int(torch.randint(1, x.shape[0], (1,), generator=gen))
    return x.roll(shift, dims=0).clone()


def _bf16_steps(recipe: IRIRecipe, device: torch.device) -> int:
    """How many of a batch's first steps run under bfloat16 autocast on ``device``: all but
    the last ``recipe.float32_steps`` where :func:`uses_bf16`, none elsewhere (a step ``t``
    runs in bfloat16 when ``t`` is below this)."""
    return max(recipe.steps - recipe.float32_steps, 0) if uses_bf16(recipe, device) else 0


def _precision(device: torch.device, bf16: bool) -> torch.autocast:
    """The autocast context of one step: bfloat16 if ``bf16``, float32 otherwise."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def _error_and_grad(f: Tensor, target: Tensor, target_norm: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample relative errors and their gradient with respect to ``f`` (analytic:
    d/df ||f - t|| / ||t|| = (f - t) / (||f - t|| ||t||)), so that autograd only runs
    through the network."""
    diff = torch.sub(f.detach(), target)  # float32 by type promotion from a bfloat16 f
    # over the non-batch dims in place: flatten(1) would copy a channels-last map
    dist = torch.linalg.vector_norm(diff, dim=tuple(range(1, diff.dim())))
    scale = 1.0 / (dist * target_norm).clamp_min(1e-20)
    # (a product written straight into bfloat16, torch.mul(..., out=), is 1.7x slower on
    # the CPU than this product and a vectorised copy)
    grad = diff.mul_(scale.view(-1, *[1] * (diff.dim() - 1)))
    return dist / target_norm, grad.to(f.dtype)


def _optimise(
    front: nn.Module,
    x: Tensor,
    recipe: IRIRecipe,
    gen: torch.Generator,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> tuple[Tensor, Tensor]:
    """The optimised IRIs of one batch (float, in the box) and the targets f(x);
    ``memory_format`` is how the front takes its inputs (:mod:`stitchlab._memory_format`)."""
    x = x.contiguous(memory_format=memory_format)
    smooth = _smooth_relus_of(front) or _NoSmooth()
    # the sources' inner ReLU states, for the switch to the exact gradient
    with torch.no_grad(), smooth.recording(keep_states=recipe.switches_on_states()):
        target = front(x).float()
    target_norm = torch.linalg.vector_norm(target.flatten(1), dim=1).clamp_min(1e-12)
    try:
        x_adv = _descend(front, x, target, target_norm, recipe, gen, memory_format, smooth)
    finally:
        smooth.off()
    return x_adv, target


def _descend(front, x, target, target_norm, recipe: IRIRecipe, gen, memory_format, smooth):
    """:func:`_optimise`'s IRIs with signed or Adam steps (``x`` in ``memory_format``,
    its targets and their norms given)."""
    lo, hi = recipe.box
    device = x.device
    coords = _adam_coordinates(recipe, x, front) if recipe.optimizer == "adam" else None
    x_adv = _start(x, recipe, gen).clamp(lo, hi).contiguous(memory_format=memory_format)
    active = torch.ones(x.shape[0], dtype=torch.bool, device=device)
    m = v = None
    if recipe.optimizer == "adam":
        m = torch.zeros_like(x_adv)
        v = torch.zeros_like(x_adv) if coords is None else coords.zeros_like(x_adv)
    early = recipe.tolerance is not None
    capped = recipe.caps_steps(front)  # each sample's step at most polyak x its Polyak step
    all_active = True
    # steps before this one run in bfloat16 (where the recipe uses it): all but the float32
    # tail, fewer once the batch's median error is below recipe.float32_below
    bf16_until = _bf16_steps(recipe, device)
    exact_from = recipe.steps - recipe.exact_relu_steps  # smooth relus: exact from this step
    mismatch = recipe.exact_relu_mismatch if recipe.switches_on_states() else None
    for t in range(recipe.steps):
        # gather and scatter only once some samples have stopped
        idx = active.nonzero().squeeze(1) if early and not all_active else None
        xa = x_adv if idx is None else x_adv[idx].contiguous(memory_format=memory_format)
        xa = xa.detach().requires_grad_(True)
        ta = target if idx is None else target[idx]
        tn = target_norm if idx is None else target_norm[idx]
        check = mismatch is not None and t < exact_from and (t + 1) % MISMATCH_EVERY == 0
        smooth.step(idx, exact=t >= exact_from, measure=mismatch if check else None)
        with _precision(device, t < bf16_until):
            f = front(xa)
        if check and smooth.mismatch() <= mismatch:
            exact_from = t + 1  # the inner ReLUs' states are the sources': exact from now on
        err, g = _error_and_grad(f, ta, tn)
        (grad,) = torch.autograd.grad(f, xa, grad_outputs=g)
        below = recipe.float32_below
        if t < bf16_until and below is not None and float(err.median()) < below:
            bf16_until = t + 1  # near bfloat16's floor: the rest in float32
        alpha = recipe.step_at(t)
        done = err < recipe.tolerance if early else None
        stopping = done is not None and bool(done.any())  # one sync for both uses below
        # the iterates that met the tolerance, kept from this step's update (boolean
        # indexing gathers a copy)
        kept = xa.detach()[done] if stopping and recipe.keep_converged else None
        with torch.no_grad():
            new = xa.detach()
            if recipe.optimizer == "sign":
                if capped:
                    _polyak_update(new, grad.sign(), grad, err, recipe.polyak, alpha)
                else:
                    new.add_(grad.sign_(), alpha=-alpha)
            else:  # Adam, in place on the moments (gathered copies once samples stopped)
                mi = m if idx is None else m[idx]
                vi = v if idx is None else v[idx]
                denom, step = _adam_moments(mi, vi, grad, t, ADAM_BETA2, coords,
                                            memory_format)  # fmt: skip
                if capped:  # the step of size 1, then each sample's size
                    step = (mi / denom if step is None else step).mul_(1 / (1 - 0.9 ** (t + 1)))
                    _polyak_update(new, step, grad, err, recipe.polyak, alpha)
                elif step is None:
                    new.addcdiv_(mi, denom, value=-alpha / (1 - 0.9 ** (t + 1)))
                else:
                    new.sub_(step, alpha=alpha / (1 - 0.9 ** (t + 1)))
                # no momentum pushing a pixel out of the box
                mi.masked_fill_((new < lo) | (new > hi), 0.0)
                if idx is not None:
                    m[idx], v[idx] = mi, vi
            new.clamp_(lo, hi)
            if kept is not None:
                new[done] = kept
            if idx is None:
                x_adv = new
            else:
                x_adv[idx] = new
            if stopping:
                active[done if idx is None else idx[done]] = False
                all_active = False
                if not bool(active.any()):
                    break
    return x_adv.detach()


def _adam_moments(
    mi: Tensor, vi: Tensor, grad: Tensor, t: int, b2: float, coords, memory_format
) -> tuple[Tensor, Tensor | None]:
    """Step ``t`` of Adam's moments, in place: the first moment ``mi`` in x (linear, so it
    is the coordinates' moment mapped back; the box is in x), the second ``vi`` in
    ``coords`` (:func:`_adam_coordinates`; None: pixels). Returns the bias-corrected
    denominator and, in coordinates, the step ``synthesis(analysis(mi) / denom)`` in the
    iterate's ``memory_format`` (in pixels None: ``mi / denom`` is formed only where it is
    needed), before the first moment's bias correction."""
    mi.mul_(0.9).add_(grad, alpha=0.1)
    vi.mul_(b2)
    if coords is None:
        vi.addcmul_(grad, grad, value=1 - b2)
    else:
        coords.add_power_(vi, coords.analysis(grad), 1 - b2)
    denom = (vi / (1 - b2 ** (t + 1))).sqrt_().add_(1e-8)
    if coords is None:
        return denom, None
    step = coords.synthesis(coords.scale_(coords.analysis(mi), denom))
    if memory_format == torch.channels_last:
        # in the iterate's layout: mixed layouts take a slow path on the CPU
        step = step.contiguous(memory_format=memory_format)
    return denom, step


def _polyak_update(
    new: Tensor, step: Tensor, grad: Tensor, err: Tensor, fraction: float, alpha: float
) -> None:
    """``new -= eta * step`` in place, each sample's ``eta`` the step size ``alpha`` capped
    at ``fraction`` x its Polyak step ``err / <grad, step>``: the size at which the
    error's linearisation along ``step`` reaches the error's least value, 0 (the source
    itself is an exact IRI). Where ``<grad, step>`` is not positive the step keeps
    ``alpha``. ``step`` (a tensor of its own) is overwritten."""
    dims = tuple(range(1, step.dim()))
    slope = (grad * step).sum(dims)
    size = (fraction * err / slope.clamp_min(1e-30)).clamp_max_(alpha)
    size.masked_fill_(~(slope > 0), alpha)
    new.sub_(step.mul_(size.view(-1, *[1] * len(dims))))



@torch.no_grad()
def _measure(
    front: nn.Module,
    x: Tensor,
    x_adv: Tensor,
    target: Tensor,
    box: tuple[float, float],
    precision: str = "uint8",
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(quantised IRIs as stored, error after quantisation, error before, pixel RMS, null:
    the relative distance of the next image's representation in the batch)."""
    err_float = _per_sample_error(front(x_adv), target)
    q = quantise(x_adv, box, precision)
    deq = dequantise(q, box).to(x_adv.device, x_adv.dtype)
    err_q = _per_sample_error(front(deq), target)
    rms = (deq - x).flatten(1).pow(2).mean(1).sqrt() / (box[1] - box[0])
    if target.shape[0] >= 2:
        null = _per_sample_error(target.roll(-1, dims=0), target)
    else:
        null = torch.full((target.shape[0],), float("nan"), device=target.device)
    return q, err_q, err_float, rms, null


def _batch_generator(seed: int, start_index: int) -> torch.Generator:
    """Noise generator of the batch that starts at ``start_index``: independent of chunking
    history, so that an interrupted run and an uninterrupted one draw the same numbers."""
    return torch.Generator().manual_seed((seed * 1_000_003 + start_index) % (2**63))


def generate_iris(
    model: nn.Module,
    point: str,
    images: Tensor | DataLike,
    steps: int | None = None,
    step_size: float | None = None,
    seed: int = 0,
    *,
    device: str | torch.device | None = None,
    leaf_modules: tuple[type, ...] = (),
    output: int | str | None = None,
    **recipe,
) -> IRIResult:
    """IRIs of ``images`` for ``model`` cut at ``point``.

    Args:
        model: the front model (not modified; a frozen eval-mode copy of its prefix runs).
        point: the stitch point whose representation the IRIs must reproduce.
        images: a tensor ``(N, C, H, W)`` (or of another rank with a batch axis first,
            e.g. waveforms ``(N, C, T)``) in the box, or data as for :func:`stitch`.
        steps: number of optimisation steps (default: the recipe's, 270).
        step_size: (initial) step size in box units (default 0.1 for Adam; the paper's
            signed steps use 1/255 at 32x32: ``preset="paper"``).
        seed: seed of the noise start; the result is deterministic for a seed (on one
            machine and memory format: a convolutional front runs channels-last on the
            CPU, see :mod:`stitchlab._memory_format`, with its eval-mode BatchNorms folded
            into the convolutions, see :mod:`stitchlab._batchnorm`; both change only the
            rounding).
        device: where to run (default: the model's device).
        leaf_modules: module classes not to trace into (see :func:`stitchlab.split`).
        output: which element of ``model``'s output is the logits (tuple/dict outputs).
        **recipe: further :class:`IRIRecipe` fields (optimizer, start, start_scale,
            tolerance, box, precision, final_step_size, batch_size, amp) or ``preset``.

    Returns:
        :class:`IRIResult` with IRIs quantised to the recipe's storage precision (uint8
        levels by default, as stored) and, per IRI, the achieved relative error after
        quantisation and the pixel distance.
    """
    given = {k: v for k, v in (("steps", steps), ("step_size", step_size)) if v is not None}
    rec = IRIRecipe.from_kwargs(**given, **recipe)
    dev = torch.device(device) if device is not None else _module_device(model)
    front = _recipe_front(model, point, leaf_modules, output, rec).to(dev)
    if isinstance(images, Tensor):
        _check_images(images, rec.box)
        sources = [images]
    else:
        dataset, _ = as_dataset(images, "images")
        sources = [x for x, _ in batches(dataset, rec.batch_size, torch.device("cpu"))]
        sources = [torch.cat(sources)]
    out = []
    x_all = sources[0]
    fmt = torch.contiguous_format
    if len(x_all):  # BatchNorm folded, then the memory format: each from a trial on two sources
        trial = x_all[:2].to(dev)
        rec = rec.for_front(front, trial)
        front, _ = folded(front, trial)
        fmt = memory_format_for(front, trial)
    for i in range(0, x_all.shape[0], rec.batch_size):
        x = x_all[i : i + rec.batch_size].to(dev)
        out.append(_run_batch(front, x, rec, seed, i, fmt))
    return IRIResult(
        iris=dequantise(torch.cat([o[0] for o in out]), rec.box),
        rel_error=torch.cat([o[1] for o in out]),
        rel_error_float=torch.cat([o[2] for o in out]),
        pixel_rms=torch.cat([o[3] for o in out]),
        null_error=torch.cat([o[4] for o in out]),
        precision=rec.precision,
    )


def _check_images(images: Tensor, box: tuple[float, float]) -> None:
    if images.dim() < 2 or not images.is_floating_point():
        raise ValueError(
            f"images must be a float tensor with a batch axis first ((N, C, H, W) images, "
            f"(N, C, T) waveforms); got {tuple(images.shape)} {images.dtype}."
        )
    check_images(images, "images")
    lo, hi = box
    if float(images.min()) < lo - 1e-4 or float(images.max()) > hi + 1e-4:
        raise ValueError(
            f"images lie outside the box {box} (min {float(images.min()):.3f}, max "
            f"{float(images.max()):.3f}); pass box=(low, high) for normalised inputs."
        )


def _run_batch(
    front, x, rec: IRIRecipe, seed: int, start: int, memory_format=torch.contiguous_format
):
    if x.device.type == "cpu":
        keep_freed_memory()  # reuse each step's buffers instead of new pages (_allocator)
    gen = _batch_generator(seed, start)
    x_adv, target = _optimise(front, x, rec, gen, memory_format)
    q, err_q, err_f, rms, null = _measure(front, x, x_adv, target, rec.box, rec.precision)
    return q.cpu().contiguous(), err_q.cpu(), err_f.cpu(), rms.cpu(), null.cpu()



