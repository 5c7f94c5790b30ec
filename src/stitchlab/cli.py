"""The ``stitchlab`` command: a thin layer over the library."""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

__all__ = ["main"]

EXAMPLES = {
    "layers": "stitchlab layers resnet18 --width 16\n  stitchlab layers vit_tiny_patch4_32",
    "demo": "stitchlab demo --out demo-out\n  stitchlab demo --out /tmp/d --quick",
}


def _cmd_layers(args: argparse.Namespace) -> int:
    from . import models
    from .layers import ActivationSpec
    from .split import split, stitch_points

    options = {}
    if args.width is not None:
        options["width"] = args.width
    model = models.create(args.model, num_classes=args.num_classes, **options).eval()
    size = args.input_size or (224 if "224" in args.model else 32)
    x = torch.rand(1, 3, size, size)
    print(f"{args.model}: {len(stitch_points(model))} stitch points (input 3x{size}x{size})")
    with torch.no_grad():
        for p in stitch_points(model):
            front, _ = split(model, p)
            spec = ActivationSpec.of(front(x), getattr(model, "num_prefix_tokens", None))
            print(f"  {p:<14} {spec}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from . import evaluate, models, stitch, stitch_points
    from .data import shapes
    from .train import train_classifier

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    n_train, n_test, epochs, stitch_epochs = (1500, 500, 4, 2) if args.quick else (4000, 1000, 8, 4)
    start = time.time()
    train = shapes(n_train, seed=0)
    test = shapes(n_test, seed=1)
    nets = {}
    for seed in (0, 1):
        torch.manual_seed(seed)
        net = models.create("small_cnn", width=16)
        train_classifier(net, train, epochs=epochs, seed=seed)
        nets[seed] = net
        print(f"trained small_cnn seed {seed} ({time.time() - start:.0f} s)", flush=True)
    back = nets[0]
    pairs = {"identical": nets[0], "cross-seed": nets[1]}
    rows = []
    for pair, front in pairs.items():
        for point in stitch_points(back):
            for objective in ("hlm", "slm", "dm", "fula"):
                s = stitch(
                    front,
                    back,
                    point,
                    train,
                    objective=objective,
                    epochs=stitch_epochs,
                    lr=3e-3,
                    seed=0,
                )
                scores = evaluate(s, test, back)
                rows.append(
                    {
                        "pair": pair,
                        "point": point,
                        "objective": objective,
                        "protocol": "standard",
                        "seed": 0,
                        **{k: round(v, 3) for k, v in scores.items()},
                        "init_residual": round(float(s.init_residual or 0), 5),
                    }
                )
                print(
                    f"{pair:<11} {point:<9} {objective:<5} agreement {scores['agreement']:6.2f}",
                    flush=True,
                )
    table = out / "results.csv"
    with table.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {table} ({len(rows)} rows) in {time.time() - start:.0f} s")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stitchlab",
        description="Functional similarity of neural networks by (invariance-aware) stitching.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=f"examples:\n  {EXAMPLES[name]}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    lay = add("layers", "List a model's stitch points with their activation shapes.")
    lay.add_argument("model", help="a registered model name (e.g. resnet18)")
    lay.add_argument("--width", type=int, default=None, help="model width option")
    lay.add_argument("--num-classes", type=int, default=10)
    lay.add_argument("--input-size", type=int, default=None, help="image side (32 or 224)")
    lay.set_defaults(func=_cmd_layers)

    demo = add("demo", "Train small networks on generated data and stitch them.")
    demo.add_argument("--out", required=True, help="output folder")
    demo.add_argument("--quick", action="store_true", help="a smaller, faster run")
    demo.set_defaults(func=_cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``stitchlab`` command."""
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (KeyError, ValueError, TypeError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"stitchlab {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
