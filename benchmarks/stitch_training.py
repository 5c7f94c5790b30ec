"""Stitch training speed: stitchlab against hook-based stitching, same batches, same run.

Baseline (what released stitching code does): every step runs the full front network from
the image (a forward hook grabs the activation at the point), the full back network from
the image with a hook that overwrites its activation at the point with the stitch output,
and a separate reference copy of the back network for the targets.

stitchlab: front activations and back targets are computed once (cache); every step runs
only the stitch layer and the back suffix.

Also: DM in closed form against 30 epochs of Adam (stitchlab's own cached loop).

    python benchmarks/stitch_training.py [--width 16] [--n 2560] [--objective slm]
    python benchmarks/stitch_training.py --tables memory   # channels-last against NCHW
    python benchmarks/stitch_training.py --tables fold     # BatchNorm folded in the loop
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import stitchlab as sl
from stitchlab import models
from stitchlab.data import shapes
from stitchlab.objectives import StitchOutputs, make_objective
from stitchlab.report import markdown_table
from stitchlab.splitting import later_points


def hook_baseline_epoch(
    front_model, back_model, point, layer, x, y, objective, batch_size, seed, later
):
    """One epoch of hook-based stitching; returns (seconds, step losses)."""
    front_model = copy.deepcopy(front_model).eval().requires_grad_(False)
    back_model = copy.deepcopy(back_model).eval().requires_grad_(False)
    reference = copy.deepcopy(back_model)
    layer = copy.deepcopy(layer)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-3, weight_decay=1e-4)
    obj = make_objective(objective).bind(point, later)
    grabbed, back_acts, ref_acts = {}, {}, {}
    front_model.get_submodule(point).register_forward_hook(
        lambda m, i, o: grabbed.__setitem__("a", o)
    )

    def overwrite(m, i, o):
        z = layer(grabbed["a"])
        back_acts[point] = z
        return z

    back_model.get_submodule(point).register_forward_hook(overwrite)
    for p in later:
        back_model.get_submodule(p).register_forward_hook(
            lambda m, i, o, p=p: back_acts.__setitem__(p, o)
        )
    for p in [point, *later]:
        reference.get_submodule(p).register_forward_hook(
            lambda m, i, o, p=p: ref_acts.__setitem__(p, o)
        )
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=gen)
    losses = []
    start = time.perf_counter()
    for i in range(0, len(x), batch_size):
        idx = perm[i : i + batch_size]
        xb, yb = x[idx], y[idx]
        with torch.no_grad():
            front_model(xb)  # the whole front network runs
            ref_logits = reference(xb)
        logits = back_model(xb)  # the whole back network runs, its prefix wasted
        out = StitchOutputs(logits, dict(back_acts))
        tgt = {"labels": yb, "logits": ref_logits, **{k: v for k, v in ref_acts.items()}}
        loss = obj(out, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return time.perf_counter() - start, losses


def measure_stitch(
    width: int = 16, n: int = 2560, objective: str = "slm", epochs: int = 3, ks=(1, 5, 9)
) -> list[dict]:
    """Per point: hook-based epoch vs stitchlab (cache, epoch); loss curves compared."""
    front, back, x, y = _setup(width, n)
    points = sl.stitch_points(back)
    rows = []
    for k in ks:
        point = points[k - 1]
        later = later_points(back, point)
        ours = sl.stitch(
            front, back, point, (x, y), objective=objective, epochs=epochs, cache=True,
            seed=0, lr=1e-3,
        )  # fmt: skip
        init = sl.stitch(front, back, point, (x, y), objective=objective, epochs=0)
        base_s, base_losses = hook_baseline_epoch(
            front, back, point, init.stitch_layer, x, y, objective, 128, 0, later
        )
        steps = len(base_losses)
        epoch_s = ours.timings["train"] / epochs
        cache_s = ours.timings["cache"]
        diff = max(abs(a - b) for a, b in zip(base_losses, ours.step_losses[:steps]))
        rows.append({
            "point": f"{k} ({point})", "baseline epoch s": round(base_s, 2),
            "stitchlab cache s": round(cache_s, 2), "stitchlab epoch s": round(epoch_s, 2),
            "ratio per epoch": f"{base_s / epoch_s:.1f}x",
            "ratio 1st epoch incl. cache": f"{base_s / (cache_s + epoch_s):.1f}x",
            "ratio 30 epochs": f"{30 * base_s / (cache_s + 30 * epoch_s):.1f}x",
            "max loss diff": f"{diff:.1e}",
        })  # fmt: skip
    return rows


def _measure_switch(switch, labels: tuple[str, str], width: int, n: int, objective: str,
                    epochs: int, repeats: int, ks) -> list[dict]:  # fmt: skip
    """Per point: stitchlab's cache and epoch seconds under ``switch("0")`` (the baseline)
    and ``switch("auto")`` (stitchlab's default), each its fastest of ``repeats``
    interleaved runs; and the largest difference of their loss curves."""
    front, back, x, y = _setup(width, n)
    points = sl.stitch_points(back)
    la, lb = labels
    rows = []
    for k in ks:
        point = points[k - 1]
        best: dict[str, dict] = {}
        for _ in range(repeats):
            for mode in ("0", "auto"):
                with switch(mode):
                    s = sl.stitch(front, back, point, (x, y), objective=objective,
                                  epochs=epochs, cache=True, seed=0, lr=1e-3)  # fmt: skip
                t = {"cache": s.timings["cache"], "epoch": s.timings["train"] / epochs}
                old = best.get(mode)
                best[mode] = {
                    "cache": min(t["cache"], old["cache"]) if old else t["cache"],
                    "epoch": min(t["epoch"], old["epoch"]) if old else t["epoch"],
                    "losses": s.step_losses,
                }
        a, b = best["0"], best["auto"]
        diff = max(abs(u - v) for u, v in zip(a["losses"], b["losses"]))
        rows.append({
            "point": f"{k} ({point})",
            f"{la} cache s": round(a["cache"], 2), f"{lb} cache s": round(b["cache"], 2),
            f"{la} epoch s": round(a["epoch"], 2), f"{lb} epoch s": round(b["epoch"], 2),
            "ratio cache": f"{a['cache'] / b['cache']:.2f}x",
            "ratio epoch": f"{a['epoch'] / b['epoch']:.2f}x",
            "ratio 30 epochs":
                f"{(a['cache'] + 30 * a['epoch']) / (b['cache'] + 30 * b['epoch']):.2f}x",
            "max loss diff": f"{diff:.1e}",
        })  # fmt: skip
    return rows


def measure_memory_format(
    width: int = 16, n: int = 2560, objective: str = "slm", epochs: int = 3, repeats: int = 2,
    ks=(1, 5, 9),
) -> list[dict]:
    """Per point: the frozen networks in NCHW (``STITCHLAB_CHANNELS_LAST=0``, the baseline)
    against channels-last (the CPU default); see :func:`_measure_switch`."""
    from stitchlab._memory_format import mode as memory_format_mode

    return _measure_switch(memory_format_mode, ("NCHW", "channels-last"), width, n,
                           objective, epochs, repeats, ks)  # fmt: skip


def measure_fold(
    width: int = 16, n: int = 2560, objective: str = "slm", epochs: int = 3, repeats: int = 2,
    ks=(1, 5, 9),
) -> list[dict]:
    """Per point: the training loop's back suffix with its BatchNorms as they are
    (``STITCHLAB_FOLD_BN=0``, the baseline) against folded into the convolutions (the
    default); see :func:`_measure_switch`."""
    from stitchlab._batchnorm import mode as fold_mode

    return _measure_switch(fold_mode, ("as is", "folded"), width, n, objective, epochs,
                           repeats, ks)  # fmt: skip


def measure_dm(width: int = 16, n: int = 2560, k: int = 5) -> list[dict]:
    """DM at point ``k``: closed form against 30 epochs of Adam (cached and streamed)."""
    front, back, x, y = _setup(width, n)
    point = sl.stitch_points(back)[k - 1]
    with torch.no_grad():
        target = sl.split(back, point)[0](x)

    def dm_loss(s):
        with torch.no_grad():
            return float(sl.objectives.relative_error(s.stitch_layer(s.front(x)), target))

    runs = {}
    for name, kw in {
        "closed form": dict(solver="closed_form"),
        "Adam 30 epochs, cached": dict(epochs=30, cache=True),
        "Adam 30 epochs, streamed": dict(epochs=30, cache=False),
    }.items():
        t0 = time.perf_counter()
        s = sl.stitch(front, back, point, (x, y), objective="dm", **kw)
        runs[name] = (time.perf_counter() - t0, dm_loss(s))
    closed_s = runs["closed form"][0]
    return [
        {"solver": name, "seconds": round(sec, 2), "DM loss": f"{loss:.5f}",
         "time / closed form": f"{sec / closed_s:.1f}x"}
        for name, (sec, loss) in runs.items()
    ]  # fmt: skip


def _setup(width: int, n: int):
    torch.manual_seed(0)
    back = models.create("resnet18", width=width).eval()
    torch.manual_seed(1)
    front = models.create("resnet18", width=width).eval()
    x, y = shapes(n, seed=0)
    return front, back, x, y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--n", type=int, default=2560, help="stitching images")
    ap.add_argument("--objective", default="slm")
    ap.add_argument("--epochs", type=int, default=3, help="stitchlab epochs (steady state)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tables", choices=("hooks", "memory", "fold"), default="hooks",
                    help="against hook-based stitching (and DM), NCHW against channels-last, "
                    "or the back suffix's BatchNorms as they are against folded")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.tables == "memory":
        print(f"ResNet-18 width {args.width}, {args.n} images, batch 128, {args.objective}, "
              f"{args.threads} threads: frozen networks NCHW (baseline) against channels-last, "
              "fastest of 2 interleaved runs")  # fmt: skip
        rows = measure_memory_format(args.width, args.n, args.objective, args.epochs)
        print(markdown_table(rows))
        return
    if args.tables == "fold":
        print(f"ResNet-18 width {args.width}, {args.n} images, batch 128, {args.objective}, "
              f"{args.threads} threads: the training loop's back suffix with BatchNorm as it "
              "is (baseline) against folded, fastest of 2 interleaved runs")  # fmt: skip
        print(markdown_table(measure_fold(args.width, args.n, args.objective, args.epochs)))
        return
    print(
        f"ResNet-18 width {args.width}, {args.n} images, batch 128, objective "
        f"{args.objective}, {args.threads} threads"
    )
    print(
        markdown_table(measure_stitch(args.width, args.n, args.objective, args.epochs)), flush=True
    )
    print(f"\nDM at point 5 over the {args.n} stitching images:")
    print(markdown_table(measure_dm(args.width, args.n)))


if __name__ == "__main__":
    main()
