"""What a split's self-check costs: cutting a model with the check (the halves run on the
example batch and are compared with the whole model) against the same cut without it
(``verify=False``), in the same run.

    python benchmarks/split_check.py              # resnet18, vgg16_bn, vit_tiny, small_cnn
    python benchmarks/split_check.py --quick      # small_cnn only (a smoke test)

Per model and point it prints the seconds of ``TracedModel(...)`` + ``split(point)``
without and with the check (best of ``--repeats``), the ratio, and one forward of the
example batch for scale. The check's cost at construction is one forward of the model
plus one of its traced graph (the reference, every point's value); each cut adds a
front + back pass (one forward).
"""

from __future__ import annotations

import argparse
import time

import torch

from stitchlab import models
from stitchlab.splitting import TracedModel

MODELS = {
    "resnet18": (dict(), "layer2.1"),
    "vgg16_bn": (dict(), "features.22"),
    "vit_tiny_patch4_32": (dict(), "blocks.5"),
    "small_cnn": (dict(), "blocks.1"),
}


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(name: str, batch: int, repeats: int, cuts: int) -> dict:
    options, point = MODELS[name]
    torch.manual_seed(0)
    model = models.create(name, **options).eval()
    x = torch.rand(batch, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    points = TracedModel(model, verify=False).points()
    at = [point] if cuts == 1 else points[:cuts]

    def plain() -> None:
        tm = TracedModel(model, verify=False)
        for p in at:
            tm.split(p, taps="later")

    def checked() -> None:
        tm = TracedModel(model, example=x)
        for p in at:
            tm.split(p, taps="later")

    def forward() -> None:
        with torch.no_grad():
            model(x)

    plain()  # warm-up (imports, allocator)
    checked()
    t_plain, t_checked = _best(plain, repeats), _best(checked, repeats)
    return {"model": name, "cuts": len(at), "batch": batch, "plain": t_plain,
            "checked": t_checked, "forward": _best(forward, repeats)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=3, help="example batch (the Stitcher's: 3)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    names = ["small_cnn"] if args.quick else list(MODELS)
    print(f"torch {torch.__version__}, {args.threads} threads, example batch {args.batch}, "
          f"best of {args.repeats}")  # fmt: skip
    print("| model | cuts | trace + cut (s) | with the check (s) | ratio | extra (s) | "
          "one forward (s) | extra / forward |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        for cuts in (1, 4):
            r = measure(name, args.batch, args.repeats, cuts)
            extra = r["checked"] - r["plain"]
            print(f"| {name} | {r['cuts']} | {r['plain']:.4f} | {r['checked']:.4f} | "
                  f"{r['checked'] / r['plain']:.2f}x | {extra:.4f} | {r['forward']:.4f} | "
                  f"{extra / r['forward']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
